"""The admin API end to end: real gateway processes, real Redis, the official openai client
with a key created through the API, changes seen by a second replica within a second."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis
import schemathesis

from bench.processes import Gateway
from gateway.errors import Unauthenticated
from gateway.settings import AdminSettings
from gateway.tenancy.auth import AdminAuthenticator, AdminDisabled, Authenticator
from gateway.tenancy.keys import admin_key_hashes
from gateway.tenancy.state import FileStateStore
from tests.conftest import GatewayFactory, hash_of, uncached_config

ADMIN_KEY = "sk-test-admin-7f3a9c1e5b0d2f4a6c8e"  # 32 characters at least (weak: refused)
TEAM_KEY = "sk-test-team-2b8d4f6a0c"
CHAT = {"model": "echo", "messages": [{"role": "user", "content": "hello there"}]}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def admin_client(gateway: Gateway) -> httpx.Client:
    """An admin client that checks every answer against the gateway's own /openapi.json."""
    schema = schemathesis.openapi.from_dict(httpx.get(gateway.url + "/openapi.json").json())

    def conforms(response: httpx.Response) -> None:
        response.read()
        operation = schema.find_operation_by_path(response.request.method, response.url.path)
        assert operation is not None, response.url.path
        operation.validate_response(response)

    return httpx.Client(
        base_url=gateway.url,
        headers=bearer(ADMIN_KEY),
        timeout=10,
        event_hooks={"response": [conforms]},
    )


def chat_status(gateway: Gateway, key: str) -> int:
    response = httpx.post(
        gateway.base_url + "/chat/completions", json=CHAT, headers=bearer(key), timeout=10
    )
    return response.status_code


def models_status(gateway: Gateway, key: str) -> int:
    return httpx.get(gateway.base_url + "/models", headers=bearer(key), timeout=10).status_code


def within(seconds: float, since: float, done: Callable[[], bool], what: str) -> None:
    """Polls `done` until true; fails if that takes more than `seconds` from `since`."""
    while not done():
        assert time.monotonic() - since < seconds, f"{what} not seen within {seconds} s"
        time.sleep(0.02)


def error_of(response: httpx.Response) -> dict[str, Any]:
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return dict(error)


def test_tenant_and_key_made_through_the_api_serve_every_replica(
    gateway_factory: GatewayFactory, fake_upstream: str, redis_url: str, redis_prefix: str
) -> None:
    config = uncached_config(
        fake_upstream,
        {"url": redis_url, "prefix": redis_prefix},
        [{"name": "config-team", "keys": [{"env": "TEAM_KEY"}]}],
        admin={"keys": [{"sha256": hash_of(ADMIN_KEY)}]},
    )
    first, second = (gateway_factory(config, {"TEAM_KEY": TEAM_KEY}) for _ in range(2))
    with admin_client(first) as admin:
        key = _lifecycle(admin, first, second)
    # Only hashes are stored; no key reached a log.
    store = redis.Redis.from_url(redis_url)
    stored = store.hgetall(f"{{{redis_prefix}}}:keys")
    store.close()
    assert key.encode() not in b"".join([*stored.keys(), *stored.values()])
    for gateway in (first, second):
        log = gateway.server.log()
        assert key not in log and ADMIN_KEY not in log and TEAM_KEY not in log


