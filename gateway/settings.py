"""One typed settings tree, read once at start-up from a YAML file.

Each package receives its own sub-model. Secrets are `SecretStr`, and may come from the
environment through `${NAME}` / `${NAME:-default}` in any string of the YAML file, or,
for tenant keys, through `{env: NAME}`.
"""

from __future__ import annotations

import hashlib
import math
import re
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    Field,
    field_validator,
    model_validator,
)

from gateway.backend_settings import (
    Backend,
    Concurrency,
    KubernetesTarget,
    Launch,
    RetrySettings,
    Scaling,
    ScheduleWindow,
    Timeouts,
    Weights,
)
from gateway.batch_settings import BatchFiles, BatchSettings
from gateway.cache_settings import CacheSettings, EmbedderEndpoint
from gateway.fallback_config import Chains, merge_chains
from gateway.prompt_size import SizeRoutes, model_routes
from gateway.settings_types import Controller, Name, Priority, S3Settings, Sha256Hex, Strict
from gateway.tenant_settings import (
    DeclaredKey,
    Degrade,
    ErrorBound,
    Quotas,
    Tenant,
    TenantProfile,
)


class Listen(Strict):
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)


class StateSettings(Strict):
    """Where keys (and later quotas and cache entries) live.

    `memory` keeps them in process and persists them to `path`; a `redis://` URL shares
    them between replicas, under `prefix` so several deployments can share one Redis.
    """

    url: str = "memory"
    path: Path = Path(".gateway/state.json")
    prefix: Name = "gw"
    # How long a request's quota reservation holds its concurrency slot without a settle
    # (a crashed replica's requests free theirs after it). A request that outlives it is
    # still settled by its reservation, up to a day later (gateway/tenancy/quotas.py).
    quota_lease_s: float = Field(default=600.0, gt=0)

    @field_validator("url")
    @classmethod
    def _known_scheme(cls, value: str) -> str:
        if value != "memory" and not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must be 'memory' or a redis:// / rediss:// / unix:// URL")
        return value


class StagingSettings(Strict):
    cache_dir: Path = Path(".gateway/weights")
    disk_budget_gb: float = Field(default=100.0, gt=0)
    chunk_mb: int = Field(default=8, ge=1)
    parallelism: int = Field(default=8, ge=1)
    readahead: Literal["pagecache", "none"] = "pagecache"
    s3: S3Settings = S3Settings()


class AdminSettings(Strict):
    """Keys of the admin API (`/admin/...`); none (and no $GATEWAY_ADMIN_KEY): it is off."""

    keys: list[DeclaredKey] = Field(default_factory=list)
    # Keys that read `/metrics` and `/readyz`'s details and nothing else (a scraper's);
    # $GATEWAY_OPERATOR_KEY is one more, and every admin key reads them too.
    operator_keys: list[DeclaredKey] = Field(default_factory=list)


def _default_deadlines() -> dict[Priority, float]:
    return {"interactive": 60.0, "batch": 600.0}


class HoldSettings(Strict):
    """Requests held while a backend with no ready replica starts one (README "Scale to zero")."""

    # A held streaming request gets an SSE comment line this often (the first one sends its
    # status line), so that clients and proxies do not drop a connection that stays silent.
    keepalive_s: float = Field(default=3.0, gt=0, le=60)
    # A request that names no deadline of its own, held for a start, may wait at least the
    # start's learned estimate times this (within `max_deadline_s`).
    deadline_margin: float = Field(default=1.5, ge=1)


class TrafficSettings(Strict):
    """Fair queueing, load shedding, retries and circuit breaking in front of each backend."""

    # How long a request may take end to end when the client does not say (with the
    # `x-request-timeout` header, or the `openai` SDKs' `x-stainless-read-timeout` or
    # `x-stainless-timeout`), by class; what a client asks for is honoured up to
    # `max_deadline_s`.
    deadline_s: dict[Priority, float] = Field(default_factory=_default_deadlines)
    max_deadline_s: float = Field(default=600.0, gt=0)
    max_queue: int = Field(default=1024, ge=0)  # waiting requests per backend
    default_max_tokens: int = Field(default=256, ge=1)  # reserved when a request sets none
    output_weight: float = Field(default=2.0, gt=0)  # cost of an output token vs an input one
    retry_budget_ratio: float = Field(default=0.2, ge=0, le=1)
    retry_min_per_s: float = Field(default=3.0, ge=0)  # lets light traffic retry at all
    breaker: bool = True  # circuit breaking per backend replica
    breaker_failures: int = Field(default=5, ge=1)  # consecutive, or half of the last 20
    breaker_open_s: float = Field(default=5.0, gt=0)
    retry: RetrySettings = RetrySettings()  # for every backend that sets no `retry`
    hold: HoldSettings = HoldSettings()
    # For ablation measurements (bench/slo_goodput.py), not for tuning: traffic-core
    # controllers switched off (`Controller`, the scheduler's CONTROLLERS); see
    # docs/learned-capacity.md.
    controllers_off: frozenset[Controller] = frozenset()

    @field_validator("deadline_s")
    @classmethod
    def _every_class(cls, deadlines: dict[Priority, float]) -> dict[Priority, float]:
        """A class the file leaves out keeps its default: the request path reads every one."""
        return {**_default_deadlines(), **deadlines}


