"""A cross-attention pair model over two prompts' token states (an experiment, not shipped).

Two post-norm BERT layers, initialised from the packaged MiniLM's top two layers, read both
prompts' token states end to end: each prompt embedded alone (as the cache embeds every
entry), so the states can be stored per entry and a lookup needs no second model pass over
the pair. Each side gets a learned segment vector, and each word piece that also occurs on
the other side a learned "shared" vector; a linear head reads both sides' [CLS] outputs
(their sum and absolute difference, so neither prompt is special). scripts/train_cross.py
trains it and says what it measured.

`Cross` is the torch model (training); `NumpyCross` the same arithmetic in numpy, float32,
as the gateway (which does not import torch) would run it, from the float16 weights `save`
writes. tests/cache/test_cross_model.py checks that both give the same logits.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

HIDDEN, HEADS = 384, 12  # MiniLM-L6
SPECIAL_IDS = (101, 102)  # [CLS], [SEP]: on both sides of every pair, never "shared"
_GELU_C = math.sqrt(2.0 / math.pi)
_MINILM_NAMES = {
    "q": "attention.self.query",
    "k": "attention.self.key",
    "v": "attention.self.value",
    "out": "attention.output.dense",
    "ln1": "attention.output.LayerNorm",
    "up": "intermediate.dense",
    "down": "output.dense",
    "ln2": "output.LayerNorm",
}

Side = tuple[npt.NDArray[Any], npt.NDArray[Any]]  # word-piece ids (n,), token states (n, HIDDEN)
F32 = npt.NDArray[np.float32]


class Layer(torch.nn.Module):
    """One BERT layer (tanh GELU: numpy has no erf, and fine-tuning absorbs the change)."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(HIDDEN, 3 * HIDDEN)
        self.out = torch.nn.Linear(HIDDEN, HIDDEN)
        self.ln1 = torch.nn.LayerNorm(HIDDEN, eps=1e-12)
        self.up = torch.nn.Linear(HIDDEN, 4 * HIDDEN)
        self.down = torch.nn.Linear(4 * HIDDEN, HIDDEN)
        self.ln2 = torch.nn.LayerNorm(HIDDEN, eps=1e-12)

    def load_minilm(self, weights: dict[str, torch.Tensor], layer: int) -> None:
        def get(short: str, kind: str) -> torch.Tensor:
            return weights[f"encoder.layer.{layer}.{_MINILM_NAMES[short]}.{kind}"]

        with torch.no_grad():
            for kind in ("weight", "bias"):
                fused = torch.cat([get("q", kind), get("k", kind), get("v", kind)])
                getattr(self.qkv, kind).copy_(fused)
                for short in ("out", "ln1", "up", "down", "ln2"):
                    getattr(getattr(self, short), kind).copy_(get(short, kind))

    def forward(self, x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        d = HIDDEN // HEADS
        q, k, v = self.qkv(x).view(b, t, 3, HEADS, d).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(d)
        att = att.masked_fill(pad[:, None, None, :], -1e4).softmax(-1)
        ctx = (att @ v).transpose(1, 2).reshape(b, t, HIDDEN)
        x = self.ln1(x + self.out(ctx))
        h = torch.nn.functional.gelu(self.up(x), approximate="tanh")
        out: torch.Tensor = self.ln2(x + self.down(h))
        return out


class Cross(torch.nn.Module):
    def __init__(self, layers: int, minilm: Path | None) -> None:
        """`layers` fresh layers, or MiniLM's top `layers` from its safetensors file."""
        super().__init__()
        self.segment = torch.nn.Parameter(torch.zeros(2, HIDDEN))
        self.shared = torch.nn.Parameter(torch.zeros(HIDDEN))
        self.layers = torch.nn.ModuleList(Layer() for _ in range(layers))
        self.head = torch.nn.Linear(2 * HIDDEN, 1)
        with torch.no_grad():
            self.head.weight.zero_()
        if minilm is not None:
            from safetensors.torch import load_file

            weights = load_file(str(minilm))
            for i, layer in enumerate(self.layers):
                layer.load_minilm(weights, 6 - layers + i)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        x = batch["x"] + self.segment[batch["seg"]] + batch["shared"][..., None] * self.shared
        for layer in self.layers:
            x = layer(x, batch["pad"])
        rows = torch.arange(x.shape[0])
        ca, cb = x[rows, 0], x[rows, batch["cls_b"]]
        logits: torch.Tensor = self.head(torch.cat([ca + cb, (ca - cb).abs()], -1))
        return logits.squeeze(-1)


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


def torch_batch(pairs: Sequence[tuple[Side, Side]]) -> dict[str, torch.Tensor]:
    return {name: torch.from_numpy(array) for name, array in pack(pairs).items()}


def save(model: Cross, threshold: float, info: dict[str, object], path: Path) -> None:
    """float16 weights (half the size; `round_to_half` first so scores match them)."""
    from safetensors.torch import save_file

    tensors = {k: v.detach().half().contiguous() for k, v in model.state_dict().items()}
    meta = {
        "config": json.dumps({"layers": len(model.layers)}),
        "threshold": str(threshold),
        "info": json.dumps(info, sort_keys=True),
    }
    save_file(tensors, str(path), metadata=meta)


def round_to_half(model: Cross) -> None:
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(param.half().float())


# ---- the numpy port ----------------------------------------------------------------------


def _layer_norm(x: F32, weight: F32, bias: F32) -> F32:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    out: F32 = (x - mean) / np.sqrt(var + 1e-12) * weight + bias
    return out


def _gelu(x: F32) -> F32:
    # x * x * x, not x**3: numpy 2.4's float32 power took 2.6 ms for one layer's activations.
    out: F32 = 0.5 * x * (1.0 + np.tanh(_GELU_C * (x + 0.044715 * x * x * x)))
    return out


class _NumpyLayer:
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


class NumpyCross:
    """`Cross`'s logits in numpy, from the file `save` wrote."""

    def __init__(self, tensors: dict[str, F32], layers: int, threshold: float) -> None:
        self.segment, self.shared = tensors["segment"], tensors["shared"]
        self.layers = [_NumpyLayer(tensors, f"layers.{i}") for i in range(layers)]
        self.head_w, self.head_b = tensors["head.weight"][0], float(tensors["head.bias"][0])
        self.threshold = threshold

    @classmethod
    def load(cls, path: Path) -> NumpyCross:
        from safetensors import safe_open
        from safetensors.numpy import load_file

        with safe_open(str(path), framework="np") as handle:
            meta = dict(handle.metadata() or {})
        tensors = {k: v.astype(np.float32) for k, v in load_file(str(path)).items()}
        layers = int(json.loads(meta["config"])["layers"])
        return cls(tensors, layers, float(meta["threshold"]))

    def logits(self, pairs: Sequence[tuple[Side, Side]]) -> npt.NDArray[np.float64]:
        batch = pack(pairs)
        x = batch["x"] + self.segment[batch["seg"]] + batch["shared"][..., None] * self.shared
        for layer in self.layers:
            x = layer(x, batch["pad"])
        rows = np.arange(x.shape[0])
        ca, cb = x[rows, 0], x[rows, batch["cls_b"]]
        pooled = np.concatenate([ca + cb, np.abs(ca - cb)], -1)
        return (pooled @ self.head_w).astype(np.float64) + self.head_b
