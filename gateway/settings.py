"""One typed settings tree, read once at start-up from a YAML file.

Each package receives its own sub-model. Secrets are `SecretStr`, and may come from the
environment through `${NAME}` / `${NAME:-default}` in any string of the YAML file, or,
for tenant keys, through `{env: NAME}`.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    StringConstraints,
    field_validator,
    model_validator,
)

from gateway.fallback_config import Chains, merge_chains
from warmpool.schedule import MAX_WINDOW_S, Schedule, Window, parse_cron, time_zone

Name = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")]
Priority = Literal["interactive", "batch"]
Sha256Hex = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Listen(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)


class StateSettings(_Strict):
    """Where keys (and later quotas and cache entries) live.

    `memory` keeps them in process and persists them to `path`; a `redis://` URL shares
    them between replicas, under `prefix` so several deployments can share one Redis.
    """

    url: str = "memory"
    path: Path = Path(".gateway/state.json")
    prefix: Name = "gw"

    @field_validator("url")
    @classmethod
    def _known_scheme(cls, value: str) -> str:
        if value != "memory" and not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must be 'memory' or a redis:// / rediss:// / unix:// URL")
        return value


class Timeouts(_Strict):
    connect_s: float = Field(default=5.0, gt=0)
    # Time to the first byte of the answer, and then between two reads of a stream.
    read_s: float = Field(default=300.0, gt=0)
    total_s: float | None = Field(default=None, gt=0)


class Launch(_Strict):
    """A local process the gateway starts with itself and stops with itself.

    `{port}` in `command` and in the backend's `base_url` is replaced by `port`, or by a
    free loopback port when `port` is 0; `{python}` by the gateway's own interpreter.
    """

    command: list[str] = Field(min_length=1)
    port: int = Field(default=0, ge=0, le=65535)
    ready_path: str = "/health"
    start_timeout_s: float = Field(default=180.0, gt=0)
    env: dict[str, str] = Field(default_factory=dict)


class Weights(_Strict):
    """Where a backend's weights live, and when they are staged to local disk."""

    uri: Annotated[str, StringConstraints(pattern=r"^s3://[^/]+(/.*)?$")]
    # `always`: staged at gateway start and never evicted; `on_demand`: at first use.
    staged: Literal["always", "on_demand"] = "on_demand"


class S3Settings(_Strict):
    endpoint_url: str | None = None  # None: AWS; else MinIO, R2, moto...
    region: str = "us-east-1"
    # None: the default AWS credential chain (IRSA, instance profile, env).
    access_key_id: SecretStr | None = None
    secret_access_key: SecretStr | None = None


class StagingSettings(_Strict):
    cache_dir: Path = Path(".gateway/weights")
    disk_budget_gb: float = Field(default=100.0, gt=0)
    chunk_mb: int = Field(default=8, ge=1)
    parallelism: int = Field(default=8, ge=1)
    readahead: Literal["pagecache", "none"] = "pagecache"
    s3: S3Settings = S3Settings()


class ScheduleWindow(_Strict):
    """From each time `cron` fires (5 fields, read in `scaling.timezone`), keep at least
    `min_replicas` ready for `duration_s` (README "Scale to zero")."""

    cron: str
    duration_s: float = Field(gt=0, le=MAX_WINDOW_S)
    min_replicas: int = Field(default=1, ge=1)

    @field_validator("cron")
    @classmethod
    def _parses(cls, value: str) -> str:
        parse_cron(value)  # its ValueError names the field that is wrong
        return value


class Scaling(_Strict):
    """Replica count of a `process` or `kubernetes` backend (see README "Scale to zero")."""

    min_replicas: int = Field(default=0, ge=0)
    max_replicas: int = Field(default=1, ge=1)
    idle_s: float = Field(default=60.0, gt=0)  # idle time before one of several stops
    last_replica_idle_s: float = Field(default=300.0, gt=0)  # ... before the last one stops
    # With `sleep: true`: the last replica sleeps after idle_s and stops after this long
    # without work (counted from its last work too, so it sleeps for sleep_s - idle_s).
    sleep_s: float = Field(default=1800.0, gt=0)
    # Requests (queued, in flight, queued in the engine) one replica carries before another
    # is added. None: its learned concurrency limit (`concurrency.mode: adaptive`), or 2.
    target_queue_per_replica: float | None = Field(default=None, gt=0)
    warm_pool: int = Field(default=0, ge=0)  # extra idle replicas kept loaded
    # Demand is averaged over the stable window to size the backend, and over the short
    # panic window to react to bursts (Knative's two modes).
    stable_window_s: float = Field(default=60.0, gt=0)
    panic_window_s: float = Field(default=6.0, gt=0)
    ready_timeout_s: float = Field(default=600.0, gt=0)
    schedule: list[ScheduleWindow] = Field(default_factory=list)  # raised minimums by the clock
    timezone: str = "UTC"  # an IANA name: the schedule's cron times are read there

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        time_zone(value)
        return value

    @model_validator(mode="after")
    def _bounds(self) -> Scaling:
        if self.min_replicas > self.max_replicas:
            raise ValueError("min_replicas must not exceed max_replicas")
        if any(w.min_replicas > self.max_replicas for w in self.schedule):
            raise ValueError("a schedule window's min_replicas must not exceed max_replicas")
        return self

    def plan(self) -> Schedule:
        windows = (Window(parse_cron(w.cron), w.duration_s, w.min_replicas) for w in self.schedule)
        return Schedule(tuple(windows), time_zone(self.timezone))


