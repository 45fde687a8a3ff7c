"""OpenTelemetry traces: one span per request, following the GenAI semantic conventions,
with a child span for the cache lookup, the wait in the queue and each upstream attempt,
and events for a shed request and a cold start. Off unless turned on.

    tracing = open_tracing(settings.tracing, env)      # None: off, and free
    trace = tracing.begin(headers, path)               # the client's `traceparent` continued
    with trace.span("queue"): ...                      # a child
    attempt = trace.attempt(url, n); headers.update(attempt.headers)   # `traceparent` upstream
    trace.end(status, attributes)

On when `OTEL_TRACES_EXPORTER` names `otlp` (the standard variable) or `tracing.enabled` is
set, unless `OTEL_SDK_DISABLED=true`. Spans go over OTLP, HTTP/protobuf, to
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, else `OTEL_EXPORTER_OTLP_ENDPOINT` + `/v1/traces`,
else `tracing.endpoint`, else the collector's default (`http://localhost:4318/v1/traces`),
in batches from a thread of the SDK's (a slow collector never holds a request). Another
protocol (`grpc`, `http/json`) is a start-up error that says so. The service is
`OTEL_SERVICE_NAME`, else `inference-gateway`; other `OTEL_*` variables (the sampler, the
headers, the resource) are the SDK's own.

Reference: https://opentelemetry.io/docs/specs/semconv/gen-ai/gen-ai-spans/
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

DEFAULT_SERVICE = "inference-gateway"
DEFAULT_ENDPOINT = "http://localhost:4318/v1/traces"
# The GenAI operation of each route's kind (gen_ai.operation.name).
OPERATIONS = {"chat": "chat", "completions": "text_completion", "embeddings": "embeddings"}


class TracingConfigError(ValueError):
    """Tracing is asked for in a way this gateway cannot export."""


@dataclass(frozen=True)
class TracingOptions:
    """What the configuration says (`tracing`); the environment may turn it on too."""

    enabled: bool = False
    endpoint: str | None = None


def open_tracing(options: TracingOptions, env: Mapping[str, str]) -> Tracing | None:
    """The gateway's tracing, or None when it is off."""
    if not wanted(options, env):
        return None
    check_protocol(env)
    service = env.get("OTEL_SERVICE_NAME") or DEFAULT_SERVICE
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(
        BatchSpanProcessor(OTLPSpanExporter(endpoint=_endpoint(options, env)))
    )
    return Tracing(provider)


def wanted(options: TracingOptions, env: Mapping[str, str]) -> bool:
    """Is tracing on: asked for by the configuration or `OTEL_TRACES_EXPORTER`, and the SDK
    not disabled?"""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = {e.strip() for e in env.get("OTEL_TRACES_EXPORTER", "").split(",")}
    return options.enabled or "otlp" in exporters


def check_protocol(env: Mapping[str, str]) -> None:
    """Raises TracingConfigError for an OTLP protocol other than HTTP/protobuf (checked
    before the gateway listens: `gateway serve` and `gateway check`)."""
    protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
    )
    if protocol != "http/protobuf":
        raise TracingConfigError(
            f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol}: this gateway exports traces over OTLP "
            "HTTP/protobuf only; set it to http/protobuf (the collector's port 4318)"
        )


def _endpoint(options: TracingOptions, env: Mapping[str, str]) -> str:
    if env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        return env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
    if env.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return env["OTEL_EXPORTER_OTLP_ENDPOINT"].rstrip("/") + "/v1/traces"
    return options.endpoint or DEFAULT_ENDPOINT


class Tracing:
    def __init__(self, provider: TracerProvider) -> None:
        self._provider = provider
        self._tracer = provider.get_tracer("gateway")

    def begin(self, headers: Mapping[str, str], path: str) -> RequestTrace:
        """A request's span, continuing the client's trace when it sent `traceparent`."""
        parent = propagate.extract(headers)
        span = self._tracer.start_span(f"POST {path}", parent, SpanKind.SERVER)
        return RequestTrace(self._tracer, span)

    def close(self) -> None:
        """Sends what is still buffered (at shutdown)."""
        self._provider.shutdown()


class RequestTrace:
    """One request's span and its children."""

    def __init__(self, tracer: trace.Tracer, span: Span) -> None:
        self._tracer = tracer
        self.root = span
        self._context = trace.set_span_in_context(span)

    def named(self, kind: str, model: str) -> None:
        """The span's GenAI name and attributes once the request's model is known."""
        operation = OPERATIONS.get(kind, kind)
        self.root.update_name(f"{operation} {model}")
        self.root.set_attribute("gen_ai.operation.name", operation)
        self.root.set_attribute("gen_ai.request.model", model)

    @contextlib.contextmanager
    def span(self, name: str, **attributes: Any) -> Iterator[Span]:
        """A child span around a step; an exception leaving it marks it failed."""
        child = self._tracer.start_span(name, self._context, attributes=attributes)
        try:
            yield child
        except Exception as exc:
            child.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            child.set_attribute("error.type", getattr(exc, "code", None) or type(exc).__name__)
            raise
        finally:
            child.end()

    def attempt(self, url: str, number: int) -> Attempt:
        """A child span for one upstream call, and the headers that carry it there."""
        span = self._tracer.start_span(
            "upstream",
            self._context,
            SpanKind.CLIENT,
            attributes={"url.full": url, "gateway.attempt": number},
        )
        headers: dict[str, str] = {}
        propagate.inject(headers, trace.set_span_in_context(span))
        return Attempt(span, headers)

    def event(self, name: str, **attributes: Any) -> None:
        self.root.add_event(name, attributes)

    def end(self, status: int, error: str | None, attributes: Mapping[str, Any]) -> None:
        self.root.set_attribute("http.response.status_code", status)
        for key, value in attributes.items():
            if value is not None:
                self.root.set_attribute(key, value)
        if status >= 500 or (error is not None and status >= 400):
            self.root.set_attribute("error.type", error or str(status))
        if status >= 500:
            self.root.set_status(Status(StatusCode.ERROR, error))
        self.root.end()


@dataclass
class Attempt:
    span: Span
    headers: dict[str, str]  # `traceparent` (and `tracestate`) for the upstream

    def end(self, status: int | None, error: str | None = None) -> None:
        if status is not None:
            self.span.set_attribute("http.response.status_code", status)
        if error is not None or (status is not None and status >= 500):
            self.span.set_attribute("error.type", error or str(status))
            self.span.set_status(Status(StatusCode.ERROR, error))
        self.span.end()