class Price(Strict):
    """What a model's tokens cost, in USD per million: the spend budgets charge it, the cache
    report counts the savings with it."""

    input_per_1m_tokens: float = Field(default=0.0, ge=0)
    output_per_1m_tokens: float = Field(default=0.0, ge=0)
    # Prompt tokens the engine's prefix cache read (`prompt_tokens_details.cached_tokens`);
    # None: the input price.
    cached_input_per_1m_tokens: float | None = Field(default=None, ge=0)

    def micro_usd(self, prompt: int, cached: int, completion: int) -> int:
        """The cost of a request's tokens in micro-USD (a price per million tokens is
        micro-USD per token), rounded up."""
        cached = min(cached, prompt)
        read = (
            self.input_per_1m_tokens
            if self.cached_input_per_1m_tokens is None
            else self.cached_input_per_1m_tokens
        )
        cost = (prompt - cached) * self.input_per_1m_tokens + cached * read
        return math.ceil(cost + completion * self.output_per_1m_tokens - 1e-9)


class Limits(Strict):
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    # How long a client may take to send a request's body once its headers are in (the
    # headers have their own limit, gateway/server.py); past it: 408 and the connection closes.
    body_timeout_s: float = Field(default=30.0, gt=0)
    # Counted as they arrive, before authentication (gateway/server.py): past it, 431.
    max_header_bytes: int = Field(default=64 * 1024, ge=1024)
    # Open client connections served at once: past it the one idle longest is closed for the
    # new one (gateway/server.py); with none idle, a request on one more is answered 503.
    max_connections: int = Field(default=8192, ge=1)
    # How long an idle kept-alive client connection stays open. Above the idle timeouts of
    # the proxies that pool connections to it (nginx-ingress upstreams and AWS ALB: 60 s),
    # so that they close first: a proxy reusing a connection as the gateway closes it reads
    # a broken one, and answers a POST with 502. 75 s is nginx's own default.
    keep_alive_s: int = Field(default=75, ge=1)


class ResponsesSettings(Strict):
    """Stored responses of the Responses API (gateway/dialects/stored.py)."""

    ttl_s: float = Field(default=30 * 86400, gt=0)  # OpenAI keeps them 30 days
    max_per_tenant: int = Field(default=1000, ge=1)  # its oldest forgotten first
    # And at most this many bytes of them (each holds its whole conversation).
    max_bytes_per_tenant: int = Field(default=64 * 1024 * 1024, ge=1024)


class TracingSettings(Strict):
    """OpenTelemetry traces (gateway/tracing.py); `OTEL_TRACES_EXPORTER=otlp` turns them on too."""

    enabled: bool = False
    endpoint: str | None = None  # OTLP/HTTP traces URL; the OTEL_EXPORTER_OTLP_* vars win


