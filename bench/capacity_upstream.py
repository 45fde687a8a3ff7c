"""An OpenAI-style upstream with a known, fixed capacity: a stand-in for one GPU server.

At most `--concurrency` C requests are served at once, each for exactly `--service-ms` S,
so the capacity is C / S requests per second. Requests beyond C wait in the server's own
FIFO queue, unbounded, as they would in front of a GPU model server: without admission
control in front of it, its latency grows with the backlog without limit.

Like a model server (vLLM aborts a request whose client disconnects), a request whose
client goes away is dropped, waiting or running, and its slot freed at once.

`--fail-rate` f: that fraction of requests (drawn at random) is answered 503 at once,
without a Retry-After and without taking a slot: an upstream that rejects work.

    POST /v1/chat/completions   a chat completion with `usage` (model `capacity`)
    GET  /v1/models             the model list (the gateway's health probe)
    GET  /_stats                counts since the last reset: attempts (every POST), failed
                                (the injected 503s), served, abandoned_queued,
                                abandoned_running, flushed; queued and running now,
                                max_queued (the longest the queue got); and, never reset,
                                busy_s_total (slot-seconds spent serving), served_total
                                and clock_s (the server's monotonic clock), for
                                utilisation over an interval
    POST /_control              {"fail_rate": f, "reset": true}: sets the fail rate; reset
                                answers every waiting request 409 (neither retried by the
                                gateway nor counted as a failure by its breaker) and zeroes
                                the counters. Requests from before a reset are not counted
                                after it.

Run: python -m bench.capacity_upstream --port PORT [--concurrency 4] [--service-ms 80]
                                       [--fail-rate 0.0] [--seed 1]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections import deque
from typing import Any

import orjson

from bench.asgi import read_body, run_lifespan, send_json, serve

Scope = dict[str, Any]
MODEL = "capacity"
PROMPT_TOKENS = 10
_COUNTERS = (
    "attempts",
    "failed",
    "served",
    "abandoned_queued",
    "abandoned_running",
    "flushed",
)


class Flushed(Exception):
    """The waiting request was flushed by a reset."""


class Capacity:
    """C slots, handed over in arrival order; waiters are futures in a deque."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.running = 0
        self.waiting: deque[asyncio.Future[None]] = deque()

    async def acquire(self) -> None:
        if self.running < self.slots and not self.waiting:
            self.running += 1
            return
        future = asyncio.get_running_loop().create_future()
        self.waiting.append(future)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled() and future.exception() is None:
                self.release()  # handed a slot in the moment before the cancellation
            else:
                future.cancel()  # stays in the deque; release() skips it
            raise

    def release(self) -> None:
        while self.waiting:
            future = self.waiting.popleft()
            if not future.done():
                future.set_result(None)  # the slot passes on: `running` is unchanged
                return
        self.running -= 1

    def queued(self) -> int:
        return sum(1 for f in self.waiting if not f.done())

    def flush(self) -> int:
        flushed = 0
        while self.waiting:
            future = self.waiting.popleft()
            if not future.done():
                future.set_exception(Flushed())
                flushed += 1
        return flushed


