"""Which backend serves a model (by the request's prompt size, where the model has
backends for long prompts: gateway/prompt_size.py), and which models a tenant may use.

Tenants come from the configuration, overlaid by those the admin API stored (see
gateway/tenancy/tenant_store.py): an overlay replaces the configured tenant of the same name
(keeping its configured keys), or hides it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Literal

from gateway.errors import ModelNotAllowed, ModelNotFound, Unauthenticated
from gateway.prompt_size import SizeRoutes
from gateway.settings import Tenant, TenantProfile

Source = Literal["config", "admin"]


@dataclass(frozen=True)
class ModelRoute:
    model: str
    backend: str
    by_size: bool = False  # picked by the prompt's size among the model's backends


class Catalog:
    def __init__(self, routes: Mapping[str, SizeRoutes], tenants: list[Tenant]) -> None:
        self._routes = routes
        self._configured = {t.name: t for t in tenants}
        self._tenants = dict(self._configured)
        self._overlaid: frozenset[str] = frozenset()
        self._allowed: dict[tuple[str, str], bool] = {}

    def apply(
        self, overlay: Mapping[str, TenantProfile | None], uids: Mapping[str, str] | None = None
    ) -> None:
        """Replaces the previous overlay; None hides a configured tenant. `uids`: the id
        each tenant the admin API created was given (see `Tenant.owner`)."""
        tenants = dict(self._configured)
        for name, profile in overlay.items():
            if profile is None:
                tenants.pop(name, None)
                continue
            configured = self._configured.get(name)
            keys = list(configured.keys) if configured is not None else []
            tenants[name] = tenant = Tenant(**profile.model_dump(), keys=keys)
            tenant._uid = (uids or {}).get(name)
        # Swapped whole, between two awaits: a request sees the old set or the new one.
        self._tenants = tenants
        self._overlaid = frozenset(n for n, p in overlay.items() if p is not None)
        self._allowed = {}

    def configured(self, name: str) -> bool:
        return name in self._configured

    def find(self, name: str) -> Tenant | None:
        return self._tenants.get(name)

    def listing(self) -> list[tuple[Tenant, Source]]:
        return [
            (tenant, "admin" if name in self._overlaid else "config")
            for name, tenant in sorted(self._tenants.items())
        ]

    def route(self, tenant: str, model: str, prompt_tokens: int) -> ModelRoute:
        """Where a request for `model` whose prompt is estimated at `prompt_tokens` goes:
        the one place a request's backend is picked (its model's, a fallback's, a degraded
        request's)."""
        routes = self._routes.get(model)
        if routes is None:
            raise ModelNotFound(f"The model '{model}' does not exist.", param="model")
        if not self.allows(tenant, model):
            raise ModelNotAllowed(f"Your key may not use the model '{model}'.", param="model")
        return ModelRoute(model, routes.backend_for(prompt_tokens), routes.by_size)

    def allows(self, tenant: str, model: str) -> bool:
        answer = self._allowed.get((tenant, model))
        if answer is None:
            answer = any(fnmatchcase(model, p) for p in self.tenant(tenant).models)
            self._allowed[(tenant, model)] = answer
        return answer

    def models_for(self, tenant: str) -> list[str]:
        return [model for model in self._routes if self.allows(tenant, model)]

    def cache_scope(self, name: str) -> tuple[str, list[str]]:
        """The cache scope of tenant `name` (`tenant:NAME`, or `group:NAME` when it shares
        a cache group) and the tenants in it now, whose entries it may flush or delete."""
        tenant = self.tenant(name)
        group = tenant.cache_group
        if group is None:
            return f"tenant:{name}", [name]
        members = {name, *(t.name for t in self._tenants.values() if t.cache_group == group)}
        return f"group:{group}", sorted(members)

    def current(self, owner: str) -> Tenant | None:
        """The tenant whose data `owner` names, if it still exists: None once it was
        deleted, even if a tenant of the same name was created since."""
        tenant = self._tenants.get(tenant_name(owner))
        return tenant if tenant is not None and tenant.owner == owner else None

    def of_owner(self, owner: str) -> Tenant:
        """`current(owner)`, or Unauthenticated once it was deleted (a batch job's lines run
        as their job's owner: gateway/pipeline.py's `line`)."""
        tenant = self.current(owner)
        if tenant is None:
            raise Unauthenticated("The tenant that owns this batch was deleted.")
        return tenant

    def tenant(self, name: str) -> Tenant:
        tenant = self._tenants.get(name)
        if tenant is None:
            # A key whose tenant was removed from the configuration or deleted.
            raise Unauthenticated("Incorrect API key provided.")
        return tenant


def tenant_name(owner: str) -> str:
    """The name in a `Tenant.owner`."""
    return owner.partition("~")[0]
