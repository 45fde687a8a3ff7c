"""Tier 3's pair verifier: reads two prompts' token features together and says whether one
cached answer fits both.

A bi-encoder cosine cannot tell "sort ascending" from "sort descending" or "km to miles"
from "miles to km": the sentence vectors are nearly equal. The verifier looks at tokens.
Each token of one prompt is softly aligned to the other prompt's tokens (MiniLM's
last-layer vectors), then a small network reads the token, what it aligned to, whether
the same word piece occurs on the other side, and whether its neighbours aligned in the
same order, and gives a mismatch score. One badly matched token is enough to refuse, so
the pair's score is a soft maximum of the token scores of both sides:

    logit = bias + w * cosine - logsumexp(mismatch(token) for tokens of a and of b)

It runs on features the embedder already computed (cache/features.py): no model call,
well under a millisecond per candidate on one CPU core. Weights: cache/weights/, trained
by scripts/train_verifier.py in torch (`build_network`); the gateway runs the same
arithmetic in numpy (`NumpyNet`), without importing torch.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from cache.features import TokenFeatures

if TYPE_CHECKING:
    import torch

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
DEFAULT_WEIGHTS = WEIGHTS_DIR / "verifier.safetensors"
CLS_ID, SEP_ID = 101, 102  # MiniLM (BERT uncased) special tokens: not prompt content
FLAG_NAMES = ("stopword", "punctuation", "digit", "negation", "direction")


@dataclass(frozen=True)
class VerifierConfig:
    dim: int = 384  # token vector size of the embedding model
    proj: int = 64
    hidden: int = 64
    temperature: float = 0.05  # of the soft alignment (cosines are close together)
    use_exact: bool = True  # feature switches, for the ablations in the training script
    use_order: bool = True
    use_flags: bool = True

    def to_json(self) -> str:
        return json.dumps(self.__dict__, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> VerifierConfig:
        return cls(**json.loads(text))


@dataclass(frozen=True)
class Side:
    """One prompt's tokens, ready for the network (specials dropped, unit vectors)."""

    ids: npt.NDArray[np.int64]
    vectors: npt.NDArray[np.float32]  # (n, dim), rows L2-normalised
    flags: npt.NDArray[np.float32]  # (n, len(FLAG_NAMES))


def prepare(features: TokenFeatures, flag_table: npt.NDArray[np.uint8]) -> Side:
    keep = (features.ids != CLS_ID) & (features.ids != SEP_ID)
    if not keep.any():  # an empty prompt: keep something to align to
        keep[:] = True
    ids = features.ids[keep].astype(np.int64)
    vectors = features.embeddings[keep].astype(np.float32)
    vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-6)
    bits = flag_table[np.minimum(ids, len(flag_table) - 1)]
    flags = ((bits[:, None] >> np.arange(len(FLAG_NAMES))) & 1).astype(np.float32)
    return Side(ids, vectors, flags)


def build_network(config: VerifierConfig) -> torch.nn.Module:
    """The verifier network (torch); training and inference share this code."""
    import torch
    from torch import nn

    class VerifierNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.config = config
            n_in = 4 * config.proj + 5 + len(FLAG_NAMES)
            self.proj = nn.Linear(config.dim, config.proj)
            self.compare = nn.Sequential(
                nn.Linear(n_in, config.hidden), nn.ReLU(), nn.Linear(config.hidden, 1)
            )
            self.bias = nn.Parameter(torch.tensor(3.0))
            self.cos_weight = nn.Parameter(torch.tensor(0.0))

        def forward(self, a: dict[str, Any], b: dict[str, Any]) -> torch.Tensor:
            pa, pb = self.proj(a["vectors"]), self.proj(b["vectors"])
            m_a = self._mismatch(a, b, pa, pb)
            m_b = self._mismatch(b, a, pb, pa)
            mismatch = torch.logsumexp(torch.cat([m_a, m_b], dim=1), dim=1)
            cosine = (_mean_unit(a) * _mean_unit(b)).sum(-1)
            return self.bias + self.cos_weight * cosine - mismatch

        def _mismatch(
            self, a: dict[str, Any], b: dict[str, Any], pa: torch.Tensor, pb: torch.Tensor
        ) -> torch.Tensor:
            sim = a["vectors"] @ b["vectors"].transpose(1, 2)  # (B, na, nb)
            sim = sim.masked_fill(~b["mask"][:, None, :], -1.0)
            same = (a["ids"][:, :, None] == b["ids"][:, None, :]) & b["mask"][:, None, :]
            same_f = same.float() if config.use_exact else torch.zeros_like(sim)
            # Align by meaning, but let an identical word piece win: then a word that moved
            # (a swap) still aligns to itself and its neighbours show the move.
            alpha = torch.softmax((sim + same_f) / config.temperature, dim=-1)
            by_meaning = torch.softmax(sim / config.temperature, dim=-1)
            aligned = alpha @ pb
            parts = [pa, aligned, (pa - aligned).abs(), pa * aligned]
            extra = [
                same_f.max(-1).values,
                (by_meaning * same_f).sum(-1),  # its closest token in context is itself
                sim.max(-1).values,
                *_order(alpha @ b["pos"][:, :, None], a["mask"], config.use_order),
            ]
            flags = a["flags"] if config.use_flags else torch.zeros_like(a["flags"])
            x = torch.cat([*parts, torch.stack(extra, dim=-1), flags], dim=-1)
            scores: torch.Tensor = self.compare(x).squeeze(-1)
            return scores.masked_fill(~a["mask"], -30.0)

    return VerifierNet()


