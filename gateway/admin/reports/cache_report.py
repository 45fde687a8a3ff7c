"""The cache report: a pure function of request events (see `gateway.events.RequestEvent`).

Hits are the `exact`, `normalized` and `semantic` tiers; `exact_hits` counts the first
two (both are key matches, no similarity involved). Hit rates are over *lookups* (hits +
misses): requests that bypassed the cache (Cache-Control) or could not use it (not
cacheable, e.g. a high temperature) are counted apart and do not lower the rate. So are
requests answered 404 (an unknown model, or one that does not serve the endpoint, such as a
chat request to an embedding-only model): whatever their probe said, there was never an
answer to find, so they count as not cacheable, not as misses (see `outcome`).

A request answered by an identical request's upstream call (`coalesced`, gateway/coalesce.py)
is counted apart too: it was no lookup hit (no entry was there yet), but it saved what a hit
saves, so its tokens count in `saved_tokens` and `saved_cost_usd`.

A client's report of a bad hit (`POST /v1/cache/feedback`, recorded with cache `reported`)
is not a request: it counts in `reported_bad_hits` (those that deleted an entry), by
tenant and model and by namespace.

Similarity is bucketed from the semantic tier's search floor (`cache.decision`), below
which the tier sees no candidate at all.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cache.decision import DecisionSettings
from gateway.admin.reports.query import ReportQuery
from gateway.admin.reports.stats import histogram, iso, rate, summary
from gateway.settings import Price

# Miss reasons of lookups that gave up and let the request through (cache/semantic.py's
# Lookup.failed): the lookup budget ran out, the embedder was too busy to answer within
# it, the store failed, or something else did.
FAILED_OPEN = ("budget", "embedder_busy", "store", "error")

Record = dict[str, Any]
HIT_TIERS = frozenset({"exact", "normalized", "semantic"})
COALESCED = "coalesced"  # answered by an identical request's upstream call
SAVING = HIT_TIERS | {COALESCED}  # outcomes that spared the model a call
REPORTED = "reported"  # a bad-hit report's event (gateway.pipeline.cache_feedback)
LATENCY_EDGES_MS = [0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 30000, 60000]
SEARCH_FLOOR = DecisionSettings().similarity_floor  # no candidate is seen below it
SIMILARITY_STEP = 0.02
# Down from 1.00 to the floor (0.80 .. 1.00 by default), edges on round steps.
SIMILARITY_EDGES = [
    round(1 - SIMILARITY_STEP * i, 2)
    for i in range(math.ceil((1 - SEARCH_FLOOR) / SIMILARITY_STEP - 1e-9), -1, -1)
]
NOT_FOUND = 404
TOP_NAMESPACES = 20


@dataclass
class Tally:
    requests: int = 0
    hits: int = 0
    exact_hits: int = 0
    normalized_hits: int = 0
    semantic_hits: int = 0
    misses: int = 0
    bypassed: int = 0
    coalesced: int = 0
    not_cacheable: int = 0
    miss_reasons: dict[str, int] = field(default_factory=dict)  # "budget": failed open...
    saved_tokens: int = 0
    saved_cost_usd: float = 0.0
    reported_bad_hits: int = 0
    tenants: set[str] = field(default_factory=set)

    def add(self, event: Record, cost: float) -> None:
        if event.get("cache") == REPORTED:
            self.reported_bad_hits += 1
            return
        self.requests += 1
        tier = outcome(event)
        if tier in SAVING:
            self.saved_tokens += int(event.get("saved_tokens") or 0)
            self.saved_cost_usd += cost
        if tier in HIT_TIERS:
            self.hits += 1
            setattr(self, f"{tier}_hits", getattr(self, f"{tier}_hits") + 1)
        elif tier == COALESCED:
            self.coalesced += 1
        elif tier == "miss":
            self.misses += 1
            reason = str(event.get("miss_reason") or "unknown")  # events from before it was kept
            self.miss_reasons[reason] = self.miss_reasons.get(reason, 0) + 1
        elif tier == "bypass":
            self.bypassed += 1
        else:
            self.not_cacheable += 1
        if event.get("tenant"):
            self.tenants.add(str(event["tenant"]))

    @property
    def lookups(self) -> int:
        return self.hits + self.misses


def outcome(event: Record) -> str:
    """The cache outcome the report counts: the event's, except that a request answered 404
    never reached a lookup that could have answered it ("none", not cacheable)."""
    cache = event.get("cache")
    if event.get("status") == NOT_FOUND or not isinstance(cache, str):
        return "none"
    return cache


def selected(events: Iterable[Record], query: ReportQuery) -> list[Record]:
    return [
        e
        for e in events
        if (query.tenant is None or e.get("tenant") == query.tenant)
        and (query.model is None or e.get("model") == query.model)
    ]


def cache_report(
    events: list[Record], query: ReportQuery, pricing: Mapping[str, Price]
) -> dict[str, Any]:
    # A report that deleted nothing (an unknown id) says nothing about the cache.
    events = [e for e in events if e.get("cache") != REPORTED or e.get("status") == 200]
    costs = [saved_cost(e, pricing) for e in events]
    total = Tally()
    for event, cost in zip(events, costs, strict=True):
        total.add(event, cost)
    priced = {str(e.get("model")) for e in events if e.get("model") in pricing}
    unpriced = {str(e.get("model")) for e in events if outcome(e) in SAVING} - priced
    return {
        "kind": "cache",
        "range": {"since": iso(query.start), "until": iso(query.end)},
        "filters": {"tenant": query.tenant, "model": query.model},
        "bucket_s": query.bucket_width(),
        "totals": _totals(total) | {"unpriced_models": sorted(unpriced)},
        "latency_ms": _latency(events),
        "latency_histogram": _latency_histogram(events),
        "over_time": _over_time(events, query),
        "top_namespaces": _top_namespaces(events, costs),
        "similarity": _similarity(events),
        "by_tenant_model": _by_tenant_model(events, costs, pricing),
    }


def saved_cost(event: Record, pricing: Mapping[str, Price]) -> float:
    price = pricing.get(str(event.get("model")))
    if price is None or outcome(event) not in SAVING:
        return 0.0
    prompt = int(event.get("saved_prompt_tokens") or 0)
    completion = int(event.get("saved_completion_tokens") or 0)
    return (prompt * price.input_per_1m_tokens + completion * price.output_per_1m_tokens) / 1e6


def _totals(t: Tally) -> dict[str, Any]:
    return {
        "requests": t.requests,
        "lookups": t.lookups,
        "hits": t.hits,
        "exact_hits": t.exact_hits + t.normalized_hits,
        "normalized_hits": t.normalized_hits,
        "semantic_hits": t.semantic_hits,
        "misses": t.misses,
        # why they missed; FAILED_OPEN are lookups that failed open
        "miss_reasons": dict(sorted(t.miss_reasons.items())),
        "failed_open": sum(t.miss_reasons.get(r, 0) for r in FAILED_OPEN),
        "failed_open_budget": t.miss_reasons.get("budget", 0),
        "bypassed": t.bypassed,
        "coalesced": t.coalesced,
        "not_cacheable": t.not_cacheable,
        "hit_rate": rate(t.hits, t.lookups),
        "exact_hit_rate": rate(t.exact_hits + t.normalized_hits, t.lookups),
        "semantic_hit_rate": rate(t.semantic_hits, t.lookups),
        "saved_tokens": t.saved_tokens,
        "saved_cost_usd": round(t.saved_cost_usd, 6),
        "reported_bad_hits": t.reported_bad_hits,
    }


def _latencies(events: list[Record], hit: bool) -> list[float]:
    wanted = HIT_TIERS if hit else {"miss"}
    return [float(e["latency_ms"]) for e in events if outcome(e) in wanted]


def _latency(events: list[Record]) -> dict[str, Any]:
    report: dict[str, Any] = {}
    for name, hit in (("hit", True), ("miss", False)):
        values = _latencies(events, hit)
        report[name] = {"count": len(values), **summary(values)}
    return report


def _latency_histogram(events: list[Record]) -> dict[str, Any]:
    return {
        "edges_ms": LATENCY_EDGES_MS,
        "hit": histogram(_latencies(events, True), LATENCY_EDGES_MS),
        "miss": histogram(_latencies(events, False), LATENCY_EDGES_MS),
    }


def _over_time(events: list[Record], query: ReportQuery) -> list[dict[str, Any]]:
    width = query.bucket_width()
    first = query.start // width * width  # buckets on round times (whole 5 minutes, ...)
    count = max(1, math.ceil((query.end - first) / width))
    buckets = [Tally() for _ in range(count)]
    for event in events:
        index = min(count - 1, int((float(event["ts"]) - first) // width))
        buckets[index].add(event, 0.0)
    return [
        {
            "start": iso(first + i * width),
            "requests": b.requests,
            "lookups": b.lookups,
            "hits": b.hits,
            "hit_rate": rate(b.hits, b.lookups),
        }
        for i, b in enumerate(buckets)
    ]


def _top_namespaces(events: list[Record], costs: list[float]) -> list[dict[str, Any]]:
    groups: dict[tuple[str, str], Tally] = defaultdict(Tally)
    for event, cost in zip(events, costs, strict=True):
        if event.get("namespace"):
            groups[(str(event["namespace"]), str(event.get("model")))].add(event, cost)
    ranked = sorted(groups.items(), key=lambda item: (-item[1].requests, -item[1].hits))
    return [
        {
            "namespace": namespace,
            "tenant": ", ".join(sorted(t.tenants)),  # several when a cache group shares it
            "model": model,
            "requests": t.requests,
            "hits": t.hits,
            "hit_rate": rate(t.hits, t.lookups),
            "saved_tokens": t.saved_tokens,
            "reported_bad_hits": t.reported_bad_hits,
        }
        for (namespace, model), t in ranked[:TOP_NAMESPACES]
    ]


def _similarity(events: list[Record]) -> dict[str, Any]:
    hits = [float(e["similarity"]) for e in events if _scored(e, "semantic")]
    near = [float(e["similarity"]) for e in events if _scored(e, "miss")]
    return {
        "edges": SIMILARITY_EDGES,
        "hits": histogram(hits, SIMILARITY_EDGES),
        "near_misses": histogram(near, SIMILARITY_EDGES),
    }


def _scored(event: Record, tier: str) -> bool:
    return outcome(event) == tier and isinstance(event.get("similarity"), int | float)


def _by_tenant_model(
    events: list[Record], costs: list[float], pricing: Mapping[str, Price]
) -> list[dict[str, Any]]:
    groups: dict[tuple[str, str], Tally] = defaultdict(Tally)
    for event, cost in zip(events, costs, strict=True):
        groups[(str(event.get("tenant") or "-"), str(event.get("model") or "-"))].add(event, cost)
    return [
        {
            "tenant": tenant,
            "model": model,
            "requests": t.requests,
            "hits": t.hits,
            "hit_rate": rate(t.hits, t.lookups),
            "saved_tokens": t.saved_tokens,
            "saved_cost_usd": round(t.saved_cost_usd, 6),
            "reported_bad_hits": t.reported_bad_hits,
            "priced": model in pricing,  # else the cost saved is unknown, not zero
        }
        for (tenant, model), t in sorted(groups.items())
    ]
