"""What a hostile client tries, against real gateway processes (issue 37): each test is one
finding of the review, and failed on the code it was found in.

- made-up model names do not become metric labels or log fields, and are capped;
- a flood of random keys does not push the known keys out of the key cache;
- nothing shipped holds a usable key, and weak admin keys stop the gateway at start;
- request line and headers are limited as they arrive, before authentication (431);
- a large body never counts against the header limit;
- connections past the cap, none of them idle, are answered 503, in the API's error JSON;
- JSON nested too deep is a 400 in the API's words, never a 500;
- model servers the gateway starts inherit none of its secrets;
- files the gateway writes are its user's alone;
- the upstream's `x-ratelimit-*` headers do not override the gateway's own.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml

from bench.processes import ROOT, Gateway, free_port, start_gateway
from cache.codec import write_snapshot
from gateway.config_file import load_settings
from gateway.errors import Unauthenticated
from gateway.settings import hash_key
from gateway.tenancy.auth import Authenticator
from gateway.tenancy.keys import GUESSED_DIGESTS, create_key
from gateway.tenancy.state import FileStateStore
from tests.conftest import fake_backend, hash_of
from tests.support.raw_http import read_answer

KEY = "sk-test-abuse-tenant-0123456789abcdef"
ADMIN_KEY = "sk-test-abuse-admin-0123456789abcdef"
ADMIN_ENV = {"GATEWAY_ADMIN_KEY": ADMIN_KEY}
CHAT = {"model": "echo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.fixture(scope="module")
def gateway(fake_upstream: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    work = tmp_path_factory.mktemp("abuse")
    config = {
        "state": {"url": "memory", "path": str(work / "state.json")},
        "backends": [fake_backend(fake_upstream)],
        "cache": {"enabled": False},
        "tenants": [{"name": "alpha", "keys": [{"sha256": hash_of(KEY)}]}],
    }
    gw = start_gateway(config, work, ADMIN_ENV)
    yield gw
    gw.stop()


def chat(gateway: Gateway, body: dict[str, Any] | bytes) -> httpx.Response:
    content = body if isinstance(body, bytes) else orjson.dumps(body)
    headers = {"authorization": f"Bearer {KEY}", "content-type": "application/json"}
    return httpx.post(f"{gateway.base_url}/chat/completions", content=content, headers=headers)


def metrics(gateway: Gateway) -> str:
    # An admin key reads /metrics whether or not it is open to the public.
    headers = {"authorization": f"Bearer {ADMIN_KEY}"}
    return httpx.get(f"{gateway.url}/metrics", headers=headers).text


def error_of(response: httpx.Response) -> dict[str, Any]:
    error: dict[str, Any] = response.json()["error"]
    return error


# ---- 1. structures keyed by client input --------------------------------------------------


def test_made_up_model_names_become_no_label_and_no_log_field(gateway: Gateway) -> None:
    names = [f"made-up-{secrets.token_hex(96)}" for _ in range(30)]
    for name in names:
        answer = chat(gateway, {**CHAT, "model": name})
        assert answer.status_code == 404 and error_of(answer)["code"] == "model_not_found"
    exposed = metrics(gateway)
    assert 'model="unknown"' in exposed
    time.sleep(0.5)  # the access log is written in the background
    log = gateway.server.log()
    for name in names:
        assert name not in exposed and name not in log


def test_model_names_are_capped_in_the_schema(gateway: Gateway) -> None:
    answer = chat(gateway, {**CHAT, "model": "m" * 64 * 1024})
    assert answer.status_code == 400
    error = error_of(answer)
    assert error["param"] == "model" and error["code"] == "string_above_max_length"
    assert "maximum length 256" in error["message"] and "m" * 300 not in error["message"]


async def test_a_flood_of_random_keys_keeps_the_known_keys_cached(tmp_path: Path) -> None:
    store = FileStateStore(tmp_path / "state.json")
    key, record = await create_key(store, "alpha")
    auth = Authenticator(store, {}, cache_ttl_s=3600.0)
    assert (await auth.authenticate(f"Bearer {key}")).tenant == "alpha"
    refused = 0
    for _ in range(110_000):  # more than every bound of the key cache
        try:
            await auth.authenticate(f"Bearer sk-{secrets.token_hex(8)}")
        except Unauthenticated:
            refused += 1
    assert refused == 110_000
    # Revoked in the store: the answer still cached shows that the flood left it there.
    assert await store.revoke_key(record.key_id)
    assert (await auth.authenticate(f"Bearer {key}")).tenant == "alpha"


# ---- 2. default credentials ---------------------------------------------------------------


def _shipped_configs() -> list[Path]:
    return sorted(
        [*(ROOT / "config").glob("*.yaml"), *(ROOT / "infra" / "k8s").rglob("gateway.yaml")]
    )


@pytest.mark.parametrize("path", _shipped_configs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_shipped_configuration_holds_a_key(path: Path) -> None:
    # A digest in a shipped file is a key whose owner is whoever reads the file.
    text = path.read_text()
    assert not re.search(r"^\s*-?\s*sha256:", text, re.M), f"{path.name} declares a key"
    environ = {**os.environ, "GATEWAY_K8S_TOKEN": "t", "REDIS_URL": "redis://r:6379/0"}
    settings = load_settings(path, environ)
    declared = [*settings.admin.keys, *(k for t in settings.tenants for k in t.keys)]
    assert all(k.sha256 not in GUESSED_DIGESTS for k in declared)


def test_the_dev_overlay_ships_no_key() -> None:
    spec = yaml.safe_load((ROOT / "infra/k8s/overlays/dev/kustomization.yaml").read_text())
    for generator in spec.get("secretGenerator", []):
        for literal in generator.get("literals", []):
            name, _, value = literal.partition("=")
            assert "key" not in name or not value, f"{literal} is a usable key"


def _serve(tmp_path: Path, tenants: list[dict[str, Any]], env: dict[str, str]) -> str:
    """The refusal of a gateway that must not start: its exit code 2 and its stderr."""
    config = tmp_path / "weak.yaml"
    backend = {"name": "b", "base_url": "http://127.0.0.1:9/v1", "models": ["m"]}
    state = {"url": "memory", "path": str(tmp_path / "state.json")}
    config.write_text(yaml.safe_dump({"state": state, "backends": [backend], "tenants": tenants}))
    command = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(config)]
    started = subprocess.run(
        [*command, "--port", str(free_port())],
        env={**os.environ, **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert started.returncode == 2, started.stderr
    return started.stderr


@pytest.mark.parametrize(
    ("tenants", "env", "named"),
    [
        ([], {"GATEWAY_ADMIN_KEY": "short-admin-key-123"}, "$GATEWAY_ADMIN_KEY has 19 characters"),
        ([], {"GATEWAY_OPERATOR_KEY": "scraper-key"}, "$GATEWAY_OPERATOR_KEY has 11"),
        ([], {"GATEWAY_ADMIN_KEY": "password"}, "$GATEWAY_ADMIN_KEY is a well-known key"),
        (
            [{"name": "t", "keys": [{"sha256": hash_key("test")}]}],
            {},
            "tenants.0.keys.0.sha256 is the digest of a well-known key",
        ),
    ],
    ids=["short-admin", "short-operator", "guessable-admin", "test-digest"],
)
def test_weak_keys_stop_the_gateway_at_start(
    tmp_path: Path, tenants: list[dict[str, Any]], env: dict[str, str], named: str
) -> None:
    refusal = _serve(tmp_path, tenants, {"GATEWAY_ADMIN_KEY": "", **env})
    assert "refusing to start with weak keys" in refusal and named in refusal


# ---- 8. request limits before authentication ----------------------------------------------


def _exchange(port: int, request: bytes, *, finish: bool = True) -> tuple[bytes, float]:
    """What the gateway answers to `request` sent raw (unfinished: the socket stays open
    for writing), and how long the answer took."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=15) as sock:
        sock.sendall(request)
        if finish:
            sock.shutdown(socket.SHUT_WR)
        answer = b""
        while not answer.endswith(b"}") and (data := sock.recv(65536)):
            answer += data
    return answer, time.monotonic() - started


