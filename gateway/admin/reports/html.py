"""The cache and cold-start reports as one self-contained HTML page.

Everything is inline: the CSS and the plots (SVG from `gateway.admin.reports.svg`, with the
browser's own tooltips, so no script at all). A Content-Security-Policy forbids every
fetch and every script, so the page stays offline and inert even if a value ever slipped
past escaping. Every value from a report is escaped (html.escape) before it reaches the page.
Reports arrive as plain dicts (their JSON form); missing keys and nulls read as "no data".

Over 400 lines: one self-contained page (markup, styles and every section's plot) with
no template engine; the plots themselves are in `svg.py`.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from gateway.admin.reports.svg import Point, Row, Segment, Series, hbars, histogram, line_plot

Fmt = Callable[[float], str]

HIT, MISS, NEAR, BYPASS, SEMANTIC = "#0f9d8a", "#ef8a3c", "#8a7fd6", "#b8bec7", "#5aa9e6"
NONE = "#6b7280"  # not cacheable: never looked up
PALETTE = ("#4c78a8", "#f58518", "#54a24b", "#b279a2", "#e45756", "#72b7b2", "#eeca3b")
WIDE = 1120  # viewBox width of a plot that spans the page, so its text keeps its size
EMPTY = "No data in this range"
MAX_START_ROWS = 25


def render(cache: dict[str, Any] | None, cold_start: dict[str, Any] | None) -> str:
    """The whole page; either report may be absent (not requested)."""
    sections = [_cache_section(cache), _cold_start_section(cold_start)]
    body = "".join(sections) or f'<p class="empty" data-empty="page">{EMPTY}</p>'
    head = _header(cache or cold_start or {})
    return _PAGE_HEAD + head + body + _PAGE_TAIL


# -- formatting ---------------------------------------------------------------------------


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _num(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        return None
    return float(value)


def _fmt(value: object, pattern: Fmt) -> str:
    number = _num(value)
    return "—" if number is None else pattern(number)


def _pct(value: object) -> str:
    return _fmt(value, lambda n: f"{n * 100:.1f}%")


def _int(value: object) -> str:
    return _fmt(value, lambda n: f"{round(n):,}")


def _usd(value: object) -> str:
    return _fmt(value, lambda n: f"${n:,.4f}" if 0 < n < 1 else f"${n:,.2f}")


def _ms(value: object) -> str:
    return _fmt(value, lambda n: f"{n:,.0f} ms" if n >= 10 else f"{n:.1f} ms")


def _secs(value: object) -> str:
    return _fmt(value, _seconds_text)


def _seconds_text(n: float) -> str:
    if n >= 3600:
        return f"{n / 3600:,.1f} h"
    if n >= 60:
        return f"{n / 60:.1f} min"
    return f"{n:.2f} s" if n < 10 else f"{n:.1f} s"


def _when(iso: object, short: bool = False) -> str:
    if not isinstance(iso, str):
        return "\u2014"
    try:
        moment = datetime.fromisoformat(iso)
    except ValueError:
        return iso
    return moment.strftime("%m-%d %H:%M" if short else "%Y-%m-%d %H:%M:%S %Z").strip()


def _compact(n: float) -> str:
    """Axis labels: 30000 reads as 30k, so that long bucket edges do not collide."""
    return f"{n / 1000:g}k" if n >= 1000 else f"{n:g}"


def _items(value: object) -> list[Mapping[str, Any]]:
    return [item for item in value if isinstance(item, Mapping)] if isinstance(value, list) else []


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


# -- page structure -----------------------------------------------------------------------


def _header(report: Mapping[str, Any]) -> str:
    span = _map(report.get("range"))
    filters = [f"{k}: {v}" for k, v in _map(report.get("filters")).items() if v not in (None, "")]
    scope = " · ".join(filters) or "all tenants and models"
    return (
        f'<header><h1>Gateway report</h1><p class="range">{_e(_when(span.get("since")))}'
        f' → {_e(_when(span.get("until")))}</p><p class="scope">{_e(scope)}</p></header>'
    )


def _section(title: str, kind: str, content: str) -> str:
    return f'<section data-report="{kind}"><h2>{_e(title)}</h2>{content}</section>'


def _tiles(tiles: Sequence[tuple[str, str, str]]) -> str:
    cells = "".join(
        f'<div class="tile"><div class="label">{_e(label)}</div>'
        f'<div class="value" data-headline="{_e(label)}">{_e(value)}</div>'
        f'<div class="sub">{_e(sub)}</div></div>'
        for label, value, sub in tiles
    )
    return f'<div class="tiles">{cells}</div>'


def _figure(title: str, plot_id: str, svg: str | None, note: str = "", wide: bool = False) -> str:
    content = svg or f'<p class="empty" data-plot="{plot_id}" data-empty="true">{EMPTY}</p>'
    caption = f'<p class="note">{_e(note)}</p>' if note else ""
    cls = "figure wide" if wide else "figure"
    return f'<figure class="{cls}"><figcaption>{_e(title)}</figcaption>{content}{caption}</figure>'


def _table(
    table_id: str, headers: Sequence[str], rows: Sequence[Sequence[str]], text_columns: int
) -> str:
    """A table whose first `text_columns` columns are words and the rest right-aligned numbers."""
    if not rows:
        return f'<p class="empty" data-table="{table_id}" data-empty="true">{EMPTY}</p>'

    def cells(tag: str, row: Sequence[str]) -> str:
        return "".join(
            f'<{tag} class="{"t" if i < text_columns else "n"}">{_e(c)}</{tag}>'
            for i, c in enumerate(row)
        )

    body = "".join(f"<tr>{cells('td', row)}</tr>" for row in rows)
    return (  # wide tables scroll sideways inside the page rather than widen it
        f'<div class="scroll"><table data-table="{table_id}"><thead><tr>{cells("th", headers)}'
        f"</tr></thead><tbody>{body}</tbody></table></div>"
    )


# -- cache --------------------------------------------------------------------------------


def _cache_section(report: Mapping[str, Any] | None) -> str:
    if report is None:
        return ""
    totals = _map(report.get("totals"))
    if not _num(totals.get("requests")):
        return _section("Cache", "cache", f'<p class="empty" data-empty="cache">{EMPTY}</p>')
    latency, similarity = _map(report.get("latency_histogram")), _map(report.get("similarity"))
    latency_series = [
        Series("hits", HIT, _counts(latency.get("hit"))),
        Series("misses", MISS, _counts(latency.get("miss"))),
    ]
    similarity_series = [
        Series("hits", HIT, _counts(similarity.get("hits"))),
        Series("near misses", NEAR, _counts(similarity.get("near_misses"))),
    ]
    figures = [
        _figure("Where requests went", "request-mix", _request_mix(totals), wide=True),
        _figure(
            "Hit rate over time",
            "hit-rate-over-time",
            _hit_rate_plot(_items(report.get("over_time"))),
            "Line: hit rate per bucket. Grey bars: requests per bucket.",
        ),
        _figure(
            "Latency of hits vs misses",
            "latency-histogram",
            _histogram_plot(
                "latency-histogram",
                latency.get("edges_ms"),
                latency_series,
                _compact,
                "ms",
            ),
            "Share of each group per latency bucket.",
        ),
        _figure(
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
    content = (
        _cache_tiles(totals, _map(report.get("latency_ms")), _items(report.get("by_tenant_model")))
        + '<div class="figures">'
        + "".join(figures)
        + "</div><h3>Top namespaces</h3>"
        + _namespaces_table(_items(report.get("top_namespaces")))
        + "<h3>By tenant and model</h3>"
        + _tenant_model_table(_items(report.get("by_tenant_model")), totals)
    )
    return _section("Cache", "cache", content)


def _cache_tiles(
    totals: Mapping[str, Any], latency: Mapping[str, Any], rows: list[Mapping[str, Any]]
) -> str:
    hit, miss = _map(latency.get("hit")), _map(latency.get("miss"))
    return _tiles(
        [
            ("Hit rate", _pct(totals.get("hit_rate")), f"{_int(totals.get('requests'))} requests"),
            ("Exact hits", _int(totals.get("exact_hits")), _pct(totals.get("exact_hit_rate"))),
            (
                "Semantic hits",
                _int(totals.get("semantic_hits")),
                _pct(totals.get("semantic_hit_rate")),
            ),
            ("Tokens saved", _int(totals.get("saved_tokens")), "not sent upstream"),
            ("Cost saved", *_cost_saved(totals, rows)),
            ("Hit latency p50", _ms(hit.get("p50")), f"p95 {_ms(hit.get('p95'))}"),
            ("Miss latency p50", _ms(miss.get("p50")), f"p95 {_ms(miss.get('p95'))}"),
        ]
    )


def _cost_saved(totals: Mapping[str, Any], rows: list[Mapping[str, Any]]) -> tuple[str, str]:
    """The dollars saved and a word on prices; "unpriced" rather than $0.00 when nothing
    saved was priced (hits only on models without a price, or no model in range has one)."""
    saved = _num(totals.get("saved_cost_usd"))
    unpriced = totals.get("unpriced_models")
    missing = [str(m) for m in unpriced] if isinstance(unpriced, list) else []
    nothing_priced = bool(rows) and not any(r.get("priced", True) for r in rows)
    sub = "no price for " + ", ".join(missing) if missing else "at configured prices"
    if not saved and (missing or nothing_priced):
        return "unpriced", sub if missing else "no price configured"
    return _usd(saved), sub


def _row_cost(row: Mapping[str, Any], unpriced: object) -> str:
    """A row's cost saved; "unpriced" rather than $0.00 for a model with no price."""
    if row.get("priced") is False or (isinstance(unpriced, list) and row.get("model") in unpriced):
        return "unpriced"
    return _usd(row.get("saved_cost_usd"))


