"""Key lifecycle across two gateway processes sharing a real Redis, driven through the CLI."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import redis

from tests.conftest import GatewayFactory, uncached_config

CHAT = {"model": "echo", "messages": [{"role": "user", "content": "hi"}]}


def _status(url: str, key: str) -> int:
    headers = {"Authorization": f"Bearer {key}"}
    return httpx.post(url + "/chat/completions", json=CHAT, headers=headers, timeout=5).status_code


def test_key_created_used_and_revoked_on_every_replica(
    gateway_factory: GatewayFactory, fake_upstream: str, redis_url: str, redis_prefix: str
) -> None:
    state = {"url": redis_url, "prefix": redis_prefix}
    config = uncached_config(fake_upstream, state, [{"name": "acme"}])
    first, second = gateway_factory(config), gateway_factory(config)

    created = first.cli("keys", "create", "--tenant", "acme")
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip()
    assert key.startswith("sk-gw-") and len(key) > 30
    assert _status(first.base_url, key) == 200
    assert _status(second.base_url, key) == 200

    # Only the hash is stored: the key itself appears nowhere in Redis.
    stored = redis.Redis.from_url(redis_url).hgetall(f"{{{redis_prefix}}}:keys")
    assert len(stored) == 1 and key.encode() not in b"".join([*stored.keys(), *stored.values()])

    listed = first.cli("keys", "list")
    key_id = listed.stdout.splitlines()[1].split()[0]
    assert "acme" in listed.stdout and key not in listed.stdout

    revoked = second.cli("keys", "revoke", key_id)
    assert revoked.returncode == 0, revoked.stderr
    revoked_at = time.monotonic()
    for gateway in (first, second):
        while _status(gateway.base_url, key) != 401:
            assert time.monotonic() - revoked_at < 1.0, "revoked key still accepted after 1 s"
            time.sleep(0.05)
    assert second.cli("keys", "revoke", key_id).returncode == 1
    for gateway in (first, second):
        assert key not in gateway.server.log()


def test_unknown_tenant_is_refused_by_cli(
    gateway_factory: GatewayFactory, fake_upstream: str, tmp_path: Path
) -> None:
    state = {"url": "memory", "path": str(tmp_path / "state.json")}
    config = uncached_config(fake_upstream, state, [{"name": "acme"}])
    gateway = gateway_factory(config)
    result = gateway.cli("keys", "create", "--tenant", "nobody")
    assert result.returncode == 2 and "unknown tenant 'nobody'" in result.stderr


def test_memory_store_keys_persist_and_revoke_while_running(
    gateway_factory: GatewayFactory, fake_upstream: str, tmp_path: Path
) -> None:
    state = {"url": "memory", "path": str(tmp_path / "state.json")}
    config = uncached_config(fake_upstream, state, [{"name": "acme"}])
    gateway = gateway_factory(config)
    key = gateway.cli("keys", "create", "--tenant", "acme").stdout.strip()
    deadline = time.monotonic() + 1.0
    while _status(gateway.base_url, key) != 200:
        assert time.monotonic() < deadline, "a key created by the CLI is not seen by the gateway"
        time.sleep(0.05)
    gateway.stop()
    restarted = gateway_factory(config)
    assert _status(restarted.base_url, key) == 200
    key_id = restarted.cli("keys", "list").stdout.splitlines()[1].split()[0]
    assert restarted.cli("keys", "revoke", key_id).returncode == 0
    deadline = time.monotonic() + 1.0
    while _status(restarted.base_url, key) != 401:
        assert time.monotonic() < deadline, "revoked key still accepted after 1 s"
        time.sleep(0.05)
    assert key not in (tmp_path / "state.json").read_text()


def test_redis_down_unknown_key_gets_503_not_401(
    gateway_factory: GatewayFactory, fake_upstream: str
) -> None:
    from bench.processes import free_port

    dead = f"redis://127.0.0.1:{free_port()}"
    config = uncached_config(fake_upstream, {"url": dead}, [{"name": "acme"}])
    gateway = gateway_factory(config)
    response = httpx.post(
        gateway.base_url + "/chat/completions",
        json=CHAT,
        headers={"Authorization": "Bearer sk-gw-whatever"},
        timeout=10,
    )
    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"
    assert response.json()["error"]["code"] == "state_store_unavailable"
    assert httpx.get(gateway.url + "/readyz").status_code == 503
