"""The cross-attention pair model: two transformer layers that read both prompts together.

Two post-norm BERT layers, initialised from the packaged MiniLM's top two layers and
fine-tuned by scripts/train_cross.py, read both prompts' stored token features end to end
(MiniLM's last-layer vectors, cache/features.py: each prompt embedded alone, as the cache
embeds every entry, so a lookup needs no second model pass). Each side gets a learned
segment vector, and each word piece that also occurs on the other side a learned "shared"
vector; a linear head reads both sides' [CLS] outputs (their sum and absolute difference,
so neither prompt is special).

In the decision (cache/decision.py) it is a second opinion: when the pair verifier passes
no candidate, it reads the most similar one that every guard except the content-word rule
let through, and serves it at its threshold. It was trained without QQP (data:
docs/semantic-cache.md "The pair model's second opinion"; threshold choice and figures:
docs/cache-quality.md "The pair model's bar, chosen leave one source out").

This is the gateway's numpy arithmetic, float32, from the float16 weights; the torch model
that trains them is scripts/cross_model.py, tested to give the same logits.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from cache.features import TokenFeatures

HIDDEN, HEADS = 384, 12  # MiniLM-L6
SPECIAL_IDS = (101, 102)  # [CLS], [SEP]: on both sides of every pair, never "shared"
DEFAULT_WEIGHTS = Path(__file__).resolve().parent / "weights" / "cross.safetensors"
_GELU_C = math.sqrt(2.0 / math.pi)

Side = tuple[npt.NDArray[Any], npt.NDArray[Any]]  # word-piece ids (n,), token states (n, HIDDEN)
F32 = npt.NDArray[np.float32]


def pack(pairs: Sequence[tuple[Side, Side]]) -> dict[str, npt.NDArray[Any]]:
    """Both prompts' token states end to end, one row per pair, padded to the longest."""
    width = max(len(a[0]) + len(b[0]) for a, b in pairs)
    n = len(pairs)
    x = np.zeros((n, width, HIDDEN), np.float32)
    seg = np.zeros((n, width), np.int64)
    shared = np.zeros((n, width), np.float32)
    pad = np.ones((n, width), np.bool_)
    cls_b = np.zeros(n, np.int64)
    for row, ((ids_a, states_a), (ids_b, states_b)) in enumerate(pairs):
        na, nb = len(ids_a), len(ids_b)
        x[row, :na], x[row, na : na + nb] = states_a, states_b
        seg[row, na : na + nb] = 1
        shared[row, :na] = np.isin(ids_a, ids_b) & ~np.isin(ids_a, SPECIAL_IDS)
        shared[row, na : na + nb] = np.isin(ids_b, ids_a) & ~np.isin(ids_b, SPECIAL_IDS)
        pad[row, : na + nb] = False
        cls_b[row] = na
    return {"x": x, "seg": seg, "shared": shared, "pad": pad, "cls_b": cls_b}


def _layer_norm(x: F32, weight: F32, bias: F32) -> F32:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    out: F32 = (x - mean) / np.sqrt(var + 1e-12) * weight + bias
    return out


def _gelu(x: F32) -> F32:
    # x * x * x, not x**3: numpy 2.4's float32 power took 2.6 ms for one layer's activations.
    return cast(F32, 0.5 * x * (1.0 + np.tanh(_GELU_C * (x + 0.044715 * x * x * x))))


class _Layer:
    def __init__(self, tensors: dict[str, F32], prefix: str) -> None:
        def get(name: str) -> F32:
            return tensors[f"{prefix}.{name}"]

        self.qkv = get("qkv.weight").T.copy(), get("qkv.bias")
        self.out = get("out.weight").T.copy(), get("out.bias")
        self.ln1 = get("ln1.weight"), get("ln1.bias")
        self.up = get("up.weight").T.copy(), get("up.bias")
        self.down = get("down.weight").T.copy(), get("down.bias")
        self.ln2 = get("ln2.weight"), get("ln2.bias")

    def __call__(self, x: F32, pad: npt.NDArray[np.bool_]) -> F32:
        b, t, _ = x.shape
        d = HIDDEN // HEADS
        qkv = (x @ self.qkv[0] + self.qkv[1]).reshape(b, t, 3, HEADS, d).transpose(2, 0, 3, 1, 4)
        att = qkv[0] @ qkv[1].transpose(0, 1, 3, 2) / np.float32(math.sqrt(d))
        att = np.where(pad[:, None, None, :], np.float32(-1e4), att)
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        ctx = (att @ qkv[2]).transpose(0, 2, 1, 3).reshape(b, t, HIDDEN)
        x = _layer_norm(x + ctx @ self.out[0] + self.out[1], *self.ln1)
        h = _gelu(x @ self.up[0] + self.up[1])
        return _layer_norm(x + h @ self.down[0] + self.down[1], *self.ln2)


def side(features: bytes) -> Side:
    f = TokenFeatures.from_bytes(features)
    return f.ids, f.embeddings.astype(np.float32)


class PairModel:
    """The trained model, from the file scripts/cross_model.py's `save` wrote (float16
    tensors; `threshold` and `info` in its metadata). `threshold` and `score_many` over
    feature bytes are what the decision asks of it (cache/decision.py `Verifier`)."""

    def __init__(
        self, tensors: dict[str, F32], layers: int, threshold: float, info: dict[str, Any]
    ) -> None:
        self.segment, self.shared = tensors["segment"], tensors["shared"]
        self.layers = [_Layer(tensors, f"layers.{i}") for i in range(layers)]
        self.head_w, self.head_b = tensors["head.weight"][0], float(tensors["head.bias"][0])
        self.threshold = threshold  # the default bar a pair must reach to be a hit
        self.info = info

    @classmethod
    def load(cls, path: Path = DEFAULT_WEIGHTS) -> PairModel:
        from safetensors import safe_open
        from safetensors.numpy import load_file

        with safe_open(str(path), framework="np") as handle:
            meta = dict(handle.metadata() or {})
        tensors = {k: v.astype(np.float32) for k, v in load_file(str(path)).items()}
        layers = int(json.loads(meta["config"])["layers"])
        info = json.loads(meta.get("info", "{}"))
        return cls(tensors, layers, float(meta["threshold"]), info)

    def logits(self, pairs: Sequence[tuple[Side, Side]]) -> npt.NDArray[np.float64]:
        batch = pack(pairs)
        x = batch["x"] + self.segment[batch["seg"]] + batch["shared"][..., None] * self.shared
        for layer in self.layers:
            x = layer(x, batch["pad"])
        rows = np.arange(x.shape[0])
        ca, cb = x[rows, 0], x[rows, batch["cls_b"]]
        pooled = np.concatenate([ca + cb, np.abs(ca - cb)], -1)
        out: npt.NDArray[np.float64] = (pooled @ self.head_w).astype(np.float64) + self.head_b
        return out

    def probabilities(self, pairs: Sequence[tuple[Side, Side]]) -> list[float]:
        """Per (cached, query) pair, the probability that one answer serves both."""
        if not pairs:
            return []
        return [1.0 / (1.0 + math.exp(-float(x))) for x in self.logits(pairs)]

    def score_many(self, query: bytes, candidates: Sequence[bytes]) -> list[float]:
        # The cached prompt first, the query second, as in training (which saw both orders).
        return self.probabilities([(side(c), side(query)) for c in candidates])
