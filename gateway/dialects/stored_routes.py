"""The stored-response routes of the Responses API, a tenant's own responses only:

    GET    /v1/responses/{id}               the response as it was sent
    GET    /v1/responses/{id}/input_items   the input items it was asked with
    DELETE /v1/responses/{id}
    POST   /v1/responses/{id}/cancel        400: only background responses can be cancelled,
                                            and this gateway runs none

Another tenant's id answers 404, as an unknown one does.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.dialects.stored import ResponseStore, Stored
from gateway.errors import BadRequest, NotFound
from gateway.settings import Tenant

Handler = Callable[[Tenant], Awaitable[Response]]
AsTenant = Callable[[Request, Handler], Awaitable[Response]]  # Pipeline.as_tenant


def stored_routes(
    store: Callable[[], ResponseStore], as_tenant: Callable[[], AsTenant]
) -> list[Route]:
    def route(
        path: str, method: str, action: Callable[[ResponseStore, str, str], Awaitable[Response]]
    ) -> Route:
        async def endpoint(request: Request) -> Response:
            response_id = request.path_params["response_id"]

            async def handler(tenant: Tenant) -> Response:
                return await action(store(), tenant.owner, response_id)

            return await as_tenant()(request, handler)

        return Route(path, endpoint, methods=[method])

    one = "/v1/responses/{response_id}"
    return [
        route(one, "GET", _get),
        route(one, "DELETE", _delete),
        route(one + "/input_items", "GET", _input_items),
        route(one + "/cancel", "POST", _cancel),
    ]


async def _found(store: ResponseStore, owner: str, response_id: str) -> Stored:
    stored = await store.get(owner, response_id)
    if stored is None:
        raise NotFound(f"Response with id '{response_id}' not found.")
    return stored


async def _get(store: ResponseStore, owner: str, response_id: str) -> Response:
    return _json((await _found(store, owner, response_id)).response)


async def _delete(store: ResponseStore, owner: str, response_id: str) -> Response:
    if not await store.delete(owner, response_id):
        raise NotFound(f"Response with id '{response_id}' not found.")
    return _json({"id": response_id, "object": "response", "deleted": True})


async def _input_items(store: ResponseStore, owner: str, response_id: str) -> Response:
    items = (await _found(store, owner, response_id)).input
    first, last = (items[0]["id"], items[-1]["id"]) if items else (None, None)
    listing = {
        "object": "list",
        "data": items,
        "first_id": first,
        "last_id": last,
        "has_more": False,
    }
    return _json(listing)


async def _cancel(store: ResponseStore, owner: str, response_id: str) -> Response:
    await _found(store, owner, response_id)
    raise BadRequest("Only responses created with background=true can be cancelled.")


def _json(body: Any) -> Response:
    return Response(orjson.dumps(body), 200, media_type="application/json")