def _refused_head(answer: bytes) -> None:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431 "), answer[:200]
    error = orjson.loads(body)["error"]
    assert error["type"] == "invalid_request_error"
    assert error["code"] == "request_headers_too_large" and "65536 bytes" in error["message"]


@pytest.mark.parametrize("size", [70 * 1024, 2 * 1024 * 1024], ids=["70KiB", "2MiB"])
def test_oversized_headers_get_431_before_authentication(gateway: Gateway, size: int) -> None:
    header = b"x-padding: " + b"a" * size + b"\r\n"
    request = b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\n" + header + b"\r\n"
    _refused_head(_exchange(gateway.port, request)[0])


def test_many_headers_and_long_urls_count_too(gateway: Gateway) -> None:
    many = b"".join(b"x-h%d: %s\r\n" % (i, b"v" * 100) for i in range(1000))
    _refused_head(_exchange(gateway.port, b"GET /v1/models HTTP/1.1\r\n" + many + b"\r\n")[0])
    url = b"/v1/models?q=" + b"a" * 70 * 1024
    _refused_head(_exchange(gateway.port, b"GET " + url + b" HTTP/1.1\r\nhost: gw\r\n\r\n")[0])


def test_a_header_that_never_ends_is_refused_as_it_arrives(gateway: Gateway) -> None:
    endless = b"GET /v1/models HTTP/1.1\r\nx-endless: " + b"a" * 100 * 1024
    answer, seconds = _exchange(gateway.port, endless, finish=False)
    _refused_head(answer)
    assert seconds < 5  # not the 10 s the headers may take


