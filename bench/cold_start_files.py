"""Page-cache state of staged files for bench/cold_start.py: drop, warm, hold, check, read.

`drop` asks the kernel to forget the files' cached pages (`POSIX_FADV_DONTNEED`); it cannot
drop pages that a process still maps, nor dirty ones (the stager fdatasyncs what it
publishes), and on a virtual machine the host may still cache the disk image: `resident`
(mincore) says what the guest really holds, and the raw disk read says how fast "disk" is.

`Held` keeps files in the page cache by mapping them shared and read-only and `mlock`ing
the mapping: the locked pages are the page cache's own (a shared mapping copies nothing),
and reclaim skips them. Some machines reclaim idle page cache on their own: the one this
was written on runs DAMON with a `pageout` scheme for memory not touched for ~30 s, which
took pages of files read 20 s before a worker got to them. Warmed files are held until the
request that needs them has been answered.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import time
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType

BLOCK_BYTES = 16 * 1024 * 1024  # as warmpool.readahead and bench/weight_load.py
_LIBC = ctypes.CDLL(None, use_errno=True)
_LOWEST_BIT = bytes(value & 1 for value in range(256))


def drop(paths: Iterable[Path]) -> None:
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)  # nothing dirty may stay behind (DONTNEED skips dirty pages)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def warm(paths: Iterable[Path]) -> None:
    raw_read(paths)


def raw_read(paths: Iterable[Path]) -> tuple[int, float]:
    """(bytes, seconds) of a plain sequential read, one file after another, one thread,
    16 MiB reads into one reused buffer: the figure a loader is measured against."""
    buffer = memoryview(bytearray(BLOCK_BYTES))
    total = 0
    started = time.perf_counter()
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            while count := os.readv(fd, [buffer]):
                total += count
        finally:
            os.close(fd)
    return total, time.perf_counter() - started


def resident(paths: Iterable[Path]) -> float:
    """Fraction of the files' pages in the page cache (mincore), 0..1."""
    pages = cached = 0
    for path in paths:
        size = path.stat().st_size
        if size == 0:
            continue
        count = -(-size // mmap.PAGESIZE)
        vector = (ctypes.c_ubyte * count)()
        # Copy-on-write, so that ctypes may take its address; nothing is written, or read.
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) as m:
            anchor = ctypes.c_char.from_buffer(m)
            try:
                address = ctypes.c_void_p(ctypes.addressof(anchor))
                if _LIBC.mincore(address, ctypes.c_size_t(size), vector) != 0:
                    raise OSError(ctypes.get_errno(), "mincore failed")
            finally:
                del anchor  # the mapping cannot close while ctypes holds a pointer into it
        pages += count
        cached += bytes(vector).translate(_LOWEST_BIT).count(1)  # other bits are reserved
    return cached / pages if pages else 1.0


_LIBC.mmap.restype = ctypes.c_void_p
_LIBC.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
_LIBC.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_LIBC.mlock.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value


class Held:
    """The files' pages locked in the page cache while the context lasts (see above)."""

    def __init__(self, paths: Iterable[Path]) -> None:
        self._paths = list(paths)
        self._maps: list[tuple[int, int]] = []  # (address, length)

    def __enter__(self) -> Held:
        try:
            for path in self._paths:
                self._hold(path)
        except BaseException:
            self.release()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def _hold(self, path: Path) -> None:
        size = path.stat().st_size
        if size == 0:
            return
        fd = os.open(path, os.O_RDONLY)
        try:
            address = _LIBC.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        finally:
            os.close(fd)  # the mapping keeps the file
        if address is None or address == _MAP_FAILED:
            raise OSError(ctypes.get_errno(), f"mmap of {path} failed")
        self._maps.append((address, size))
        if _LIBC.mlock(ctypes.c_void_p(address), ctypes.c_size_t(size)) != 0:
            raise OSError(ctypes.get_errno(), f"mlock of {path} ({size} bytes) failed")

    def release(self) -> None:
        for address, size in self._maps:
            _LIBC.munmap(ctypes.c_void_p(address), ctypes.c_size_t(size))  # unlocks too
        self._maps.clear()