class KubernetesTarget(_Strict):
    server: str  # the API server URL
    token: SecretStr  # a service account token (RBAC: deployments/scale on this target)
    namespace: str
    deployment: str
    service: str  # whose EndpointSlices list the ready pods
    port: int | None = None
    ca_file: Path | None = None


class RetrySettings(_Strict):
    """Retries before the first byte (see README "Traffic control"); per backend or for all."""

    max_attempts: int = Field(default=3, ge=1, le=10)  # the first attempt included
    base_s: float = Field(default=0.05, ge=0)  # full-jitter backoff: uniform below base * 2^n
    cap_s: float = Field(default=2.0, ge=0)  # ... and below this
    max_retry_after_s: float = Field(default=2.0, ge=0)  # a longer Retry-After is relayed


class Concurrency(_Strict):
    """How many requests each replica gets at once (README "Learned capacity").

    `adaptive` learns it from the engine's metrics (when `engine` is declared) and from
    answer latency, between `min` and the backend's `max_concurrency`; `fixed` dispatches
    exactly `max_concurrency` per replica, as a hand-set limit.
    """

    mode: Literal["adaptive", "fixed"] = "adaptive"
    initial: int = Field(default=8, ge=1)  # the first limit, before anything is learned
    min: int = Field(default=1, ge=1)
    interval_s: float = Field(default=0.25, gt=0, le=10)  # control tick and metrics scrape
    metrics_path: str = "/metrics"  # at the engine's root, or a full http(s):// URL
    kv_high: float = Field(default=0.95, gt=0, le=1)  # KV usage at which an engine is full
    # Time to first token may reach this multiple of its baseline before the limit is cut
    # (README "Learned capacity": why 3).
    latency_tolerance: float = Field(default=3.0, ge=1.1, le=10)


class Backend(_Strict):
    name: Name
    # http: a static upstream at base_url; process: workers the gateway starts itself
    # (`command`); kubernetes: a Deployment scaled through the API.
    kind: Literal["http", "process", "kubernetes"] = "http"
    base_url: str = ""
    command: list[str] = Field(default_factory=list)  # {port} {weights} {python} {host}
    env: dict[str, str] = Field(default_factory=dict)  # process: added to the gateway's own
    ready_path: str = "/health"
    kubernetes: KubernetesTarget | None = None
    scaling: Scaling = Scaling()
    models: list[Name] = Field(min_length=1)
    api_key: SecretStr | None = None
    timeouts: Timeouts = Timeouts()
    # Per replica: the ceiling of the learned limit, or the limit with `concurrency.mode: fixed`.
    max_concurrency: int = Field(default=256, ge=1)
    # What serves the model: its /metrics are read for capacity (none: latency only).
    engine: Literal["vllm", "sglang", "tgi", "none"] = "none"
    # vLLM started with `--scheduling-policy priority`: requests carry their class's rank.
    priority_scheduling: bool = False
    # vLLM started with `--enable-sleep-mode` (and VLLM_SERVER_DEV_MODE=1): an idle last
    # replica sleeps (weights in host memory) before it stops; see README "Scale to zero".
    sleep: bool = False
    concurrency: Concurrency = Concurrency()
    health_path: str = "/models"
    launch: Launch | None = None
    weights: Weights | None = None
    retry: RetrySettings | None = None  # None: `traffic.retry`
    # Per model of this backend: the models tried in its place (gateway/fallback.py).
    fallbacks: dict[Name, list[Name]] = Field(default_factory=dict)

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if value and not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _kind_needs(self) -> Backend:
        if self.kind == "http" and not self.base_url:
            raise ValueError("an http backend needs base_url")
        if self.kind == "process" and not self.command:
            raise ValueError("a process backend needs command")
        if self.kind == "kubernetes" and self.kubernetes is None:
            raise ValueError("a kubernetes backend needs the kubernetes section")
        if self.kind == "http" and self.scaling.schedule:
            raise ValueError("scaling.schedule needs a process or kubernetes backend")
        if self.env and self.kind != "process":
            raise ValueError("env is for process backends (it is the command's environment)")
        if "{weights}" in " ".join(self.command) and self.weights is None:
            raise ValueError("command uses {weights} but the backend declares no weights")
        if self.priority_scheduling and self.engine != "vllm":
            raise ValueError("priority_scheduling needs engine: vllm (its `priority` field)")
        if self.sleep:
            self._can_sleep()
        if self.concurrency.min > self.max_concurrency:
            raise ValueError("concurrency.min must be <= max_concurrency")
        return self

    def _can_sleep(self) -> None:
        if self.engine != "vllm":
            raise ValueError("sleep needs engine: vllm (its sleep mode: --enable-sleep-mode)")
        if self.kind == "http":
            raise ValueError("sleep needs a process or kubernetes backend (the gateway scales)")
        if self.scaling.sleep_s <= self.scaling.idle_s:
            raise ValueError(
                "scaling.sleep_s must be longer than scaling.idle_s (both count from the "
                "replica's last work: it sleeps after idle_s and stops after sleep_s)"
            )