def _lifecycle(admin: httpx.Client, first: Gateway, second: Gateway) -> str:

    created = admin.post(
        "/admin/tenants", json={"name": "acme", "quotas": {"tokens_per_day": 10**6}}
    )
    assert created.status_code == 201, created.text
    assert created.json()["source"] == "admin" and created.json()["weight"] == 1.0
    assert admin.post("/admin/tenants", json={"name": "acme"}).status_code == 409
    listed = {t["name"]: t["source"] for t in admin.get("/admin/tenants").json()["data"]}
    assert listed == {"acme": "admin", "config-team": "config"}

    issued = admin.post("/admin/tenants/acme/keys")
    assert issued.status_code == 201, issued.text
    key, key_id = issued.json()["key"], issued.json()["id"]
    assert key.startswith("sk-gw-") and key_id.startswith("key_")
    made_at = time.monotonic()
    within(1.0, made_at, lambda: models_status(second, key) == 200, "new tenant on replica 2")

    with openai.OpenAI(base_url=second.base_url, api_key=key, max_retries=0) as client:
        completion = client.chat.completions.create(
            model="echo", messages=[{"role": "user", "content": "hello there"}]
        )
    assert completion.choices[0].message.content
    assert completion.usage is not None

    usage = admin.get("/admin/tenants/acme/usage").json()
    assert usage["tokens_today"]["used"] == completion.usage.total_tokens
    assert usage["tokens_today"]["remaining"] == 10**6 - completion.usage.total_tokens
    assert usage["in_flight"] == 0 and usage["requests_per_minute"] is None

    _reports_count(admin, "acme")

    patched = admin.patch("/admin/tenants/acme", json={"quotas": {"requests_per_minute": 1}})
    assert patched.status_code == 200, patched.text
    assert patched.json()["quotas"]["tokens_per_day"] == 10**6  # merged, not replaced
    patched_at = time.monotonic()
    within(1.0, patched_at, lambda: chat_status(second, key) == 429, "new quota on replica 2")
    assert chat_status(first, key) == 429  # one bucket, shared through Redis
    with (
        openai.OpenAI(base_url=first.base_url, api_key=key, max_retries=0) as client,
        pytest.raises(openai.RateLimitError),
    ):
        client.chat.completions.create(model="echo", messages=[{"role": "user", "content": "x"}])
    assert admin.get("/admin/tenants/acme/usage").json()["requests_per_minute"]["remaining"] == 0

    # Admin routes refuse tenant keys (403) and missing or unknown keys (401); the admin key
    # is no tenant's key (401 on the OpenAI routes).
    for tenant_key in (key, TEAM_KEY):
        refused = httpx.get(first.url + "/admin/tenants", headers=bearer(tenant_key))
        assert refused.status_code == 403
        assert error_of(refused)["type"] == "permission_error"
    assert httpx.get(first.url + "/admin/tenants").status_code == 401
    assert httpx.get(first.url + "/admin/tenants", headers=bearer("sk-nope")).status_code == 401
    for gateway in (first, second):
        assert chat_status(gateway, ADMIN_KEY) == 401
        assert models_status(gateway, ADMIN_KEY) == 401

    keys = admin.get("/admin/tenants/acme/keys").json()["data"]
    assert [(k["id"], k["source"]) for k in keys] == [(key_id, "stored")]
    assert all("key" not in k for k in keys)
    declared = admin.get("/admin/tenants/config-team/keys").json()["data"]
    assert [k["source"] for k in declared] == ["config"]
    assert admin.delete(f"/admin/keys/{declared[0]['id']}").status_code == 409

    revoked = admin.delete(f"/admin/keys/{key_id}")
    assert revoked.status_code == 200 and revoked.json()["deleted"] is True
    revoked_at = time.monotonic()
    for gateway in (first, second):
        within(1.0, revoked_at, lambda g=gateway: models_status(g, key) == 401, "revocation")
    assert admin.delete(f"/admin/keys/{key_id}").status_code == 404
    return key


def _reports_count(admin: httpx.Client, tenant: str) -> None:
    """The reports, read through the admin API, count the request just served."""
    params = {"since": "10m", "tenant": tenant}
    deadline = time.monotonic() + 5  # events are written in batches, every 0.5 s
    while admin.get("/admin/reports/cache", params=params).json()["totals"]["requests"] < 1:
        assert time.monotonic() < deadline, "the request never reached the cache report"
        time.sleep(0.1)
    assert admin.get("/admin/reports/cold-start").json()["kind"] == "cold_start"
    assert admin.get("/admin/reports/cache", params={"since": "soon"}).status_code == 400
    (backend,) = admin.get("/admin/backends").json()["data"]  # its learned capacity
    (replica,) = backend["replicas"]
    assert replica["mode"] == "adaptive" and replica["source"] == "latency"
    assert backend["limit"] == replica["limit"] >= 1


