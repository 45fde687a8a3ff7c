"""The reports as rich tables in a terminal (`gateway report ... --format table`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

BAR_WIDTH = 30
MAX_ROWS = 20


def render(console: Console, report: dict[str, Any]) -> None:
    if report["kind"] == "cache":
        render_cache(console, report)
    elif report["kind"] == "batches":
        render_batches(console, report)
    else:
        render_cold_start(console, report)


def render_batches(console: Console, report: dict[str, Any]) -> None:
    console.print(_title("Batch jobs", report))
    t = report["totals"]
    statuses = ", ".join(f"{s} {n}" for s, n in t["by_status"].items()) or "-"
    summary = Table("jobs", "by status", "lines", "completed", "failed")
    summary.add_row(
        str(t["jobs"]), statuses, str(t["lines"]), str(t["completed"]), str(t["failed"])
    )
    console.print(summary)
    jobs = Table("tenant", "status", "model", "done (failed)", "created", "ended", title="Jobs")
    jobs.add_column("batch", no_wrap=True)  # an id to copy whole
    for j in report["jobs"][:MAX_ROWS]:
        done = f"{_pct(j['progress'])} of {j['total']} ({j['failed']})"
        cells = (j["tenant"], j["status"], j["model"] or "-", done, _moment(j["created_at"]))
        jobs.add_row(*cells, _moment(j["ended_at"]), j["id"])
    console.print(jobs)


def _moment(iso: str | None) -> str:
    """`2026-11-27T03:38:10Z` as `11-27 03:38:10` (UTC), to fit a terminal's row."""
    return "-" if iso is None else iso[5:19].replace("T", " ")


def render_cache(console: Console, report: dict[str, Any]) -> None:
    console.print(_title("Cache report", report))
    t = report["totals"]
    summary = Table("requests", "lookups", "hits", "exact", "semantic", "misses", "bypassed")
    summary.add_column("coalesced")
    summary.add_column("hit rate")
    summary.add_column("saved tokens")
    summary.add_column("saved USD")
    summary.add_column("reported bad")
    summary.add_row(
        *(str(t[k]) for k in ("requests", "lookups", "hits", "exact_hits", "semantic_hits")),
        str(t["misses"]),
        str(t["bypassed"]),
        str(t.get("coalesced", 0)),
        _pct(t["hit_rate"]),
        str(t["saved_tokens"]),
        f"{t['saved_cost_usd']:.4f}",
        str(t.get("reported_bad_hits", 0)),
    )
    console.print(summary)
    reasons = t.get("miss_reasons") or {}
    if reasons:  # "budget", "store", "error": lookups that failed open
        why = Table("why", "misses", title="Misses by reason")
        for reason, count in reasons.items():
            why.add_row(reason, str(count))
        console.print(why)
    latency = Table("latency (ms)", "count", "p50", "p95", "p99", title="Hits vs misses")
    for name in ("hit", "miss"):
        row = report["latency_ms"][name]
        latency.add_row(name, str(row["count"]), *(_num(row[p]) for p in ("p50", "p95", "p99")))
    console.print(latency)
    console.print(_over_time(report["over_time"]))
    console.print(_similarity(report["similarity"]))
    console.print(_rows("Top namespaces", report["top_namespaces"], _NAMESPACE_COLUMNS))
    console.print(_rows("By tenant and model", report["by_tenant_model"], _TENANT_COLUMNS))


def render_cold_start(console: Console, report: dict[str, Any]) -> None:
    console.print(_title("Cold-start report", report))
    models = Table(
        "model", "starts", "failed", "TTFT p50", "p95", "max", "waited", "wait p95", "shed"
    )
    models.add_column("start est.")
    models.add_column("wakes")
    models.add_column("wake TTFT p50")
    models.add_column("at zero")
    models.add_column("asleep")
    models.add_column("warm")
    models.add_column("GPU-h saved")
    for m in report["models"]:
        models.add_row(
            m["model"],
            str(m["cold_starts"]),
            str(m["failed"]),
            *(_secs(m["ttft_s"][p]) for p in ("p50", "p95", "max")),
            str(m["waited_requests"]),
            _secs(m["wait_s"]["p95"]),
            str(m["shed_while_cold"]),
            _secs(m.get("start_estimate_s")),
            str(m.get("wakes", 0)),
            _secs((m.get("wake_ttft_s") or {}).get("p50")),
            _secs(m["time_at_zero_s"]),
            _secs(m.get("time_asleep_s")),
            _secs(m["time_warm_s"]),
            f"{m['gpu_hours_saved']:.3f}",
        )
    console.print(models)
    phases = Table("model", *report["phases"], title="Mean seconds per phase")
    for m in report["models"]:
        phases.add_row(m["model"], *(_secs(m["phases_s"].get(p)) for p in report["phases"]))
    console.print(phases)
    starts = Table("at", "model", "outcome", "TTFT", *report["phases"], title="Recent starts")
    for s in report["starts"][-MAX_ROWS:]:
        cells = (_secs(s["phases_s"].get(p)) for p in report["phases"])
        outcome = s["outcome"] or "-"
        if s.get("kind") == "wake":
            outcome = f"wake: {outcome}"
        starts.add_row(s["at"] or "-", s["model"], outcome, _secs(s["ttft_s"]), *cells)
    console.print(starts)
    for note in report.get("notes") or []:
        console.print(f"[dim]{note}[/dim]")


_NAMESPACE_COLUMNS = ("namespace", "tenant", "model", "requests", "hits", "hit_rate")
_TENANT_COLUMNS = ("tenant", "model", "requests", "hits", "hit_rate", "saved_tokens")


def _title(name: str, report: dict[str, Any]) -> str:
    r, f = report["range"], report["filters"]
    scope = ", ".join(f"{k} {v}" for k, v in f.items() if v) or "all tenants and models"
    return f"[bold]{name}[/bold]  {r['since']} → {r['until']}  ({scope})"


def _over_time(rows: Sequence[dict[str, Any]]) -> Table:
    table = Table("bucket start", "requests", "hits", "hit rate", "", title="Hit rate over time")
    shown = [r for r in rows if r["requests"]][-MAX_ROWS:]
    for r in shown:
        bar = "█" * round((r["hit_rate"] or 0) * BAR_WIDTH)
        table.add_row(r["start"], str(r["requests"]), str(r["hits"]), _pct(r["hit_rate"]), bar)
    return table


def _similarity(similarity: dict[str, Any]) -> Table:
    table = Table("similarity", "hits", "near misses", title="Similarity (semantic tier)")
    edges = similarity["edges"]
    for i, (hits, near) in enumerate(
        zip(similarity["hits"], similarity["near_misses"], strict=True)
    ):
        table.add_row(f"{edges[i]:.2f}-{edges[i + 1]:.2f}", str(hits), str(near))
    return table


def _rows(title: str, rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> Table:
    table = Table(*columns, title=title)
    for row in rows[:MAX_ROWS]:
        table.add_row(*(_cell(name, row[name]) for name in columns))
    return table


def _cell(name: str, value: Any) -> str:
    if name == "hit_rate":
        return _pct(value)
    if name == "namespace":
        return str(value)[:16]
    return str(value)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"
