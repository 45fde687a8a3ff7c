"""The cache report's section of the HTML page: headline tiles, where requests went, hit
rate over time, latency and similarity histograms, and the namespace and tenant tables.

`cache_section(report)` takes the report's JSON form (`gateway.admin.reports.cache_report`);
the page around it is `gateway.admin.reports.html`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.admin.reports.html_blocks import (
    BYPASS,
    EMPTY,
    HIT,
    MISS,
    NEAR,
    NONE,
    SEMANTIC,
    WIDE,
    Fmt,
    compact,
    figure,
    integer,
    items,
    mapping,
    ms,
    num,
    pct,
    section,
    table,
    tiles,
    usd,
    when,
)
from gateway.admin.reports.svg import Point, Row, Segment, Series, hbars, histogram, line_plot


def cache_section(report: Mapping[str, Any] | None) -> str:
    if report is None:
        return ""
    totals = mapping(report.get("totals"))
    if not num(totals.get("requests")):
        return section("Cache", "cache", f'<p class="empty" data-empty="cache">{EMPTY}</p>')
    latency = mapping(report.get("latency_histogram"))
    similarity = mapping(report.get("similarity"))
    latency_series = [
        Series("hits", HIT, _counts(latency.get("hit"))),
        Series("misses", MISS, _counts(latency.get("miss"))),
    ]
    similarity_series = [
        Series("hits", HIT, _counts(similarity.get("hits"))),
        Series("near misses", NEAR, _counts(similarity.get("near_misses"))),
    ]
    figures = [
        figure("Where requests went", "request-mix", _request_mix(totals), wide=True),
        figure(
            "Hit rate over time",
            "hit-rate-over-time",
            _hit_rate_plot(items(report.get("over_time"))),
            "Line: hit rate per bucket. Grey bars: requests per bucket.",
        ),
        figure(
            "Latency of hits vs misses",
            "latency-histogram",
            _histogram_plot(
                "latency-histogram",
                latency.get("edges_ms"),
                latency_series,
                compact,
                "ms",
            ),
            "Share of each group per latency bucket.",
        ),
        figure(
            "Similarity of hits and near misses",
            "similarity",
            _histogram_plot(
                "similarity",
                similarity.get("edges"),
                similarity_series,
                lambda n: f"{n:.2f}",
                "cosine similarity",
            ),
            "Near misses crowding just under the hits suggest the threshold is worth a look.",
        ),
    ]
    by_tenant_model = items(report.get("by_tenant_model"))
    content = (
        _cache_tiles(totals, mapping(report.get("latency_ms")), by_tenant_model)
        + '<div class="figures">'
        + "".join(figures)
        + "</div><h3>Top namespaces</h3>"
        + _namespaces_table(items(report.get("top_namespaces")))
        + "<h3>By tenant and model</h3>"
        + _tenant_model_table(by_tenant_model, totals)
    )
    return section("Cache", "cache", content)


def _cache_tiles(
    totals: Mapping[str, Any], latency: Mapping[str, Any], rows: list[Mapping[str, Any]]
) -> str:
    hit, miss = mapping(latency.get("hit")), mapping(latency.get("miss"))
    return tiles(
        [
            (
                "Hit rate",
                pct(totals.get("hit_rate")),
                f"{integer(totals.get('requests'))} requests",
            ),
            ("Exact hits", integer(totals.get("exact_hits")), pct(totals.get("exact_hit_rate"))),
            (
                "Semantic hits",
                integer(totals.get("semantic_hits")),
                pct(totals.get("semantic_hit_rate")),
            ),
            ("Tokens saved", integer(totals.get("saved_tokens")), "not sent upstream"),
            ("Cost saved", *_cost_saved(totals, rows)),
            ("Hit latency p50", ms(hit.get("p50")), f"p95 {ms(hit.get('p95'))}"),
            ("Miss latency p50", ms(miss.get("p50")), f"p95 {ms(miss.get('p95'))}"),
        ]
    )


def _cost_saved(totals: Mapping[str, Any], rows: list[Mapping[str, Any]]) -> tuple[str, str]:
    """The dollars saved and a word on prices; "unpriced" rather than $0.00 when nothing
    saved was priced (hits only on models without a price, or no model in range has one)."""
    saved = num(totals.get("saved_cost_usd"))
    unpriced = totals.get("unpriced_models")
    missing = [str(m) for m in unpriced] if isinstance(unpriced, list) else []
    nothing_priced = bool(rows) and not any(r.get("priced", True) for r in rows)
    sub = "no price for " + ", ".join(missing) if missing else "at configured prices"
    if not saved and (missing or nothing_priced):
        return "unpriced", sub if missing else "no price configured"
    return usd(saved), sub


def _row_cost(row: Mapping[str, Any], unpriced: object) -> str:
    """A row's cost saved; "unpriced" rather than $0.00 for a model with no price."""
    if row.get("priced") is False or (isinstance(unpriced, list) and row.get("model") in unpriced):
        return "unpriced"
    return usd(row.get("saved_cost_usd"))