def test_memory_store_tenants_persist_override_and_delete(
    gateway_factory: GatewayFactory, fake_upstream: str, tmp_path: Path
) -> None:
    state = {"url": "memory", "path": str(tmp_path / "state.json")}
    tenants = [{"name": "config-team", "keys": [{"sha256": hash_of(TEAM_KEY)}]}]
    config = uncached_config(fake_upstream, state, tenants)
    env = {"GATEWAY_ADMIN_KEY": ADMIN_KEY}
    gateway = gateway_factory(config, env)
    served = httpx.get(gateway.url + "/openapi.json")  # no key needed
    assert served.status_code == 200 and "/admin/tenants/{name}" in served.json()["paths"]
    with admin_client(gateway) as admin:
        _refuses_bad_bodies(admin)
        assert (
            admin.post("/admin/tenants", json={"name": "solo", "models": ["echo"]}).status_code
            == 201
        )
        limited = admin.patch("/admin/tenants/solo", json={"quotas": {"max_concurrent": 4}})
        assert limited.json()["quotas"]["max_concurrent"] == 4
        key = admin.post("/admin/tenants/solo/keys").json()["key"]
        assert chat_status(gateway, key) == 200
        usage = admin.get("/admin/tenants/solo/usage").json()  # this process's counters
        assert usage["tokens_today"]["used"] > 0 and usage["in_flight"] == 0
        assert usage["max_concurrent"] == 4 and usage["tokens_today"]["limit"] is None
        # An override of a configured tenant applies at once, and keeps its configured keys.
        narrowed = admin.patch("/admin/tenants/config-team", json={"models": ["nothing-*"]})
        assert narrowed.json()["source"] == "admin"
        assert chat_status(gateway, TEAM_KEY) == 403

    restarted = gateway_factory(config, env)  # same state file: what the API wrote persists
    gateway.stop()
    with admin_client(restarted) as admin:
        assert admin.get("/admin/tenants/solo").json()["models"] == ["echo"]
        assert chat_status(restarted, key) == 200 and chat_status(restarted, TEAM_KEY) == 403
        deleted = admin.delete("/admin/tenants/solo")
        assert deleted.json() == {
            "object": "tenant",
            "name": "solo",
            "deleted": True,
            "keys_revoked": 1,
        }
        assert chat_status(restarted, key) == 401
        # Deleting a configured tenant hides it (its configured keys stop too) until re-created.
        assert admin.delete("/admin/tenants/config-team").status_code == 200
        assert admin.get("/admin/tenants/config-team").status_code == 404
        assert chat_status(restarted, TEAM_KEY) == 401
        assert admin.post("/admin/tenants", json={"name": "config-team"}).status_code == 201
        assert chat_status(restarted, TEAM_KEY) == 200
    assert key not in (tmp_path / "state.json").read_text()


def _refuses_bad_bodies(admin: httpx.Client) -> None:
    bad = [
        ("post", "/admin/tenants", {"name": "x", "weight": 0}, "weight"),
        ("post", "/admin/tenants", {"name": "x", "keys": []}, "keys"),
        ("post", "/admin/tenants", {"name": "a/b"}, "name"),
        ("post", "/admin/tenants", {"name": "x", "priority_header": "yes"}, "priority_header"),
        ("post", "/admin/tenants", {"weight": 2}, "name"),
        ("patch", "/admin/tenants/config-team", {"quotas": {"requests_per_minute": 0}}, None),
        ("patch", "/admin/tenants/config-team", {"name": "renamed"}, "name"),
    ]
    for method, path, body, param in bad:
        response = admin.request(method, path, json=body)
        assert response.status_code == 400, (body, response.text)
        error = error_of(response)
        assert error["type"] == "invalid_request_error"
        assert param is None or error["param"] == param, error
    not_json = admin.post("/admin/tenants", content=b"{nope")
    assert not_json.status_code == 400
    assert admin.patch("/admin/tenants/nobody", json={}).status_code == 404
    assert admin.get("/admin/tenants/nobody/usage").status_code == 404
    method_not_allowed = httpx.put(
        str(admin.base_url) + "/admin/tenants", headers=bearer(ADMIN_KEY)
    )
    assert method_not_allowed.status_code == 405 and "GET" in method_not_allowed.headers["allow"]


async def test_without_an_admin_key_the_admin_api_is_off_not_open(tmp_path: Path) -> None:
    tenants = Authenticator(FileStateStore(tmp_path / "state.json"), {})
    guard = AdminAuthenticator(admin_key_hashes(AdminSettings(), {}), tenants)
    for authorization in (None, "Bearer anything", f"Bearer {ADMIN_KEY}"):
        with pytest.raises(AdminDisabled) as refused:
            await guard.authenticate(authorization)
        assert refused.value.status == 404 and "GATEWAY_ADMIN_KEY" in refused.value.message
    enabled = AdminAuthenticator(
        admin_key_hashes(AdminSettings(), {"GATEWAY_ADMIN_KEY": ADMIN_KEY}), tenants
    )
    await enabled.authenticate(f"Bearer {ADMIN_KEY}")
    with pytest.raises(Unauthenticated):
        await enabled.authenticate("Bearer sk-unknown")
