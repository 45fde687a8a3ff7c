"""Reading safetensors weights straight into tensors, for a fast worker start.

A safetensors file is an 8-byte little-endian header length, a JSON header (each tensor's
dtype, shape and byte range in the data that follows) and the tensors' bytes back to back.
So each file's data goes into one buffer, and every tensor is a view into that buffer: no
per-tensor allocation and no copy after the read. Two ways to fill the buffer:

- `chunked`: threads read the file in large chunks (`os.preadv`, which releases the GIL)
  into one buffer allocated for the file. (Asking for 2 MB pages with MADV_HUGEPAGE was
  tried: on a kernel that compacts memory on demand, some loads stalled at 0.2 GB/s.)
- `mmap`: the file is mapped copy-on-write and its pages mapped up front (read-only, so
  nothing is copied); the tensors then live in the page cache, shared with it. Chunks not
  in the page cache yet (`mincore`) are first read through it with the same parallel large
  reads, which is faster from disk than letting the mapping fault them in: on the machine
  this was written on, tensors mapped straight after a cold read were slow to touch for
  seconds (first forward 3.5 s instead of 0.3 s for 1 GB). An in-place write to a weight
  would copy that page, never change the file. A staged file must be replaced by rename
  (as the staging code does), never rewritten in place.

With CUDA, each file gets one device buffer; every thread reads its chunk into its own pinned
host buffer and copies it to the device with `non_blocking=True` on its own side stream,
waiting for that copy before it reuses the pinned buffer. Checked once on an H200
(bench/gpu_check.py loader: every tensor bit-equal to a CPU load; 23.8 GB/s from the page
cache, five times safetensors' own load onto the GPU; docs/measurements.md "What was seen
on a GPU").

`bench/weight_load.py` measures both against a plain sequential read of the same files.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import queue
import struct
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

Method = Literal["chunked", "mmap"]
METHODS: tuple[Method, ...] = ("mmap", "chunked")
DEFAULT_METHOD: Method = "mmap"
# Enough to keep an NVMe queue busy; beyond the cores, page-cache copies gain nothing.
DEFAULT_THREADS = min(8, max(2, os.cpu_count() or 2))
CHUNK_BYTES = 64 * 1024 * 1024
INDEX = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"

_MADV_POPULATE_READ = 22  # Linux 5.14; Python's mmap module does not name it
_SCRATCH_BYTES = 8 * 1024 * 1024
_LOWEST_BIT = bytes(value & 1 for value in range(256))
_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}

StateDict = dict[str, torch.Tensor]


@dataclass(frozen=True)
class LoadStats:
    method: str
    device: str
    files: int
    tensors: int
    bytes: int  # the tensors' bytes; headers not counted
    seconds: float

    @property
    def gbps(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0

    def as_json(self) -> dict[str, object]:
        return {
            "loader": self.method,
            "files": self.files,
            "tensors": self.tensors,
            "bytes": self.bytes,
            "weights_read_s": round(self.seconds, 4),
            "load_gbps": round(self.gbps, 3),
        }


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    begin: int  # byte offsets into the file's data section
    end: int


@dataclass(frozen=True)
class SafetensorsFile:
    path: Path
    data_offset: int  # where the data section starts in the file
    data_bytes: int
    tensors: tuple[TensorEntry, ...]

    @classmethod
    def open(cls, path: Path) -> SafetensorsFile:
        with open(path, "rb") as file:
            (header_bytes,) = struct.unpack("<Q", file.read(8))
            header = json.loads(file.read(header_bytes))
            file_bytes = os.fstat(file.fileno()).st_size
        header.pop("__metadata__", None)
        tensors = tuple(sorted((_entry(name, info) for name, info in header.items()), key=_begin))
        data_bytes = max((entry.end for entry in tensors), default=0)
        if 8 + header_bytes + data_bytes > file_bytes:
            raise ValueError(f"{path} is truncated: {file_bytes} bytes, header says more")
        return cls(Path(path), 8 + header_bytes, data_bytes, tensors)

    def views(self, data: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
        """Each tensor as a view of `data`, a uint8 tensor holding the data section."""
        for entry in self.tensors:
            raw = data[entry.begin : entry.end]
            if entry.begin % entry.dtype.itemsize:
                # Another writer's layout may leave a tensor unaligned; only that one is copied.
                raw = raw.clone()
            yield entry.name, raw.view(entry.dtype).view(entry.shape)


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files of a model folder laid out as `save_pretrained` lays them out."""
    index = folder / INDEX
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        return [folder / name for name in sorted(set(weight_map.values()))]
    single = folder / SINGLE_FILE
    return [single] if single.is_file() else []


