"""Removing one bad cache entry, not a namespace: a hit names its entry (`x-cache-key`); the
tenant that got it reports it (`POST /v1/cache/feedback`), or an admin deletes it
(`DELETE /admin/cache/entries/{id}`), and no replica serves it again. Another scope's id
reads as unknown. Two gateway replicas on real Redis, real MiniLM."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.processes import OPERATOR, Gateway
from tests.admin.test_admin_cache import ADMIN_KEY, KEYS, cache_state, config, stored
from tests.conftest import GatewayFactory


def ask(gateway: Gateway, tenant: str, prompt: str) -> httpx.Response:
    body = {"model": "echo", "messages": [{"role": "user", "content": prompt}]}
    headers = {"Authorization": f"Bearer {KEYS[tenant]}"}
    response = httpx.post(gateway.base_url + "/chat/completions", json=body, headers=headers)
    assert response.status_code == 200, response.text
    return response


def hit_key(gateway: Gateway, tenant: str, prompt: str) -> str:
    response = ask(gateway, tenant, prompt)
    assert response.headers["x-cache"] == "hit"
    return response.headers["x-cache-key"]


def feedback(gateway: Gateway, tenant: str | None, body: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {KEYS[tenant]}"} if tenant else {}
    content = body if isinstance(body, bytes) else None
    json = None if isinstance(body, bytes) else body
    return httpx.post(
        gateway.base_url + "/cache/feedback", headers=headers, content=content, json=json
    )


def admin_delete(gateway: Gateway, entry_id: str, key: str = ADMIN_KEY) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"}
    return httpx.delete(f"{gateway.url}/admin/cache/entries/{entry_id}", headers=headers)


def error_code(response: httpx.Response) -> str:
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return str(error["code"])


@pytest.fixture
def replicas(
    gateway_factory: GatewayFactory,
    fake_upstream: str,
    redis_url: str,
    redis_prefix: str,
    tmp_path: Path,
) -> tuple[Gateway, Gateway]:
    settings = config(fake_upstream, {"url": redis_url, "prefix": redis_prefix}, tmp_path / "c")
    return gateway_factory(settings, timeout_s=120), gateway_factory(settings, timeout_s=120)


def test_a_reported_hit_is_gone_from_every_replica_and_only_its_scope_may_report_it(
    replicas: tuple[Gateway, Gateway],
) -> None:
    first, second = replicas
    prompt = "What is the capital of Canada?"
    stored(first, "a", prompt)
    key = hit_key(second, "a", prompt)
    assert len(key) == 32 and prompt not in key

    other = feedback(second, "b", {"id": key})  # another tenant's entry: unknown
    assert other.status_code == 404 and error_code(other) == "cache_entry_not_found"
    assert cache_state(first, "a", prompt) == "hit"

    done = feedback(second, "a", {"id": key})
    assert done.status_code == 200, done.text
    assert done.json() == {"object": "cache.feedback", "id": key, "deleted": True}
    assert cache_state(first, "a", prompt) == "miss"  # the other replica dropped it too
    assert feedback(first, "a", {"id": key}).status_code == 404  # gone

    assert feedback(first, None, {"id": key}).status_code == 401
    assert feedback(first, "a", b"{not json").status_code == 400
    assert feedback(first, "a", {"entry": key}).status_code == 400
    assert feedback(first, "a", {"id": "../../etc"}).status_code == 404
    metrics = httpx.get(second.url + "/metrics", headers=OPERATOR).text
    assert 'gateway_cache_deleted_entries_total{cause="bad_hit",tenant="a"} 1.0' in metrics


def test_a_cache_group_member_reports_a_shared_entry_and_admins_delete_any(
    replicas: tuple[Gateway, Gateway],
) -> None:
    first, second = replicas
    shared, own = "How many legs does a spider have?", "How many legs does an ant have?"
    stored(first, "g1", shared)
    key = hit_key(second, "g2", shared)  # g1's entry, served to the group
    assert feedback(second, "g2", {"id": key}).status_code == 200
    assert cache_state(first, "g1", shared) == "miss"

    stored(first, "b", own)
    entry_id = hit_key(second, "b", own)
    assert admin_delete(first, entry_id, key=KEYS["b"]).status_code == 403  # a tenant key
    deleted = admin_delete(first, entry_id)
    assert deleted.status_code == 200, deleted.text
    assert deleted.json() == {
        "object": "cache.entry.deleted",
        "id": entry_id,
        "tenant": "b",
        "model": "echo",
        "deleted": True,
    }
    assert cache_state(second, "b", own) == "miss"
    missing = admin_delete(first, entry_id)
    assert missing.status_code == 404 and error_code(missing) == "cache_entry_not_found"
    metrics = httpx.get(first.url + "/metrics", headers=OPERATOR).text
    assert 'gateway_cache_deleted_entries_total{cause="admin",tenant="b"} 1.0' in metrics
    assert reported_bad_hits(second) == {"g2": 1}


def reported_bad_hits(gateway: Gateway) -> dict[str, int]:
    """The cache report's bad-hit reports by tenant, once the events reach it."""
    deadline = time.monotonic() + 10
    while True:
        response = httpx.get(
            gateway.url + "/admin/reports/cache",
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
            params={"since": "1h"},
        )
        report = response.json()
        if report["totals"]["reported_bad_hits"] or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    rows = report["by_tenant_model"]
    return {r["tenant"]: r["reported_bad_hits"] for r in rows if r["reported_bad_hits"]}
