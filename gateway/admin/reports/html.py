"""The cache and cold-start reports as one self-contained HTML page.

Everything is inline: the CSS and the plots (SVG from `gateway.admin.reports.svg`, with the
browser's own tooltips, so no script at all). A Content-Security-Policy forbids every
fetch and every script, so the page stays offline and inert even if a value ever slipped
past escaping. Every value from a report is escaped (html.escape) before it reaches the page.
Reports arrive as plain dicts (their JSON form); missing keys and nulls read as "no data".

Here: the page around the sections (header, styles). The sections are `html_cache` and
`html_cold_start`; what they are built of (formatting, tiles, figures, tables) is
`html_blocks`. No template engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.admin.reports.html_blocks import EMPTY, escape, mapping, when
from gateway.admin.reports.html_cache import cache_section
from gateway.admin.reports.html_cold_start import cold_start_section


def render(cache: dict[str, Any] | None, cold_start: dict[str, Any] | None) -> str:
    """The whole page; either report may be absent (not requested)."""
    sections = [cache_section(cache), cold_start_section(cold_start)]
    body = "".join(sections) or f'<p class="empty" data-empty="page">{EMPTY}</p>'
    head = _header(cache or cold_start or {})
    return _PAGE_HEAD + head + body + _PAGE_TAIL


def _header(report: Mapping[str, Any]) -> str:
    span = mapping(report.get("range"))
    filters = [
        f"{k}: {v}" for k, v in mapping(report.get("filters")).items() if v not in (None, "")
    ]
    scope = " · ".join(filters) or "all tenants and models"
    return (
        f'<header><h1>Gateway report</h1><p class="range">{escape(when(span.get("since")))}'
        f' → {escape(when(span.get("until")))}</p><p class="scope">{escape(scope)}</p></header>'
    )


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