def load_state_dict_fast(
    folder: Path,
    *,
    device: str = "cpu",
    method: Method = DEFAULT_METHOD,
    threads: int = DEFAULT_THREADS,
    chunk_bytes: int = CHUNK_BYTES,
) -> tuple[StateDict, LoadStats]:
    """Every tensor of the model in `folder`, on `device` (blocking: run it in a thread)."""
    paths = weight_files(Path(folder))
    if not paths:
        raise FileNotFoundError(f"no {SINGLE_FILE} or {INDEX} in {folder}")
    return load_files(paths, device=device, method=method, threads=threads, chunk_bytes=chunk_bytes)


def load_files(
    paths: list[Path],
    *,
    device: str = "cpu",
    method: Method = DEFAULT_METHOD,
    threads: int = DEFAULT_THREADS,
    chunk_bytes: int = CHUNK_BYTES,
) -> tuple[StateDict, LoadStats]:
    started = time.perf_counter()
    files = [SafetensorsFile.open(path) for path in paths]
    target = torch.device(device)
    if target.type == "cuda":
        buffers = _read_to_cuda(files, target, threads, chunk_bytes)
        method_used = "chunked"
    elif method == "mmap":
        buffers = _map_files(files, threads, chunk_bytes)
        method_used = "mmap"
    else:
        buffers = _read_chunked(files, threads, chunk_bytes)
        method_used = "chunked"
    state: StateDict = {}
    for file, data in zip(files, buffers, strict=True):
        state.update(file.views(data))
    stats = LoadStats(
        method=method_used,
        device=str(target),
        files=len(files),
        tensors=len(state),
        bytes=sum(file.data_bytes for file in files),
        seconds=time.perf_counter() - started,
    )
    return state, stats


def _read_chunked(
    files: list[SafetensorsFile], threads: int, chunk_bytes: int
) -> list[torch.Tensor]:
    buffers = [torch.empty(file.data_bytes, dtype=torch.uint8) for file in files]
    with (
        ThreadPoolExecutor(threads, thread_name_prefix="weights-read") as pool,
        _opened(files) as fds,
    ):
        jobs = [
            pool.submit(_read_into, fd, _writable(buffer)[start:stop], file.data_offset + start)
            for file, fd, buffer in zip(files, fds, buffers, strict=True)
            for start, stop in _chunks(file.data_bytes, chunk_bytes)
        ]
        for job in jobs:
            job.result()
    return buffers


def _read_to_cuda(
    files: list[SafetensorsFile], device: torch.device, threads: int, chunk_bytes: int
) -> list[torch.Tensor]:
    buffers = [torch.empty(file.data_bytes, dtype=torch.uint8, device=device) for file in files]
    staging: queue.SimpleQueue[tuple[torch.Tensor, torch.cuda.Stream]] = queue.SimpleQueue()
    for _ in range(threads):
        pinned = torch.empty(chunk_bytes, dtype=torch.uint8, pin_memory=True)
        staging.put((pinned, torch.cuda.Stream(device)))  # type: ignore[no-untyped-call]

    def copy_chunk(fd: int, target: torch.Tensor, position: int) -> None:
        pinned, stream = staging.get()
        try:
            host = pinned[: target.numel()]
            _read_into(fd, _writable(host), position)
            with torch.cuda.stream(stream):
                target.copy_(host, non_blocking=True)
            stream.synchronize()  # the pinned buffer is free again only once the copy is done
        finally:
            staging.put((pinned, stream))

    with (
        ThreadPoolExecutor(threads, thread_name_prefix="weights-read") as pool,
        _opened(files) as fds,
    ):
        jobs = [
            pool.submit(copy_chunk, fd, buffer[start:stop], file.data_offset + start)
            for file, fd, buffer in zip(files, fds, buffers, strict=True)
            for start, stop in _chunks(file.data_bytes, chunk_bytes)
        ]
        for job in jobs:
            job.result()
    return buffers


