"""The embedder's forward pass on ONNX Runtime (CPU): the graph cache/onnx_export.py wrote.

The same word pieces as the torch path (the model's own tokenizer, through the
`tokenizers` library directly: transformers' wrapper costs more per call than the
tokenizing), then one `InferenceSession.run` for the batch, which returns the token vectors
and the mean-pooled sentence vector; cache/embedder.py's `split_rows` makes the
`Embedded` values, so both backends store identical features for identical vectors.

`OnnxEncoder.of` takes what it needs from a loaded sentence-transformers model;
`OnnxEncoder.from_folder` the same, as `read_bert_folder` read it from the model's folder
(`tokenizer.json`, `sentence_bert_config.json`, the pooling config) without torch,
transformers or sentence-transformers: importing them was most of a gateway's start
(11.5 s with the cache on, 2.5 s without them).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
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


@dataclass(frozen=True)
class BertFolder:
    """What the encoder needs of a sentence-transformers model folder, read from its files."""

    tokenizer: str  # tokenizer.json's text
    max_tokens: int
    pad_token: str
    dimension: int


def read_bert_folder(folder: Path) -> BertFolder | None:
    """The model in `folder` if it is of the one shape `from_folder` builds right (and
    cache/bert.py, hence the export, reproduces): Transformer, mean Pooling and an optional
    Normalize; the text as given (no lower-casing of its own); a `tokenizer.json` whose pad
    token it names. None for anything else: load it the full way."""
    try:
        modules = [str(m["type"]).rsplit(".", 1)[-1] for m in _json(folder / "modules.json")]
        pooling = _json(folder / "1_Pooling" / "config.json")
        config = _json(folder / "sentence_bert_config.json")
        pad = _json(folder / "tokenizer_config.json").get("pad_token", "[PAD]")
        definition = (folder / "tokenizer.json").read_text()
        vocab = json.loads(definition)["model"]["vocab"]
        dimension = int(pooling["word_embedding_dimension"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    modes = {key for key, value in pooling.items() if key.startswith("pooling_mode") and value}
    plain = (
        modules in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"])
        and modes == {"pooling_mode_mean_tokens"}
        and not config.get("do_lower_case", False)
        and config.get("transformer_task", "feature-extraction") == "feature-extraction"
        and isinstance(pad, str)
        and isinstance(vocab, dict)
        and pad in vocab
    )
    if not plain:
        return None
    return BertFolder(definition, int(config.get("max_seq_length") or 512), pad, dimension)


def _json(path: Path) -> Any:
    return json.loads(path.read_text())


def _tokenizer(definition: str, max_tokens: int, pad_token: str, pad_id: int | None = None) -> Any:
    """A `tokenizers.Tokenizer` from its JSON definition that truncates to `max_tokens`
    and pads with `pad_token`."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(definition)
    tokenizer.enable_truncation(max_length=max_tokens)
    pad = tokenizer.token_to_id(pad_token) if pad_id is None else pad_id
    if pad is None:
        raise ValueError(f"the tokenizer has no pad token {pad_token!r}")
    tokenizer.enable_padding(pad_id=int(pad), pad_token=pad_token)
    return tokenizer


def _session(graph: Path) -> Any:
    import onnxruntime

    return onnxruntime.InferenceSession(
        str(graph), session_options(), providers=["CPUExecutionProvider"]
    )


class OnnxEncoder:
    """An `Encoder` on ONNX Runtime. Blocking: call it from one worker thread at a time."""

    def __init__(
        self,
        graph: Path,
        tokenizer: Any,
        *,
        max_tokens: int,
        dimension: int,
        precision: str = "float32",
    ) -> None:
        self._session = _session(graph)
        self._precision = precision  # of the graph's weights: "float32" or "int8"
        self._tokenizer = tokenizer  # tokenizers.Tokenizer: truncates and pads
        self._max_tokens = max_tokens
        self._dimension = dimension
        self.path = graph
        self.forward_passes = 0

    @classmethod
    def of(cls, model: SentenceTransformer, graph: Path, precision: str = "float32") -> OnnxEncoder:
        """An encoder for `model` (its tokenizer and sizes) running `graph`, whose weights
        are `precision` ("float32", or "int8": cache/onnx_export.py ensure_int8)."""
        length = model.max_seq_length
        max_tokens = int(length) if length is not None else 512
        source = model.tokenizer
        tokenizer = _tokenizer(
            source.backend_tokenizer.to_str(), max_tokens, source.pad_token, source.pad_token_id
        )
        dimension = int(model.get_embedding_dimension() or 0)
        return cls(
            graph, tokenizer, max_tokens=max_tokens, dimension=dimension, precision=precision
        )

    @classmethod
    def from_folder(
        cls, folder: BertFolder, graph: Path, precision: str = "float32"
    ) -> OnnxEncoder:
        """The encoder `of` would build for the model of `folder` (`read_bert_folder`)."""
        tokenizer = _tokenizer(folder.tokenizer, folder.max_tokens, folder.pad_token)
        return cls(
            graph,
            tokenizer,
            max_tokens=folder.max_tokens,
            dimension=folder.dimension,
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
        """One forward pass over `texts` (pass a bounded batch); with int8 weights, one
        pass per text.

        The int8 graph quantises its activations dynamically: each tensor is scaled by its
        range over the whole batch, padding included, so a prompt's vector depended on
        what it was embedded with (cosine 0.994 to itself alone, measured), and the same
        cached prompt could be a hit or a miss by the luck of its batch. One pass per text
        keeps a vector a function of its own text; batching saved ~10% a prompt here.
        float32 needs no such care (the same vector in any batch, to 1e-7)."""
        if self._precision == "int8":
            return [e for text in texts for e in self._forward([text])]
        return self._forward(texts)

    def _forward(self, texts: Sequence[str]) -> list[Embedded]:
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
