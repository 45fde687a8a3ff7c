"""How fast the worker's weight loader reads a model, against a plain read of the same files.

Writes (or reuses) a synthetic Llama (`scripts/make_synthetic_model.py`) under --dir, then
measures in one run, rounds interleaved so that noise falls on every case alike:

    raw_read_gbps   plain sequential reads of the weight files (16 MiB buffer, one thread)
    load_gbps       every tensor in memory, by one loader:
                      loader=fast method=mmap      backends.worker.weights, the default: the
                                                   files mapped, cold chunks read through the
                                                   page cache first (zero copies)
                      loader=fast method=chunked   the same module, reading in parallel chunks
                                                   into memory of its own (one copy)
                      loader=safetensors method=mmap|pread   safetensors.torch.load_file
                                                   (mmap maps lazily; pread copies each tensor)
    load_ratio      load_gbps / raw_read_gbps of the same cache state

each with `cache`: `pagecache` (files read once before, still cached) or `disk` (dropped
from the page cache with POSIX_FADV_DONTNEED before each measurement; on a virtual machine
the host may still cache them). A load counts as done when every tensor is resident and
mapped: after the loader returns, one byte of every 4 KiB page of every tensor is read, so
that a loader that maps lazily pays for the reads it deferred. GB are 10^9 bytes.

    python bench/weight_load.py --quick         # a 0.25 GB model, under a minute
    python bench/weight_load.py --size-gb 1.0   # a 1 GB model, 5 rounds

Prints JSON lines only; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from backends.worker.synthetic_model import write_synthetic_model  # noqa: E402
from backends.worker.weights import (  # noqa: E402
    CHUNK_BYTES,
    DEFAULT_THREADS,
    METHODS,
    Method,
    load_files,
    weight_files,
)
from bench.report import emitter  # noqa: E402

PAGE = 4096
RAW_BLOCK = 16 * 1024 * 1024
CACHES = ("pagecache", "disk")
Loaded = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Case:
    loader: str
    method: str
    load: Callable[[list[Path]], Loaded]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="0.25 GB, 2 rounds")
    parser.add_argument("--size-gb", type=float, default=None, help="default 1.0 (0.25 quick)")
    parser.add_argument("--rounds", type=int, default=None, help="default 5 (2 quick)")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/weight-load-bench"))
    parser.add_argument("--device", default="cpu", help="cpu, or cuda to load onto the GPU")
    args = parser.parse_args(argv)
    size_gb = args.size_gb or (0.25 if args.quick else 1.0)
    rounds = args.rounds or (2 if args.quick else 5)

    folder = write_synthetic_model(args.dir / f"synthetic-{size_gb:g}gb", size_gb)
    files = weight_files(folder)
    total = sum(path.stat().st_size for path in files)
    params = {
        "size_gb": size_gb,
        "bytes": total,
        "files": len(files),
        "rounds": rounds,
        "device": args.device,
        "threads": DEFAULT_THREADS,
        "chunk_mib": CHUNK_BYTES // 2**20,
    }
    log(f"{folder}: {len(files)} files, {total / 1e9:.3f} GB; {rounds} rounds")
    cases = _cases(args.device)
    samples: dict[tuple[str, str, str], list[float]] = {}
    for round_number in range(rounds):
        for cache in CACHES:
            _prepare(cache, files)
            samples.setdefault(("raw", "read", cache), []).append(raw_read(files))
            for case in cases:
                _prepare(cache, files)
                samples.setdefault((case.loader, case.method, cache), []).append(
                    timed_load(case, files)
                )
        log(f"round {round_number + 1}/{rounds} done")
    _report(samples, params)
    return 0


def raw_read(files: list[Path]) -> float:
    """GB/s of plain sequential reads into one reused buffer."""
    buffer = memoryview(bytearray(RAW_BLOCK))
    started = time.perf_counter()
    total = 0
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            while count := os.readv(fd, [buffer]):
                total += count
        finally:
            os.close(fd)
    return total / (time.perf_counter() - started) / 1e9


def timed_load(case: Case, files: list[Path]) -> float:
    started = time.perf_counter()
    state = case.load(files)
    total = touch(state)
    seconds = time.perf_counter() - started
    del state
    gc.collect()  # unmaps and frees before the next case drops or reads the files
    return total / seconds / 1e9


def touch(state: Loaded) -> int:
    """Read one byte of every page of every tensor; return the tensors' bytes."""
    total = 0
    for tensor in state.values():
        if tensor.numel() == 0:
            continue
        raw = tensor.reshape(-1).view(torch.uint8)
        raw[::PAGE].sum()
        raw[-1].item()
        total += raw.numel()
    return total


def _cases(device: str) -> list[Case]:
    def fast(method: Method) -> Callable[[list[Path]], Loaded]:
        return lambda files: load_files(files, device=device, method=method)[0]

    def safetensors(backend: str) -> Callable[[list[Path]], Loaded]:
        from safetensors.torch import load_file

        def load(files: list[Path]) -> Loaded:
            state: Loaded = {}
            for path in files:
                state.update(load_file(path, device=device, backend=backend))
            return state

        return load

    return [
        *(Case("fast", method, fast(method)) for method in METHODS),
        *(Case("safetensors", backend, safetensors(backend)) for backend in ("mmap", "pread")),
    ]


def _prepare(cache: str, files: list[Path]) -> None:
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            if cache == "disk":
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            else:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        finally:
            os.close(fd)
    if cache == "pagecache":
        raw_read(files)  # whatever WILLNEED left out is read now


def _report(samples: dict[tuple[str, str, str], list[float]], params: dict[str, object]) -> None:
    raw = {cache: statistics.median(samples[("raw", "read", cache)]) for cache in CACHES}
    for cache in CACHES:
        emit("raw_read_gbps", raw[cache], "GB/s", cache=cache, loader="raw", **params)
    for (loader, method, cache), values in samples.items():
        if loader == "raw":
            continue
        load = statistics.median(values)
        spread = {"min": round(min(values), 3), "max": round(max(values), 3)}
        emit(
            "load_gbps", load, "GB/s", cache=cache, loader=loader, method=method, **spread, **params
        )
        ratio = load / raw[cache]
        emit("load_ratio", ratio, "ratio", cache=cache, loader=loader, method=method, **params)


emit = emitter("weight_load", digits=3)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
