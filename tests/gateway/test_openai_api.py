"""The OpenAI API surface through a real gateway process, driven by the official client."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from bench.processes import OPERATOR, Gateway, start_gateway
from tests.conftest import fake_backend, hash_of

ALPHA_KEY = "sk-test-alpha-0123456789abcdef"
BETA_KEY = "sk-test-beta-0123456789abcdef"


@pytest.fixture(scope="module")
def gateway(fake_upstream: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    work = tmp_path_factory.mktemp("gw")
    config = {
        "state": {"url": "memory", "path": str(work / "state.json")},
        "limits": {"max_body_bytes": 64 * 1024},
        "backends": [fake_backend(fake_upstream, timeouts={"read_s": 1.0})],
        "cache": {"enabled": False},
        "tenants": [
            {"name": "alpha", "keys": [{"sha256": hash_of(ALPHA_KEY)}]},
            {"name": "beta", "models": ["echo"], "keys": [{"sha256": hash_of(BETA_KEY)}]},
        ],
    }
    gw = start_gateway(config, work)
    yield gw
    gw.stop()


@pytest.fixture
def client(gateway: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.base_url, api_key=ALPHA_KEY, max_retries=0)


def test_chat_completion(client: openai.OpenAI) -> None:
    answer = client.chat.completions.create(
        model="echo",
        messages=[
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hello there"},
        ],
    )
    assert answer.choices[0].message.content == "echo: hello there"
    assert answer.usage is not None and answer.usage.completion_tokens == 3
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + 3


def test_chat_stream_is_relayed_chunk_by_chunk_in_order(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="echo",
        messages=[{"role": "user", "content": "one two three four"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    texts = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert texts == ["echo:", " one", " two", " three", " four"]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5


def test_completions_plain_and_streamed(client: openai.OpenAI) -> None:
    answer = client.completions.create(model="echo", prompt="say cheese")
    assert answer.choices[0].text == "echo: say cheese"
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(model="echo", prompt="say cheese", stream=True)
    )
    assert streamed == "echo: say cheese"


def test_embeddings(client: openai.OpenAI) -> None:
    result = client.embeddings.create(model="echo", input=["a", "b"])
    assert [len(d.embedding) for d in result.data] == [8, 8]
    assert result.data[0].embedding != result.data[1].embedding


def test_models_lists_only_what_the_tenant_may_use(gateway: Gateway) -> None:
    alpha = openai.OpenAI(base_url=gateway.base_url, api_key=ALPHA_KEY)
    beta = openai.OpenAI(base_url=gateway.base_url, api_key=BETA_KEY)
    assert {m.id for m in alpha.models.list()} >= {"echo", "slow", "die-midstream"}
    assert [m.id for m in beta.models.list()] == ["echo"]


def test_request_id_header_and_client_key_not_forwarded(
    gateway: Gateway, fake_upstream: str
) -> None:
    response = httpx.post(
        f"{gateway.base_url}/chat/completions",
        headers={"Authorization": f"Bearer {ALPHA_KEY}", "Cookie": "a=b"},
        json={"model": "echo", "messages": [{"role": "user", "content": "x"}]},
    )
    assert response.status_code == 200
    assert response.headers["x-request-id"].startswith("req_")
    seen = httpx.get(fake_upstream.removesuffix("/v1") + "/_last").json()
    assert seen["authorization"] == "Bearer upstream-secret-xyz"
    assert "cookie" not in seen
    assert seen["x-request-id"] == response.headers["x-request-id"]


def _error(response: httpx.Response, status: int) -> dict[str, object]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert response.headers["x-request-id"]
    return dict(error)


def _post(gateway: Gateway, path: str, key: str | None = ALPHA_KEY, **kw: object) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(gateway.base_url + path, headers=headers, timeout=10, **kw)  # type: ignore[arg-type]


CHAT = {"model": "echo", "messages": [{"role": "user", "content": "hi"}]}


def test_401_missing_and_unknown_key(gateway: Gateway) -> None:
    assert (
        _error(_post(gateway, "/chat/completions", None, json=CHAT), 401)["type"]
        == "authentication_error"
    )
    assert (
        _error(_post(gateway, "/chat/completions", "sk-wrong", json=CHAT), 401)["code"]
        == "invalid_api_key"
    )
    raw = httpx.post(
        gateway.base_url + "/chat/completions", json=CHAT, headers={"Authorization": "Basic abc"}
    )
    _error(raw, 401)


def test_400_bad_bodies(gateway: Gateway) -> None:
    assert "JSON" in str(
        _error(_post(gateway, "/chat/completions", content=b"{not json"), 400)["message"]
    )
    assert (
        _error(_post(gateway, "/chat/completions", json={"model": "echo"}), 400)["param"]
        == "messages"
    )
    assert (
        _error(_post(gateway, "/chat/completions", json={"model": "echo", "messages": []}), 400)[
            "param"
        ]
        == "messages"
    )
    assert (
        _error(_post(gateway, "/embeddings", json={"model": 5, "input": "x"}), 400)["param"]
        == "model"
    )
    _error(_post(gateway, "/completions", json=[1, 2]), 400)
    _error(_post(gateway, "/completions", content=b""), 400)
    invalid_utf8 = b'{"model": "echo", "prompt": "\xff\xfe"}'
    _error(_post(gateway, "/completions", content=invalid_utf8), 400)


def test_403_404_413(gateway: Gateway) -> None:
    beta = _post(gateway, "/chat/completions", BETA_KEY, json={**CHAT, "model": "slow"})
    assert _error(beta, 403)["type"] == "permission_error"
    assert (
        _error(_post(gateway, "/chat/completions", json={**CHAT, "model": "gpt-9"}), 404)["code"]
        == "model_not_found"
    )
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * 70_000}]}
    assert _error(_post(gateway, "/chat/completions", json=big), 413)["code"] == "request_too_large"
    assert _error(httpx.get(gateway.base_url + "/nothing-here"), 404)["code"] == "unknown_url"
    assert (
        _error(httpx.get(gateway.base_url + "/chat/completions"), 405)["code"]
        == "method_not_allowed"
    )


def test_413_without_content_length(gateway: Gateway) -> None:
    def body() -> Iterator[bytes]:
        yield b'{"model": "echo", "prompt": "'
        for _ in range(100):
            yield b"y" * 1024
        yield b'"}'

    _error(_post(gateway, "/completions", content=body()), 413)


def test_502_504_and_upstream_statuses(gateway: Gateway) -> None:
    assert (
        _error(_post(gateway, "/chat/completions", json={**CHAT, "model": "error-500"}), 502)[
            "type"
        ]
        == "upstream_error"
    )
    slow = {**CHAT, "model": "slow", "x_delay": 3}
    assert _error(_post(gateway, "/chat/completions", json=slow), 504)["type"] == "timeout_error"
    busy = _post(gateway, "/chat/completions", json={**CHAT, "model": "busy-429"})
    # An upstream's own 4xx answer is relayed as it is, with its Retry-After.
    assert busy.status_code == 429
    assert busy.json()["error"]["type"] == "rate_limit_error"
    assert busy.headers["retry-after"] == "7"


def test_openai_client_raises_typed_errors(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.InternalServerError) as caught:
        client.chat.completions.create(
            model="error-500", messages=[{"role": "user", "content": "x"}]
        )
    assert caught.value.status_code == 502


def test_stream_broken_mid_way_ends_with_error_event(
    client: openai.OpenAI, gateway: Gateway
) -> None:
    stream = client.chat.completions.create(
        model="die-midstream", messages=[{"role": "user", "content": "a b c d"}], stream=True
    )
    received = []
    with pytest.raises(openai.APIError) as caught:
        for chunk in stream:
            received.append(chunk.choices[0].delta.content)
    assert received == ["echo:", " a"]
    assert "die-midstream" not in str(caught.value) or "upstream" in str(caught.value)
    assert "upstream" in str(caught.value)
    # The gateway is still healthy and serving.
    assert httpx.get(gateway.url + "/healthz").status_code == 200
    assert client.chat.completions.create(
        model="echo", messages=[{"role": "user", "content": "ok"}]
    )


def test_stream_without_done_is_reported(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="no-done", messages=[{"role": "user", "content": "a"}], stream=True
    )
    with pytest.raises(openai.APIError, match="before \\[DONE\\]"):
        list(stream)


def test_client_disconnect_cancels_upstream_stream(gateway: Gateway, fake_upstream: str) -> None:
    stats_url = fake_upstream.removesuffix("/v1") + "/_stats"
    before = httpx.get(stats_url).json()["abandoned_streams"]
    body = {
        "model": "hang-midstream",
        "stream": True,
        "messages": [{"role": "user", "content": "a b c"}],
    }
    with httpx.stream(
        "POST",
        gateway.base_url + "/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {ALPHA_KEY}"},
    ) as response:
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")
    # The client has gone; the upstream request must be cancelled, not left hanging.
    import time

    deadline = time.monotonic() + 5
    while httpx.get(stats_url).json()["abandoned_streams"] == before:
        assert time.monotonic() < deadline, "upstream stream was not cancelled"
        time.sleep(0.05)


def test_metrics_health_and_readiness(gateway: Gateway) -> None:
    _post(gateway, "/chat/completions", json=CHAT)
    text = httpx.get(gateway.url + "/metrics", headers=OPERATOR).text
    assert 'gateway_requests_total{model="echo",status="200",tenant="alpha"}' in text
    assert "gateway_request_duration_seconds_bucket" in text
    assert "gateway_upstream_duration_seconds_bucket" in text
    assert "gateway_requests_in_flight" in text
    assert 'gateway_upstream_errors_total{backend="fake"' in text
    assert httpx.get(gateway.url + "/healthz").json() == {"status": "ok"}
    ready = httpx.get(gateway.url + "/readyz", headers=OPERATOR)
    assert ready.status_code == 200 and ready.json()["backends"] == {"fake": True}


def test_access_log_is_json_and_has_no_secrets(gateway: Gateway) -> None:
    import json
    import time

    _post(gateway, "/chat/completions", json=CHAT)
    last = _post(gateway, "/chat/completions", "sk-leaked-candidate-999", json=CHAT)
    deadline = time.monotonic() + 2
    while last.headers["x-request-id"] not in gateway.server.log():
        assert time.monotonic() < deadline, "access line not written within 2 s"
        time.sleep(0.02)
    lines = [json.loads(line) for line in gateway.server.log().splitlines() if line.startswith("{")]
    access = [line for line in lines if "request_id" in line]
    assert any(
        line["tenant"] == "alpha" and line["model"] == "echo" and line["status"] == 200
        for line in access
    )
    assert any(line["status"] == 401 and line["tenant"] is None for line in access)
    assert all({"request_id", "status", "latency_ms", "path"} <= set(line) for line in access)
    log = gateway.server.log()
    for secret in (ALPHA_KEY, BETA_KEY, "sk-leaked-candidate-999", "upstream-secret-xyz"):
        assert secret not in log
