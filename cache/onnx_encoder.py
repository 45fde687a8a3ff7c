"""The embedder's forward pass on ONNX Runtime (CPU): the graph cache/onnx_export.py wrote.

The same word pieces as the torch path (the model's own tokenizer, through the
`tokenizers` library directly: transformers' wrapper costs more per call than the
tokenizing), then one `InferenceSession.run` for the batch, which returns the token vectors
and the mean-pooled sentence vector; cache/embedder.py's `split_rows` makes the
`Embedded` values, so both backends store identical features for identical vectors.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from cache.embedder import Embedded, split_rows
from cache.onnx_export import INPUTS, OUTPUTS

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer


def session_options() -> Any:
    """One thread, sequential: measured on this 2-core machine (bench/cache_latency.py's
    prompts, float32), one thread ran a lone prompt in 6.5 ms against 5.3 ms on two, but a
    batch of eight in 57 ms against 99 ms: two threads wait at every operator for a core
    the event loop or another process holds, as torch's do (cache/embedder.py
    load_embedder). Without spinning, so an idle embedder leaves its core alone."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3  # errors only: its graph notes are not ours to act on
    return options


class OnnxEncoder:
    """An `Encoder` on ONNX Runtime. Blocking: call it from one worker thread at a time."""

    def __init__(
        self,
        session: Any,
        tokenizer: Any,
        *,
        max_tokens: int,
        dimension: int,
        path: Path,
        precision: str = "float32",
    ) -> None:
        self._session = session
        self._precision = precision  # of the graph's weights: "float32" or "int8"
        self._tokenizer = tokenizer  # tokenizers.Tokenizer: truncates and pads
        self._max_tokens = max_tokens
        self._dimension = dimension
        self.path = path
        self.forward_passes = 0

    @classmethod
    def of(cls, model: SentenceTransformer, graph: Path, precision: str = "float32") -> OnnxEncoder:
        """An encoder for `model` (its tokenizer and sizes) running `graph`, whose weights
        are `precision` ("float32", or "int8": cache/onnx_export.py ensure_int8)."""
        import onnxruntime
        from tokenizers import Tokenizer

        length = model.max_seq_length
        max_tokens = int(length) if length is not None else 512
        source = model.tokenizer
        tokenizer = Tokenizer.from_str(source.backend_tokenizer.to_str())
        tokenizer.enable_truncation(max_length=max_tokens)
        tokenizer.enable_padding(pad_id=int(source.pad_token_id), pad_token=source.pad_token)
        session = onnxruntime.InferenceSession(
            str(graph), session_options(), providers=["CPUExecutionProvider"]
        )
        dimension = int(model.get_embedding_dimension() or 0)
        return cls(
            session,
            tokenizer,
            max_tokens=max_tokens,
            dimension=dimension,
            path=graph,
            precision=precision,
        )

    @property
    def backend(self) -> str:
        return "onnx"

    @property
    def precision(self) -> str:
        return self._precision

    @property
    def dimension(self) -> int:
        return self._dimension

    @property
    def max_tokens(self) -> int:
        return self._max_tokens

    def tokenizer_vocab(self) -> dict[str, int]:
        return dict(self._tokenizer.get_vocab())

    def encode(self, texts: Sequence[str]) -> list[Embedded]:
        """One forward pass over `texts` (pass a bounded batch)."""
        if not texts:
            return []
        encodings = self._tokenizer.encode_batch(list(texts))
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        tokens, vectors = self._session.run(
            list(OUTPUTS), dict(zip(INPUTS, (ids, mask), strict=True))
        )
        self.forward_passes += 1
        return split_rows(vectors, tokens, ids, mask.sum(axis=1), self._max_tokens)
