"""How a batch line enters the request path as its job's tenant, in the `batch` class.

The runner sends each line through a second `Pipeline`, built in gateway/compose/__init__.py from
the same parts as the online one (pools, quotas, cache, lifecycle) but two:

- `LineAuthenticator`: the principal is the tenant the line's request names
  (`Authorization: Batch TENANT`). No key is involved: the job's creator was authenticated
  when it created the job, and the tenant's keys are only ever kept hashed. This pipeline is
  reachable from the runner only, never from the network (the HTTP routes and the hot path
  use the online one), so the header is the runner's word, not a client's.
- `BatchClass`: the catalog as batch lines see it, every tenant in the `batch` class (the
  `x-priority` header counts only for tenants allowed to choose), so that interactive traffic
  always goes first in the fair queue.

Nothing here runs for an online request.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import anyio
from starlette.requests import Request
from starlette.types import Message

from gateway.batches.lines import InputLine
from gateway.disconnect import SERVER_CANCELS
from gateway.errors import Unauthenticated
from gateway.settings import Tenant, TenantProfile
from gateway.tenancy.auth import Authenticator, Principal
from gateway.tenancy.tenants import Catalog, ModelRoute, Source

SCHEME = "Batch"


class LineAuthenticator(Authenticator):
    """Authenticates batch lines only (see the module): no store, no keys. The header
    names the job's owner (`Tenant.owner`), so that a job of a tenant deleted since runs
    nothing, even after a tenant of the same name was created."""

    def __init__(self, catalog: Catalog) -> None:  # nothing of Authenticator's: no key
        self._catalog = catalog

    async def authenticate(self, authorization: str | None) -> Principal:
        scheme, _, owner = (authorization or "").partition(" ")
        if scheme != SCHEME or not owner:
            raise Unauthenticated("A batch line without its job's tenant.")
        tenant = self._catalog.current(owner)
        if tenant is None:
            raise Unauthenticated("The batch's tenant was deleted.")
        return Principal(tenant.name, "batch")


class BatchClass(Catalog):
    """`catalog`, with every tenant in the `batch` class. It delegates every method (and so
    follows the tenants the admin API changes); tests check that none is left to `Catalog`."""

    def __init__(self, catalog: Catalog) -> None:  # keeps no state of Catalog's own
        self._catalog = catalog

    def tenant(self, name: str) -> Tenant:
        return self._catalog.tenant(name).model_copy(update={"priority": "batch"})

    def apply(
        self, overlay: Mapping[str, TenantProfile | None], uids: Mapping[str, str] | None = None
    ) -> None:
        self._catalog.apply(overlay, uids)

    def current(self, owner: str) -> Tenant | None:
        return self._catalog.current(owner)

    def configured(self, name: str) -> bool:
        return self._catalog.configured(name)

    def find(self, name: str) -> Tenant | None:
        return self._catalog.find(name)

    def listing(self) -> list[tuple[Tenant, Source]]:
        return self._catalog.listing()

    def route(self, tenant: str, model: str, prompt_tokens: int) -> ModelRoute:
        return self._catalog.route(tenant, model, prompt_tokens)

    def allows(self, tenant: str, model: str) -> bool:
        return self._catalog.allows(tenant, model)

    def models_for(self, tenant: str) -> list[str]:
        return self._catalog.models_for(tenant)

    def cache_scope(self, name: str) -> tuple[str, list[str]]:
        return self._catalog.cache_scope(name)


def line_request(owner: str, line: InputLine) -> Request:
    """The line as an HTTP request of its job's owner, over a scope of its own."""
    headers = [
        (b"authorization", f"{SCHEME} {owner}".encode()),
        (b"content-type", b"application/json"),
        (b"content-length", str(len(line.body)).encode()),
        (b"x-priority", b"batch"),
    ]
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": line.url,
        "raw_path": line.url.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": headers,
        "client": None,
        "server": None,
        # No connection to lose: the runner cancels a line itself (no watcher task).
        SERVER_CANCELS: True,
    }
    return Request(scope, _body_once(line.body))


def _body_once(body: bytes) -> Any:
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if sent:
            await anyio.sleep_forever()  # nothing else arrives; never a disconnect
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive
