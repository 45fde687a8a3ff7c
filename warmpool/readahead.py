"""Read staged files once, in large sequential blocks, so they sit in the page cache.

A model server then loads (or mmaps) them at memory speed instead of disk speed. One
sequential pass per file keeps a spinning or network disk streaming; `POSIX_FADV_WILLNEED`
lets the kernel queue its own read-ahead of the whole file ahead of ours. The measured rate
is the disk's when the files were cold, and memory's when they were already cached (right
after a download, they usually are). Blocking: run it in a thread.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path

from warmpool.staged import Throughput

BLOCK_BYTES = 16 * 1024 * 1024


def read_ahead(
    paths: Iterable[Path], block_bytes: int = BLOCK_BYTES, advise: Iterable[Path] = ()
) -> Throughput:
    """Read `paths`; only advise the kernel to read `advise` (files read moments ago).

    The throughput counts the bytes read, not the advised ones."""
    started = time.perf_counter()
    for path in advise:
        _advise(path)
    buffer = bytearray(block_bytes)
    total = sum(_read_file(path, memoryview(buffer)) for path in paths)
    return Throughput(total, time.perf_counter() - started)


def _advise(path: Path) -> None:
    if not hasattr(os, "posix_fadvise"):  # macOS: nothing to ask
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
    finally:
        os.close(fd)


def _read_file(path: Path, buffer: memoryview) -> int:
    fd = os.open(path, os.O_RDONLY)
    try:
        if hasattr(os, "posix_fadvise"):  # Linux; macOS has no fadvise
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        total = 0
        while read := os.readv(fd, [buffer]):
            total += read
        return total
    finally:
        os.close(fd)