# Limits travel through Lua as doubles: beyond 2^53 they would lose precision.
_MAX_LIMIT = 2**53


class Quotas(_Strict):
    """Per-tenant limits, shared by all replicas through the state store (None: unlimited)."""

    requests_per_minute: int | None = Field(default=None, ge=1, le=_MAX_LIMIT)
    tokens_per_minute: int | None = Field(default=None, ge=1, le=_MAX_LIMIT)
    max_concurrent: int | None = Field(default=None, ge=1, le=_MAX_LIMIT)
    tokens_per_day: int | None = Field(default=None, ge=1, le=_MAX_LIMIT)
    tokens_per_month: int | None = Field(default=None, ge=1, le=_MAX_LIMIT)


class DeclaredKey(_Strict):
    """A key declared in config: its SHA-256 (`sha256`), or a variable holding the key (`env`).

    With `env` and `generate: true`, a missing variable makes the gateway generate a key
    and print it once at start-up (for demos).
    """

    sha256: Sha256Hex | None = None
    env: Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")] | None = None
    generate: bool = False

    @model_validator(mode="after")
    def _one_source(self) -> DeclaredKey:
        if (self.sha256 is None) == (self.env is None):
            raise ValueError("give exactly one of 'sha256' (hex digest of the key) or 'env'")
        return self


class ErrorBound(_Strict):
    """Opt-in error-bounded semantic hits (cache/error_bound.py, after vCache): a near match
    is served with the chance that keeps wrong answers at or under `delta` per request,
    learned online from would-be hits the model also answers and that are compared.

    Applied to the tenant's semantic-tier hits (README "Error-bounded mode"), with the
    evidence pooled per cache namespace.
    """

    delta: float = Field(gt=0, le=0.2)  # the bound: wrong answers per request
    # namespace: evidence pooled for the namespace, which learns where entries are asked
    # only once or twice (bench/error_bound.py). entry (vCache as published) is refused
    # until evidence can live and die with its entry.
    scope: Literal["entry", "namespace"] = "namespace"

    @field_validator("scope")
    @classmethod
    def _namespace_only(cls, scope: str) -> str:
        if scope != "namespace":
            raise ValueError(
                "scope 'entry' is not supported yet: evidence is kept per namespace "
                "(use scope: namespace, the default)"
            )
        return scope


class TenantProfile(_Strict):
    """A tenant without its keys: what the admin API creates and updates."""

    name: Name
    weight: float = Field(default=1.0, gt=0)
    priority: Literal["interactive", "batch"] = "interactive"
    # May requests choose their class with the `x-priority` header (never above `priority`
    # unless this is true)?
    priority_header: bool = False
    models: list[str] = Field(default_factory=lambda: ["*"])
    quotas: Quotas = Quotas()
    # Tenants naming the same group share cache entries; otherwise a tenant's entries are its own.
    cache_group: Name | None = None
    cache_error_bound: ErrorBound | None = None  # None: the shipped fixed decision


class Tenant(TenantProfile):
    keys: list[DeclaredKey] = Field(default_factory=list)


class AdminSettings(_Strict):
    """Keys of the admin API (`/admin/...`); none (and no $GATEWAY_ADMIN_KEY): it is off."""

    keys: list[DeclaredKey] = Field(default_factory=list)


