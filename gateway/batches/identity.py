"""How a batch line enters the request path as its job's tenant, in the `batch` class.

The runner sends each line through a second `Pipeline`, built in gateway/compose/__init__.py
from the same parts as the online one but its catalog, and through its typed entry
(`Pipeline.line`: the job's owner, the line's body, kind and path), not as an HTTP request.
No key is involved: the job's creator was authenticated when it created the job, and a
tenant's keys are only ever kept hashed. The catalog is `BatchClass`: every tenant in the
`batch` class (the `x-priority` header counts only for tenants allowed to choose), so that
interactive traffic always goes first in the fair queue.

Nothing here runs for an online request.
"""

from __future__ import annotations

from collections.abc import Mapping

from gateway.settings import Tenant, TenantProfile
from gateway.tenancy.tenants import Catalog, ModelRoute, Source


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

    def of_owner(self, owner: str) -> Tenant:
        return self._catalog.of_owner(owner).model_copy(update={"priority": "batch"})

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