def test_headers_under_the_limit_reach_authentication(gateway: Gateway) -> None:
    padding = {"x-padding": "a" * 60 * 1024}
    answer = httpx.post(f"{gateway.base_url}/chat/completions", json=CHAT, headers=padding)
    assert answer.status_code == 401


def test_a_large_body_never_counts_against_the_header_limit(gateway: Gateway) -> None:
    # The head first, then a body larger than the header limit in one write (it arrives in
    # reads apart from the head), twice on one connection: both reach the app.
    big = {**CHAT, "model": "echo", "messages": [{"role": "user", "content": "x" * 200_000}]}
    body = orjson.dumps(big)
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\n"
        b"authorization: Bearer %s\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n" % (KEY.encode(), len(body))
    )
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=15) as sock:
        for _ in range(2):
            sock.sendall(head)
            time.sleep(0.2)  # the head is read on its own
            sock.sendall(body)
            status, payload = read_answer(sock)
            assert status == b"HTTP/1.1 200 OK", payload[:300]
            assert orjson.loads(payload)["object"] == "chat.completion"


def test_connections_past_the_cap_get_503(
    fake_upstream: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    work = tmp_path_factory.mktemp("connections")
    config = {
        "state": {"url": "memory", "path": str(work / "state.json")},
        "backends": [fake_backend(fake_upstream)],
        "cache": {"enabled": False},
        "limits": {"max_connections": 3},
    }
    gw = start_gateway(config, work)
    try:
        probe = b"GET /healthz HTTP/1.1\r\nhost: gw\r\n\r\n"
        held = [socket.create_connection(("127.0.0.1", gw.port), timeout=10) for _ in range(3)]
        for sock in held:
            # Busy, each in the middle of its headers: an idle one would give way to the new
            # connection instead (tests/gateway/test_keep_alive.py).
            sock.sendall(probe[:-2])
        time.sleep(0.3)  # the gateway has them all
        with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as extra:
            extra.sendall(probe)
            answer = b""
            while data := extra.recv(65536):  # connection: close ends it
                answer += data
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503 "), answer[:200]
        assert b"content-type: application/json" in head.lower()
        error = orjson.loads(body)["error"]
        assert error["type"] == "service_unavailable" and error["code"] == "too_many_connections"
        held.pop().close()
        time.sleep(0.3)  # the gateway sees the connection go
        assert httpx.get(f"{gw.url}/healthz").status_code == 200
        for sock in held:
            sock.close()
    finally:
        gw.stop()


@pytest.mark.parametrize("depth", [200, 300, 5000])
def test_json_nested_too_deep_is_a_400(gateway: Gateway, depth: int) -> None:
    nested = b'{"a":' * depth + b"1" + b"}" * depth
    body = orjson.dumps(CHAT)[:-1] + b',"metadata":' + nested + b"}"
    answer = chat(gateway, body)
    assert answer.status_code == 400
    error = error_of(answer)
    assert error["type"] == "invalid_request_error" and error["code"] == "json_too_deep"
    assert "128 levels" in error["message"]
    assert "Traceback" not in gateway.server.log()


def test_a_batch_line_nested_too_deep_is_a_400(gateway: Gateway) -> None:
    # Deeper than orjson writes (255), within what it reads (1024): the line is written again.
    nested = b'{"a":' * 300 + b"1" + b"}" * 300
    body = orjson.dumps(CHAT)[:-1] + b',"metadata":' + nested + b"}"
    line = b'{"custom_id":"1","method":"POST","url":"/v1/chat/completions","body":' + body + b"}"
    upload = httpx.post(
        f"{gateway.base_url}/files",
        headers={"authorization": f"Bearer {KEY}"},
        data={"purpose": "batch"},
        files={"file": ("in.jsonl", line + b"\n", "application/jsonl")},
    )
    assert upload.status_code == 400, upload.text
    assert "128 levels" in error_of(upload)["message"]


# ---- 9. secrets stay in the gateway -------------------------------------------------------


@pytest.fixture(scope="module")
def spied(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, Path]]:
    """A gateway that starts tests/security/spy_upstream.py itself, with secrets in its
    environment, and writes its files under a umask that would let others read them."""
    work = tmp_path_factory.mktemp("spied")
    launch = {
        "command": ["{python}", "-m", "tests.security.spy_upstream", "--port", "{port}"],
        "ready_path": "/v1/models",
        "env": {"SPY_GIVEN": "by-launch-env"},
    }
    config = {
        "state": {"url": "memory", "path": str(work / "state" / "state.json")},
        "backends": [
            {"name": "spy", "base_url": "http://127.0.0.1:{port}/v1", "models": ["spy"]}
            | {"launch": launch}
        ],
        "cache": {"enabled": False},
        "tenants": [
            {
                "name": "alpha",
                "keys": [{"sha256": hash_of(KEY)}],
                "quotas": {"requests_per_minute": 100},
            }
        ],
    }
    secrets_env = {"AWS_SECRET_ACCESS_KEY": "not-a-real-aws-value", "AWS_ACCESS_KEY_ID": "AK"}
    umask = os.umask(0o022)
    try:
        gw = start_gateway(config, work, {**ADMIN_ENV, **secrets_env})
    finally:
        os.umask(umask)
    yield gw, work
    gw.stop()


