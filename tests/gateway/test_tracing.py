"""OpenTelemetry traces from a real gateway process to an OTLP/HTTP receiver started here:
one span per request in the GenAI conventions, continuing the client's trace, with children
for the cache lookup, the queue and the upstream attempt, whose `traceparent` reaches the
upstream (gateway/tracing.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from bench.processes import Gateway, free_port, start_gateway
from gateway.tracing import TracingConfigError, TracingOptions, open_tracing
from tests.conftest import fake_backend, hash_of

KEY = "sk-test-tracing-0123456789abcdef"
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


class Receiver:
    """An OTLP/HTTP traces endpoint: the spans it received, by name."""

    def __init__(self) -> None:
        self.spans: list[Any] = []
        self.content_types: set[str] = set()
        received = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                received.content_types.add(self.headers["content-type"])
                request = ExportTraceServiceRequest.FromString(body)
                for resource in request.resource_spans:
                    for scope in resource.scope_spans:
                        received.spans.extend(scope.spans)
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.port = free_port()
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def named(self, name: str, timeout_s: float = 10.0) -> list[Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = [s for s in self.spans if s.name == name]
            if found:
                return found
            time.sleep(0.05)
        raise AssertionError(f"no span {name!r}; got {[s.name for s in self.spans]}")


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    made = Receiver()
    yield made
    made.server.shutdown()
    made.server.server_close()


@pytest.fixture(scope="module")
def gateway(
    fake_upstream: str, receiver: Receiver, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    work = tmp_path_factory.mktemp("gw")
    config = {
        "state": {"url": "memory", "path": str(work / "state.json")},
        "backends": [fake_backend(fake_upstream)],
        "cache": {"enabled": True, "lookup_budget_ms": 3000, "path": str(work / "cache")},
        "tenants": [{"name": "traced", "keys": [{"sha256": hash_of(KEY)}]}],
    }
    env = {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.port}",
        "OTEL_BSP_SCHEDULE_DELAY": "100",  # ms: export soon after a span ends
        "OTEL_SERVICE_NAME": "gateway-under-test",
    }
    gw = start_gateway(config, work, env, timeout_s=120)
    yield gw
    gw.stop()


def attributes(span: Any) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for item in span.attributes:
        value = item.value
        found[item.key] = value.string_value or value.int_value or value.bool_value
    return found


def test_a_request_is_one_genai_span_with_its_steps_as_children(
    gateway: Gateway, receiver: Receiver, fake_upstream: str
) -> None:
    answer = httpx.post(
        f"{gateway.base_url}/chat/completions",
        json={"model": "echo", "messages": [{"role": "user", "content": "trace me"}]},
        headers={
            "authorization": f"Bearer {KEY}",
            "traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01",
        },
    )
    assert answer.status_code == 200
    (root,) = receiver.named("chat echo")
    assert root.trace_id.hex() == CLIENT_TRACE and root.parent_span_id.hex() == CLIENT_SPAN
    assert root.kind == root.SPAN_KIND_SERVER
    seen = attributes(root)
    assert seen["gen_ai.operation.name"] == "chat" and seen["gen_ai.request.model"] == "echo"
    assert seen["gen_ai.usage.output_tokens"] == 3 and seen["gen_ai.usage.input_tokens"] > 0
    assert seen["http.response.status_code"] == 200 and seen["gateway.tenant"] == "traced"
    assert seen["gateway.cache"] == "miss"
    children = {s.name: s for s in receiver.spans if s.parent_span_id == root.span_id}
    assert {"cache lookup", "queue", "upstream"} <= set(children)
    upstream = children["upstream"]
    assert upstream.kind == upstream.SPAN_KIND_CLIENT
    assert attributes(upstream)["http.response.status_code"] == 200
    # The engine continues the trace from the attempt's span.
    sent = httpx.get(fake_upstream.removesuffix("/v1") + "/_last").json()
    assert sent["traceparent"] == f"00-{CLIENT_TRACE}-{upstream.span_id.hex()}-01"
    assert receiver.content_types == {"application/x-protobuf"}


def test_a_refused_request_is_a_span_with_its_error(gateway: Gateway, receiver: Receiver) -> None:
    answer = httpx.post(
        f"{gateway.base_url}/chat/completions",
        json={"model": "echo", "messages": [{"role": "user", "content": "no key"}]},
    )
    assert answer.status_code == 401
    spans = receiver.named("POST /v1/chat/completions")  # no model: it never routed
    refused = [attributes(s) for s in spans if attributes(s)["http.response.status_code"] == 401]
    assert refused and refused[0]["error.type"] == "invalid_api_key"


def test_off_unless_asked_and_http_protobuf_only() -> None:
    assert open_tracing(TracingOptions(), {}) is None
    assert open_tracing(TracingOptions(enabled=True), {"OTEL_SDK_DISABLED": "true"}) is None
    grpc = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    with pytest.raises(TracingConfigError, match="http/protobuf"):
        open_tracing(TracingOptions(), grpc)


def test_gateway_check_refuses_a_protocol_it_cannot_export(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text("backends: [{name: b, base_url: 'http://127.0.0.1:9/v1', models: [m]}]\n")
    env = {**os.environ, "OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    command = [sys.executable, "-m", "gateway.cli", "check", "--config", str(config)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "HTTP/protobuf only" in done.stderr
    env.pop("OTEL_TRACES_EXPORTER")  # tracing off: the protocol is none of its business
    assert subprocess.run(command, env=env, capture_output=True, timeout=60).returncode == 0
