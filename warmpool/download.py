"""One model's files, fetched into its partial folder with parallel ranged GETs.

Chunks of all files go through one queue in file order, so files finish one after another;
each file is hashed as its chunks land (`PartFile.digest_more`), so verifying it at the end
is quick, and its fsync and rename happen while the next one downloads. Each worker reads
its chunks into one buffer of its own, reused. `parallelism` workers take
chunks from it, which bounds the GETs in flight and the chunk buffers held in memory.
Resume comes from the part files' sidecars and from `state.json`, which lists the files
already verified (by ETag, so a changed object is fetched again). A file that fails
verification is deleted and fetched once more; a second failure is an IntegrityError.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from warmpool.blocking import BlockingPool
from warmpool.errors import IntegrityError, StagingError
from warmpool.layout import CacheLayout, read_json, write_json_atomic
from warmpool.partfile import PartFile
from warmpool.retry import TransferRetryPolicy, with_retries
from warmpool.source import WeightSource
from warmpool.verify import FileSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DownloadSettings:
    chunk_bytes: int
    parallelism: int
    retry: TransferRetryPolicy
    checkpoint_s: float = 1.0  # how often a file's finished chunks are made durable


@dataclass(frozen=True)
class DownloadResult:
    fetched_bytes: int  # over the network by this run
    resumed_bytes: int  # already on disk from an interrupted run
    seconds: float
    read_back: frozenset[str]  # files hashed by this run: every byte read back just now


class ModelDownload:
    def __init__(
        self,
        source: WeightSource,
        specs: list[FileSpec],
        layout: CacheLayout,
        model: str,
        uri: str,
        pool: BlockingPool,
        settings: DownloadSettings,
        on_bytes: Callable[[int], None],
    ) -> None:
        self._source, self._layout, self._pool = source, layout, pool
        self._model, self._uri, self._settings = model, uri, settings
        self._on_bytes = on_bytes
        self._files = [
            PartFile(
                spec,
                layout.part(model, spec.name),
                layout.sidecar(model, spec.name),
                layout.ready(model, spec.name),
                settings.chunk_bytes,
                settings.checkpoint_s,
            )
            for spec in specs
        ]
        self._verified: dict[str, str] = {}  # name -> ETag, mirrored in state.json
        self._state_lock = threading.Lock()
        self._queue: deque[tuple[PartFile, int]] = deque()
        self._finishing: set[str] = set()
        self._fetched_again: set[str] = set()
        self._read_back: set[str] = set()
        self._workers = 0  # each holds at most one chunk in memory
        self._group: asyncio.TaskGroup | None = None
        self.fetched_bytes = 0

    @property
    def bytes_on_disk(self) -> int:
        return sum(
            pf.spec.size if pf.spec.name in self._verified else pf.bytes_done for pf in self._files
        )

    async def run(self) -> DownloadResult:
        started = time.perf_counter()
        pending = await self._pool.run(self._prepare)
        resumed = self.bytes_on_disk
        self._on_bytes(resumed)
        try:
            async with asyncio.TaskGroup() as group:
                self._group = group
                for pf in pending:
                    self._schedule(pf)
        except ExceptionGroup as errors:
            raise _first_staging_error(errors)  # noqa: B904 - its own cause is kept
        finally:
            self._group = None
            await self._pool.run(_close_all, self._files)
        seconds = time.perf_counter() - started
        return DownloadResult(self.fetched_bytes, resumed, seconds, frozenset(self._read_back))

    def _schedule(self, pf: PartFile) -> None:
        assert self._group is not None
        if pf.complete:
            self._finishing.add(pf.spec.name)
            self._group.create_task(self._finish(pf))
            return
        self._queue.extend((pf, index) for index in pf.missing())
        # Workers leave when the queue runs dry; a file fetched again may need new ones.
        while self._workers < min(self._settings.parallelism, len(self._queue)):
            self._workers += 1
            self._group.create_task(self._worker())

    async def _worker(self) -> None:
        assert self._group is not None
        buffer = memoryview(bytearray(self._settings.chunk_bytes))  # reused for every chunk
        try:
            while self._queue:
                pf, index = self._queue.popleft()
                data = await self._fetch(pf, index, buffer)
                await self._pool.run(pf.write_chunk, index, data)
                # Hashing runs beside the next GET, not in this worker's way (`PartFile`).
                self._group.create_task(self._pool.run(pf.digest_more))
                self.fetched_bytes += len(data)
                self._on_bytes(len(data))
                if pf.complete and pf.spec.name not in self._finishing:
                    self._schedule(pf)
        finally:
            self._workers -= 1

    async def _fetch(self, pf: PartFile, index: int, buffer: memoryview) -> memoryview:
        start, stop = pf.chunk_range(index)
        what = f"{pf.spec.name} bytes {start}-{stop - 1}"
        chunk = buffer[: stop - start]
        read = partial(self._source.read_into, pf.spec.remote, start, chunk)
        await with_retries(read, self._settings.retry, what)
        return chunk

    async def _finish(self, pf: PartFile) -> None:
        # The file's last chunks are hashed while its last writes go to disk (CPU beside
        # I/O), so that `finish` has little of either left. A group, not gather: both
        # threads are done before anything may close the file.
        async with asyncio.TaskGroup() as both:
            both.create_task(self._pool.run(pf.sync))
            both.create_task(self._pool.run(pf.digest_more))
        reason = await self._pool.run(pf.finish)
        if reason is None:
            if pf.spec.verified_by != "size":
                self._read_back.add(pf.spec.name)
            await self._pool.run(self._mark_verified, pf.spec)
            return
        if pf.spec.name in self._fetched_again:
            raise IntegrityError(f"{reason}, also after downloading it again")
        log.warning("%s: %s; downloading it again", self._model, reason)
        self._fetched_again.add(pf.spec.name)
        self._finishing.discard(pf.spec.name)
        self._on_bytes(-pf.spec.size)
        await self._pool.run(pf.open)
        self._schedule(pf)

    def _prepare(self) -> list[PartFile]:
        """Keep what an earlier run verified, clear strays, and open the rest."""
        state = read_json(self._layout.state(self._model))
        earlier = state.get("verified") if isinstance(state, dict) else None
        earlier = earlier if isinstance(earlier, dict) else {}
        self._verified = {
            pf.spec.name: pf.spec.remote.etag
            for pf in self._files
            if earlier.get(pf.spec.name) == pf.spec.remote.etag and _has_size(pf.ready, pf.spec)
        }
        pending = [pf for pf in self._files if pf.spec.name not in self._verified]
        self._remove_strays(pending)
        self._write_state()
        for pf in pending:
            pf.open()
        return pending

    def _remove_strays(self, pending: list[PartFile]) -> None:
        partial_dir = self._layout.partial(self._model)
        keep = {self._layout.ready(self._model, name) for name in self._verified}
        keep |= {path for pf in pending for path in (pf.part, pf.sidecar)}
        for sub in ("files", "parts"):
            for folder, _, names in os.walk(partial_dir / sub):
                for name in names:
                    if (path := Path(folder, name)) not in keep:
                        path.unlink()
        partial_dir.mkdir(parents=True, exist_ok=True)

    def _mark_verified(self, spec: FileSpec) -> None:
        with self._state_lock:
            self._verified[spec.name] = spec.remote.etag
            self._write_state()

    def _write_state(self) -> None:
        state = {"model": self._model, "uri": self._uri, "verified": self._verified}
        write_json_atomic(self._layout.state(self._model), state)


def _has_size(path: Path, spec: FileSpec) -> bool:
    try:
        return path.stat().st_size == spec.size
    except FileNotFoundError:
        return False


def _close_all(files: list[PartFile]) -> None:
    for pf in files:
        pf.close()


def _first_staging_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The TaskGroup wraps errors; callers expect the StagingError of the failed chunk."""
    for exc in group.exceptions:
        found = _first_staging_error(exc) if isinstance(exc, BaseExceptionGroup) else exc
        if isinstance(found, StagingError):
            return found
    return group
