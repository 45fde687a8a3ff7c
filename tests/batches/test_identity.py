"""A batch line's identity: its job's tenant, without a key, in the batch class."""

from __future__ import annotations

import inspect

import pytest

from gateway.batches.identity import BatchClass, LineAuthenticator, line_request
from gateway.batches.lines import InputLine
from gateway.disconnect import SERVER_CANCELS
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


async def test_a_line_is_its_tenants_and_nothing_else_is() -> None:
    tenants = catalog()
    auth = LineAuthenticator(tenants)
    assert (await auth.authenticate("Batch acme")).tenant == "acme"
    # Deleted, then created again through the admin API: the old job's lines run nothing.
    tenants.apply({"acme": TenantProfile(name="acme")}, {"acme": "u2"})
    assert (await auth.authenticate("Batch acme~u2")).tenant == "acme"
    for header in (None, "", "Bearer sk-x", "Batch", "Batch ", "Batch acme", "Batch acme~u1"):
        with pytest.raises(Unauthenticated):
            await auth.authenticate(header)


async def test_the_line_request() -> None:
    body = b'{"model": "m1", "messages": []}'
    request = line_request("acme", InputLine(0, "c", "/v1/chat/completions", "m1", body))
    assert request.url.path == "/v1/chat/completions" and request.method == "POST"
    assert request.headers["authorization"] == "Batch acme"
    assert request.headers["x-priority"] == "batch"
    assert request.headers["content-length"] == str(len(body))
    assert request.scope[SERVER_CANCELS] is True
    assert await request.body() == body
