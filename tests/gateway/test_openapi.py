"""/openapi.json: a valid OpenAPI 3.1 document naming every route the gateway serves."""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from starlette.routing import Route

from gateway.app import HotPath, create_app
from gateway.openapi import openapi_document
from gateway.settings import Settings

_UNDOCUMENTED: set[tuple[str, str]] = set()


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    return openapi_document()


def served_routes() -> set[tuple[str, str]]:
    settings = Settings.model_validate(
        {"backends": [{"name": "b", "base_url": "http://x/v1", "models": ["m"]}]}
    )
    app = create_app(settings, environ={})
    assert isinstance(app, HotPath)
    found = set()
    for route in app.app.routes:
        assert isinstance(route, Route)
        for method in route.methods or ():
            if method != "HEAD":
                found.add((route.path, method.lower()))
    return found


def documented(document: dict[str, Any]) -> set[tuple[str, str]]:
    return {
        (path, method)
        for path, item in document["paths"].items()
        for method in item
        if method in ("get", "post", "patch", "put", "delete")
    }


def test_every_route_served_is_documented_and_no_other(document: dict[str, Any]) -> None:
    assert served_routes() == documented(document)


def test_loads_in_schemathesis_with_every_reference_resolved(document: dict[str, Any]) -> None:
    assert document["openapi"] == "3.1.0"
    schema = schemathesis.openapi.from_dict(document)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == len(documented(document))
    for operation in operations:
        for response in operation.definition.raw["responses"].values():
            for media in response.get("content", {}).values():
                _resolves(document, media["schema"])


def _resolves(document: dict[str, Any], schema: Any) -> None:
    if isinstance(schema, dict):
        ref = schema.get("$ref")
        if ref is not None:
            name = ref.removeprefix("#/components/schemas/")
            assert name in document["components"]["schemas"], ref
        for value in schema.values():
            _resolves(document, value)
    elif isinstance(schema, list):
        for value in schema:
            _resolves(document, value)


def test_admin_operations_need_the_admin_key_and_say_how_they_fail(
    document: dict[str, Any],
) -> None:
    for path, item in document["paths"].items():
        for method, operation in item.items():
            if method == "parameters":
                continue
            statuses = set(operation["responses"])
            if path.startswith("/admin/"):
                assert operation["security"] == [{"adminKey": []}]
                assert {"401", "403", "404", "503"} <= statuses, (path, method)
            if path.startswith("/v1/messages"):  # Anthropic's clients send x-api-key
                assert operation["security"] == [{"anthropicKey": []}, {"tenantKey": []}]
            elif path.startswith("/v1/"):
                assert operation["security"] == [{"tenantKey": []}]
                assert {"401", "503"} <= statuses, (path, method)
            if "requestBody" in operation:
                assert {"400", "413"} <= statuses, (path, method)
    chat = document["paths"]["/v1/chat/completions"]["post"]["responses"]
    assert {"400", "401", "403", "404", "413", "429", "503"} <= set(chat)
    error = document["components"]["schemas"]["ErrorBody"]
    assert error["required"] == ["error"]


def test_admin_bodies_come_from_the_validating_models(document: dict[str, Any]) -> None:
    schemas = document["components"]["schemas"]
    create = schemas["TenantCreate"]
    assert create["additionalProperties"] is False and "keys" not in create["properties"]
    assert create["required"] == ["name"]
    assert schemas["Quotas"]["properties"]["requests_per_minute"]["anyOf"][0]["minimum"] == 1
    assert "key" in schemas["KeyCreated"]["required"]
    assert "key" not in schemas["KeyInfo"]["properties"]
