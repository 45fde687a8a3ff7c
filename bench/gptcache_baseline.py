"""GPTCache 0.1.44 as the baseline of bench/cache_quality.py, wired through its own API.

Its adapter (`gptcache.adapter.api.get`), its SSDataManager, its FAISS vector store
(`IDMap,Flat`, L2 on the vectors, top_k 1 as its factory sets) and its default similarity
evaluation (`SearchDistanceEvaluation(max_distance=4.0, positive=False)`: rank = 4 - squared
L2 distance, a hit when rank >= 4 * similarity_threshold). With unit vectors the squared
distance is 2 - 2 cos, so its default threshold 0.8 serves a hit at cosine >= 0.6.

Only the scalar store is ours: a dict, because GPTCache's sqlite store needs SQLAlchemy,
which is not installed here (and no behaviour of the comparison depends on it). The
embedding function returns the same MiniLM vectors the gateway uses, looked up by text.
"""

from __future__ import annotations

import atexit
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from gptcache import Cache, Config
from gptcache.adapter.api import get
from gptcache.manager import VectorBase, get_data_manager
from gptcache.manager.scalar_data.base import CacheData, CacheStorage
from gptcache.processor.pre import get_prompt
from gptcache.similarity_evaluation import SearchDistanceEvaluation


class MemoryScalarStore(CacheStorage):  # type: ignore[misc]
    """GPTCache's scalar-store interface over a dict (only what a read-only bench needs)."""

    def __init__(self) -> None:
        self._rows: dict[int, CacheData] = {}

    def create(self) -> None:
        pass

    def batch_insert(self, all_data: list[CacheData]) -> list[int]:
        ids = []
        for data in all_data:
            key = len(self._rows) + 1
            self._rows[key] = data
            ids.append(key)
        return ids

    def get_data_by_id(self, key: int) -> CacheData | None:
        return self._rows.get(int(key))

    def mark_deleted(self, keys: Sequence[int]) -> None:
        for key in keys:
            self._rows.pop(int(key), None)

    def clear_deleted_data(self) -> None:
        pass

    def get_ids(self, deleted: bool = True) -> list[int]:
        return [] if deleted else list(self._rows)

    def count(self, state: int = 0, is_all: bool = False) -> int:
        return len(self._rows)

    def add_session(self, question_id: Any, session_id: Any, session_question: Any) -> None:
        pass

    def list_sessions(self, session_id: Any = None, key: Any = None) -> list[Any]:
        return []

    def delete_session(self, keys: Any) -> None:
        pass

    def report_cache(self, *args: Any, **kwargs: Any) -> None:
        pass

    def close(self) -> None:
        pass


class GPTCacheBaseline:
    def __init__(self) -> None:
        self._folder = tempfile.TemporaryDirectory(prefix="gptcache-bench-")
        # GPTCache flushes its index at exit (atexit, last in first out): remove the
        # folder only after that.
        atexit.register(self._folder.cleanup)
        self._vectors: dict[str, npt.NDArray[np.float32]] = {}
        self._manager = get_data_manager(
            cache_base=MemoryScalarStore(),
            vector_base=VectorBase(
                "faiss", dimension=384, index_path=str(Path(self._folder.name) / "faiss.index")
            ),
            max_size=1_000_000,  # no eviction during the benchmark
        )
        self.cache = Cache()
        self.cache.init(
            pre_embedding_func=get_prompt,
            embedding_func=self._embed,
            data_manager=self._manager,
            similarity_evaluation=SearchDistanceEvaluation(),
            config=Config(similarity_threshold=0.8, enable_token_counter=False),
        )

    def _embed(self, text: str, **_: Any) -> npt.NDArray[np.float32]:
        return self._vectors[text]

    def fill(self, prompts: Sequence[str], vectors: Sequence[npt.NDArray[np.float32]]) -> None:
        """Store prompt i with answer "i" (so a hit names the entry it came from)."""
        answers = [str(i) for i in range(len(prompts))]
        self._manager.import_data(list(prompts), answers, list(vectors), [None] * len(prompts))

    def get_all(
        self, prompts: Sequence[str], vectors: dict[str, npt.NDArray[np.float32]], threshold: float
    ) -> list[int | None]:
        self._vectors.update(vectors)
        self.cache.config.similarity_threshold = threshold
        answers = [get(p, cache_obj=self.cache) for p in prompts]
        return [None if a is None else int(a) for a in answers]

    def ranked(
        self, prompts: Sequence[str], vectors: dict[str, npt.NDArray[np.float32]]
    ) -> list[tuple[int, float]]:
        """Each prompt's nearest entry and GPTCache's rank of it (for recall at a precision)."""
        evaluation = SearchDistanceEvaluation()
        out = []
        for prompt in prompts:
            found = self._manager.search(vectors[prompt])[0]
            entry = int(self._manager.get_scalar_data(found).answers[0].answer)
            out.append((entry, float(evaluation.evaluation({}, {"search_result": found}))))
        return out

    def close(self) -> None:
        self._vectors.clear()
