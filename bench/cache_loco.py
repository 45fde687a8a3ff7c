"""Leave one category out (issue 16, part 2): how the semantic tier does on a kind of prompt
its pair verifier never saw, against the shipped verifier on the same pairs.

For each source (the nine authored categories of prompt-pairs-dev.jsonl, and the PAWS
pairs of paraphrase-dev.jsonl), scripts/train_verifier.py trains a verifier with every
pair of that source left out, and the synthetic pairs it makes from their texts too
(`--hold-out SOURCE`), and chooses its threshold on the out-of-fold scores of what is left
(`--folds`, 3 here against the shipped 5, for time). The whole default decision (tier 2,
floor, guards, that verifier) then runs on the source's held-out half, in a namespace of
that half alone, as bench/cache_quality.py does: side `a` stored, side `b` asked. The
shipped verifier runs on the same pairs; it trained on the source's *other* half, so the
difference between the two rows is what having seen the category was worth. The held-out
halves are small (9 to 40 pairs a category), so the `loco` verifier is also measured on
both halves of its source (`halves: both`), none of which it saw.

What this does not hold out: the guards, the lexicon of scripts/synthetic_pairs.py and the
seed prompts were written by people who had read every category of both files. So the
`loco` figures are still development figures, an upper bound on a truly new kind of prompt.
QQP is never trained on, so it has no row here (bench/cache_quality.py reports it).

Prints JSON lines: {"bench": "cache_loco", "metric", "value", "unit", "source", "verifier"}
and `halves` ("held_out" or "both"), with metrics precision, recall, false_hits, pairs,
duplicates, threshold, train_s; `verifier` is "shipped" or "loco".

    python bench/cache_loco.py                         # all ten sources, ~30 minutes here
    python bench/cache_loco.py --quick                 # a smoke run, under a minute: one
                                                       # source, 3 epochs, no threshold
                                                       # choice (the fixed 0.9)
    python bench/cache_loco.py --source authored-dev/support --source paws-wiki/dev
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.cache_quality import (  # noqa: E402
    CachedVerifier,
    build_queries,
    counts,
    gateway_outcomes,
)
from bench.pair_data import PARAPHRASES, PROMPT_PAIRS, Pair, held_out_pairs, load_pairs  # noqa: E402
from bench.report import emitter, progress_of  # noqa: E402
from cache.decision import DecisionSettings  # noqa: E402
from cache.embedder import Embedded, Encoder, embed_many, load_embedder  # noqa: E402
from cache.verifier import DEFAULT_WEIGHTS, PairVerifier  # noqa: E402

QUICK_SOURCE = "authored-dev/math"


emit = emitter("cache_loco")


progress = progress_of("cache_loco")


def sources() -> list[str]:
    authored = sorted({p.source for p in load_pairs(PROMPT_PAIRS)})
    paws = sorted({p.source for p in load_pairs(PARAPHRASES) if p.source.startswith("paws")})
    return authored + paws


def pairs_of(source: str, *, halves: str) -> list[Pair]:
    """The source's pairs: its held-out half ("held_out"), or both halves ("both")."""
    path = PARAPHRASES if source.startswith("paws") else PROMPT_PAIRS
    pairs = load_pairs(path) if halves == "both" else held_out_pairs(load_pairs(path))
    return [p for p in pairs if p.source == source]


def train_without(source: str, out: Path, folds: int, quick: bool) -> float:
    """Trains a verifier with `source` left out; returns the seconds it took."""
    started = time.monotonic()
    command = [sys.executable, str(ROOT / "scripts" / "train_verifier.py")]
    command += ["--hold-out", source, "--out", str(out)]
    command += ["--folds", "1", "--epochs", "3", "--threshold", "0.9"] if quick else []
    command += [] if quick else ["--folds", str(folds)]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return time.monotonic() - started


def embedded(pairs: list[Pair], encoder: Encoder) -> dict[str, Embedded]:
    texts = sorted({t for p in pairs for t in (p.a, p.b)})
    return dict(zip(texts, embed_many(encoder, texts, 64), strict=True))


def measure(
    pairs: list[Pair], vectors: dict[str, Embedded], model: PairVerifier, **params: Any
) -> None:
    queries = build_queries(pairs, vectors)
    # The verifier alone (no pair model's second opinion): what this benchmark compares.
    outcomes = gateway_outcomes(queries, DecisionSettings(), CachedVerifier(model), None)
    correct, false, duplicates, recalled = counts(queries, outcomes)
    hits = correct + false
    emit("precision", round(correct / hits, 4) if hits else None, "ratio", **params)
    emit("recall", round(recalled / max(duplicates, 1), 4), "ratio", **params)
    emit("false_hits", false, "count", **params)
    emit("threshold", model.threshold, "score", **params)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--source", action="append", default=[], help="default: all ten")
    parser.add_argument("--folds", type=int, default=3, help="for the threshold choice")
    parser.add_argument("--quick", action="store_true", help=f"only {QUICK_SOURCE}")
    args = parser.parse_args()
    chosen = args.source or ([QUICK_SOURCE] if args.quick else sources())
    unknown = set(chosen) - set(sources())
    if unknown:
        parser.error(f"unknown source(s) {sorted(unknown)}; known: {sources()}")

    encoder = load_embedder(device="cpu")
    shipped = PairVerifier.load(DEFAULT_WEIGHTS)
    with tempfile.TemporaryDirectory(prefix="bench-loco-") as tmp:
        for source in chosen:
            half, both = pairs_of(source, halves="held_out"), pairs_of(source, halves="both")
            for halves, pairs in (("held_out", half), ("both", both)):
                emit("pairs", len(pairs), "pairs", source=source, halves=halves)
                emit("duplicates", sum(p.duplicate for p in pairs), "pairs", **_of(source, halves))
            vectors = embedded(both, encoder)  # the held-out half's texts are among them
            measure(half, vectors, shipped, **_of(source, "held_out"), verifier="shipped")
            progress(f"{source}: training without it")
            weights = Path(tmp) / "loco.safetensors"
            seconds = train_without(source, weights, args.folds, args.quick)
            emit("train_s", round(seconds, 1), "s", source=source, verifier="loco")
            loco = PairVerifier.load(weights)
            for halves, pairs in (("held_out", half), ("both", both)):
                measure(pairs, vectors, loco, **_of(source, halves), verifier="loco")


def _of(source: str, halves: str) -> dict[str, str]:
    return {"source": source, "halves": halves}


if __name__ == "__main__":
    main()
