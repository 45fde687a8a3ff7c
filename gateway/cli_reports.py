"""`gateway report cache|cold-start|all|batches`: the reports, built from the state store
and written as a table, JSON or HTML (for gateway/cli.py)."""

from __future__ import annotations

import argparse
import asyncio
import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common.redis_client import RedisFactory
from gateway.settings import Settings

if TYPE_CHECKING:
    from gateway.admin.reports import ReportKind

_REPORTS: dict[str, tuple[str, list[ReportKind]]] = {
    "cache": ("hit rate, savings, latency of hits vs misses", ["cache"]),
    "cold-start": ("cold starts, their phases, time at zero", ["cold_start"]),
    "all": ("both reports (one HTML page with --format html)", ["cache", "cold_start"]),
}


def report_parsers(
    commands: Any, config: argparse.ArgumentParser, redis: Callable[[Settings], RedisFactory]
) -> None:
    """The `gateway report ...` commands; `redis`: the state store's clients."""
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument("--since", default="1h", help="a duration back (1h, 7d) or ISO time")
    options.add_argument("--until", help="a duration back or ISO time (default: now)")
    options.add_argument("--tenant", help="only this tenant's requests")
    options.add_argument("--model", help="only this model")
    options.add_argument("--bucket", default="5m", help="hit rate over time per bucket (5m)")
    options.add_argument("--format", choices=("table", "json", "html"), default="table")
    options.add_argument("--output", help="write to this file instead of stdout")
    reports = commands.add_parser(
        "report", help="cache and cold-start reports from the state store"
    ).add_subparsers(required=True, metavar="REPORT")
    for name, (summary, _) in _REPORTS.items():
        parser = reports.add_parser(name, parents=[config, options], help=summary)
        parser.set_defaults(run=functools.partial(_report, redis=redis), report=name)
    batches = reports.add_parser(
        "batches", parents=[config, options], help="batch jobs: status and progress of each"
    )
    batches.set_defaults(run=functools.partial(_batch_report, redis=redis), report="batches")


def _report(
    settings: Settings, args: argparse.Namespace, redis: Callable[[Settings], RedisFactory]
) -> int:
    from gateway.admin.reports import QueryError, ReportQuery, ReportUnavailable, build_report

    try:
        query = ReportQuery.parse(args.since, args.until, args.tenant, args.model, args.bucket)
    except QueryError as exc:
        print(f"gateway: {exc}", file=sys.stderr)
        return 2

    async def run() -> dict[str, dict[str, Any]]:
        kinds = _REPORTS[args.report][1]
        clients = redis(settings)
        return {kind: await build_report(kind, settings, clients, query) for kind in kinds}

    try:
        reports = asyncio.run(run())
    except ReportUnavailable as exc:
        print(f"gateway: {exc}", file=sys.stderr)
        return 1
    _write(_formatted(reports, args.format), args.output)
    return 0


def _batch_report(
    settings: Settings, args: argparse.Namespace, redis: Callable[[Settings], RedisFactory]
) -> int:
    from gateway.admin.reports import QueryError, ReportQuery
    from gateway.batches.report import BatchReportUnavailable, batch_report

    if args.format == "html":
        print("gateway: the batches report has no HTML form; use table or json", file=sys.stderr)
        return 2
    try:
        query = ReportQuery.parse(args.since, args.until, args.tenant, args.model, args.bucket)
    except QueryError as exc:
        print(f"gateway: {exc}", file=sys.stderr)
        return 2
    try:
        report = asyncio.run(batch_report(settings, redis(settings), query))
    except BatchReportUnavailable as exc:
        print(f"gateway: {exc}", file=sys.stderr)
        return 1
    _write(_formatted({"batches": report}, args.format), args.output)
    return 0


def _formatted(reports: dict[str, dict[str, Any]], form: str) -> str:
    if form == "json":
        import json

        data = next(iter(reports.values())) if len(reports) == 1 else reports
        return json.dumps(data, indent=2) + "\n"
    if form == "html":
        from gateway.admin.reports.html import render

        return render(reports.get("cache"), reports.get("cold_start"))
    import io

    from rich.console import Console

    from gateway.admin.reports.table import render as render_table

    buffer = io.StringIO()
    console = Console(file=buffer, width=120, force_terminal=sys.stdout.isatty())
    for report in reports.values():
        render_table(console, report)
    return buffer.getvalue()


def _write(text: str, output: str | None) -> None:
    if output is None:
        sys.stdout.write(text)
        return
    Path(output).write_text(text, encoding="utf-8")
    print(f"wrote {output}", file=sys.stderr)
