"""The cross-attention pair model's torch side: the model scripts/train_cross.py trains, and
the float16 file it saves (cache/weights/cross.safetensors).

`Cross` computes what cache/cross.py's `PairModel` computes in numpy (the gateway does not
import torch): two post-norm BERT layers, initialised from the packaged MiniLM's top two
layers, over both prompts' token states end to end, a segment vector per side, a "shared"
vector on word pieces found on both sides, a linear head over both [CLS] outputs.
tests/cache/test_cross_model.py checks that both give the same logits from the saved file.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from cache.cross import HEADS, HIDDEN, Side, pack  # noqa: E402

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
