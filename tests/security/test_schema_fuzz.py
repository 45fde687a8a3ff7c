"""Schemathesis against the gateway's own `/openapi.json`, served by a real gateway process:
generated requests to every OpenAI and admin route, with no key, a tenant key and the admin
key. No answer may be a 5xx the schema does not document (the fake upstream is healthy, so
none is expected at all), and every answer must match the documented status codes, content
types, headers and body schemas."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from bench.processes import Gateway, start_fake_upstream, start_gateway
from tests.conftest import fake_backend, hash_of

TENANT_KEY = "sk-test-fuzz-tenant-0123456789"
ADMIN_KEY = "sk-test-fuzz-admin-0123456789"
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
IDENTITIES = {"no-key": None, "tenant-key": TENANT_KEY, "admin-key": ADMIN_KEY}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    work = tmp_path_factory.mktemp("fuzz")
    upstream, base_url = start_fake_upstream(work)
    config = {
        "state": {"url": "memory", "path": str(work / "state.json")},
        # The cache is exercised elsewhere; here it would only slow every generated request.
        "cache": {"enabled": False},
        "admin": {"keys": [{"sha256": hash_of(ADMIN_KEY)}]},
        "backends": [fake_backend(base_url)],
        "tenants": [{"name": "fuzz", "keys": [{"sha256": hash_of(TENANT_KEY)}]}],
    }
    gw = start_gateway(config, work)
    yield gw
    gw.stop()
    upstream.stop()


@pytest.fixture(scope="module")
def schema(gateway: Gateway) -> Any:
    document = httpx.get(gateway.url + "/openapi.json").json()
    return schemathesis.openapi.from_dict(document)


@pytest.mark.parametrize("identity", list(IDENTITIES))
def test_every_answer_matches_the_schema(gateway: Gateway, schema: Any, identity: str) -> None:
    key = IDENTITIES[identity]
    headers = {"authorization": f"Bearer {key}"} if key else {}
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 16
    statuses: set[int] = set()
    for operation in operations:
        fuzz(operation, gateway.url, headers, statuses)
    if key is None:
        assert 401 in statuses
    else:
        assert statuses & {200, 201}, statuses


def fuzz(operation: Any, base_url: str, headers: dict[str, str], statuses: set[int]) -> None:
    @settings(
        max_examples=20, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(case=operation.as_strategy())
    def run(case: Any) -> None:
        # The generated case may carry its own Authorization; the identity wins.
        response = case.call(base_url=base_url, headers=headers, timeout=30)
        statuses.add(response.status_code)
        case.validate_response(response, checks=CHECKS, headers=headers)

    run()
