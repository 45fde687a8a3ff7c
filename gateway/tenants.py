"""Which backend serves a model, and which models a tenant may use."""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase

from gateway.errors import ModelNotAllowed, ModelNotFound, Unauthenticated
from gateway.settings import Tenant


@dataclass(frozen=True)
class ModelRoute:
    model: str
    backend: str


class Catalog:
    def __init__(self, routes: dict[str, str], tenants: list[Tenant]) -> None:
        self._routes = routes
        self._tenants = {t.name: t for t in tenants}
        self._allowed: dict[tuple[str, str], bool] = {}

    def route(self, tenant: str, model: str) -> ModelRoute:
        backend = self._routes.get(model)
        if backend is None:
            raise ModelNotFound(f"The model '{model}' does not exist.", param="model")
        if not self.allows(tenant, model):
            raise ModelNotAllowed(f"Your key may not use the model '{model}'.", param="model")
        return ModelRoute(model, backend)

    def allows(self, tenant: str, model: str) -> bool:
        answer = self._allowed.get((tenant, model))
        if answer is None:
            answer = any(fnmatchcase(model, p) for p in self.tenant(tenant).models)
            self._allowed[(tenant, model)] = answer
        return answer

    def models_for(self, tenant: str) -> list[str]:
        return [model for model in self._routes if self.allows(tenant, model)]

    def tenant(self, name: str) -> Tenant:
        tenant = self._tenants.get(name)
        if tenant is None:
            # A key whose tenant was removed from the configuration.
            raise Unauthenticated("Incorrect API key provided.")
        return tenant
