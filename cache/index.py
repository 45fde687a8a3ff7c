"""One namespace's vectors: a FAISS inner-product index with tombstones (`NamespaceIndex`).

Vectors are L2-normalised, so inner product is cosine similarity. The partition into
namespaces, one `NamespaceIndex` each, is cache/vector_index.py's `VectorIndex`.

Index kind, chosen at each (re)build from the namespace's live size:

- exact `IndexFlatIP` up to `IndexConfig.flat_max` vectors (20k by default: one query
  costs about 1.5 ms on one core of the reference machine, 0.65 ms at 10k, 12 ms at 100k);
- `IndexHNSWFlat` above it (about 0.2 ms per query at 100k, recall@1 against flat ~1.0 on
  clustered embeddings), and back to flat below half the threshold (hysteresis);
- on a machine with CUDA and faiss-gpu (`faiss.get_num_gpus() > 0`) every namespace is a
  `GpuIndexFlatIP` (`_to_gpu`): brute force on a GPU is faster than HNSW on a CPU well
  past a million vectors, and GPU indexes support what this module needs (add, search,
  reconstruct) and nothing more, so the rest of the code path is the same.

Deletes and TTL expiry are tombstones: the position of a removed vector is marked dead
and skipped by searches, which over-fetch (doubling up to `_MAX_FETCH`) until they have k
live results or reach the similarity floor. `IndexFlat.remove_ids` would shift every later
position (an O(n) memmove per delete) and HNSW cannot remove at all, so both kinds share
one strategy: when dead positions exceed `compact_fraction` of the index, or the kind no
longer fits the size, `rebuild()` copies the live vectors into a fresh index. The copy is
built without holding the lock (an HNSW build takes seconds), then the vectors added
meanwhile are appended and the swap happens under the lock, so searches never wait for it.

Every method blocks; the stores call the slow ones from worker threads.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from cache.entry import Vector

Kind = Literal["flat", "hnsw"]
Hit = tuple[str, float]  # (entry_id, similarity)

_MAX_FETCH = 1024  # GPU flat search caps k at 2048; a cache lookup never needs more
_BULK = 1024  # adds of at least this many vectors may use every OpenMP thread
# search_many_now() scans a flat index of up to this many positions (live or dead): about 1 ms
# on one core here, less than a hop to a worker thread costs when the cores are busy.
# HNSW (about 0.2 ms at 100k) and GPU searches are always quick.
_QUICK_FLAT = 16_384


@dataclass(frozen=True)
class IndexConfig:
    flat_max: int = 20_000
    hnsw_m: int = 32
    hnsw_ef_construction: int = 64
    hnsw_ef_search: int = 128
    compact_fraction: float = 0.25
    gpu: bool | None = None  # None: use a GPU when faiss-gpu sees one


class NamespaceIndex:
    """The vectors of one namespace; thread-safe."""

    def __init__(self, dim: int, config: IndexConfig, gpu: Any | None) -> None:
        self._dim = dim
        self._config = config
        self._gpu = gpu  # faiss.StandardGpuResources, or None on CPU
        self._lock = threading.Lock()
        self._rebuilding = threading.Lock()
        self._kind: Kind = "flat"
        self._index = self._build("flat", np.empty((0, dim), np.float32))
        self._ids: list[str | None] = []  # FAISS position -> entry id; None once removed
        self._pos: dict[str, int] = {}  # live entry id -> FAISS position
        self._retired = False  # dropped from its VectorIndex: adds must go elsewhere

    @property
    def kind(self) -> Kind:
        return self._kind

    def __len__(self) -> int:
        return len(self._pos)

    def __contains__(self, entry_id: object) -> bool:
        return entry_id in self._pos

    def ids(self) -> list[str]:
        with self._lock:
            return list(self._pos)

    def add(self, ids: Sequence[str], vectors: Vector) -> int:
        """Add vectors (one row per id); ids already present stay as they are (entries are
        immutable, and replicas see their own inserts twice). Returns how many were added."""
        added = self._add(ids, vectors)
        if added is None:
            raise RuntimeError("this namespace index was dropped")
        return added

    def _add(self, ids: Sequence[str], vectors: Vector) -> int | None:
        """`add`, or None if the index was retired (dropped) in the meantime."""
        rows = _as_matrix(vectors, self._dim)
        if len(rows) != len(ids):
            raise ValueError(f"{len(ids)} ids for {len(rows)} vectors")
        with self._lock:
            if self._retired:
                return None
            fresh = _first_new(ids, self._pos)
            if fresh:
                with _omp_threads(1 if len(fresh) < _BULK else None):
                    self._index.add(np.ascontiguousarray(rows[fresh]))
            for n in fresh:
                self._pos[ids[n]] = len(self._ids)
                self._ids.append(ids[n])
            return len(fresh)

    def retire_if_empty(self, force: bool = False) -> bool:
        """Mark the index dead (adds then go to a new one) if it is empty, or if `force`."""
        with self._lock:
            self._retired = self._retired or force or not self._pos
            return self._retired

    def remove(self, ids: Iterable[str]) -> int:
        with self._lock:
            removed = 0
            for entry_id in ids:
                position = self._pos.pop(entry_id, None)
                if position is not None:
                    self._ids[position] = None
                    removed += 1
            return removed

    def search(
        self,
        query: Vector,
        k: int,
        floor: float = -1.0,
        accept: Callable[[str], bool] | None = None,
    ) -> list[Hit]:
        """The k most similar live ids with similarity >= floor (and `accept`ed), best first."""
        q = _as_matrix(query, self._dim)[:1]
        with self._lock:
            return self._search(q, k, floor, accept)

    def search_many_now(
        self, queries: Vector, k: int, floor: float, accepts: Sequence[Callable[[str], bool]]
    ) -> list[list[Hit]] | None:
        """`search` for several queries (one row each, with its own `accept`) in one FAISS
        call, if that is quick and the index is free now; None otherwise (an add, a
        rebuild's copy or another search holds it, or a flat scan would be long). For
        callers on an event loop, which must not wait: they search in a thread instead.
        32 queries of a 10k flat namespace cost a few times one, not 32 times."""
        q = _as_matrix(queries, self._dim)
        if not self._lock.acquire(blocking=False):
            return None
        try:
            if self._kind == "flat" and self._gpu is None and len(self._ids) > _QUICK_FLAT:
                return None
            fetch = self._first_fetch(k)
            if k <= 0 or fetch <= 0:
                return [[] for _ in accepts]
            with _omp_threads(1):
                scores, positions = self._index.search(q, fetch)
            found = []
            for row, accept in enumerate(accepts):
                hits, exhausted = self._collect(scores[row], positions[row], k, floor, accept)
                if self._wants_more(hits, k, exhausted, fetch):  # past tombstones, alone
                    hits = self._search(q[row : row + 1], k, floor, accept, self._more(fetch))
                found.append(hits)
            return found
        finally:
            self._lock.release()

    def _search(
        self,
        q: Vector,
        k: int,
        floor: float,
        accept: Callable[[str], bool] | None,
        fetch: int | None = None,
    ) -> list[Hit]:
        """Fetches `fetch` results (default `_first_fetch`), four times more while dead
        positions or refused ids leave fewer than k."""
        fetch = self._first_fetch(k) if fetch is None else fetch
        while k > 0 and fetch > 0:
            with _omp_threads(1):
                scores, positions = self._index.search(q, fetch)
            hits, exhausted = self._collect(scores[0], positions[0], k, floor, accept)
            if not self._wants_more(hits, k, exhausted, fetch):
                return hits
            fetch = self._more(fetch)
        return []

    def _first_fetch(self, k: int) -> int:
        return min(len(self._ids), 2 * k + 8, _MAX_FETCH)

    def _more(self, fetch: int) -> int:
        return min(len(self._ids), fetch * 4, _MAX_FETCH)

    def _wants_more(self, hits: list[Hit], k: int, exhausted: bool, fetch: int) -> bool:
        """Whether a bigger fetch could find hits this one lacked."""
        return len(hits) < k and exhausted and fetch < min(len(self._ids), _MAX_FETCH)

    def _collect(
        self,
        scores: Any,
        positions: Any,
        k: int,
        floor: float,
        accept: Callable[[str], bool] | None,
    ) -> tuple[list[Hit], bool]:
        """Live hits from one FAISS answer, and whether a bigger fetch could find more."""
        hits: list[Hit] = []
        for score, position in zip(scores.tolist(), positions.tolist(), strict=True):
            if position < 0 or score < floor:
                return hits, False  # results are sorted: nothing better follows
            entry_id = self._ids[position]
            if entry_id is not None and (accept is None or accept(entry_id)):
                hits.append((entry_id, score))
                if len(hits) == k:
                    return hits, False
        return hits, True

    def needs_rebuild(self) -> bool:
        with self._lock:
            return self._needs_rebuild()

    def _needs_rebuild(self) -> bool:
        dead = len(self._ids) - len(self._pos)
        too_dead = dead > self._config.compact_fraction * len(self._ids)
        return too_dead or self._wanted_kind() != self._kind

    def _wanted_kind(self) -> Kind:
        live, flat_max = len(self._pos), self._config.flat_max
        if self._gpu is not None:
            return "flat"
        if self._kind == "hnsw":
            return "hnsw" if live >= flat_max // 2 else "flat"
        return "hnsw" if live > flat_max else "flat"

    def rebuild(self) -> bool:
        """Compact (and switch kind) if needed; returns whether it rebuilt. Blocks for
        seconds on a big HNSW namespace, but never blocks searches or adds for that long."""
        if not self._rebuilding.acquire(blocking=False):
            return False
        try:
            with self._lock:
                if not self._needs_rebuild():
                    return False
                cut, kind = len(self._ids), self._wanted_kind()
                keep = [p for p, entry_id in enumerate(self._ids) if entry_id is not None]
                vectors = self._vectors(keep, cut)
            fresh = self._build(kind, vectors)
            with self._lock:
                self._swap(fresh, kind, keep, cut)
            return True
        finally:
            self._rebuilding.release()

    def _swap(self, fresh: Any, kind: Kind, keep: list[int], cut: int) -> None:
        """Install `fresh` (built from positions `keep`), adding what arrived after `cut`."""
        tail = [p for p in range(cut, len(self._ids)) if self._ids[p] is not None]
        if tail:
            fresh.add(self._vectors(tail, len(self._ids)))
        # A position stays live only if its id still points at it: removals (and
        # remove-then-add of the same id) during the build become dead slots here.
        old_ids, old_pos = self._ids, self._pos
        self._ids = [
            entry_id if entry_id is not None and old_pos.get(entry_id) == p else None
            for p in keep + tail
            for entry_id in (old_ids[p],)
        ]
        self._pos = {entry_id: p for p, entry_id in enumerate(self._ids) if entry_id is not None}
        self._index, self._kind = fresh, kind

    def _vectors(self, positions: list[int], end: int) -> Vector:
        if not positions:
            return np.empty((0, self._dim), np.float32)
        start = positions[0]
        block: Vector = self._index.reconstruct_n(start, end - start)
        return np.ascontiguousarray(block[np.asarray(positions) - start])

    def _build(self, kind: Kind, vectors: Vector) -> Any:
        import faiss

        index: Any
        if kind == "hnsw":
            index = faiss.IndexHNSWFlat(self._dim, self._config.hnsw_m, faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efConstruction = self._config.hnsw_ef_construction
            index.hnsw.efSearch = self._config.hnsw_ef_search
        else:
            index = faiss.IndexFlatIP(self._dim)
            if self._gpu is not None:
                index = _to_gpu(self._gpu, index)
        if len(vectors):
            index.add(vectors)
        return index


def _first_new(ids: Sequence[str], present: dict[str, int]) -> list[int]:
    """Positions in `ids` of ids not `present`, first occurrence only."""
    seen: set[str] = set()
    fresh = []
    for n, entry_id in enumerate(ids):
        if entry_id not in present and entry_id not in seen:
            seen.add(entry_id)
            fresh.append(n)
    return fresh


def _as_matrix(vectors: Vector, dim: int) -> Vector:
    rows = np.ascontiguousarray(vectors, dtype=np.float32)
    if rows.ndim == 1:
        rows = rows[None, :]
    if rows.ndim != 2 or rows.shape[1] != dim:
        raise ValueError(f"expected vectors of dimension {dim}, got shape {vectors.shape}")
    return rows


@contextlib.contextmanager
def _omp_threads(n: int | None) -> Iterator[None]:
    """Run FAISS with `n` OpenMP threads in this OS thread (None: leave as is).

    One query, or a few added vectors, must not wake an OpenMP team: on a busy machine the
    team waits for cores, and a 10k flat search measured 0.65 ms on one thread against
    10-30 ms on two. libgomp keeps the setting per OS thread, and FAISS bundles its own
    libgomp, so this touches neither other threads nor torch.
    """
    if n is None:
        yield
        return
    import faiss

    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(n)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(before)


def _to_gpu(resources: Any, index: Any) -> Any:
    """The GPU branch: the same flat index, moved to device 0."""
    import faiss

    return faiss.index_cpu_to_gpu(resources, 0, index)
