"""A backend's settings: where it is, how it starts and scales, how much it takes at once
(`backends[]` in the configuration; README "Configuration reference"). Part of the one
settings tree (`gateway.settings`, which re-exports every name here)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, StringConstraints, field_validator, model_validator

from gateway.settings_types import Name, Strict
from warmpool.schedule import MAX_WINDOW_S, Schedule, Window, parse_cron, time_zone


class Timeouts(Strict):
    connect_s: float = Field(default=5.0, gt=0)
    # Time to the first byte of the answer, and then between two reads of a stream.
    read_s: float = Field(default=300.0, gt=0)
    total_s: float | None = Field(default=None, gt=0)
    # A pooled connection idle this long is closed by the gateway. Under the server's own
    # keep-alive (uvicorn's, so vLLM's and SGLang's: 5 s), so that the gateway closes
    # first: a connection reused just as the server closes it fails the request, which
    # then costs a retry (backends/http.py).
    idle_s: float = Field(default=4.0, gt=0)


class Launch(Strict):
    """A local process the gateway starts with itself and stops with itself.

    `{port}` in `command` and in the backend's `base_url` is replaced by `port`, or by a
    free loopback port when `port` is 0; `{python}` by the gateway's own interpreter.
    """

    command: list[str] = Field(min_length=1)
    port: int = Field(default=0, ge=0, le=65535)
    ready_path: str = "/health"
    start_timeout_s: float = Field(default=180.0, gt=0)
    env: dict[str, str] = Field(default_factory=dict)
    # n: the process (and its children) runs on the gateway's first n CPUs, where the
    # gateway has more than n, and leaves it the rest; None: on all of them. vLLM's CPU
    # build busy-polls in two processes: on two cores, unpinned, its streams stalled for
    # seconds (docs/measurements.md, "`make run-vllm` on two cores").
    cpus: int | None = Field(default=None, ge=1)


class Weights(Strict):
    """Where a backend's weights live, and when they are staged to local disk."""

    uri: Annotated[str, StringConstraints(pattern=r"^s3://[^/]+(/.*)?$")]
    # `always`: staged at gateway start and never evicted; `on_demand`: at first use.
    staged: Literal["always", "on_demand"] = "on_demand"


class ScheduleWindow(Strict):
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


class Scaling(Strict):
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


class KubernetesTarget(Strict):
    server: str  # the API server URL
    token: SecretStr  # a service account token (RBAC: deployments/scale on this target)
    namespace: str
    deployment: str
    service: str  # whose EndpointSlices list the ready pods
    port: int | None = None
    ca_file: Path | None = None


class RetrySettings(Strict):
    """Retries before the first byte (see README "Traffic control"); per backend or for all."""

    max_attempts: int = Field(default=3, ge=1, le=10)  # the first attempt included
    base_s: float = Field(default=0.05, ge=0)  # full-jitter backoff: uniform below base * 2^n
    cap_s: float = Field(default=2.0, ge=0)  # ... and below this
    max_retry_after_s: float = Field(default=2.0, ge=0)  # a longer Retry-After is relayed


class Concurrency(Strict):
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
    # With engine: none, time to first token may reach this multiple of its baseline before
    # the limit is cut (docs/learned-capacity.md "Learned capacity": why 3).
    latency_tolerance: float = Field(default=3.0, ge=1.1, le=10)


class Backend(Strict):
    name: Name
    # http: a static upstream at base_url; process: workers the gateway starts itself
    # (`command`); kubernetes: a Deployment scaled through the API.
    kind: Literal["http", "process", "kubernetes"] = "http"
    base_url: str = ""
    # http: more replicas of the same server, each its own base URL (with base_url: more).
    base_urls: list[str] = Field(default_factory=list)
    # A session's or prompt prefix's requests go to one replica while it has room, for its
    # engine's prefix cache (gateway/traffic/affinity.py); else the one with most headroom.
    affinity: bool = True
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
    # The backend serves Anthropic's `/v1/messages` itself (vLLM does): Messages requests
    # go to it as the client sent them, instead of translated to chat completions. Not
    # cached nor coalesced; see docs/agent-apis.md "Pass-through".
    native_messages: bool = False
    # vLLM started with `--long-prefill-token-threshold N` (a request computes at most N
    # prompt tokens a step): lower-class dispatches are paced a step per N prompt tokens,
    # so their prompts do not prefill side by side (docs/traffic-control.md "Batch beside
    # interactive traffic"). None: a prompt is one step.
    prefill_chunk_tokens: int | None = Field(default=None, ge=1, le=2**31 - 1)
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
    # Its models' requests whose estimated prompt is above this many tokens come here, the
    # rest to the model's backend without it (gateway/prompt_size.py). None: it takes all.
    prompt_tokens_above: int | None = Field(default=None, ge=1, le=2**31 - 1)

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        return _url(value)

    @field_validator("base_urls")
    @classmethod
    def _http_urls(cls, values: list[str]) -> list[str]:
        return [_url(value) for value in values]

    @model_validator(mode="after")
    def _kind_needs(self) -> Backend:
        if self.kind == "http" and not (self.base_url or self.base_urls):
            raise ValueError("an http backend needs base_url (or base_urls)")
        if self.base_urls and (self.kind != "http" or self.launch is not None):
            raise ValueError("base_urls is for http backends the gateway does not launch")
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
        if "latency_tolerance" in self.concurrency.model_fields_set and self.engine != "none":
            raise ValueError(
                "concurrency.latency_tolerance applies only with engine: none (an engine "
                "whose metrics are read is limited by them alone)"
            )
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


def _url(value: str) -> str:
    if value and not value.startswith(("http://", "https://")):
        raise ValueError("must start with http:// or https://")
    return value.rstrip("/")