def _request_mix(totals: Mapping[str, Any]) -> str | None:
    """Every request in one bar, by where it went; the bar is labelled with the sum of
    what it draws. A report without `not_cacheable` gets the remainder drawn as such."""
    looked = [
        ("exact hits", HIT, num(totals.get("exact_hits")) or 0),
        ("semantic hits", SEMANTIC, num(totals.get("semantic_hits")) or 0),
        ("misses", MISS, num(totals.get("misses")) or 0),
        ("bypassed", BYPASS, num(totals.get("bypassed")) or 0),
    ]
    rest = num(totals.get("not_cacheable"))
    if rest is None:
        rest = max(0.0, (num(totals.get("requests")) or 0) - sum(v for _, _, v in looked))
    parts = [*looked, ("not cacheable", NONE, rest)]
    drawn = sum(v for _, _, v in parts) or 1
    segments = [Segment(v, f"{name}: {integer(v)} ({pct(v / drawn)})") for name, _, v in parts]
    row = Row("requests", segments, integer(sum(s.value for s in segments)))
    return hbars("request-mix", [row], [(n, c) for n, c, _ in parts], WIDE)


def _hit_rate_plot(buckets: list[Mapping[str, Any]]) -> str | None:
    points = []
    for bucket in buckets:
        start, rate = when(bucket.get("start"), short=True), num(bucket.get("hit_rate"))
        tip = f"{start}: hit rate {pct(rate)}, {integer(bucket.get('requests'))} requests"
        points.append(Point(start, rate, num(bucket.get("requests")) or 0, tip))
    return line_plot("hit-rate-over-time", points, HIT)


def _histogram_plot(
    plot_id: str, edges: object, series: list[Series], fmt: Fmt, unit: str
) -> str | None:
    buckets = max(len(s.counts) for s in series)
    labels = _bucket_labels(edges if isinstance(edges, list) else [], buckets, fmt)
    return histogram(plot_id, labels, series, unit) if buckets else None


def _counts(value: object) -> list[float]:
    return [num(c) or 0 for c in value] if isinstance(value, list) else []


def _bucket_labels(edges: list[Any], buckets: int, fmt: Fmt) -> list[str]:
    """Labels for `buckets` bars whether the edges bound both sides or list upper bounds."""
    text = ["\u221e" if v is None else fmt(v) for v in (num(e) for e in edges)]
    if len(text) == buckets + 1:
        return [f"{text[i]}\u2013{text[i + 1]}" for i in range(buckets)]
    uppers = [f"\u2264{t}" for t in text[:buckets]]
    if len(uppers) < buckets and text:
        uppers.append(f">{text[-1]}")
    return uppers + [f"#{i + 1}" for i in range(len(uppers), buckets)]


# The columns both cache tables share, headers and cells in the same order.
_USAGE_HEADERS = ["Tenant", "Model", "Requests", "Hits", "Hit rate", "Tokens saved"]


def _usage_cells(r: Mapping[str, Any]) -> list[str]:
    return [
        str(r.get("tenant", "")),
        str(r.get("model", "")),
        integer(r.get("requests")),
        integer(r.get("hits")),
        pct(r.get("hit_rate")),
        integer(r.get("saved_tokens")),
    ]


def _namespaces_table(rows: list[Mapping[str, Any]]) -> str:
    cells = [[str(r.get("namespace", "")), *_usage_cells(r)] for r in rows]
    return table("top-namespaces", ["Namespace", *_USAGE_HEADERS], cells, 3)


def _tenant_model_table(rows: list[Mapping[str, Any]], totals: Mapping[str, Any]) -> str:
    unpriced = totals.get("unpriced_models")
    cells = [[*_usage_cells(r), _row_cost(r, unpriced)] for r in rows]
    return table("by-tenant-model", [*_USAGE_HEADERS, "Cost saved"], cells, 2)
