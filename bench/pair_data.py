"""The labelled prompt pairs in ../shared/data, and the fixed train / held-out split.

The verifier trains on one half of the authored prompt pairs (and of the PAWS pairs) and
is measured on the other half. The split is a pure function of the pair's text, so the
training script and the benchmark always agree on it without sharing a file.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data"
AUTHORED_KINDS = Path(__file__).resolve().parent / "pairs" / "authored-kinds.jsonl"
PROMPT_PAIRS = DATA_DIR / "prompt-pairs-dev.jsonl"
PARAPHRASES = DATA_DIR / "paraphrase-dev.jsonl"
# QQP text is licensed for non-commercial use only: never a training input.
NEVER_TRAIN_SOURCES = frozenset({"qqp"})
# bench/pairs/authored-kinds.jsonl: written for evaluation by someone who never saw the
# training data, generator or rules, so no training or choosing step may read any of it.
NEVER_TRAIN_PREFIXES = ("authored-kinds/",)
SPLIT_RULE = "sha256(a + '\\x1f' + b): first 8 hex digits as an integer, odd = held out"


@dataclass(frozen=True)
class Pair:
    a: str
    b: str
    duplicate: bool
    source: str
    why: str = ""

    @property
    def held_out(self) -> bool:
        """True for the half that no training step may read."""
        if self.source in NEVER_TRAIN_SOURCES or self.source.startswith(NEVER_TRAIN_PREFIXES):
            return True
        digest = hashlib.sha256(f"{self.a}\x1f{self.b}".encode()).hexdigest()
        return int(digest[:8], 16) % 2 == 1


def load_pairs(path: Path) -> list[Pair]:
    with path.open(encoding="utf-8") as handle:
        rows = [json.loads(line) for line in handle if line.strip()]
    return [
        Pair(r["a"], r["b"], bool(r["duplicate"]), str(r["source"]), str(r.get("why", "")))
        for r in rows
    ]


def training_pairs(pairs: Iterable[Pair]) -> list[Pair]:
    return [p for p in pairs if not p.held_out]


def held_out_pairs(pairs: Iterable[Pair]) -> list[Pair]:
    return [p for p in pairs if p.held_out]
