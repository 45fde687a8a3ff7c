"""A sentence-transformers embedding model, loaded from a local folder."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from backends.worker.config import ModelSpec

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer


@dataclass(frozen=True)
class Embeddings:
    vectors: npt.NDArray[np.float32]  # one unit-norm row per input
    prompt_tokens: int


class Embedder:
    """Blocking calls: run them in the worker's compute thread, not on the event loop."""

    def __init__(self, name: str, model: SentenceTransformer) -> None:
        self.name = name
        self._model = model

    @classmethod
    def load(cls, spec: ModelSpec, device: str) -> Embedder:
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(str(spec.path), device=device, local_files_only=True)
        return cls(spec.name, model)

    @property
    def bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self._model.parameters())

    def probe(self) -> Embeddings:
        """Embed one short text: a real forward pass."""
        return self.embed(["Hello"])

    @property
    def dimension(self) -> int:
        return int(self._model.get_embedding_dimension() or 0)

    def embed(self, texts: Sequence[str]) -> Embeddings:
        vectors = self._model.encode(
            list(texts), normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
        )
        return Embeddings(np.asarray(vectors, dtype=np.float32), self._count_tokens(texts))

    def _count_tokens(self, texts: Sequence[str]) -> int:
        # The model truncates long inputs, and the mask counts what it actually read.
        features = self._model.preprocess(list(texts))
        return int(features["attention_mask"].sum())