def _request_mix(totals: Mapping[str, Any]) -> str | None:
    """Every request in one bar, by where it went; the bar is labelled with the sum of
    what it draws. A report without `not_cacheable` gets the remainder drawn as such."""
    looked = [
        ("exact hits", HIT, _num(totals.get("exact_hits")) or 0),
        ("semantic hits", SEMANTIC, _num(totals.get("semantic_hits")) or 0),
        ("misses", MISS, _num(totals.get("misses")) or 0),
        ("bypassed", BYPASS, _num(totals.get("bypassed")) or 0),
    ]
    rest = _num(totals.get("not_cacheable"))
    if rest is None:
        rest = max(0.0, (_num(totals.get("requests")) or 0) - sum(v for _, _, v in looked))
    parts = [*looked, ("not cacheable", NONE, rest)]
    drawn = sum(v for _, _, v in parts) or 1
    segments = [Segment(v, f"{name}: {_int(v)} ({_pct(v / drawn)})") for name, _, v in parts]
    row = Row("requests", segments, _int(sum(s.value for s in segments)))
    return hbars("request-mix", [row], [(n, c) for n, c, _ in parts], WIDE)


def _hit_rate_plot(buckets: list[Mapping[str, Any]]) -> str | None:
    points = []
    for bucket in buckets:
        when, rate = _when(bucket.get("start"), short=True), _num(bucket.get("hit_rate"))
        tip = f"{when}: hit rate {_pct(rate)}, {_int(bucket.get('requests'))} requests"
        points.append(Point(when, rate, _num(bucket.get("requests")) or 0, tip))
    return line_plot("hit-rate-over-time", points, HIT)