class Settings(Strict):
    listen: Listen = Listen()
    state: StateSettings = StateSettings()
    limits: Limits = Limits()
    cache: CacheSettings = CacheSettings()
    traffic: TrafficSettings = TrafficSettings()
    staging: StagingSettings = StagingSettings()
    backends: list[Backend] = Field(min_length=1)
    tenants: list[Tenant] = Field(default_factory=list)
    admin: AdminSettings = AdminSettings()
    pricing: dict[str, Price] = Field(default_factory=dict)  # by model name
    batches: BatchSettings = BatchSettings()
    responses: ResponsesSettings = ResponsesSettings()
    tracing: TracingSettings = TracingSettings()
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # Per model: the models tried in its place (gateway/fallback.py); also per backend.
    fallbacks: dict[Name, list[Name]] = Field(default_factory=dict)
    # Per model: what its requests give up under overload (gateway/degrade.py).
    degrade: dict[Name, Degrade] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _unique_names(self) -> Settings:
        _require_unique("backends", [b.name for b in self.backends])
        _require_unique("tenants", [t.name for t in self.tenants])
        self.model_routes()  # raises ValueError when a model's backends are wrong
        self.fallback_chains()  # raises ValueError when they are wrong
        self._check_degrade()
        self._check_priced()
        return self

    def _check_priced(self) -> None:
        """A tenant with a spend budget may use priced models only: an unpriced one would
        cost it nothing, and the budget would never bind."""
        served = self.model_names()
        for tenant in self.tenants:
            if not tenant.quotas.spends:
                continue
            for model in served:
                allowed = any(fnmatchcase(model, p) for p in tenant.models)
                if allowed and model not in self.pricing:
                    raise ValueError(
                        f"tenants[{tenant.name}].quotas: a spend budget, and it may use "
                        f"{model!r}, which has no price: add it to `pricing` or narrow "
                        "the tenant's `models`"
                    )

    def _check_degrade(self) -> None:
        """A policy's model is served, and one its tenants may use (a request is never
        degraded to a model its tenant could not ask for)."""
        served = set(self.model_names())
        for model, policy in self.degrade.items():
            if model not in served:
                raise ValueError(f"degrade: {model!r} is not a model any backend serves")
            if policy.model == model:
                raise ValueError(f"degrade.{model}: model names the model itself")
            _degrade_model(f"degrade.{model}", policy, served)
        for tenant in self.tenants:
            if tenant.degrade is None:
                continue
            where = f"tenants[{tenant.name}].degrade"
            _degrade_model(where, tenant.degrade, served)
            cheaper = tenant.degrade.model
            if cheaper is not None and not any(fnmatchcase(cheaper, p) for p in tenant.models):
                raise ValueError(f"{where}: the tenant may not use {cheaper!r}")

    def model_names(self) -> list[str]:
        return list(self.model_routes())

    def model_routes(self) -> dict[str, SizeRoutes]:
        """Per model, its backends by prompt size (gateway/prompt_size.py)."""
        return model_routes(self.backends)

    def fallback_chains(self) -> Chains:
        """Per model with fallbacks, the models tried in its place, in order."""
        backend_of = {model: routes.backends for model, routes in self.model_routes().items()}
        per_backend = {b.name: b.fallbacks for b in self.backends if b.fallbacks}
        return merge_chains(backend_of, self.fallbacks, per_backend)


def _degrade_model(where: str, policy: Degrade, served: set[str]) -> None:
    if policy.model is not None and policy.model not in served:
        raise ValueError(f"{where}: {policy.model!r} is not a model any backend serves")


def _require_unique(what: str, names: list[str]) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ValueError(f"duplicate name {name!r} in {what}")
        seen.add(name)


def hash_key(key: str) -> str:
    """Keys are random 192-bit secrets, so one SHA-256 suffices (no slow KDF needed)."""
    return hashlib.sha256(key.encode()).hexdigest()


_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def expand_env(value: Any, environ: dict[str, str]) -> Any:
    """Replaces `${NAME}` and `${NAME:-default}` in every string of a parsed YAML tree."""
    if isinstance(value, str):
        return _ENV_REF.sub(lambda m: _lookup(m, environ), value)
    if isinstance(value, list):
        return [expand_env(item, environ) for item in value]
    if isinstance(value, dict):
        return {key: expand_env(item, environ) for key, item in value.items()}
    return value


def _lookup(match: re.Match[str], environ: dict[str, str]) -> str:
    name, default = match.group(1), match.group(2)
    if name in environ:
        return environ[name]
    if default is not None:
        return default
    raise ConfigError(f"environment variable {name} is not set (referenced as ${{{name}}})")


class ConfigError(Exception):
    """The configuration file is missing, unparsable or invalid; the message says where."""


# Re-exported: the whole tree is read from here (`from gateway.settings import Backend`).
__all__ = [
    "Backend",
    "BatchFiles",
    "BatchSettings",
    "CacheSettings",
    "Concurrency",
    "DeclaredKey",
    "Degrade",
    "EmbedderEndpoint",
    "ErrorBound",
    "KubernetesTarget",
    "Launch",
    "Name",
    "Priority",
    "Quotas",
    "RetrySettings",
    "S3Settings",
    "Scaling",
    "ScheduleWindow",
    "Sha256Hex",
    "Tenant",
    "TenantProfile",
    "Timeouts",
    "Weights",
]
