"""The report page's building blocks: how values read, and the pieces every section is made of.

Formatting turns a report's values (plain JSON: anything may be missing, null or the wrong
type) into words, with "—" for no value: `pct`, `integer`, `usd`, `ms`, `secs`, `when`.
`escape` is the one way a value reaches the markup. The pieces (`section`, `tiles`,
`figure`, `table`) escape what they are given and write "no data" where there is none.
The page itself is `gateway.admin.reports.html`; its sections are `html_cache` and
`html_cold_start`.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

Fmt = Callable[[float], str]

HIT, MISS, NEAR, BYPASS, SEMANTIC = "#0f9d8a", "#ef8a3c", "#8a7fd6", "#b8bec7", "#5aa9e6"
NONE = "#6b7280"  # not cacheable: never looked up
PALETTE = ("#4c78a8", "#f58518", "#54a24b", "#b279a2", "#e45756", "#72b7b2", "#eeca3b")
WIDE = 1120  # viewBox width of a plot that spans the page, so its text keeps its size
EMPTY = "No data in this range"


# -- formatting ---------------------------------------------------------------------------


def escape(value: object) -> str:
    return html.escape(str(value), quote=True)


def num(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        return None
    return float(value)


def fmt(value: object, pattern: Fmt) -> str:
    number = num(value)
    return "—" if number is None else pattern(number)


def pct(value: object) -> str:
    return fmt(value, lambda n: f"{n * 100:.1f}%")


def integer(value: object) -> str:
    return fmt(value, lambda n: f"{round(n):,}")


def usd(value: object) -> str:
    return fmt(value, lambda n: f"${n:,.4f}" if 0 < n < 1 else f"${n:,.2f}")


def ms(value: object) -> str:
    return fmt(value, lambda n: f"{n:,.0f} ms" if n >= 10 else f"{n:.1f} ms")


def secs(value: object) -> str:
    return fmt(value, _seconds_text)


def _seconds_text(n: float) -> str:
    if n >= 3600:
        return f"{n / 3600:,.1f} h"
    if n >= 60:
        return f"{n / 60:.1f} min"
    return f"{n:.2f} s" if n < 10 else f"{n:.1f} s"


def when(iso: object, short: bool = False) -> str:
    if not isinstance(iso, str):
        return "\u2014"
    try:
        moment = datetime.fromisoformat(iso)
    except ValueError:
        return iso
    return moment.strftime("%m-%d %H:%M" if short else "%Y-%m-%d %H:%M:%S %Z").strip()


def compact(n: float) -> str:
    """Axis labels: 30000 reads as 30k, so that long bucket edges do not collide."""
    return f"{n / 1000:g}k" if n >= 1000 else f"{n:g}"


def items(value: object) -> list[Mapping[str, Any]]:
    return [item for item in value if isinstance(item, Mapping)] if isinstance(value, list) else []


def mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


# -- page structure -----------------------------------------------------------------------


def section(title: str, kind: str, content: str) -> str:
    return f'<section data-report="{kind}"><h2>{escape(title)}</h2>{content}</section>'


def tiles(cards: Sequence[tuple[str, str, str]]) -> str:
    cells = "".join(
        f'<div class="tile"><div class="label">{escape(label)}</div>'
        f'<div class="value" data-headline="{escape(label)}">{escape(value)}</div>'
        f'<div class="sub">{escape(sub)}</div></div>'
        for label, value, sub in cards
    )
    return f'<div class="tiles">{cells}</div>'


def figure(title: str, plot_id: str, svg: str | None, note: str = "", wide: bool = False) -> str:
    content = svg or f'<p class="empty" data-plot="{plot_id}" data-empty="true">{EMPTY}</p>'
    caption = f'<p class="note">{escape(note)}</p>' if note else ""
    cls = "figure wide" if wide else "figure"
    return (
        f'<figure class="{cls}"><figcaption>{escape(title)}</figcaption>{content}{caption}</figure>'
    )


def table(
    table_id: str, headers: Sequence[str], rows: Sequence[Sequence[str]], text_columns: int
) -> str:
    """A table whose first `text_columns` columns are words and the rest right-aligned numbers."""
    if not rows:
        return f'<p class="empty" data-table="{table_id}" data-empty="true">{EMPTY}</p>'

    def cells(tag: str, row: Sequence[str]) -> str:
        return "".join(
            f'<{tag} class="{"t" if i < text_columns else "n"}">{escape(c)}</{tag}>'
            for i, c in enumerate(row)
        )

    body = "".join(f"<tr>{cells('td', row)}</tr>" for row in rows)
    return (  # wide tables scroll sideways inside the page rather than widen it
        f'<div class="scroll"><table data-table="{table_id}"><thead><tr>{cells("th", headers)}'
        f"</tr></thead><tbody>{body}</tbody></table></div>"
    )
