"""The local cache store's snapshot write: its time against a raw write of as many bytes,
the memory it takes, and how late the event loop runs meanwhile; and its read.

The local store (cache/store_local.py) rewrites its whole snapshot file in a worker thread while
the event loop serves requests. Each measurement runs in a child process of its own (so
that its peak memory is its own): `entries` synthetic entries as the gateway stores them
(bench/cache_latency_data.py: 12-token verifier features, an echo answer, ~11 KB each),
then

    raw_write_s            the same number of bytes written from one buffer, fsynced (the
                           faster of two): this machine's write speed now, the baseline
    snapshot_write_s       cache/codec.py write_snapshot, fsync included
    snapshot_write_ratio   snapshot_write_s / raw_write_s
    snapshot_peak_extra_mb the process's peak resident memory during the write, above
                           what it held before it
    loop_lag_idle_p99_ms   a uvloop task asking to wake every 1 ms: how late it woke
                           (p99), with nothing else running, for as long as the write took
    loop_lag_p99_ms,       the same while write_snapshot runs in a worker thread, as the
    loop_lag_max_ms        store runs it

and then, in a fresh process (as a gateway starting up), with the file in the page cache:

    snapshot_read_s        cache/codec.py read_snapshot
    snapshot_read_held_mb  the resident memory the read entries hold once it returned
    snapshot_read_peak_mb  the process's peak resident memory during the read, above what
                           it held before it

JSON lines on stdout, `{"bench": "snapshot_write", "metric", "value", "unit", "entries"}`.

    python bench/snapshot_write.py            # 10k and 100k entries (~1.1 GB of disk)
    python bench/snapshot_write.py --quick    # 10k
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import cache_latency_data as data
from bench.measure import percentile
from bench.report import emitter
from cache.codec import StoredEntry, read_snapshot, write_snapshot

DIM = 384
TICK_S = 0.001


emit = emitter("snapshot_write")


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KB on Linux


def _raw_write(path: Path, size: int) -> float:
    buffer = os.urandom(1 << 20) * max(1, size >> 20)
    started = time.perf_counter()
    with open(path, "wb") as out:
        out.write(buffer)
        out.flush()
        os.fsync(out.fileno())
    seconds = time.perf_counter() - started
    path.unlink()
    return seconds


async def _lags_while(work: asyncio.Future[Any] | None, seconds: float) -> list[float]:
    """How late a task asking to wake every TICK_S woke, until `work` is done (or, with
    none, for `seconds`)."""
    lags: list[float] = []
    ends = time.perf_counter() + seconds
    while (work is not None and not work.done()) or (work is None and time.perf_counter() < ends):
        asked = time.perf_counter()
        await asyncio.sleep(TICK_S)
        lags.append((time.perf_counter() - asked - TICK_S) * 1000.0)
    return lags


async def _measure(path: Path, stored: list[StoredEntry]) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    before = _peak_rss_mb()
    started = time.perf_counter()
    write = loop.run_in_executor(None, write_snapshot, path, DIM, stored)
    busy = await _lags_while(write, 0.0)
    await write
    seconds = time.perf_counter() - started
    peak = _peak_rss_mb() - before
    idle = await _lags_while(None, seconds)
    return {"seconds": seconds, "peak_mb": peak, "busy": busy, "idle": idle}


def write_child(entries: int, path: Path) -> None:
    """Measures the write of `entries` to `path`, and leaves the file there."""
    import uvloop

    features = data.filler_features(12)
    stored = list(data.filler_entries(entries, features))
    measured = uvloop.run(_measure(path, stored))
    size = path.stat().st_size
    raw = min(_raw_write(path.with_name("raw.bin"), size) for _ in range(2))
    busy, idle = measured["busy"], measured["idle"]
    params = {"entries": entries}
    emit("snapshot_mb", round(size / 1e6, 1), "MB", **params)
    emit("raw_write_s", round(raw, 3), "s", **params)
    emit("snapshot_write_s", round(measured["seconds"], 3), "s", **params)
    emit("snapshot_write_ratio", round(measured["seconds"] / raw, 2), "ratio", **params)
    emit("snapshot_peak_extra_mb", round(measured["peak_mb"], 1), "MB", **params)
    emit("loop_lag_idle_p99_ms", round(percentile(idle, 99), 3), "ms", **params)
    emit("loop_lag_p99_ms", round(percentile(busy, 99), 3), "ms", **params)
    emit("loop_lag_max_ms", round(max(busy), 3), "ms", **params)


def read_child(entries: int, path: Path) -> None:
    """Measures a fresh process's read of the snapshot at `path` (in the page cache)."""
    before, resident = _peak_rss_mb(), _resident_mb()
    started = time.perf_counter()
    stored = read_snapshot(path, DIM)
    seconds = time.perf_counter() - started
    held = _resident_mb() - resident
    assert len(stored) == entries
    params = {"entries": entries}
    emit("snapshot_read_s", round(seconds, 3), "s", **params)
    emit("snapshot_read_held_mb", round(held, 1), "MB", **params)
    emit("snapshot_read_peak_mb", round(_peak_rss_mb() - before, 1), "MB", **params)


def _resident_mb() -> float:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="10k entries only")
    parser.add_argument("--write", nargs=2, metavar=("ENTRIES", "PATH"), help=argparse.SUPPRESS)
    parser.add_argument("--read", nargs=2, metavar=("ENTRIES", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.write is not None:
        write_child(int(args.write[0]), Path(args.write[1]))
        return 0
    if args.read is not None:
        read_child(int(args.read[0]), Path(args.read[1]))
        return 0
    for entries in (10_000,) if args.quick else (10_000, 100_000):
        with tempfile.TemporaryDirectory(prefix="bench-snapshot-") as tmp:
            path = str(Path(tmp) / "entries.bin")
            for step in ("--write", "--read"):
                child = [sys.executable, __file__, step, str(entries), path]
                if subprocess.run(child, check=False, timeout=600).returncode != 0:
                    print(f"snapshot_write: {step} {entries} could not measure", file=sys.stderr)
                    return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
