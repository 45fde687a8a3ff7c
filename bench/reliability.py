"""Reliability figures: the fault suite's cases (bench/chaos_cases.py) with bigger
bursts, then a short soak, against one real deployment on loopback (two gateway replicas,
a private Redis, healthy, faulty and on-demand upstreams).

Prints a table (case, requests sent, answered by outcome, lost, p99 latency, notes) to
stderr and, per case, a JSON line to stdout:
`{"bench": "reliability", "case", "sent", "answered", "lost", "errors_5xx_unexpected",
"p99_ms", "outcomes", "notes"}`. A case whose own checks failed says so in `notes` (and
the script exits 1), as does any lost request or unexpected 5xx.

Run: python bench/reliability.py [--scale 3] [--soak 20] [--quick]  (`make reliability-report`)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import chaos_cases  # noqa: E402
from bench.chaos import Burst  # noqa: E402
from bench.chaos_deployment import Deployment, deployment  # noqa: E402
from bench.soak import soak  # noqa: E402

# Burst sizes at --scale 1: the test suite's sizes.
SIZES: dict[str, dict[str, Any]] = {
    "upstream-faults": {"n": 2},
    "upstream-killed": {"n": 12},
    "upstream-slow": {"n": 4},
    "redis-outage": {"n": 45},
    "redis-flush": {"n": 30},
    "replica-killed": {"n": 60},
    "hostile-bodies": {"n": 2},
    "slow-clients": {"n": 30, "loris": 40},
    "disconnects": {"n": 12},
    "cold-starts": {"n": 8},
    "held-start-fails": {"n": 6},
    "sleep-cycles": {"n": 8},
}


def run_case(d: Deployment, name: str, scale: int) -> list[Burst]:
    sizes = {k: v * scale for k, v in SIZES[name].items()}
    started = time.monotonic()
    chaos_cases.SENT.clear()
    try:
        made = chaos_cases.by_name()[name](d, **sizes)
    except AssertionError as exc:
        sent = chaos_cases.SENT[:] or [Burst(name, [], frozenset())]
        sent[-1].notes.append(f"CHECK FAILED: {str(exc)[:300]}")
        return sent
    bursts = made if isinstance(made, list) else [made]
    for burst in bursts:
        try:
            burst.check()
        except AssertionError as exc:
            burst.notes.append(f"CHECK FAILED: {str(exc)[:300]}")
    bursts[-1].notes.append(f"{time.monotonic() - started:.1f} s")
    return bursts


def table(bursts: list[Burst]) -> str:
    rows = [("case", "sent", "answered by outcome", "lost", "p99 ms", "notes")]
    for b in bursts:
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(b.by_outcome.items()) if k[:4] != "lost")
        p99 = f"{b.p99_ms():.0f}" if b.results else "-"
        rows.append((b.name, str(b.sent), outcomes, str(len(b.lost)), p99, "; ".join(b.notes)))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = []
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row[:5], widths, strict=True)]
        lines.append(" | ".join([*cells, row[5]]))
        if len(lines) == 1:
            lines.append("-+-".join("-" * w for w in [*widths, 5]))
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scale", type=int, default=3, help="burst sizes x the tests'")
    parser.add_argument("--soak", type=float, default=20.0, help="seconds of soak")
    parser.add_argument("--rate", type=float, default=20.0, help="soak requests per second")
    parser.add_argument("--quick", action="store_true", help="test-sized bursts, 10 s soak")
    args = parser.parse_args()
    scale, soak_s = (1, 10.0) if args.quick else (args.scale, args.soak)
    bursts: list[Burst] = []
    with (
        tempfile.TemporaryDirectory(prefix="reliability-") as folder,
        deployment(Path(folder)) as d,
    ):
        for name in SIZES:
            print(f"[reliability] {name}", file=sys.stderr, flush=True)
            for burst in run_case(d, name, scale):
                bursts.append(burst)
                print(orjson.dumps({**burst.figures(), "notes": burst.notes}).decode())
        soaked, _ = soak(d, soak_s, args.rate)
        soaked.notes.append(f"{soak_s:.0f} s at {args.rate:.0f}/s, mixed")
        bursts.append(soaked)
        print(orjson.dumps({**soaked.figures(), "notes": soaked.notes}).decode())
    print(table(bursts), file=sys.stderr)
    bad = [
        b.name for b in bursts if b.lost or b.unexpected_5xx or any("FAILED" in n for n in b.notes)
    ]
    if bad:
        print(f"[reliability] FAILED: {', '.join(bad)}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