class CacheSettings(_Strict):
    """The semantic cache. See README "Semantic cache" for the tiers and their defaults."""

    enabled: bool = True
    model_path: str | None = None  # a sentence-transformers folder; None: the packaged MiniLM
    device: str | None = None  # None: cuda when available, else cpu
    # What runs the embedding model: onnx (ONNX Runtime, CPU only), torch, or auto: onnx on
    # the CPU, torch on CUDA (README "Semantic cache").
    embedder: Literal["auto", "onnx", "torch"] = "auto"
    path: Path = Path(".gateway/cache")  # where the `memory` state store persists entries
    ttl_s: float = Field(default=7 * 86400, gt=0)
    max_entries_per_namespace: int = Field(default=10_000, ge=1)
    lookup_budget_ms: float = Field(default=50.0, gt=0)
    batch_window_ms: float = Field(default=2.0, ge=0)
    max_batch: int = Field(default=32, ge=1)
    max_temperature: float = Field(default=1.0, ge=0)
    cacheable_tools: list[str] = Field(default_factory=list)
    semantic: bool = True  # tier 3 (verified embedding similarity); tiers 1-2 always on


def _default_deadlines() -> dict[Priority, float]:
    return {"interactive": 60.0, "batch": 600.0}


class HoldSettings(_Strict):
    """Requests held while a backend with no ready replica starts one (README "Scale to zero")."""

    # A held streaming request gets an SSE comment line this often (the first one sends its
    # status line), so that clients and proxies do not drop a connection that stays silent.
    keepalive_s: float = Field(default=3.0, gt=0, le=60)
    # A request that names no deadline of its own, held for a start, may wait at least the
    # start's learned estimate times this (within `max_deadline_s`).
    deadline_margin: float = Field(default=1.5, ge=1)


class TrafficSettings(_Strict):
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


class Price(_Strict):
    """What a model's tokens cost, in USD per million (for the cache report's savings)."""

    input_per_1m_tokens: float = Field(default=0.0, ge=0)
    output_per_1m_tokens: float = Field(default=0.0, ge=0)


class Limits(_Strict):
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    # How long a client may take to send a request's body once its headers are in (the
    # headers have their own limit, gateway/server.py); past it: 408 and the connection closes.
    body_timeout_s: float = Field(default=30.0, gt=0)


_WINDOW = r"^[1-9][0-9]*[smh]$"  # a completion window: 24h, 90m, 30s


class BatchFiles(_Strict):
    """Where batch files' bytes live (inputs, outputs, errors): a local folder, or S3."""

    store: Literal["local", "s3"] = "local"
    path: Path | None = None  # local: None is `files/` next to the state file
    bucket: str | None = None  # s3: required
    prefix: str = "gateway-files/"  # s3: object keys are PREFIX + file id
    s3: S3Settings = S3Settings()

    @model_validator(mode="after")
    def _bucket_for_s3(self) -> BatchFiles:
        if self.store == "s3" and not self.bucket:
            raise ValueError("store: s3 needs bucket")
        return self


class BatchSettings(_Strict):
    """Batch jobs (`/v1/files`, `/v1/batches`), run inside the gateway (README "Batch jobs")."""

    enabled: bool = True
    max_file_bytes: int = Field(default=100 * 1024 * 1024, ge=1024)
    max_lines: int = Field(default=50_000, ge=1)
    concurrency: int = Field(default=4, ge=1)  # a job's lines in flight at once
    max_concurrency: int = Field(default=16, ge=1)  # lines in flight over all jobs
    max_jobs: int = Field(default=4, ge=1)  # jobs run at once (each holds its input in memory)
    # The windows `completion_window` may name (OpenAI knows 24h only), and their lengths.
    completion_windows: list[Annotated[str, StringConstraints(pattern=_WINDOW)]] = Field(
        default_factory=lambda: ["24h"], min_length=1
    )
    retry_base_s: float = Field(default=1.0, gt=0)  # a line refused for load (429, 503) ...
    retry_cap_s: float = Field(default=60.0, gt=0)  # ... retries after backoff up to this
    poll_s: float = Field(default=1.0, gt=0)  # how often jobs are looked for (other replicas')
    drain_s: float = Field(default=10.0, ge=0)  # at shutdown, lines in flight get this long
    lease_s: float = Field(default=30.0, gt=0)  # Redis: a replica's claim on a job
    files: BatchFiles = BatchFiles()


class Settings(_Strict):
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
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # Per model: the models tried in its place (gateway/fallback.py); also per backend.
    fallbacks: dict[Name, list[Name]] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _unique_names(self) -> Settings:
        _require_unique("backends", [b.name for b in self.backends])
        _require_unique("tenants", [t.name for t in self.tenants])
        served = [model for backend in self.backends for model in backend.models]
        _require_unique("models served by backends", served)
        self.fallback_chains()  # raises ValueError when they are wrong
        return self

    def model_names(self) -> list[str]:
        return [model for backend in self.backends for model in backend.models]

    def fallback_chains(self) -> Chains:
        """Per model with fallbacks, the models tried in its place, in order."""
        backend_of = {model: b.name for b in self.backends for model in b.models}
        per_backend = {b.name: b.fallbacks for b in self.backends if b.fallbacks}
        return merge_chains(backend_of, self.fallbacks, per_backend)


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
