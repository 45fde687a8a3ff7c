"""What a client sends in headers cannot steer the gateway: no header picks the upstream or
the tenant, hop-by-hop and credential headers are not forwarded either way, and the
upstream's own credential replaces whatever the client sent."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bench.processes import Gateway, ServerProcess, start_fake_upstream, start_gateway
from tests.conftest import fake_backend, hash_of

KEY = "sk-test-headers-a-0123456789"
OTHER_KEY = "sk-test-headers-b-0123456789"
HOP_BY_HOP = {
    "connection": "keep-alive, x-secret-hop",
    "keep-alive": "timeout=5",
    "proxy-authorization": "Basic c2VjcmV0OnNlY3JldA==",
    "proxy-connection": "keep-alive",
    "te": "trailers",
    "trailer": "x-checksum",
    "upgrade": "h2c",
    "x-secret-hop": "must-not-pass",
}
STEERING = {
    "x-forwarded-host": "{other}",
    "x-forwarded-for": "10.0.0.1",
    "forwarded": "for=10.0.0.1;host={other}",
    "x-upstream-url": "http://{other}/v1",
    "x-backend": "other",
    "x-tenant": "b",
    "x-api-key": OTHER_KEY,
    "openai-organization": "org-b",
}


@pytest.fixture(scope="module")
def upstreams(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    first, first_url = start_fake_upstream(tmp_path_factory.mktemp("up-a"))
    second, second_url = start_fake_upstream(tmp_path_factory.mktemp("up-b"))
    servers: list[ServerProcess] = [first, second]
    yield first_url, second_url
    for server in servers:
        server.stop()


@pytest.fixture(scope="module")
def gateway(
    upstreams: tuple[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    work: Path = tmp_path_factory.mktemp("headers-gw")
    config = {
        "state": {"url": "memory", "path": str(work / "state.json")},
        "cache": {"enabled": False},
        "backends": [fake_backend(upstreams[0])],
        "tenants": [
            {"name": "a", "keys": [{"sha256": hash_of(KEY)}], "models": ["echo"]},
            {"name": "b", "keys": [{"sha256": hash_of(OTHER_KEY)}]},
        ],
    }
    gw = start_gateway(config, work)
    yield gw
    gw.stop()


def control(base_url: str, path: str) -> dict[str, object]:
    answer: dict[str, object] = httpx.get(base_url.removesuffix("/v1") + path).json()
    return answer


def test_no_header_chooses_the_upstream_or_the_tenant(
    gateway: Gateway, upstreams: tuple[str, str]
) -> None:
    second = upstreams[1]
    other = second.removeprefix("http://").removesuffix("/v1")
    headers = {name: value.format(other=other) for name, value in STEERING.items()}
    before = [control(url, "/_stats")["requests"] for url in upstreams]
    answer = httpx.post(
        gateway.base_url + "/chat/completions",
        json={"model": "echo", "messages": [{"role": "user", "content": "hi"}]},
        headers={"authorization": f"Bearer {KEY}", "host": other, **headers},
    )
    assert answer.status_code == 200, answer.text
    after = [control(url, "/_stats")["requests"] for url in upstreams]
    assert after == [before[0] + 1, before[1]]  # type: ignore[operator]
    # Tenant b may use every model and tenant a only `echo`: still tenant a, whatever it says.
    refused = httpx.post(
        gateway.base_url + "/chat/completions",
        json={"model": "slow", "messages": [{"role": "user", "content": "hi"}]},
        headers={"authorization": f"Bearer {KEY}", **headers},
    )
    assert refused.status_code == 403, refused.text


def test_hop_by_hop_and_client_credentials_are_not_forwarded(
    gateway: Gateway, upstreams: tuple[str, str]
) -> None:
    answer = httpx.post(
        gateway.base_url + "/chat/completions",
        json={"model": "echo", "messages": [{"role": "user", "content": "hello"}]},
        headers={"authorization": f"Bearer {KEY}", **HOP_BY_HOP, **STEERING},
    )
    assert answer.status_code == 200, answer.text
    seen = {k.lower(): str(v) for k, v in control(upstreams[0], "/_last").items()}
    for name in [*HOP_BY_HOP, *STEERING]:
        if name == "connection":
            assert "x-secret-hop" not in seen.get(name, "")
        else:
            assert name not in seen, (name, seen[name])
    # The upstream sees its own credential, never the tenant's key.
    assert seen["authorization"] == "Bearer upstream-secret-xyz"
    assert KEY not in str(seen)


def test_upstream_credentials_and_hop_headers_never_reach_the_client(gateway: Gateway) -> None:
    answer = httpx.post(
        gateway.base_url + "/chat/completions",
        json={"model": "echo", "messages": [{"role": "user", "content": "hello"}]},
        headers={"authorization": f"Bearer {KEY}"},
    )
    assert answer.status_code == 200
    assert "upstream-secret-xyz" not in answer.text + str(answer.headers)
    assert not {"server", "keep-alive", "proxy-authenticate", "trailer"} & set(answer.headers)
