"""The similarity at which a deployment's own embedder (cache/remote_embedder.py) may call
two prompts the same, chosen on the operator's labelled pairs.

Each embedder has its own scale (MiniLM's 0.80 means little to another model), and no
verifier reads a remote embedder's candidates, so the decision is the guards and one
threshold (cache/decision.py `calibrated_threshold`). `calibrate` replays that decision on
pairs `{"a", "b", "duplicate"}` (the format of ../shared/data's dev sets): every pair the
guards let through is a hit from its similarity up, and the threshold is the lowest at
which the hits' precision reaches the target, with at least `MIN_HITS` true ones (a
threshold from two lucky pairs says nothing). With no such threshold the semantic tier
stays off for that embedder. `gateway cache calibrate` writes the result next to the
cache (`calibration.json`), the gateway reads it at start.

Calibrate on pairs like the deployment's traffic, and not on the pairs you report on: a
threshold met on the pairs it was chosen on is a development figure.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import orjson

from cache.decision import DecisionSettings, guarded
from cache.embedder import Encoder, embed_many

MIN_HITS = 5
DEFAULT_PRECISION = 0.95


@dataclass(frozen=True)
class Pair:
    a: str
    b: str
    duplicate: bool


@dataclass(frozen=True)
class Calibration:
    embedder: str  # the identity it was made for (`RemoteEncoder.identity`)
    threshold: float | None  # None: no threshold reaches the target
    target_precision: float
    precision: float  # at the threshold, on the pairs
    recall: float  # of the duplicates, on the pairs
    pairs: int
    duplicates: int

    def to_json(self) -> bytes:
        return orjson.dumps(asdict(self), option=orjson.OPT_INDENT_2)

    @staticmethod
    def load(path: Path) -> Calibration | None:
        if not path.exists():
            return None
        return Calibration(**orjson.loads(path.read_bytes()))


def read_pairs(path: Path) -> list[Pair]:
    pairs = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        row = orjson.loads(line)
        if not (isinstance(row.get("a"), str) and isinstance(row.get("b"), str)):
            raise ValueError(f"{path}:{number}: a pair needs strings a and b")
        if not isinstance(row.get("duplicate"), bool):
            raise ValueError(f"{path}:{number}: a pair needs duplicate: true or false")
        pairs.append(Pair(row["a"], row["b"], row["duplicate"]))
    return pairs


def calibrate(
    pairs: Sequence[Pair],
    encoder: Encoder,
    identity: str,
    target_precision: float = DEFAULT_PRECISION,
    settings: DecisionSettings | None = None,
) -> Calibration:
    settings = settings or DecisionSettings()
    vectors = embed_many(encoder, [text for p in pairs for text in (p.a, p.b)])
    similarities = [
        float(np.dot(vectors[2 * i].vector, vectors[2 * i + 1].vector)) for i in range(len(pairs))
    ]
    passing = [
        (similarity, pair.duplicate)
        for pair, similarity in zip(pairs, similarities, strict=True)
        if guarded(pair.a, pair.b, settings) is None
    ]
    duplicates = sum(p.duplicate for p in pairs)
    threshold, precision, found = _lowest_threshold(passing, target_precision)
    return Calibration(
        identity,
        threshold,
        target_precision,
        round(precision, 4),
        round(found / duplicates, 4) if duplicates else 0.0,
        len(pairs),
        duplicates,
    )


def _lowest_threshold(
    passing: list[tuple[float, bool]], target: float
) -> tuple[float | None, float, int]:
    """(threshold, precision, true hits) at the lowest similarity whose hits from there up
    reach `target` precision with at least MIN_HITS true ones; (None, 0, 0) if none does."""
    best: tuple[float | None, float, int] = (None, 0.0, 0)
    true = false = 0
    ranked = sorted(passing, reverse=True)
    for similarity, tied in itertools.groupby(ranked, key=lambda p: p[0]):
        for _, duplicate in tied:  # a threshold takes every pair at its similarity
            true += duplicate
            false += not duplicate
        precision = true / (true + false)
        if precision >= target and true >= MIN_HITS:
            best = (similarity, precision, true)
    return best
