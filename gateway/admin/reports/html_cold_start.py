"""The cold-start report's section of the HTML page: headline tiles, the phases of each
model's starts and of the latest starts one by one, time to first token, time at zero, and
the per-model table.

`cold_start_section(report)` takes the report's JSON form
(`gateway.admin.reports.cold_start_report`); the page around it is `gateway.admin.reports.html`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gateway.admin.reports.html_blocks import (
    EMPTY,
    HIT,
    MISS,
    NEAR,
    PALETTE,
    figure,
    fmt,
    integer,
    items,
    mapping,
    num,
    pct,
    secs,
    section,
    table,
    tiles,
    when,
)
from gateway.admin.reports.svg import Row, Segment, hbars

MAX_START_ROWS = 25


def cold_start_section(report: Mapping[str, Any] | None) -> str:
    if report is None:
        return ""
    models, starts = items(report.get("models")), items(report.get("starts"))
    if not models and not starts:
        return section(
            "Cold starts", "cold_start", f'<p class="empty" data-empty="cold_start">{EMPTY}</p>'
        )
    phases = [str(p) for p in report.get("phases") or [] if isinstance(p, str)]
    colors = [(p, PALETTE[i % len(PALETTE)]) for i, p in enumerate(phases)]
    recent = starts[-MAX_START_ROWS:]
    figures = [
        figure(
            "Cold-start phases per model (mean)",
            "cold-start-phases",
            hbars(
                "cold-start-phases", [_phase_row(m.get("model"), m, phases) for m in models], colors
            ),
        ),
        figure(
            f"Cold starts, one bar each (latest {len(recent)})",
            "cold-start-timeline",
            hbars("cold-start-timeline", [_start_row(s, phases) for s in recent], colors),
        ),
        figure("Time to first token per model", "ttft-per-model", _ttft_plot(models)),
        figure(
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
    return section("Cold starts", "cold_start", content)


def _cold_tiles(
    report: Mapping[str, Any], models: list[Mapping[str, Any]], starts: list[Mapping[str, Any]]
) -> str:
    ttft = _overall_ttft(report, models, starts)

    def total(key: str) -> float:
        return sum(num(m.get(key)) or 0 for m in models)

    return tiles(
        [
            ("Cold starts", integer(total("cold_starts")), _started_sub(total)),
            ("TTFT p50", secs(ttft.get("p50")), "cold start to first token"),
            ("TTFT p95", secs(ttft.get("p95")), f"max {secs(ttft.get('max'))}"),
            ("Requests that waited", integer(total("waited_requests")), "for a cold start"),
            ("Shed while cold", integer(total("shed_while_cold")), "refused with Retry-After"),
            ("GPU-hours saved", fmt(total("gpu_hours_saved"), lambda n: f"{n:,.2f}"), "at zero"),
        ]
    )


def _started_sub(total: Callable[[str], float]) -> str:
    """Failed starts, and wakes from sleep where there were any (they are no starts)."""
    failed = f"{integer(total('failed'))} failed"
    return f"{failed}, {integer(total('wakes'))} wakes" if total("wakes") else failed


def _overall_ttft(
    report: Mapping[str, Any], models: list[Mapping[str, Any]], starts: list[Mapping[str, Any]]
) -> Mapping[str, Any]:
    """The report's own overall figures when it has them, else from the individual starts."""
    if isinstance(report.get("ttft_s"), Mapping):
        return mapping(report.get("ttft_s"))
    if len(models) == 1:
        return mapping(models[0].get("ttft_s"))
    values = sorted(v for v in (num(s.get("ttft_s")) for s in starts) if v is not None)
    if not values:
        return {}

    def rank(q: float) -> float:  # nearest rank, as a person would count it
        return values[max(0, math.ceil(q * len(values)) - 1)]

    return {"p50": rank(0.5), "p95": rank(0.95), "max": values[-1]}


def _phase_row(label: object, item: Mapping[str, Any], phases: Sequence[str]) -> Row:
    spent = mapping(item.get("phases_s"))
    segments = [Segment(num(spent.get(p)) or 0, f"{p}: {secs(spent.get(p))}") for p in phases]
    return Row(str(label), segments, secs(sum(s.value for s in segments)))


def _start_row(start: Mapping[str, Any], phases: Sequence[str]) -> Row:
    row = _phase_row(
        f"{start.get('model', '')} · {when(start.get('at'), short=True)}", start, phases
    )
    ttft = num(start.get("ttft_s"))
    return Row(row.label, row.segments, secs(ttft) if ttft is not None else row.total)


def _ttft_plot(models: list[Mapping[str, Any]]) -> str | None:
    rows = []
    for model in models:
        ttft = mapping(model.get("ttft_s"))
        p50, p95, top = (num(ttft.get(k)) or 0 for k in ("p50", "p95", "max"))
        segments = [
            Segment(p50, f"p50 {secs(p50)}"),
            Segment(max(p95 - p50, 0), f"p95 {secs(p95)}"),
            Segment(max(top - max(p95, p50), 0), f"max {secs(top)}"),
        ]
        rows.append(Row(str(model.get("model", "")), segments, f"max {secs(top)}"))
    legend = [("p50", PALETTE[0]), ("p95", "#9ecae9"), ("max", "#dfe3e8")]
    return hbars("ttft-per-model", rows, legend)


def _zero_plot(models: list[Mapping[str, Any]]) -> str | None:
    # Asleep only where a backend has a sleep tier; colours follow the legend's order.
    states = [("time_at_zero_s", "at zero", HIT), ("time_warm_s", "warm", MISS)]
    if any(num(m.get("time_asleep_s")) for m in models):
        states.insert(1, ("time_asleep_s", "asleep", NEAR))
    rows = []
    for model in models:
        spent = [(num(model.get(key)) or 0, name) for key, name, _ in states]
        whole = sum(seconds for seconds, _ in spent)
        share = spent[0][0] / whole if whole else 0
        segments = [Segment(seconds, f"{name}: {secs(seconds)}") for seconds, name in spent]
        rows.append(Row(str(model.get("model", "")), segments, f"{pct(share)} at zero"))
    return hbars("time-at-zero", rows, [(name, color) for _, name, color in states])


def _models_table(models: list[Mapping[str, Any]]) -> str:
    headers = ["Model", "Backend", "Cold starts", "Failed", "TTFT p50", "TTFT p95", "TTFT max"]
    headers += ["Waited", "Wait p50", "Wait p95", "Wait max", "Shed while cold", "Start estimate"]
    headers += ["GPU-h saved"]
    cells = []
    for m in models:
        ttft, wait = mapping(m.get("ttft_s")), mapping(m.get("wait_s"))
        cells.append(
            [str(m.get("model", "")), str(m.get("backend", ""))]
            + [integer(m.get(k)) for k in ("cold_starts", "failed")]
            + [secs(ttft.get(k)) for k in ("p50", "p95", "max")]
            + [integer(m.get("waited_requests"))]
            + [secs(wait.get(k)) for k in ("p50", "p95", "max")]
            + [integer(m.get("shed_while_cold")), secs(m.get("start_estimate_s"))]
            + [fmt(m.get("gpu_hours_saved"), lambda n: f"{n:.2f}")]
        )
    return table("cold-start-models", headers, cells, 2)
