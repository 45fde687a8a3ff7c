"""What every benchmark prints: its figures as JSON lines on stdout, one per metric
(`{"bench", "metric", "value", "unit", ...}`), and its progress on stderr.

A script makes its two printers once: `emit = emitter(BENCH)` and `progress =
progress_of(BENCH)`. A float value is rounded to `digits` places where the script asks
(None: as measured); NaN and infinities become null, so every line is valid JSON.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from typing import Any, Protocol

import orjson

STARTED = time.monotonic()


class Emit(Protocol):
    def __call__(
        self, metric: str, value: float | int | None, unit: str, **fields: Any
    ) -> None: ...


def line(
    bench: str, metric: str, value: float | int | None, unit: str, digits: int | None = None
) -> dict[str, Any]:
    """The start of a figure's line, its value rounded (and NaN or infinite: None)."""
    if isinstance(value, float):
        if not math.isfinite(value):
            value = None
        elif digits is not None:
            value = round(value, digits)
    return {"bench": bench, "metric": metric, "value": value, "unit": unit}


def emitter(bench: str, digits: int | None = None) -> Emit:
    """Prints one figure of `bench` per call, as a JSON line on stdout."""

    def emit(metric: str, value: float | int | None, unit: str, **fields: Any) -> None:
        out = line(bench, metric, value, unit, digits) | fields
        sys.stdout.write(orjson.dumps(out).decode() + "\n")
        sys.stdout.flush()

    return emit


def progress_of(bench: str) -> Callable[[str], None]:
    """Prints a progress line of `bench` on stderr: the wall clock and the seconds since
    the script started."""

    def progress(message: str) -> None:
        elapsed = time.monotonic() - STARTED
        stamp = time.strftime("%H:%M:%S")
        print(f"[{bench} {stamp} {elapsed:6.1f}s] {message}", file=sys.stderr, flush=True)

    return progress
