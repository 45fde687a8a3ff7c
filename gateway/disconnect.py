"""Cancelling a request's work when its client leaves before the answer.

    answer = await unless_disconnected(request, answer_coroutine)

The client is gone: its queue place and upstream request are cancelled instead of being
served to nobody, and `ClientGone` (499, for the log) is raised. Two ways to notice:

- under the gateway's own server (`gateway/server.py`), the HTTP protocol cancels the
  request's task itself when the connection is lost before the response is complete: the
  scope says so (`SERVER_CANCELS`), and the task registers itself (`TASK`) while the
  answer is made, and again while a stream is relayed (`gateway/relay.py`). No extra task
  (Starlette's streams otherwise run a second task per stream to listen for it).
- under any other ASGI server, one watcher task per request waits for `http.disconnect`
  and cancels the request's task (a task group of two tasks cost a fifth of the gateway's
  CPU per proxied request; the watcher alone, about a tenth).

Either starts only once the body is read: the watcher consumes the request's messages.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, MutableMapping
from typing import Any, TypeVar

from starlette.requests import Request

from gateway.errors import ClientGone

SERVER_CANCELS = "gateway.server_cancels_on_disconnect"  # set by the server, in the scope
TASK = "gateway.task"  # the task to cancel, set while the answer is being made
DISCONNECTED = "gateway.disconnected"  # set by the server before it cancels

T = TypeVar("T")


async def unless_disconnected(request: Request, answer: Awaitable[T]) -> T:
    if request.scope.get(SERVER_CANCELS):
        return await cancelled_by_server(request.scope, answer)
    current = asyncio.current_task()
    assert current is not None
    return await _watched(request, current, answer)


async def cancelled_by_server(scope: MutableMapping[str, Any], work: Awaitable[T]) -> T:
    """`work`, registered for the server to cancel if the client leaves meanwhile; then
    `ClientGone`. Only where the scope says the server does so (`SERVER_CANCELS`)."""
    current = asyncio.current_task()
    assert current is not None
    scope[TASK] = current
    try:
        return await work
    except asyncio.CancelledError:
        if scope.get(DISCONNECTED) and current.uncancel() == 0:
            raise ClientGone("The client closed the connection before the answer.") from None
        raise
    finally:
        scope[TASK] = None


def cancel_on_disconnect(scope: dict[str, Any]) -> None:
    """For the server: the connection of `scope` is lost before its response started."""
    task = scope.get(TASK)
    if task is not None:
        scope[DISCONNECTED] = True
        task.cancel()


async def _watched(request: Request, current: asyncio.Task[Any], answer: Awaitable[T]) -> T:
    watcher = asyncio.get_running_loop().create_task(_cancel_on_disconnect(request, current))
    try:
        return await answer
    except asyncio.CancelledError:
        if _client_left(watcher) and current.uncancel() == 0:
            raise ClientGone("The client closed the connection before the answer.") from None
        raise
    finally:
        watcher.cancel()


async def _cancel_on_disconnect(request: Request, task: asyncio.Task[Any]) -> bool:
    while (await request.receive())["type"] != "http.disconnect":
        pass
    task.cancel()
    return True


def _client_left(watcher: asyncio.Task[bool]) -> bool:
    return watcher.done() and not watcher.cancelled() and watcher.exception() is None
