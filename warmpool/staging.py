"""WeightStager: model weights from S3 to a local cache folder, verified, within a disk budget.

    async with WeightStager(cache_dir, S3WeightSource.factory(...), disk_budget_bytes=...) as s:
        s.pin("llama-8b")                                  # `staged: always`: never evicted
        staged = await s.stage("llama-8b", "s3://weights/llama-8b/")
        staged.path, staged.download, staged.readahead      # folder, MB/s of each phase

- Staging lists the prefix, reads `manifest.json` if there is one, makes room (evicting
  least recently used unpinned models), downloads with parallel ranged GETs, verifies
  each file (see `warmpool.verify`), publishes the folder atomically, then reads it ahead
  into the page cache. `warmpool.layout` draws the folder.
- Interrupted stagings (cancelled, crashed, failed) resume: finished chunks and verified
  files are kept and only the rest is fetched.
- Concurrent `stage()` calls for one model share one download (`warmpool.flight`). If the
  caller doing the work is cancelled, one of the others takes over, resuming from what is
  on disk.
- A staged model is served from disk as it is; `evict()` it to fetch a newer version
  (a different URI for the same model name re-stages on its own).
- Last use is kept in memory by `touch()` (cheap enough for every request) and saved as the
  `.complete` marker's mtime by the next async call, so LRU order survives restarts.
- `readahead="pagecache"` reads the files once after staging (and on `warm()`); "none"
  skips it. Right after a download, files whose checksum was just computed had every byte
  read back from the page cache by the verification: they are only advised
  (`POSIX_FADV_WILLNEED`, which re-reads whatever was dropped since), not read again.
  Pinning into page-locked host memory is left to the process that loads the weights:
  such memory belongs to the process that allocates it.
- One stager owns a cache folder. Cancel its stagings before `aclose()`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Literal

from warmpool.blocking import BlockingPool
from warmpool.budget import CacheEntry, plan_eviction
from warmpool.catalog import save_last_use, scan
from warmpool.download import DownloadSettings, ModelDownload
from warmpool.errors import IntegrityError, ModelNotStaged, SourceError, SourceNotFound
from warmpool.flight import Flight, LeaderGone, Progress
from warmpool.layout import CacheLayout, discard, publish
from warmpool.readahead import read_ahead
from warmpool.retry import TransferRetryPolicy, with_retries
from warmpool.source import RemoteObject, WeightSource, WeightSourceFactory, parse_s3_uri
from warmpool.staged import StagedFile, StagedModel, Throughput
from warmpool.verify import MANIFEST, FileSpec, ManifestEntry, parse_manifest, plan_files

log = logging.getLogger(__name__)

MiB = 1024 * 1024
MAX_MANIFEST_BYTES = 16 * MiB
DEFAULT_RETRY = TransferRetryPolicy()


class WeightStager:
    def __init__(
        self,
        cache_dir: Path,
        source_factory: WeightSourceFactory,
        disk_budget_bytes: int,
        *,
        chunk_bytes: int = 8 * MiB,
        parallelism: int = 8,
        readahead: Literal["pagecache", "none"] = "pagecache",
        retry: TransferRetryPolicy = DEFAULT_RETRY,
        verify_etag: bool = True,
        checkpoint_s: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if chunk_bytes < 1 or parallelism < 1 or disk_budget_bytes < 0:
            raise ValueError("chunk_bytes and parallelism must be positive, the budget >= 0")
        self._layout = CacheLayout(Path(cache_dir))
        self._source_factory = source_factory
        self._budget = disk_budget_bytes
        self._settings = DownloadSettings(chunk_bytes, parallelism, retry, checkpoint_s)
        self._readahead = readahead
        self._verify_etag = verify_etag
        self._clock = clock
        self._pool = BlockingPool(parallelism + 2)
        self._open_lock = asyncio.Lock()
        self._opened = False
        self._published: dict[str, StagedModel] = {}
        self._partials: dict[str, CacheEntry] = {}  # interrupted downloads still on disk
        self._reserved: dict[str, int] = {}  # full size of each staging in progress
        self._last_used: dict[str, float] = {}
        self._unsaved_use: set[str] = set()
        self._reading: Counter[str] = Counter()
        self._pinned: set[str] = set()
        self._flights: dict[str, Flight] = {}
        self._evicting: dict[str, asyncio.Event] = {}  # set once the folders are gone

    # -- lifecycle ---------------------------------------------------------------------

    async def open(self) -> None:
        """Create the folders and load what earlier runs staged. Idempotent."""
        async with self._open_lock:
            if self._opened:
                return
            published, partials = await self._pool.run(scan, self._layout)
            for staged, last_used in published:
                self._published[staged.model] = staged
                self._last_used[staged.model] = last_used
            self._partials = {entry.model: entry for entry in partials}
            await self._warm_up_source()
            self._opened = True

    async def _warm_up_source(self) -> None:
        """Make and close one source: the first S3 client of a session loads botocore's
        service model (0.1-0.3 s here), which should not be on the first cold start's path.
        Nothing goes over the network with explicit credentials."""
        try:
            async with self._source_factory():
                pass
        except SourceError as exc:  # the staging that needs the source will say it again
            log.warning("could not open a weight source yet: %s", exc)

    async def aclose(self) -> None:
        if self._opened:
            await self._save_use()
        self._pool.close()

    async def __aenter__(self) -> WeightStager:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- state, cheap and synchronous ----------------------------------------------------

    def is_staged(self, model: str) -> bool:
        """Published with its `.complete` marker (as of `open()` and this stager's own work)."""
        self._require_open()
        return model in self._published

    def staged(self, model: str) -> StagedModel | None:
        self._require_open()
        return self._published.get(model)

    def pin(self, model: str) -> None:
        """Never evict this model to make room (`staged: always`); `stage()` it to fetch it."""
        self._pinned.add(model)

    def touch(self, model: str) -> None:
        """Mark a use: the least recently used models are evicted first."""
        self._last_used[model] = self._clock()
        self._unsaved_use.add(model)

    def snapshot(self) -> list[CacheEntry]:
        """Everything that counts against the disk budget, as the eviction policy sees it."""
        now = self._clock()
        entries = [
            CacheEntry(
                model,
                staged.total_bytes,
                self._last_used.get(model, 0.0),
                pinned=model in self._pinned,
                busy=self._reading[model] > 0,
            )
            for model, staged in self._published.items()
        ]
        entries += [replace(e, pinned=e.model in self._pinned) for e in self._partials.values()]
        entries += [CacheEntry(m, n, now, busy=True) for m, n in self._reserved.items()]
        return entries

    def _require_open(self) -> None:
        if not self._opened:
            raise RuntimeError("await WeightStager.open() (or use it with async with) first")

    # -- staging -----------------------------------------------------------------------

    async def stage(self, model: str, uri: str, progress: Progress | None = None) -> StagedModel:
        """Stage `model` from `uri` unless it already is; then it returns at once."""
        parse_s3_uri(uri)  # a bad URI fails here, not in whoever shares the download
        await self.open()
        while True:
            if (staged := await self._already_staged(model, uri)) is not None:
                return staged
            flight = self._flights.get(model)
            if flight is None:
                return await self._lead(model, uri, progress)
            if progress is not None:
                flight.listeners.append(progress)
            try:
                staged = await asyncio.shield(flight.future)
            except LeaderGone:
                continue  # loop: this caller may now lead, resuming from the partial files
            finally:
                if progress in flight.listeners:
                    flight.listeners.remove(progress)
            if staged.uri == uri:
                return staged

    async def _already_staged(self, model: str, uri: str) -> StagedModel | None:
        staged = self._published.get(model)
        if staged is None:
            return None
        marker_there = await self._pool.run(self._layout.marker(model).exists)
        if staged.uri != uri or not marker_there:
            log.info("%s: staged copy is from %s or gone; staging %s again", model, staged.uri, uri)
            await self.evict(model)
            return None
        self.touch(model)
        await self._save_use()
        return staged

    async def _lead(self, model: str, uri: str, progress: Progress | None) -> StagedModel:
        flight = Flight(asyncio.get_running_loop().create_future())
        if progress is not None:
            flight.listeners.append(progress)
        self._flights[model] = flight
        try:
            staged = await self._stage_now(model, uri, flight)
        except Exception as exc:
            flight.future.set_exception(exc)
            raise
        except BaseException:
            flight.future.set_exception(LeaderGone())
            raise
        finally:
            del self._flights[model]
            if flight.future.done() and not flight.future.cancelled():
                flight.future.exception()  # mark retrieved: nobody may be waiting
        flight.future.set_result(staged)
        return staged

    async def _stage_now(self, model: str, uri: str, flight: Flight) -> StagedModel:
        location = parse_s3_uri(uri)
        retry = self._settings.retry
        async with self._source_factory() as source:
            listing = partial(source.list_objects, location)
            objects = await with_retries(listing, retry, f"listing {location}")
            if not objects:
                raise SourceNotFound(f"no objects under {location}")
            specs = plan_files(objects, await self._manifest(source, objects), self._verify_etag)
            flight.total = sum(spec.size for spec in specs)
            staged, read_back = await self._download(model, uri, source, specs, flight)
        self.touch(model)
        await self._save_use()
        if self._readahead == "pagecache":
            staged = replace(staged, readahead=await self._read_ahead(model, read_back))
        log.info(
            "staged %s: fetched %s, resumed %d bytes", model, staged.download, staged.resumed_bytes
        )
        return staged

    async def _manifest(
        self, source: WeightSource, objects: list[RemoteObject]
    ) -> dict[str, ManifestEntry] | None:
        obj = next((o for o in objects if o.name == MANIFEST), None)
        if obj is None:
            return None
        if not 0 < obj.size <= MAX_MANIFEST_BYTES:
            raise IntegrityError(
                f"{MANIFEST} is {obj.size} bytes; expected 1 to {MAX_MANIFEST_BYTES}"
            )
        read = partial(source.read_range, obj, 0, obj.size)
        return parse_manifest(await with_retries(read, self._settings.retry, MANIFEST))

    async def _download(
        self, model: str, uri: str, source: WeightSource, specs: list[FileSpec], flight: Flight
    ) -> tuple[StagedModel, frozenset[str]]:
        """The published model, and the files that verification read back in full."""
        # A staging of this model may start while an eviction of it still deletes folders.
        while (evicting := self._evicting.get(model)) is not None:
            await evicting.wait()
        leftover = self._partials.pop(model, None)
        download = ModelDownload(
            source, specs, self._layout, model, uri, self._pool, self._settings, flight.report
        )
        try:
            await self._make_room(model, flight.total)
            result = await download.run()
            staged = StagedModel(
                model,
                uri,
                self._layout.published(model),
                tuple(_staged_file(spec) for spec in specs),
                from_cache=False,
                resumed_bytes=result.resumed_bytes,
                download=Throughput(result.fetched_bytes, result.seconds),
            )
            await self._publish(staged)
            return staged, result.read_back
        except BaseException:
            if model not in self._published:  # else cancelled after publishing: nothing left
                on_disk = max(download.bytes_on_disk, leftover.bytes if leftover else 0)
                self._partials[model] = CacheEntry(model, on_disk, self._clock(), partial=True)
            raise
        finally:
            self._reserved.pop(model, None)

    async def _make_room(self, model: str, needed: int) -> None:
        # Plan and reserve with no await in between: concurrent stagings see each other.
        victims = plan_eviction(self.snapshot(), model, needed, self._budget)
        for victim in victims:
            (self._partials if victim.partial else self._published).pop(victim.model, None)
        self._reserved[model] = needed
        for victim in victims:
            log.info("evicting %s (%d bytes) for %s", victim.model, victim.bytes, model)
        folders = self._layout.partial, self._layout.published
        await self._discard([(v.model, folders[not v.partial](v.model)) for v in victims])

    async def _discard(self, folders: list[tuple[str, Path]]) -> None:
        """Delete model folders. Stagings of these models wait (`_download`) until they are gone.

        The events are registered before the first await, in the caller's synchronous step.
        """
        events = {model: self._evicting.setdefault(model, asyncio.Event()) for model, _ in folders}
        try:
            for _, folder in folders:
                await self._pool.run(discard, folder, self._layout.trash)
        finally:
            for model, event in events.items():
                if self._evicting.get(model) is event:
                    del self._evicting[model]
                event.set()

    async def _publish(self, staged: StagedModel) -> None:
        done = threading.Event()

        def work() -> None:
            publish(self._layout, staged.model, staged.marker(self._clock()))
            done.set()

        try:
            await self._pool.run(work)
        finally:
            # Also when cancelled: the thread ran to its end, so the index must say so.
            if done.is_set():
                self._published[staged.model] = replace(staged, from_cache=True, download=None)

    # -- use of staged models ----------------------------------------------------------

    async def warm(self, model: str) -> Throughput:
        """Read the model's files into the page cache; returns how fast that went."""
        await self.open()
        return await self._read_ahead(model, frozenset())

    async def _read_ahead(self, model: str, cached: frozenset[str]) -> Throughput:
        """Read the files, except those in `cached`: advised only (see the module's notes)."""
        staged = self._published.get(model)
        if staged is None:
            raise ModelNotStaged(f"{model} is not staged")
        self._reading[model] += 1
        try:
            paths = [staged.path / f.name for f in staged.files if f.name not in cached]
            advised = [staged.path / f.name for f in staged.files if f.name in cached]
            return await self._pool.run(read_ahead, paths, advise=advised)
        finally:
            self._reading[model] -= 1

    async def evict(self, model: str) -> bool:
        """Remove the published copy (pinned or not) and any interrupted download of it.

        A staging in progress for the model keeps its partial files. True if anything went.
        """
        await self.open()
        folders = []
        if self._published.pop(model, None) is not None:
            folders.append((model, self._layout.published(model)))
        if model not in self._flights and self._partials.pop(model, None) is not None:
            folders.append((model, self._layout.partial(model)))
        await self._discard(folders)
        return bool(folders)

    async def _save_use(self) -> None:
        unsaved = {m: self._last_used[m] for m in self._unsaved_use if m in self._published}
        self._unsaved_use.clear()
        if unsaved:
            await self._pool.run(save_last_use, self._layout, unsaved)


def _staged_file(spec: FileSpec) -> StagedFile:
    return StagedFile(spec.name, spec.size, spec.remote.etag, spec.sha256, spec.verified_by)