def _map_files(files: list[SafetensorsFile], threads: int, chunk_bytes: int) -> list[torch.Tensor]:
    mappings = []
    for file in files:
        with open(file.path, "rb") as handle:
            mappings.append(mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY))
    with (
        ThreadPoolExecutor(threads, thread_name_prefix="weights-read") as pool,
        _opened(files) as fds,
    ):
        scratch = threading.local()
        jobs = [
            pool.submit(_read_through, fd, start, stop, scratch)
            for fd, mapping in zip(fds, mappings, strict=True)
            for start, stop in _missing_chunks(mapping, chunk_bytes)
        ]
        for job in jobs:
            job.result()
    for mapping in mappings:
        _populate(mapping)
    return [
        torch.frombuffer(mapping, dtype=torch.uint8)[file.data_offset :][: file.data_bytes]
        for file, mapping in zip(files, mappings, strict=True)
    ]


def _missing_chunks(mapping: mmap.mmap, chunk_bytes: int) -> Iterator[tuple[int, int]]:
    """The chunks of a mapped file with pages not in the page cache."""
    resident = _resident_pages(mapping)
    for start, stop in _chunks(len(mapping), chunk_bytes):
        first, end = start // mmap.PAGESIZE, -(-stop // mmap.PAGESIZE)
        if resident is None or b"\x00" in resident[first:end]:
            yield start, stop


def _resident_pages(mapping: mmap.mmap) -> bytes | None:
    """One byte per page, 1 where the page is in the page cache (mincore); None if unknown."""
    pages = -(-len(mapping) // mmap.PAGESIZE)
    vector = (ctypes.c_ubyte * pages)()
    anchor = ctypes.c_char.from_buffer(mapping)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        address, length = ctypes.c_void_p(ctypes.addressof(anchor)), ctypes.c_size_t(len(mapping))
        if libc.mincore(address, length, vector) != 0:
            return None
    except (AttributeError, OSError):  # no mincore on this platform
        return None
    finally:
        del anchor
    # Only the lowest bit is defined; the others are reserved.
    return bytes(vector).translate(_LOWEST_BIT)


def _read_through(fd: int, start: int, stop: int, scratch: threading.local) -> None:
    """Read a range into a reused buffer, only so that it lands in the page cache."""
    buffer = getattr(scratch, "buffer", None)
    if buffer is None:
        buffer = scratch.buffer = memoryview(bytearray(_SCRATCH_BYTES))
    for position in range(start, stop, _SCRATCH_BYTES):
        _read_into(fd, buffer[: min(_SCRATCH_BYTES, stop - position)], position)


def _populate(mapping: mmap.mmap) -> None:
    """Map every page now, read-only (no copy-on-write), rather than fault them in later."""
    try:
        mapping.madvise(_MADV_POPULATE_READ)
    except OSError:  # an older kernel: pages fault in on first use instead
        mapping.madvise(mmap.MADV_WILLNEED)


def _writable(buffer: torch.Tensor) -> memoryview:
    # numpy's stubs do not declare the buffer protocol that arrays have.
    return memoryview(buffer.numpy()).cast("B")  # type: ignore[arg-type]


def _read_into(fd: int, target: memoryview, position: int) -> None:
    while target:
        count = os.preadv(fd, [target], position)
        if count == 0:
            raise EOFError(f"file ended {len(target)} bytes early (fd {fd}, offset {position})")
        target, position = target[count:], position + count


def _chunks(size: int, chunk_bytes: int) -> Iterator[tuple[int, int]]:
    for start in range(0, size, chunk_bytes):
        yield start, min(size, start + chunk_bytes)


@contextmanager
def _opened(files: list[SafetensorsFile]) -> Iterator[list[int]]:
    fds: list[int] = []
    try:
        for file in files:
            fds.append(os.open(file.path, os.O_RDONLY))
        yield fds
    finally:
        for fd in fds:
            os.close(fd)


def _entry(name: str, info: dict[str, object]) -> TensorEntry:
    dtype = _DTYPES.get(str(info["dtype"]))
    if dtype is None:
        raise ValueError(f"tensor {name!r} has dtype {info['dtype']}, which this loader lacks")
    begin, end = (int(offset) for offset in info["data_offsets"])  # type: ignore[attr-defined]
    shape = tuple(int(size) for size in info["shape"])  # type: ignore[attr-defined]
    return TensorEntry(name, dtype, shape, begin, end)


def _begin(entry: TensorEntry) -> int:
    return entry.begin