def _mean_unit(side: dict[str, Any]) -> torch.Tensor:
    """The unit vector of a side's mean token vector (padding left out)."""
    mask: torch.Tensor = side["mask"][:, :, None].float()
    mean: torch.Tensor = (side["vectors"] * mask).sum(1) / mask.sum(1).clamp(min=1.0)
    unit: torch.Tensor = mean / mean.norm(dim=-1, keepdim=True).clamp(min=1e-6)
    return unit


def _order(
    aligned_pos: torch.Tensor, mask: torch.Tensor, enabled: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Where a token's neighbours landed on the other side, relative to where it landed:
    about +1 after and -1 before when the order is kept. A swap flips the signs."""
    import torch

    p = aligned_pos.squeeze(-1)
    if not enabled:
        return torch.zeros_like(p), torch.zeros_like(p)
    step = p[:, 1:] - p[:, :-1]
    valid = mask[:, 1:] & mask[:, :-1]
    step = torch.where(valid, step, torch.ones_like(step)).clamp(-4.0, 4.0)
    ones = torch.ones_like(p[:, :1])
    return torch.cat([ones, step], dim=1), torch.cat([step, ones], dim=1)


def batch_sides(sides: list[Side]) -> dict[str, Any]:
    """Pad sides into the tensors the network reads (torch, for training)."""
    import torch

    return {name: torch.from_numpy(array) for name, array in padded(sides).items()}


def padded(sides: list[Side]) -> dict[str, Any]:
    """Sides padded to one length, as numpy arrays: vectors, ids, flags, mask, pos."""
    n = max(len(s.ids) for s in sides)
    dim = sides[0].vectors.shape[1]
    vectors = np.zeros((len(sides), n, dim), dtype=np.float32)
    ids = np.full((len(sides), n), -1, dtype=np.int64)
    flags = np.zeros((len(sides), n, len(FLAG_NAMES)), dtype=np.float32)
    mask = np.zeros((len(sides), n), dtype=bool)
    for row, side in enumerate(sides):
        k = len(side.ids)
        vectors[row, :k], ids[row, :k], flags[row, :k], mask[row, :k] = (
            side.vectors,
            side.ids,
            side.flags,
            True,
        )
    pos = np.ascontiguousarray(np.broadcast_to(np.arange(n, dtype=np.float32), (len(sides), n)))
    return {"vectors": vectors, "ids": ids, "flags": flags, "mask": mask, "pos": pos}


class NumpyNet:
    """`build_network`'s forward pass in numpy, on its trained weights: what the gateway
    runs. torch is for training: importing it cost a gateway 1.5 s of its start, and its
    per-operator overhead most of a lone pair's score (1.7 ms there, 0.8 ms here)."""

    def __init__(self, config: VerifierConfig, weights: dict[str, npt.NDArray[Any]]) -> None:
        self.config = config
        w = {name: np.asarray(value, dtype=np.float32) for name, value in weights.items()}
        self._proj_w, self._proj_b = w["proj.weight"].T.copy(), w["proj.bias"]
        self._hidden_w, self._hidden_b = w["compare.0.weight"].T.copy(), w["compare.0.bias"]
        self._out_w, self._out_b = w["compare.2.weight"].T.copy(), w["compare.2.bias"]
        self._bias, self._cos_weight = float(w["bias"]), float(w["cos_weight"])

    def __call__(self, a: dict[str, Any], b: dict[str, Any]) -> npt.NDArray[np.float64]:
        """The pairs' logits (row i of `a` against row i of `b`), in float64."""
        pa, pb = self._project(a), self._project(b)
        mismatch = np.concatenate([self._mismatch(a, b, pa, pb), self._mismatch(b, a, pb, pa)], 1)
        cosine = (_mean_direction(a) * _mean_direction(b)).sum(-1)
        logits = self._bias + self._cos_weight * cosine - _logsumexp(mismatch)
        return np.asarray(logits, dtype=np.float64)

    def _project(self, side: dict[str, Any]) -> npt.NDArray[np.float32]:
        return side["vectors"] @ self._proj_w + self._proj_b  # type: ignore[no-any-return]

    def _mismatch(
        self, a: dict[str, Any], b: dict[str, Any], pa: npt.NDArray[Any], pb: npt.NDArray[Any]
    ) -> npt.NDArray[np.float32]:
        config = self.config
        sim = a["vectors"] @ b["vectors"].transpose(0, 2, 1)  # (B, na, nb)
        sim = np.where(b["mask"][:, None, :], sim, np.float32(-1.0))
        same = (a["ids"][:, :, None] == b["ids"][:, None, :]) & b["mask"][:, None, :]
        same_f = same.astype(np.float32) if config.use_exact else np.zeros_like(sim)
        alpha = _softmax((sim + same_f) / config.temperature)
        by_meaning = _softmax(sim / config.temperature)
        aligned = alpha @ pb
        order = _order_steps((alpha @ b["pos"][:, :, None])[..., 0], a["mask"], config.use_order)
        extra = [same_f.max(-1), (by_meaning * same_f).sum(-1), sim.max(-1), *order]
        flags = a["flags"] if config.use_flags else np.zeros_like(a["flags"])
        parts = [pa, aligned, np.abs(pa - aligned), pa * aligned, np.stack(extra, -1), flags]
        hidden = np.maximum(np.concatenate(parts, -1) @ self._hidden_w + self._hidden_b, 0)
        scores = (hidden @ self._out_w + self._out_b)[..., 0]
        return np.where(a["mask"], scores, np.float32(-30.0)).astype(np.float32)


def _softmax(x: npt.NDArray[Any]) -> npt.NDArray[Any]:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)  # type: ignore[no-any-return]


