"""Tenants written by the admin API, kept current on every replica.

Each tenant the admin API created or changed is one JSON document in the state store:
`{"tenant": {...TenantProfile...}, "updated_at": unix_s, "uid": ID}`, or `{"deleted": true,
...}` for a configured tenant the API deleted. `uid` is given when the API creates the
tenant and kept by every change after (a configured tenant changed by the API has none):
its data is kept by it (`Tenant.owner`), so a tenant created again under a deleted one's
name never sees the old one's files, jobs, cache entries or quota counters.
`TenantDirectory.run()` polls the store's version every `poll_s` (0.5 s) and, when it
moved, reloads the documents into the `Catalog`: so a change made on one replica reaches
the others' live traffic within about a second, with no restart. While the store is
unreachable the last overlay stays in force.
"""

from __future__ import annotations

import logging
import secrets
import time
from typing import Any

import anyio
from pydantic import ValidationError

from gateway.settings import TenantProfile
from gateway.tenancy.state import StateStore, StateStoreError
from gateway.tenancy.tenants import Catalog

_log = logging.getLogger("gateway.tenancy.tenants")


class TenantDirectory:
    def __init__(self, store: StateStore, catalog: Catalog, poll_s: float = 0.5) -> None:
        self._store = store
        self.catalog = catalog
        self._poll_s = poll_s
        self._version: str | None = None
        self._updated: dict[str, float] = {}
        self._uids: dict[str, str] = {}
        self._failing = False

    def updated_at(self, name: str) -> float | None:
        return self._updated.get(name)

    async def refresh(self) -> None:
        """Reloads the overlay if the store changed; raises StateStoreError."""
        version = await self._store.tenants_version()
        if version == self._version:
            return
        docs = await self._store.list_tenants()
        overlay: dict[str, TenantProfile | None] = {}
        uids: dict[str, str] = {}
        for name, doc in docs.items():
            if _read(name, doc, overlay):
                self._updated[name] = float(doc.get("updated_at", 0.0))
                if isinstance(doc.get("uid"), str):
                    uids[name] = doc["uid"]
        self.catalog.apply(overlay, uids)
        self._uids = uids
        self._version = version

    async def run(self) -> None:
        while True:
            try:
                await self.refresh()
                self._failing = False
            except StateStoreError as exc:
                if not self._failing:
                    _log.warning("tenant store unreachable, keeping last tenants: %s", exc)
                self._failing = True
            await anyio.sleep(self._poll_s)

    async def save(self, profile: TenantProfile, *, created: bool = False) -> None:
        """Stores the tenant; `created`: a new one, with an id of its own (see the module),
        else a change that keeps the id it has (none for a configured tenant)."""
        doc: dict[str, Any] = {"tenant": profile.model_dump(mode="json"), "updated_at": time.time()}
        uid = secrets.token_hex(8) if created else self._uids.get(profile.name)
        if uid is not None:
            doc["uid"] = uid
        await self._store.put_tenant(profile.name, doc)
        await self.refresh()

    async def remove(self, name: str) -> None:
        if self.catalog.configured(name):
            await self._store.put_tenant(name, {"deleted": True, "updated_at": time.time()})
        else:
            await self._store.drop_tenant(name)
        self._updated.pop(name, None)
        await self.refresh()


def _read(name: str, doc: dict[str, Any], overlay: dict[str, TenantProfile | None]) -> bool:
    if doc.get("deleted") is True:
        overlay[name] = None
        return False
    try:
        overlay[name] = TenantProfile.model_validate(doc.get("tenant"))
    except ValidationError as exc:
        # Written by another version of the gateway: keep the configured tenant, say why.
        _log.warning("ignoring stored tenant %r: %s", name, exc.errors(include_url=False)[0])
        return False
    return True
