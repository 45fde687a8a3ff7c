"""The cold-start report: a pure function of cold-start timelines (`warmpool.timeline`),
scale events and request events (see `gateway.events`).

Phases of one start, from its timeline's events:

    staging        staging_begun → staging_done           (weights copied to local disk)
    process_start  staging_done, else the first event → the first process_started
    weight_load    the last process_started → ready       (loading, and the readiness probe)
    wake           wake_begun → ready                     (a wake: an asleep replica woken)
    first_byte     ready → first_byte                     (the first waiting request's answer)

and, inside weight_load, where the engine says its start went (`engine_*`: a vLLM process
replica's imports and processes, weights, compile and warm-up, KV cache and API server,
read from its own log by backends/vllm_startup.py): a 70 s start whose weights took 0.06 s
is fixed by caching the compilation, not by faster storage.

Time to first token is the first event → first_byte, for starts a request waited for.
The start estimate is the one the gateway learns (warmpool.start_estimate): the median
time to ready of the backend's last starts in the range; it refuses requests whose
deadline is shorter, and sets the default deadline of held requests from it.
Wakes (timelines of `kind: "wake"`, warmpool.sleep) are counted and timed apart from
starts: `wakes`, `wake_ttft_s`. Time at zero, asleep and warm follows the scale events:
from the first one seen, until `until` (or now). GPU-hours saved count time at zero only
(one GPU per replica): an asleep replica still holds its process, and its GPU's place.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from gateway.admin.reports.query import ReportQuery
from gateway.admin.reports.stats import iso, mean, percentile
from gateway.settings import Settings
from warmpool.start_estimate import StartTimes, ready_seconds

Record = dict[str, Any]
PHASES = ["staging", "process_start", "weight_load", "wake", "first_byte"]
# Inside weight_load, where the engine says its start went (a vLLM process replica: read
# from its log, backends/vllm_startup.py); listed only for backends that report them.
ENGINE_PHASES = [
    "engine_imports_and_processes",
    "engine_weights",
    "engine_compile_and_warmup",
    "engine_kv_cache",
    "engine_api_server",
]
# Said beside the figures wherever time asleep is reported.
ASLEEP_NOTE = (
    "Asleep (vLLM sleep level 1): the weights wait in host RAM (about the model's size, "
    "per replica) and the GPU's memory is free, but the replica's process (or pod) and "
    "its GPU stay allocated: no GPU-hours are saved while asleep, only while at zero."
)
MAX_STARTS = 500  # the most recent starts listed one by one


def start_time(record: Record) -> float | None:
    begun = record.get("begun_at")
    if isinstance(begun, int | float):
        return float(begun)
    times = [e.get("at") for e in record.get("events") or [] if isinstance(e, dict)]
    valid = [float(t) for t in times if isinstance(t, int | float)]
    return min(valid) if valid else None


def phases_of(record: Record) -> tuple[dict[str, float], float | None]:
    """(seconds per phase seen, time to first token or None)."""
    events = [(str(e["event"]), float(e["at"])) for e in record.get("events") or []]
    first: dict[str, float] = {}
    for name, at in events:
        first.setdefault(name, at)
    phases: dict[str, float] = {}
    begun = min((at for _, at in events), default=None)
    if "staging_begun" in first and "staging_done" in first:
        phases["staging"] = first["staging_done"] - first["staging_begun"]
    if "wake_begun" in first and "ready" in first:
        phases["wake"] = first["ready"] - first["wake_begun"]
    launched = first.get("process_started")
    origin = first.get("staging_done", begun)
    if launched is not None and origin is not None and origin <= launched:
        phases["process_start"] = launched - origin
    ready = first.get("ready")
    launches = [at for name, at in events if name == "process_started" and ready and at <= ready]
    if ready is not None and launches:
        phases["weight_load"] = ready - launches[-1]
    served = first.get("first_byte")
    if served is not None and ready is not None:
        phases["first_byte"] = served - ready
    ttft = served - begun if served is not None and begun is not None else None
    reported = record.get("phases")
    if isinstance(reported, dict):
        phases |= {k: float(v) for k, v in reported.items() if k in ENGINE_PHASES and _number(v)}
    return {k: round(v, 3) for k, v in phases.items()}, ttft


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass
class Row:
    backend: str
    models: list[str]
    starts: int = 0
    failed: int = 0
    ttft: list[float] = field(default_factory=list)
    phases: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    waits: list[float] = field(default_factory=list)
    shed_while_cold: int = 0
    ready_s: list[float] = field(default_factory=list)  # each start's time to ready, in order
    at_zero_s: float = 0.0
    warm_s: float = 0.0
    wakes: int = 0
    failed_wakes: int = 0
    wake_ttft: list[float] = field(default_factory=list)
    asleep_s: float = 0.0

    def as_json(self) -> dict[str, Any]:
        return {
            "model": ", ".join(self.models) or self.backend,
            "models": self.models,
            "backend": self.backend,
            "cold_starts": self.starts,
            "failed": self.failed,
            "ttft_s": _spread(self.ttft),
            "phases_s": {p: mean(self.phases[p]) for p in PHASES}
            | {p: mean(self.phases[p]) for p in ENGINE_PHASES if self.phases.get(p)},
            "waited_requests": len(self.waits),
            "wait_s": _spread(self.waits),
            "shed_while_cold": self.shed_while_cold,
            "start_estimate_s": _r(StartTimes(self.ready_s).estimate_s()),
            "wakes": self.wakes,
            "failed_wakes": self.failed_wakes,
            "wake_ttft_s": _spread(self.wake_ttft),
            "time_at_zero_s": round(self.at_zero_s, 3),
            "time_asleep_s": round(self.asleep_s, 3),
            "time_warm_s": round(self.warm_s, 3),
            "gpu_hours_saved": round(self.at_zero_s / 3600, 4),
        }


def _spread(values: list[float]) -> dict[str, float | None]:
    top = max(values) if values else None
    return {
        "p50": _r(percentile(values, 50)),
        "p95": _r(percentile(values, 95)),
        "max": _r(top),
    }


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def cold_start_report(
    settings: Settings,
    query: ReportQuery,
    starts: list[Record],
    scale: list[Record],
    requests: list[Record],
    now: float | None = None,
) -> dict[str, Any]:
    rows = _rows(settings, query, starts, scale, requests, time.time() if now is None else now)
    listed = _listed_starts(starts, rows)
    return {
        "kind": "cold_start",
        "range": {"since": iso(query.start), "until": iso(query.end)},
        "filters": {"tenant": query.tenant, "model": query.model},
        "phases": PHASES,
        "notes": [ASLEEP_NOTE] if any(r.wakes or r.asleep_s for r in rows.values()) else [],
        "models": [rows[name].as_json() for name in sorted(rows)],
        "starts": listed[-MAX_STARTS:],
    }


def _rows(
    settings: Settings,
    query: ReportQuery,
    starts: list[Record],
    scale: list[Record],
    requests: list[Record],
    now: float,
) -> dict[str, Row]:
    served = {b.name: list(b.models) for b in settings.backends}
    wanted = _backends_wanted(settings, query)
    rows = {name: Row(name, served[name]) for name in wanted if name in served}
    rows.update(_scalable_rows(settings, wanted))

    def row(backend: str) -> Row | None:
        if backend not in wanted and query.model is not None:
            return None
        return rows.setdefault(backend, Row(backend, served.get(backend, [])))

    for record in starts:
        if record.get("outcome") != "closed" and (r := row(str(record.get("backend")))):
            _add_start(r, record)
    for event in requests:  # only backends that scale (the rows made above)
        if (r := rows.get(str(event.get("backend")))) is not None:
            _add_request(r, event, query)
    _add_scale_time(scale, query, row, now)
    return rows


def _backends_wanted(settings: Settings, query: ReportQuery) -> set[str]:
    if query.model is None:
        return {b.name for b in settings.backends if b.kind != "http"}
    return {b.name for b in settings.backends if query.model in b.models}


def _scalable_rows(settings: Settings, wanted: set[str]) -> dict[str, Row]:
    return {
        b.name: Row(b.name, list(b.models))
        for b in settings.backends
        if b.kind != "http" and b.name in wanted
    }


def _add_start(row: Row, record: Record) -> None:
    if record.get("kind") == "wake":
        _add_wake(row, record)
        return
    row.starts += 1
    if record.get("outcome") == "failed":
        row.failed += 1
        return
    phases, ttft = phases_of(record)
    for name, seconds in phases.items():
        row.phases[name].append(seconds)
    if (ready := ready_seconds(record)) is not None:
        row.ready_s.append(ready)
    if ttft is not None:
        row.ttft.append(ttft)


def _add_wake(row: Row, record: Record) -> None:
    row.wakes += 1
    if record.get("outcome") == "failed":
        row.failed_wakes += 1
        return
    phases, ttft = phases_of(record)
    for name, seconds in phases.items():
        row.phases[name].append(seconds)
    if ttft is not None:
        row.wake_ttft.append(ttft)


def _add_request(row: Row, event: Record, query: ReportQuery) -> None:
    if query.tenant is not None and event.get("tenant") != query.tenant:
        return
    if query.model is not None and event.get("model") != query.model:
        return
    if isinstance(event.get("cold_wait_ms"), int | float):
        row.waits.append(float(event["cold_wait_ms"]) / 1000)
    if event.get("refused") and event.get("at_zero"):
        row.shed_while_cold += 1


def _add_scale_time(scale: list[Record], query: ReportQuery, row: Any, now: float) -> None:
    until = min(query.end, now)
    by_backend: dict[str, list[Record]] = defaultdict(list)
    for event in scale:
        by_backend[str(event.get("backend"))].append(event)
    for backend, events in by_backend.items():
        target = row(backend)
        if target is not None:
            spent = split_time(events, query.start, until)
            target.at_zero_s += spent["zero"]
            target.asleep_s += spent["asleep"]
            target.warm_s += spent["warm"]


def split_time(events: list[Record], since: float, until: float) -> dict[str, float]:
    """Seconds at zero, asleep and warm within [since, until), from the events' sequence
    of states (those before `since` give the state it began in; unknown before the first
    event). Warm: replicas ready; asleep: none ready, some asleep; zero: none at all."""
    spent = {"zero": 0.0, "asleep": 0.0, "warm": 0.0}
    state: str | None = None
    mark = since
    for event in sorted(events, key=lambda e: float(e["ts"])):
        at = float(event["ts"])
        if at >= until:
            break
        if at > since and state is not None:
            spent[state] += at - mark
        state = _state(event)
        mark = max(at, since)
    if state is not None and until > mark:
        spent[state] += until - mark
    return spent


def _state(event: Record) -> str:
    if int(event.get("ready") or 0) > 0:
        return "warm"
    return "asleep" if int(event.get("asleep") or 0) > 0 else "zero"


def _listed_starts(starts: list[Record], rows: dict[str, Row]) -> list[dict[str, Any]]:
    listed = []
    for record in starts:
        backend = str(record.get("backend"))
        if backend not in rows or record.get("outcome") == "closed":
            continue
        at = start_time(record)
        phases, ttft = phases_of(record)
        listed.append(
            {
                "at": iso(at) if at is not None else None,
                "model": ", ".join(rows[backend].models) or backend,
                "backend": backend,
                "trigger": record.get("trigger"),
                "kind": record.get("kind", "start"),
                "outcome": record.get("outcome"),
                "ttft_s": _r(ttft),
                "phases_s": phases,
            }
        )
    return listed