class CapacityUpstream:
    def __init__(self, concurrency: int, service_s: float, fail_rate: float, seed: int) -> None:
        self.capacity = Capacity(concurrency)
        self.service_s = service_s
        self.fail_rate = fail_rate
        self.random = random.Random(seed)
        self.epoch = 0
        self.stats = dict.fromkeys(_COUNTERS, 0)
        self.max_queued = 0
        # Never reset, for utilisation over any interval: slot-seconds spent serving (those
        # in service counted up to now) and requests served, on the server's own clock.
        self.busy_s_total = 0.0
        self.served_total = 0
        self.started_sum = 0.0  # sum of the start times of the services under way

    def busy_s(self, now: float) -> float:
        return self.busy_s_total + self.capacity.running * now - self.started_sum

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await run_lifespan(receive, send)
            return
        path, method = scope["path"], scope["method"]
        if method == "GET":
            await self._get(path, send)
        elif path == "/_control":
            await self._control(orjson.loads(await read_body(receive) or b"{}"), send)
        elif path == "/v1/chat/completions":
            await self._chat(await read_body(receive), receive, send)
        else:
            await send_json(send, 404, _error("not found", "unknown_url"))

    async def _get(self, path: str, send: Any) -> None:
        if path == "/v1/models":
            model = {"id": MODEL, "object": "model", "created": 0, "owned_by": "bench"}
            await send_json(send, 200, {"object": "list", "data": [model]})
        elif path == "/_stats":
            queued = self.capacity.queued()
            self.max_queued = max(self.max_queued, queued)
            now = time.monotonic()
            await send_json(
                send,
                200,
                {
                    **self.stats,
                    "queued": queued,
                    "running": self.capacity.running,
                    "max_queued": self.max_queued,
                    "fail_rate": self.fail_rate,
                    "clock_s": now,
                    "busy_s_total": self.busy_s(now),
                    "served_total": self.served_total,
                },
            )
        else:
            await send_json(send, 404, _error("not found", "unknown_url"))

    async def _control(self, body: dict[str, Any], send: Any) -> None:
        if "fail_rate" in body:
            self.fail_rate = float(body["fail_rate"])
        if body.get("reset"):
            self.capacity.flush()
            self.epoch += 1
            self.stats = dict.fromkeys(_COUNTERS, 0)
            self.max_queued = 0
        await send_json(send, 200, {"fail_rate": self.fail_rate, "epoch": self.epoch})

    def _count(self, epoch: int, counter: str) -> None:
        if epoch == self.epoch:
            self.stats[counter] += 1

    async def _chat(self, raw: bytes, receive: Any, send: Any) -> None:
        epoch = self.epoch
        self._count(epoch, "attempts")
        if self.fail_rate > 0 and self.random.random() < self.fail_rate:
            self._count(epoch, "failed")
            await send_json(send, 503, _error("rejected (injected failure)", "upstream_busy"))
            return
        body = orjson.loads(raw)
        task = asyncio.current_task()
        assert task is not None
        gone: list[bool] = []
        watcher = asyncio.create_task(_cancel_on_disconnect(receive, task, gone))
        running = False
        try:
            await self.capacity.acquire()
            running = True
            self.max_queued = max(self.max_queued, self.capacity.queued())
            began = time.monotonic()
            self.started_sum += began
            try:
                await asyncio.sleep(self.service_s)
            finally:
                self.started_sum -= began
                self.busy_s_total += time.monotonic() - began
                self.capacity.release()
        except Flushed:
            watcher.cancel()
            self._count(epoch, "flushed")
            await send_json(send, 409, _error("flushed by a reset", "flushed"))
            return
        except asyncio.CancelledError:
            if not gone:
                raise
            self._count(epoch, "abandoned_running" if running else "abandoned_queued")
            return
        watcher.cancel()
        self.served_total += 1
        self._count(epoch, "served")
        await send_json(send, 200, _completion(body))


async def _cancel_on_disconnect(receive: Any, task: asyncio.Task[Any], gone: list[bool]) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    gone.append(True)
    task.cancel()


def _completion(body: dict[str, Any]) -> dict[str, Any]:
    completion = body.get("max_tokens") or body.get("max_completion_tokens") or 16
    message = {"role": "assistant", "content": "ok " * int(completion)}
    return {
        "id": "capacity-1",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", MODEL),
        "choices": [{"index": 0, "message": message, "finish_reason": "length"}],
        "usage": {
            "prompt_tokens": PROMPT_TOKENS,
            "completion_tokens": int(completion),
            "total_tokens": PROMPT_TOKENS + int(completion),
        },
    }


def _error(message: str, code: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "server_error", "param": None, "code": code}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--service-ms", type=float, default=80.0)
    parser.add_argument("--fail-rate", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    app = CapacityUpstream(args.concurrency, args.service_ms / 1000.0, args.fail_rate, args.seed)
    serve(app, args.host, args.port)


if __name__ == "__main__":
    main()