def test_model_servers_inherit_none_of_the_gateways_secrets(
    spied: tuple[Gateway, Path],
) -> None:
    answer = chat(spied[0], {**CHAT, "model": "spy"})
    assert answer.status_code == 200
    names = set(orjson.loads(answer.json()["choices"][0]["message"]["content"]))
    assert {"PATH", "SPY_GIVEN"} <= names
    leaked = {"GATEWAY_ADMIN_KEY", "AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID"} & names
    assert not leaked


def test_the_upstreams_rate_limit_headers_do_not_override_the_gateways(
    spied: tuple[Gateway, Path],
) -> None:
    answer = chat(spied[0], {**CHAT, "model": "spy"})
    assert answer.status_code == 200
    assert answer.headers["x-ratelimit-limit-requests"] == "100"  # the tenant's quota
    assert int(answer.headers["x-ratelimit-remaining-requests"]) < 100


def test_files_the_gateway_writes_are_its_users_alone(spied: tuple[Gateway, Path]) -> None:
    gateway, work = spied
    body = {**CHAT, "model": "spy"}
    line = {"custom_id": "1", "method": "POST", "url": "/v1/chat/completions", "body": body}
    upload = httpx.post(
        f"{gateway.base_url}/files",
        headers={"authorization": f"Bearer {KEY}"},
        data={"purpose": "batch"},
        files={"file": ("in.jsonl", orjson.dumps(line) + b"\n", "application/jsonl")},
    )
    assert upload.status_code == 200, upload.text
    created = gateway.cli("keys", "create", "--tenant", "alpha")  # writes state.json
    assert created.returncode == 0, created.stderr
    written = [p for p in (work / "state").rglob("*") if not p.name.endswith(".lock")]
    assert any(p.name == "state.json" for p in written)
    assert any(p.is_file() and p.parent.name != "state" for p in written)  # the batch file
    for path in written:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode & 0o077 == 0, f"{path.relative_to(work)} is {oct(mode)}"


def test_cache_snapshots_are_their_writers_alone(tmp_path: Path) -> None:
    umask = os.umask(0o022)
    try:
        write_snapshot(tmp_path / "snapshot.bin", 4, [])
    finally:
        os.umask(umask)
    assert stat.S_IMODE((tmp_path / "snapshot.bin").stat().st_mode) == 0o600