def _histogram_plot(
    plot_id: str, edges: object, series: list[Series], fmt: Fmt, unit: str
) -> str | None:
    buckets = max(len(s.counts) for s in series)
    labels = _bucket_labels(edges if isinstance(edges, list) else [], buckets, fmt)
    return histogram(plot_id, labels, series, unit) if buckets else None


def _counts(value: object) -> list[float]:
    return [_num(c) or 0 for c in value] if isinstance(value, list) else []


def _bucket_labels(edges: list[Any], buckets: int, fmt: Fmt) -> list[str]:
    """Labels for `buckets` bars whether the edges bound both sides or list upper bounds."""
    text = ["\u221e" if v is None else fmt(v) for v in (_num(e) for e in edges)]
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
        _int(r.get("requests")),
        _int(r.get("hits")),
        _pct(r.get("hit_rate")),
        _int(r.get("saved_tokens")),
    ]


def _namespaces_table(rows: list[Mapping[str, Any]]) -> str:
    cells = [[str(r.get("namespace", "")), *_usage_cells(r)] for r in rows]
    return _table("top-namespaces", ["Namespace", *_USAGE_HEADERS], cells, 3)


def _tenant_model_table(rows: list[Mapping[str, Any]], totals: Mapping[str, Any]) -> str:
    unpriced = totals.get("unpriced_models")
    cells = [[*_usage_cells(r), _row_cost(r, unpriced)] for r in rows]
    return _table("by-tenant-model", [*_USAGE_HEADERS, "Cost saved"], cells, 2)


# -- cold starts --------------------------------------------------------------------------


