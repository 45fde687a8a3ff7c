"""A deleted tenant leaves nothing to the next tenant of its name (issue 37, item 3).

The scenario of the security review, against real gateway processes (the embedded state
store, and Redis): tenant `acme` is created through the admin API, uploads a batch file,
fills the cache and its per-minute quota; the admin API deletes it and creates `acme`
again with a new key. The new tenant must see none of it: no file (listed, read or
downloaded), no cache hit, no spent quota; and a job the old tenant left running must not
run as the new one.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.processes import OPERATOR_KEY, Gateway
from tests.conftest import GatewayFactory, fake_backend, hash_of

ADMIN_KEY = "sk-test-isolation-admin-0123456789abcdef"
CHAT = {
    "model": "echo",
    "messages": [{"role": "user", "content": "What did the last acme ask?"}],
    "temperature": 0,
}
LINE = (
    b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", '
    b'"body": {"model": "echo", "messages": [{"role": "user", "content": "secret plans"}]}}\n'
)


def admin(gateway: Gateway) -> httpx.Client:
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    return httpx.Client(base_url=gateway.url, headers=headers, timeout=10)


def tenant(client: httpx.Client) -> httpx.Client:
    """Creates `acme` (one request a minute) and a key; a client with that key."""
    quotas = {"requests_per_minute": 1}
    created = client.post("/admin/tenants", json={"name": "acme", "quotas": quotas})
    assert created.status_code == 201, created.text
    key = client.post("/admin/tenants/acme/keys").json()["key"]
    headers = {"Authorization": f"Bearer {key}"}
    return httpx.Client(base_url=str(client.base_url) + "/v1", headers=headers, timeout=10)


def start(factory: GatewayFactory, upstream: str, tmp: Path, state: dict[str, Any]) -> Gateway:
    config = {
        "state": state,
        "backends": [fake_backend(upstream)],
        # The exact tiers only: whether a repeat is a hit needs no embedding model.
        "cache": {"enabled": True, "semantic": False, "path": str(tmp / "cache")},
        "admin": {"keys": [{"sha256": hash_of(ADMIN_KEY)}]},
        "batches": {"poll_s": 0.2},
    }
    return factory(config)


@pytest.fixture(params=["memory", "redis"])
def gateway(
    request: pytest.FixtureRequest,
    gateway_factory: GatewayFactory,
    fake_upstream: str,
    tmp_path: Path,
    redis_url: str,
    redis_prefix: str,
) -> Gateway:
    if request.param == "memory":
        state = {"url": "memory", "path": str(tmp_path / "state.json")}
    else:
        state = {"url": redis_url, "prefix": redis_prefix}
    return start(gateway_factory, fake_upstream, tmp_path, state)


def test_a_tenant_created_again_under_a_deleted_ones_name_starts_empty(gateway: Gateway) -> None:
    with admin(gateway) as operator:
        with tenant(operator) as old:
            upload = old.post(
                "/files",
                files={"file": ("plans.jsonl", io.BytesIO(LINE))},
                data={"purpose": "batch"},
            )
            assert upload.status_code == 200, upload.text
            file_id = upload.json()["id"]
            first = old.post("/chat/completions", json=CHAT)
            assert (first.status_code, first.headers["x-cache"]) == (200, "miss")
            assert old.post("/chat/completions", json=CHAT).status_code == 429  # quota spent
        deleted = operator.delete("/admin/tenants/acme")
        assert deleted.status_code == 200 and deleted.json()["keys_revoked"] == 1

        with tenant(operator) as new:
            assert new.get("/files").json()["data"] == []
            assert new.get(f"/files/{file_id}").status_code == 404
            assert new.get(f"/files/{file_id}/content").status_code == 404
            answer = new.post("/chat/completions", json=CHAT)
            # Neither the old tenant's spent quota (429) nor its cached answer (a hit).
            assert answer.status_code == 200, answer.text
            assert answer.headers["x-cache"] == "miss"


def test_a_deleted_tenants_jobs_are_not_the_new_ones(gateway: Gateway) -> None:
    with admin(gateway) as operator:
        operator.post("/admin/tenants", json={"name": "acme"})
        key = operator.post("/admin/tenants/acme/keys").json()["key"]
        old = httpx.Client(
            base_url=gateway.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=10
        )
        upload = old.post(
            "/files", files={"file": ("a.jsonl", io.BytesIO(LINE))}, data={"purpose": "batch"}
        )
        job = old.post(
            "/batches",
            json={
                "input_file_id": upload.json()["id"],
                "endpoint": "/v1/chat/completions",
                "completion_window": "24h",
            },
        ).json()
        operator.delete("/admin/tenants/acme")
        with tenant(operator) as new:
            assert new.get(f"/batches/{job['id']}").status_code == 404
            assert new.get("/batches").json()["data"] == []
            assert new.get("/files").json()["data"] == []
        old.close()


def test_metrics_and_readiness_details_need_an_operator_key(gateway: Gateway) -> None:
    """/metrics names every tenant with its traffic and /readyz the replicas' URLs: not
    for the public port. Plain /readyz still answers probes, with its status alone."""
    with admin(gateway) as operator, tenant(operator) as acme:
        assert acme.post("/chat/completions", json=CHAT).status_code == 200
        tenant_key = acme.headers["Authorization"]
    for headers in ({}, {"Authorization": tenant_key}, {"Authorization": "Bearer nope"}):
        scraped = httpx.get(gateway.url + "/metrics", headers=headers)
        assert scraped.status_code == 401 and "acme" not in scraped.text
        assert scraped.json()["error"]["code"] == "operator_key_required"
        ready = httpx.get(gateway.url + "/readyz", headers=headers)
        assert (ready.status_code, ready.json()) == (200, {"status": "ready"})
    for key in (OPERATOR_KEY, ADMIN_KEY):
        headers = {"Authorization": f"Bearer {key}"}
        assert 'tenant="acme"' in httpx.get(gateway.url + "/metrics", headers=headers).text
        details = httpx.get(gateway.url + "/readyz", headers=headers).json()
        # The details themselves (whether the probe of the upstream answered in time is
        # another test's business: beside a second test process it once did not).
        assert set(details) >= {"status", "backends"} and set(details["backends"]) == {"fake"}
