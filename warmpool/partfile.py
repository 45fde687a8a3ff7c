"""One file being downloaded: chunks written in place, and a sidecar of the chunks on disk.

The sidecar records the object's ETag, size and the chunk size with the finished chunk
indices; a resume keeps the chunks only when all three still match. The file is
fdatasync'd before the sidecar names a chunk, so after a crash (even a power loss) every
chunk the sidecar lists is really there.

Checkpoints (fdatasync, then the sidecar, itself fsync'd) happen at most every
`checkpoint_s` (1 s by default) per file, and when the download stops for any reason: an
fdatasync per 8 MiB chunk cost a third of the throughput with 8 writers here, and a crash
now loses at most a second of chunks.

The checksum (`warmpool.verify`) is computed while the file downloads: after each write,
`digest_more` reads back the chunks that continue the hashed stretch from the file's start
and hashes them, in one thread at a time, so that `finish` has little or nothing left to
hash. Hashing what the file holds (from the page cache, just written) rather than the
network buffers keeps the check end to end: a chunk written at the wrong place fails it.
All methods block: call them through the pool.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from warmpool.layout import read_json, write_json_atomic
from warmpool.verify import FileSpec, check_digest, new_digest

READ_BYTES = 8 * 1024 * 1024  # read-back block when hashing


class PartFile:
    def __init__(
        self,
        spec: FileSpec,
        part: Path,
        sidecar: Path,
        ready: Path,
        chunk_bytes: int,
        checkpoint_s: float = 1.0,
    ) -> None:
        self.spec = spec
        self.part = part
        self.sidecar = sidecar
        self.ready = ready
        self.chunk_bytes = chunk_bytes
        self.checkpoint_s = checkpoint_s
        self.chunks = -(-spec.size // chunk_bytes)
        self.done: set[int] = set()  # written; the sidecar lists those also made durable
        self._saved: set[int] = set()
        self._saved_at = time.monotonic()
        self._fd = -1
        self._lock = threading.Lock()  # chunks of one file finish in several threads
        # Taken before `_lock` where both are held. Guards the digest and the chunks hashed.
        self._hash_lock = threading.Lock()
        self._digest: Any = None
        self._hashed = 0  # chunks [0, _hashed) are in the digest
        self._read_buffer: bytearray | None = None

    def open(self) -> None:
        """Resume from the sidecar when it still describes this object, or start empty."""
        self.part.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.part, os.O_RDWR | os.O_CREAT, 0o644)
        self._digest, self._hashed = new_digest(self.spec), 0
        recorded = read_json(self.sidecar)
        if self._resumable(recorded):
            self.done = {i for i in recorded["done"] if isinstance(i, int) and 0 <= i < self.chunks}
            self._saved = set(self.done)
            return
        self.done, self._saved = set(), set()
        self.sidecar.unlink(missing_ok=True)
        os.ftruncate(self._fd, 0)  # drop bytes of another version of the object
        os.ftruncate(self._fd, self.spec.size)

    def _resumable(self, recorded: Any) -> bool:
        return (
            isinstance(recorded, dict)
            and all(recorded.get(key) == value for key, value in self._identity().items())
            and isinstance(recorded.get("done"), list)
            and os.fstat(self._fd).st_size == self.spec.size
        )

    def _identity(self) -> dict[str, object]:
        return {"etag": self.spec.remote.etag, "size": self.spec.size, "chunk": self.chunk_bytes}

    def chunk_range(self, index: int) -> tuple[int, int]:
        start = index * self.chunk_bytes
        return start, min(start + self.chunk_bytes, self.spec.size)

    def missing(self) -> list[int]:
        done = self._done_now()
        return [i for i in range(self.chunks) if i not in done]

    @property
    def complete(self) -> bool:
        return len(self.done) == self.chunks

    @property
    def bytes_done(self) -> int:
        return sum(stop - start for start, stop in map(self.chunk_range, self._done_now()))

    def _done_now(self) -> set[int]:
        with self._lock:  # writer threads add to the set while the event loop reads it
            return set(self.done)

    def write_chunk(self, index: int, data: bytes | bytearray | memoryview) -> None:
        start, _ = self.chunk_range(index)
        view = memoryview(data)
        while view:
            written = os.pwrite(self._fd, view, start)
            view, start = view[written:], start + written
        with self._lock:
            self.done.add(index)
            if time.monotonic() - self._saved_at >= self.checkpoint_s:
                self._checkpoint()

    def _checkpoint(self) -> None:
        # Snapshot first: chunks in it were written before the fdatasync below began.
        written = set(self.done)
        if self._fd < 0 or written == self._saved:
            return
        os.fdatasync(self._fd)
        write_json_atomic(self.sidecar, self._identity() | {"done": sorted(written)})
        self._saved, self._saved_at = written, time.monotonic()

    def digest_more(self) -> None:
        """Hash the chunks on disk that continue the hashed stretch; call it after writes.

        One thread hashes at a time; the others return at once, and the check after each
        release catches a chunk that was finished while the lock was held.
        """
        while self._hash_lock.acquire(blocking=False):
            try:
                self._hash_contiguous()
            finally:
                self._hash_lock.release()
            if not self._next_chunk_ready():
                return

    def _next_chunk_ready(self) -> bool:
        with self._lock:
            return self._digest is not None and self._fd >= 0 and self._hashed in self.done

    def _hash_contiguous(self) -> None:
        while self._next_chunk_ready():
            self._hash_range(*self.chunk_range(self._hashed))
            self._hashed += 1

    def _hash_range(self, start: int, stop: int) -> None:
        if self._read_buffer is None:
            self._read_buffer = bytearray(min(READ_BYTES, self.chunk_bytes))
        view = memoryview(self._read_buffer)
        while start < stop:
            read = os.preadv(self._fd, [view[: stop - start]], start)
            if read == 0:
                raise OSError(f"{self.part} ends at byte {start}, expected {stop}")
            self._digest.update(view[:read])
            start += read

    def sync(self) -> None:
        """Flush the written chunks to disk; `finish` does too, with less left to do after."""
        os.fdatasync(self._fd)

    def finish(self) -> str | None:
        """Verify, then move into the files folder; on a mismatch delete it and say why."""
        os.fdatasync(self._fd)  # a published file must be whole on disk, not just in cache
        with self._hash_lock:
            self._hash_contiguous()  # what the writers' threads have not hashed yet
            unhashed = self._digest is not None and self._hashed != self.chunks
            size = os.fstat(self._fd).st_size
            self._close_fd()
        if unhashed:
            reason: str | None = f"{self.spec.name}: chunk {self._hashed} was never written"
        else:
            reason = check_digest(self.spec, size, self._digest)
        if reason is not None:
            self.part.unlink(missing_ok=True)
            self.sidecar.unlink(missing_ok=True)
            self.done, self._saved = set(), set()
            return reason
        self.ready.parent.mkdir(parents=True, exist_ok=True)
        os.replace(self.part, self.ready)
        self.sidecar.unlink(missing_ok=True)
        return None

    def close(self) -> None:
        """Save what is on disk for a resume, and close."""
        with self._hash_lock, self._lock:
            self._checkpoint()
            self._close_fd()

    def _close_fd(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._read_buffer = None