def _cold_start_section(report: Mapping[str, Any] | None) -> str:
    if report is None:
        return ""
    models, starts = _items(report.get("models")), _items(report.get("starts"))
    if not models and not starts:
        return _section(
            "Cold starts", "cold_start", f'<p class="empty" data-empty="cold_start">{EMPTY}</p>'
        )
    phases = [str(p) for p in report.get("phases") or [] if isinstance(p, str)]
    colors = [(p, PALETTE[i % len(PALETTE)]) for i, p in enumerate(phases)]
    recent = starts[-MAX_START_ROWS:]
    figures = [
        _figure(
            "Cold-start phases per model (mean)",
            "cold-start-phases",
            hbars(
                "cold-start-phases", [_phase_row(m.get("model"), m, phases) for m in models], colors
            ),
        ),
        _figure(
            f"Cold starts, one bar each (latest {len(recent)})",
            "cold-start-timeline",
            hbars("cold-start-timeline", [_start_row(s, phases) for s in recent], colors),
        ),
        _figure("Time to first token per model", "ttft-per-model", _ttft_plot(models)),
        _figure(
            "Time at zero, asleep and warm",
            "time-at-zero",
            _zero_plot(models),
            " ".join(str(n) for n in report.get("notes") or []),
        ),
    ]
    content = (
        _cold_tiles(report, models, starts)
        + '<div class="figures">'
        + "".join(figures)
        + "</div><h3>Per model</h3>"
        + _models_table(models)
    )
    return _section("Cold starts", "cold_start", content)


def _cold_tiles(
    report: Mapping[str, Any], models: list[Mapping[str, Any]], starts: list[Mapping[str, Any]]
) -> str:
    ttft = _overall_ttft(report, models, starts)

    def total(key: str) -> float:
        return sum(_num(m.get(key)) or 0 for m in models)

    return _tiles(
        [
            ("Cold starts", _int(total("cold_starts")), _started_sub(total)),
            ("TTFT p50", _secs(ttft.get("p50")), "cold start to first token"),
            ("TTFT p95", _secs(ttft.get("p95")), f"max {_secs(ttft.get('max'))}"),
            ("Requests that waited", _int(total("waited_requests")), "for a cold start"),
            ("Shed while cold", _int(total("shed_while_cold")), "refused with Retry-After"),
            ("GPU-hours saved", _fmt(total("gpu_hours_saved"), lambda n: f"{n:,.2f}"), "at zero"),
        ]
    )


def _started_sub(total: Callable[[str], float]) -> str:
    """Failed starts, and wakes from sleep where there were any (they are no starts)."""
    failed = f"{_int(total('failed'))} failed"
    return f"{failed}, {_int(total('wakes'))} wakes" if total("wakes") else failed


def _overall_ttft(
    report: Mapping[str, Any], models: list[Mapping[str, Any]], starts: list[Mapping[str, Any]]
) -> Mapping[str, Any]:
    """The report's own overall figures when it has them, else from the individual starts."""
    if isinstance(report.get("ttft_s"), Mapping):
        return _map(report.get("ttft_s"))
    if len(models) == 1:
        return _map(models[0].get("ttft_s"))
    values = sorted(v for v in (_num(s.get("ttft_s")) for s in starts) if v is not None)
    if not values:
        return {}

    def rank(q: float) -> float:  # nearest rank, as a person would count it
        return values[max(0, math.ceil(q * len(values)) - 1)]

    return {"p50": rank(0.5), "p95": rank(0.95), "max": values[-1]}


def _phase_row(label: object, item: Mapping[str, Any], phases: Sequence[str]) -> Row:
    spent = _map(item.get("phases_s"))
    segments = [Segment(_num(spent.get(p)) or 0, f"{p}: {_secs(spent.get(p))}") for p in phases]
    return Row(str(label), segments, _secs(sum(s.value for s in segments)))


def _start_row(start: Mapping[str, Any], phases: Sequence[str]) -> Row:
    row = _phase_row(
        f"{start.get('model', '')} · {_when(start.get('at'), short=True)}", start, phases
    )
    ttft = _num(start.get("ttft_s"))
    return Row(row.label, row.segments, _secs(ttft) if ttft is not None else row.total)


def _ttft_plot(models: list[Mapping[str, Any]]) -> str | None:
    rows = []
    for model in models:
        ttft = _map(model.get("ttft_s"))
        p50, p95, top = (_num(ttft.get(k)) or 0 for k in ("p50", "p95", "max"))
        segments = [
            Segment(p50, f"p50 {_secs(p50)}"),
            Segment(max(p95 - p50, 0), f"p95 {_secs(p95)}"),
            Segment(max(top - max(p95, p50), 0), f"max {_secs(top)}"),
        ]
        rows.append(Row(str(model.get("model", "")), segments, f"max {_secs(top)}"))
    legend = [("p50", PALETTE[0]), ("p95", "#9ecae9"), ("max", "#dfe3e8")]
    return hbars("ttft-per-model", rows, legend)


