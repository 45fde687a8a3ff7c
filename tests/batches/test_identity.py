"""A batch line's catalog: every tenant in the batch class (the line itself enters as its
job's owner, `Pipeline.line`: tests/batches/test_batches_e2e.py)."""

from __future__ import annotations

import inspect

import pytest

from gateway.batches.identity import BatchClass
from gateway.errors import Unauthenticated
from gateway.prompt_size import SizeRoutes
from gateway.settings import Tenant, TenantProfile
from gateway.tenancy.tenants import Catalog


def catalog() -> Catalog:
    tenants = [Tenant(name="acme", models=["m*"]), Tenant(name="solo", priority="batch")]
    return Catalog({"m1": SizeRoutes("backend-a"), "x": SizeRoutes("backend-b")}, tenants)


def test_the_view_delegates_every_method_of_the_catalog() -> None:
    """Else a method added to Catalog would read state the view does not have."""
    public = {
        name
        for name, member in inspect.getmembers(Catalog, inspect.isfunction)
        if not name.startswith("_")
    }
    assert public <= set(vars(BatchClass)), public - set(vars(BatchClass))


def test_every_tenant_is_in_the_batch_class_and_the_rest_is_the_catalogs() -> None:
    inner = catalog()
    view = BatchClass(inner)
    assert view.tenant("acme").priority == "batch"
    assert inner.tenant("acme").priority == "interactive"  # the online path is unchanged
    assert view.route("acme", "m1", 0).backend == "backend-a"
    assert view.models_for("acme") == ["m1"] and not view.allows("acme", "x")
    assert view.cache_scope("acme") == ("tenant:acme", ["acme"])
    assert view.find("nobody") is None and view.configured("acme")
    assert [t.name for t, _ in view.listing()] == ["acme", "solo"]
    view.apply({"acme": None})  # what the admin API changes, the view sees too
    assert inner.find("acme") is None
    with pytest.raises(Unauthenticated):
        view.tenant("acme")


def test_a_line_is_its_jobs_owners_and_in_the_batch_class() -> None:
    tenants = catalog()
    view = BatchClass(tenants)
    assert view.of_owner("acme").priority == "batch"
    # Deleted, then created again through the admin API: the old job's lines run nothing.
    tenants.apply({"acme": TenantProfile(name="acme")}, {"acme": "u2"})
    assert view.of_owner("acme~u2").name == "acme"
    for owner in ("acme", "acme~u1", "", "nobody"):
        with pytest.raises(Unauthenticated):
            view.of_owner(owner)