def _logsumexp(x: npt.NDArray[Any]) -> npt.NDArray[Any]:
    top = x.max(-1)
    return top + np.log(np.exp(x - top[:, None]).sum(-1))  # type: ignore[no-any-return]


def _mean_direction(side: dict[str, Any]) -> npt.NDArray[Any]:
    mask = side["mask"][:, :, None].astype(np.float32)
    mean = (side["vectors"] * mask).sum(1) / np.maximum(mask.sum(1), 1.0)
    return mean / np.maximum(np.linalg.norm(mean, axis=-1, keepdims=True), 1e-6)  # type: ignore[no-any-return]


def _order_steps(
    p: npt.NDArray[Any], mask: npt.NDArray[Any], enabled: bool
) -> tuple[npt.NDArray[Any], npt.NDArray[Any]]:
    """As the torch network's `_order`: where a token's neighbours landed, relative to it."""
    if not enabled:
        return np.zeros_like(p), np.zeros_like(p)
    valid = mask[:, 1:] & mask[:, :-1]
    step = np.where(valid, p[:, 1:] - p[:, :-1], np.float32(1.0)).clip(-4.0, 4.0)
    ones = np.ones_like(p[:, :1])
    return np.concatenate([ones, step], 1), np.concatenate([step, ones], 1)


class PairVerifier:
    """Scores (query, candidate) token features: the probability one answer fits both."""

    def __init__(
        self,
        network: NumpyNet,
        flag_table: npt.NDArray[np.uint8],
        threshold: float,
        info: dict[str, Any],
    ) -> None:
        self._network = network
        self._flags = flag_table
        self.threshold = threshold  # default acceptance, tuned on the training split
        self.info = info

    @classmethod
    def load(cls, path: Path = DEFAULT_WEIGHTS) -> PairVerifier:
        from safetensors import safe_open
        from safetensors.numpy import load_file

        with safe_open(str(path), framework="np") as handle:
            meta = dict(handle.metadata() or {})
        tensors = load_file(str(path))
        flag_table = tensors.pop("flag_table").astype(np.uint8)
        network = NumpyNet(VerifierConfig.from_json(meta["config"]), tensors)
        info = json.loads(meta.get("info", "{}"))
        return cls(network, flag_table, float(meta["threshold"]), info)

    def side(self, features: bytes | TokenFeatures) -> Side:
        if isinstance(features, bytes):
            features = TokenFeatures.from_bytes(features)
        return prepare(features, self._flags)

    def score(self, query: bytes | Side, candidate: bytes | Side) -> float:
        """Probability in [0, 1]; accept when >= `threshold`."""
        return self.score_many(query, [candidate])[0]

    def score_many(self, query: bytes | Side, candidates: Sequence[bytes | Side]) -> list[float]:
        return self.score_pairs([(query, candidates)])[0]

    def score_pairs(
        self, asks: Sequence[tuple[bytes | Side, Sequence[bytes | Side]]]
    ) -> list[list[float]]:
        """Several queries' candidates in one forward pass: per (query, candidates), the
        scores score_many gives. One pass over 32 pairs measured 5 ms here against 1.9 ms
        for each pair alone (the network's per-call overhead dominates a pair)."""
        queries: list[Side] = []
        others: list[Side] = []
        for query, candidates in asks:
            q = query if isinstance(query, Side) else self.side(query)
            queries.extend([q] * len(candidates))
            others.extend(c if isinstance(c, Side) else self.side(c) for c in candidates)
        if not others:
            return [[] for _ in asks]
        logits = self._network(padded(queries), padded(others))
        # In float64: float32 rounds every confident pair to exactly 1.0, and thresholds
        # near 1 (the strict one, precision curves) need the order among them.
        scores = [1.0 / (1.0 + math.exp(-float(x))) for x in logits]
        out, start = [], 0
        for _, candidates in asks:
            out.append(scores[start : start + len(candidates)])
            start += len(candidates)
        return out