def _zero_plot(models: list[Mapping[str, Any]]) -> str | None:
    # Asleep only where a backend has a sleep tier; colours follow the legend's order.
    states = [("time_at_zero_s", "at zero", HIT), ("time_warm_s", "warm", MISS)]
    if any(_num(m.get("time_asleep_s")) for m in models):
        states.insert(1, ("time_asleep_s", "asleep", NEAR))
    rows = []
    for model in models:
        spent = [(_num(model.get(key)) or 0, name) for key, name, _ in states]
        whole = sum(seconds for seconds, _ in spent)
        share = spent[0][0] / whole if whole else 0
        segments = [Segment(seconds, f"{name}: {_secs(seconds)}") for seconds, name in spent]
        rows.append(Row(str(model.get("model", "")), segments, f"{_pct(share)} at zero"))
    return hbars("time-at-zero", rows, [(name, color) for _, name, color in states])


def _models_table(models: list[Mapping[str, Any]]) -> str:
    headers = ["Model", "Backend", "Cold starts", "Failed", "TTFT p50", "TTFT p95", "TTFT max"]
    headers += ["Waited", "Wait p50", "Wait p95", "Wait max", "Shed while cold", "Start estimate"]
    headers += ["GPU-h saved"]
    cells = []
    for m in models:
        ttft, wait = _map(m.get("ttft_s")), _map(m.get("wait_s"))
        cells.append(
            [str(m.get("model", "")), str(m.get("backend", ""))]
            + [_int(m.get(k)) for k in ("cold_starts", "failed")]
            + [_secs(ttft.get(k)) for k in ("p50", "p95", "max")]
            + [_int(m.get("waited_requests"))]
            + [_secs(wait.get(k)) for k in ("p50", "p95", "max")]
            + [_int(m.get("shed_while_cold")), _secs(m.get("start_estimate_s"))]
            + [_fmt(m.get("gpu_hours_saved"), lambda n: f"{n:.2f}")]
        )
    return _table("cold-start-models", headers, cells, 2)


_PAGE_HEAD = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Gateway report</title>
<style>
:root{--bg:#f5f6f8;--card:#fff;--fg:#1d2430;--muted:#667085;--grid:#e4e7ec;color-scheme:light dark}
@media (prefers-color-scheme:dark){:root{--bg:#12151b;--card:#1b2029;--fg:#e6e9ef;
--muted:#98a2b3;--grid:#2c3340}}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--fg);
font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif}
header,section{max-width:1180px;margin:0 auto;padding:20px 24px}
h1{margin:0;font-size:26px}h2{font-size:20px;margin:8px 0 12px}h3{font-size:16px;margin:22px 0 8px}
.range{margin:4px 0 0;font-weight:600}.scope,.note{color:var(--muted);margin:2px 0}
.note{font-size:13px}
.tiles{display:grid;grid-template-columns:repeat(auto-fill,minmax(150px,1fr));gap:12px}
.tile,.figure,table{background:var(--card);border-radius:10px;box-shadow:0 1px 3px #0002}
.tile{padding:12px 14px}.tile .label,.tile .sub{color:var(--muted);font-size:13px}
.tile .value{font-size:26px;font-weight:650;font-variant-numeric:tabular-nums}
.figures{display:grid;grid-template-columns:repeat(auto-fit,minmax(min(460px,100%),1fr));gap:14px;
margin-top:14px}
.figure{margin:0;padding:12px 14px}.figure.wide{grid-column:1/-1}
figcaption{font-weight:600;margin-bottom:6px}
svg{width:100%;height:auto;display:block}
svg text{font-size:11px;fill:var(--muted)}svg text.label{font-size:12px;fill:var(--fg)}
svg text.legend{font-size:12px;fill:var(--fg)}
svg .grid{stroke:var(--grid)}svg .mark:hover{opacity:.75}svg .volume{opacity:.35}
table{border-collapse:collapse;width:100%}.scroll{overflow-x:auto;border-radius:10px}
th,td{padding:7px 10px;border-bottom:1px solid var(--grid);font-variant-numeric:tabular-nums}
.t{text-align:left}.n{text-align:right}th{color:var(--muted);font-weight:600}
.empty{color:var(--muted);font-style:italic;padding:18px;text-align:center;
background:var(--card);border-radius:10px}
</style></head><body>
"""

_PAGE_TAIL = "\n</body></html>\n"
