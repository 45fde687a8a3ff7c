"""Vector index: one FAISS inner-product index per namespace (`VectorIndex`).

Namespaces are a hard partition by construction: each has its own FAISS index (a
`NamespaceIndex`, cache/index.py, which holds its kind, deletes and rebuilds), so a search
in one can never see another's vectors. A namespace appears on its first add and is
forgotten once empty; `maintain()` rebuilds the namespaces changed since its last call
that need it.

On a machine with CUDA and faiss-gpu (`faiss.get_num_gpus() > 0`, or `IndexConfig.gpu`)
every namespace is a GPU flat index, all on one `StandardGpuResources` (`_gpu_resources`).

Every method blocks; the stores call the slow ones from worker threads.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from cache.entry import Vector
from cache.index import Hit, IndexConfig, NamespaceIndex


class VectorIndex:
    """Per-namespace indexes; thread-safe. Namespaces appear on first add."""

    def __init__(
        self, dim: int, config: IndexConfig | None = None, *, gpu_resources: Any | None = None
    ) -> None:
        self.dim = dim
        self._config = config or IndexConfig()
        self._gpu = gpu_resources if gpu_resources is not None else _gpu_resources(self._config)
        self._lock = threading.Lock()
        self._namespaces: dict[str, NamespaceIndex] = {}
        self._touched: set[str] = set()  # changed since the last maintain()

    def empty_like(self) -> VectorIndex:
        """A new, empty index with the same settings, sharing the GPU resources if any."""
        return VectorIndex(self.dim, self._config, gpu_resources=self._gpu)

    def __len__(self) -> int:
        return sum(len(index) for index in list(self._namespaces.values()))

    def namespaces(self) -> list[str]:
        return [name for name, index in list(self._namespaces.items()) if len(index)]

    def get(self, namespace: str) -> NamespaceIndex | None:
        return self._namespaces.get(namespace)

    def add(self, namespace: str, ids: Sequence[str], vectors: Vector) -> int:
        while True:  # retried only when a drop or cleanup retired the index meanwhile
            with self._lock:
                index = self._namespaces.get(namespace)
                if index is None:
                    index = self._namespaces[namespace] = NamespaceIndex(
                        self.dim, self._config, self._gpu
                    )
                self._touched.add(namespace)
            added = index._add(ids, vectors)
            if added is not None:
                return added

    def remove(self, namespace: str, ids: Iterable[str]) -> int:
        index = self._namespaces.get(namespace)
        if index is None:
            return 0
        with self._lock:
            self._touched.add(namespace)
        return index.remove(ids)

    def drop(self, namespace: str) -> list[str]:
        """Forget a namespace; returns the ids it held."""
        with self._lock:
            index = self._namespaces.pop(namespace, None)
            if index is None:
                return []
            index.retire_if_empty(force=True)
        return index.ids()

    def search(
        self,
        namespace: str,
        query: Vector,
        k: int,
        floor: float = -1.0,
        accept: Callable[[str], bool] | None = None,
    ) -> list[Hit]:
        index = self._namespaces.get(namespace)
        return [] if index is None else index.search(query, k, floor, accept)

    def search_many_now(
        self,
        namespace: str,
        queries: Vector,
        k: int,
        floor: float,
        accepts: Sequence[Callable[[str], bool]],
    ) -> list[list[Hit]] | None:
        """NamespaceIndex.search_many_now: quick searches, or None when they would wait."""
        index = self._namespaces.get(namespace)
        if index is None:
            return [[] for _ in accepts]
        return index.search_many_now(queries, k, floor, accepts)

    def maintain(self) -> int:
        """Rebuild the changed namespaces that need it, and forget empty ones; returns how
        many were rebuilt. Only namespaces touched since the last call are looked at, so
        this stays cheap with many small namespaces."""
        with self._lock:
            touched, self._touched = self._touched, set()
        rebuilt = 0
        for name in touched:
            index = self._namespaces.get(name)
            if index is None:
                continue
            rebuilt += index.rebuild()
            with self._lock:
                if index.needs_rebuild():  # busy, or changed a lot meanwhile: next time
                    self._touched.add(name)
                elif self._namespaces.get(name) is index and index.retire_if_empty():
                    del self._namespaces[name]
        return rebuilt


def _gpu_resources(config: IndexConfig) -> Any | None:
    """StandardGpuResources when faiss-gpu sees a CUDA device (or config says so), else None."""
    import faiss

    use_gpu = config.gpu if config.gpu is not None else faiss.get_num_gpus() > 0
    return faiss.StandardGpuResources() if use_gpu else None
