"""Train the tier-3 pair verifier (cache/verifier.py) and write cache/weights/.

    python scripts/train_verifier.py                  # train, pick the threshold, save
    python scripts/train_verifier.py --folds 1        # no out-of-fold step (--threshold)
    python scripts/train_verifier.py --ablate order   # a variant without one feature
    python scripts/train_verifier.py --template-pairs 20 --out /tmp/v.safetensors
                                                      # an experiment, not shipped
                                                      # (docs/cache-quality.md "Training data ...")

Training data, and only this (see ../shared/data/README.md for the licences):
  - the training half of prompt-pairs-dev.jsonl (bench/pair_data.py holds the split);
  - the training half of the PAWS pairs in paraphrase-dev.jsonl (never the QQP pairs);
  - synthetic pairs (scripts/synthetic_pairs.py) made from our own seed prompts
    (scripts/verifier_seeds.py) and from the training-half texts;
  - only when asked (neither is in the shipped weights): --corpus-pairs, pairs of the
    licence-clean corpora in ../shared/data/train/ with a rule-made one-detail negative per
    positive (and with --swaps one with two likely nouns swapped, with --questions one
    asking another question); --template-pairs,
    scripts/verifier_templates.py's grammar of intents.

The verifier threshold is chosen on out-of-fold scores (5 folds) of the training-half
authored and PAWS pairs, run through the whole default decision, so it is never fitted on
pairs the model saw. Seeded and deterministic (torch on CPU, one thread; the summary's
`weights_sha256` repeats across runs). Prints timings to stderr and one JSON summary to
stdout. On the shared 2-core development machine a full run takes about 5 minutes: ~30-45 s
to embed ~4,000 texts, ~3.5 min for the out-of-fold fits, ~35-75 s for the final fit.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pickle
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for folder in (ROOT, ROOT / "scripts"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from synthetic_pairs import (  # noqa: E402
    SyntheticPair,
    corpus_pairs,
    direction_pairs,
    pairs_from_seed,
    unrelated_pairs,
)
from verifier_seeds import SEED_PROMPTS  # noqa: E402
from verifier_templates import template_pairs  # noqa: E402

from bench.pair_data import (  # noqa: E402
    DATA_DIR,
    PARAPHRASES,
    PROMPT_PAIRS,
    Pair,
    load_pairs,
    training_pairs,
)
from cache.decision import DecisionSettings  # noqa: E402
from cache.embedder import Embedded, embed_many, load_embedder  # noqa: E402
from cache.features import TokenFeatures  # noqa: E402
from cache.guards import GUARDS, unexplained_words  # noqa: E402
from cache.normalize import normalize  # noqa: E402
from cache.torch_encoder import SentenceEncoder  # noqa: E402
from cache.verifier import (  # noqa: E402
    DEFAULT_WEIGHTS,
    FLAG_NAMES,
    Side,
    VerifierConfig,
    batch_sides,
    build_network,
    prepare,
)


def _words(text: str) -> list[str]:
    """A word list written as one string (long lists stay readable)."""
    return text.split()


_STOPWORDS = _words(
    """a an the of in on at for by with about as is are was were be been do does did i you
we my your our me it its this that these those and or but if how what why when where
which who can could would should will shall may might must so very just also any
some there here then please thanks hi hey hello"""
)
_NEGATIONS = _words("not no never without none nor neither cannot nothing nobody nowhere")
_DIRECTIONS = _words("to into from than onto toward towards before after vs versus")


# Out-of-fold scores of these choose the threshold; each must reach its precision.
SCORED_KINDS = {"authored": 0.98, "paws": 0.95}


@dataclass(frozen=True)
class Example:
    a: str
    b: str
    label: float
    weight: float
    fold: int  # -1: always trained on (never scored out of fold)
    kind: str


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def flag_table(encoder: SentenceEncoder) -> np.ndarray:
    """One bit per FLAG_NAMES entry for every word piece of the model's vocabulary."""
    vocab: dict[str, int] = encoder.tokenizer_vocab()
    table = np.zeros(max(vocab.values()) + 1, dtype=np.uint8)
    words = {"stopword": _STOPWORDS, "negation": _NEGATIONS, "direction": _DIRECTIONS}
    for token, index in vocab.items():
        bits = 0
        for bit, name in enumerate(FLAG_NAMES):
            if name in words and token in words[name]:
                bits |= 1 << bit
        if not any(ch.isalnum() for ch in token.lstrip("#")):
            bits |= 1 << FLAG_NAMES.index("punctuation")
        if any(ch.isdigit() for ch in token):
            bits |= 1 << FLAG_NAMES.index("digit")
        table[index] = bits
    return table


def fold_of(pair: Pair, folds: int) -> int:
    digest = hashlib.sha256(f"fold\x1f{pair.a}\x1f{pair.b}".encode()).digest()
    return int.from_bytes(digest[:4], "big") % max(folds, 1)


def build_examples(args: argparse.Namespace, rng: random.Random) -> list[Example]:
    """The training pairs; none of a `--hold-out` source, nor synthetic pairs made from
    its texts (bench/cache_loco.py measures on that source)."""
    kept = set(args.hold_out)
    authored = [p for p in training_pairs(load_pairs(PROMPT_PAIRS)) if p.source not in kept]
    paws = [
        p
        for p in training_pairs(load_pairs(PARAPHRASES))
        if p.source.startswith("paws") and p.source not in kept
    ]
    examples = [
        Example(
            p.a, p.b, float(p.duplicate), args.authored_weight, fold_of(p, args.folds), "authored"
        )
        for p in authored
    ]
    examples += [
        Example(p.a, p.b, float(p.duplicate), args.paws_weight, fold_of(p, args.folds), "paws")
        for p in paws
    ]
    synthetic: list[tuple[SyntheticPair, int]] = []
    for seed in SEED_PROMPTS:
        synthetic += [(s, -1) for s in pairs_from_seed(seed, seed, rng, args.per_seed)]
    for pair in authored:
        for text in (pair.a, pair.b):
            made = pairs_from_seed(text, text, rng, args.per_seed)
            synthetic += [(s, fold_of(pair, args.folds)) for s in made]
    synthetic += [(s, -1) for s in unrelated_pairs(SEED_PROMPTS, rng, len(SEED_PROMPTS))]
    synthetic += [(s, -1) for s in direction_pairs(rng, args.direction_pairs)]
    if args.corpus_pairs:  # none in the shipped weights (docs/cache-quality.md "Training data ...")
        made = corpus_pairs(load_corpora(), rng, args.corpus_pairs, args.swaps, args.questions)
        synthetic += [(s, -1) for s in made]
    if args.template_pairs:
        synthetic += [(s, -1) for s in template_pairs(rng, args.template_pairs)]
    examples += [
        Example(s.a, s.b, float(s.duplicate), 1.0, fold, f"synthetic/{s.kind}")
        for s, fold in synthetic
    ]
    return examples


def load_corpora() -> list[dict[str, object]]:
    """The licence-clean training corpora (../shared/data/train/, see its README)."""
    rows: list[dict[str, object]] = []
    for path in sorted((DATA_DIR / "train").glob("*.jsonl")):
        with path.open(encoding="utf-8") as handle:
            rows += [json.loads(line) for line in handle if line.strip()]
    return rows


def embed_texts(
    encoder: SentenceEncoder, texts: list[str], table: np.ndarray, cache: Path | None
) -> tuple[dict[str, Side], dict[str, np.ndarray]]:
    ordered = sorted(
        set(texts), key=lambda t: (len(t), t)
    )  # similar lengths per batch: little padding
    embedded = embed_cached(encoder, ordered, cache)
    sides = {
        text: prepare(TokenFeatures.from_bytes(e.features), table)
        for text, e in zip(ordered, embedded, strict=True)
    }
    return sides, {text: e.vector for text, e in zip(ordered, embedded, strict=True)}


def embed_cached(encoder: SentenceEncoder, texts: list[str], cache: Path | None) -> list[Embedded]:
    """embed_many, reading and extending a pickle of earlier runs' embeddings when given
    (the encoder is fixed, so a text's embedding never changes; saves minutes per run)."""
    known: dict[str, Embedded] = {}
    if cache is not None and cache.exists():
        with cache.open("rb") as handle:
            known = pickle.load(handle)  # noqa: S301 - a file this script wrote
    missing = [t for t in texts if t not in known]
    known.update(zip(missing, embed_many(encoder, missing, 64), strict=True))
    if cache is not None and missing:
        with cache.open("wb") as handle:
            pickle.dump(known, handle)
    return [known[t] for t in texts]


def train(
    config: VerifierConfig,
    examples: list[Example],
    sides: dict[str, Side],
    args: argparse.Namespace,
) -> torch.nn.Module:
    torch.manual_seed(args.seed)
    order_rng = random.Random(args.seed)  # noqa: S311 - seeded shuffling, not security
    network = build_network(config)
    optimizer = torch.optim.AdamW(network.parameters(), lr=args.lr, weight_decay=1e-3)
    dropout = torch.nn.Dropout(args.dropout)
    for _epoch in range(args.epochs):
        network.train()
        shuffled = examples[:]
        order_rng.shuffle(shuffled)
        for start in range(0, len(shuffled), args.batch):
            chunk = shuffled[start : start + args.batch]
            a, b = _batch(chunk, sides, order_rng)
            a["vectors"], b["vectors"] = dropout(a["vectors"]), dropout(b["vectors"])
            labels = torch.tensor([e.label for e in chunk])
            weights = torch.tensor([e.weight for e in chunk])
            loss = torch.nn.functional.binary_cross_entropy_with_logits(
                network(a, b), labels, weight=weights
            )
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return network.eval()


def _batch(
    chunk: list[Example], sides: dict[str, Side], rng: random.Random
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    # Either prompt may be the cached one: train on both orders.
    flips = [rng.random() < 0.5 for _ in chunk]
    left = [sides[e.b if f else e.a] for e, f in zip(chunk, flips, strict=True)]
    right = [sides[e.a if f else e.b] for e, f in zip(chunk, flips, strict=True)]
    return batch_sides(left), batch_sides(right)


def predict(
    network: torch.nn.Module, examples: list[Example], sides: dict[str, Side]
) -> np.ndarray:
    out: list[float] = []
    with torch.inference_mode():
        for start in range(0, len(examples), 256):
            chunk = examples[start : start + 256]
            a = batch_sides([sides[e.a] for e in chunk])
            b = batch_sides([sides[e.b] for e in chunk])
            out.extend(torch.sigmoid(network(a, b)).tolist())
    return np.asarray(out)


def precision_recall_table(
    scores: np.ndarray,
    labels: np.ndarray,
    thresholds: tuple[float, ...] = (0.5, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99),
) -> list[dict[str, float]]:
    rows = []
    for t in thresholds:
        hit = scores >= t
        tp = float((hit & (labels == 1)).sum())
        rows.append(
            {
                "threshold": t,
                "precision": round(tp / max(hit.sum(), 1), 3),
                "recall": round(tp / max((labels == 1).sum(), 1), 3),
                "false_hits": int((hit & (labels == 0)).sum()),
            }
        )
    return rows


def out_of_fold(
    config: VerifierConfig,
    examples: list[Example],
    sides: dict[str, Side],
    args: argparse.Namespace,
) -> tuple[np.ndarray, list[Example]]:
    scored = [e for e in examples if e.kind in SCORED_KINDS]
    scores = np.zeros(len(scored))
    for fold in range(args.folds):
        train_set = [e for e in examples if e.fold != fold]
        network = train(config, train_set, sides, args)
        index = [i for i, e in enumerate(scored) if e.fold == fold]
        scores[index] = predict(network, [scored[i] for i in index], sides)
        log(f"fold {fold}: {len(train_set)} training pairs, {len(index)} scored")
    return scores, scored


def save(
    network: torch.nn.Module,
    table: np.ndarray,
    threshold: float,
    info: dict[str, object],
    path: Path,
) -> None:
    from safetensors.torch import save_file

    tensors = {k: v.detach().contiguous() for k, v in network.state_dict().items()}
    tensors["flag_table"] = torch.from_numpy(table.astype(np.uint8))
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "config": network.config.to_json(),
        "threshold": str(threshold),
        "info": json.dumps(info, sort_keys=True),
    }
    save_file(tensors, str(path), metadata=meta)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--per-seed", type=int, default=4)
    parser.add_argument("--authored-weight", type=float, default=3.0)
    parser.add_argument("--paws-weight", type=float, default=1.0)
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--direction-pairs", type=int, default=300)
    parser.add_argument(
        "--template-pairs", type=int, default=0, help="per intent of verifier_templates.py"
    )
    parser.add_argument(
        "--corpus-pairs", type=int, default=0, help="pairs per source of ../shared/data/train/"
    )
    parser.add_argument(
        "--swaps", action="store_true", help="with --corpus-pairs: swapped-noun negatives too"
    )
    parser.add_argument(
        "--questions", action="store_true", help="with --corpus-pairs: another question too"
    )
    parser.add_argument("--threshold", type=float, default=None, help="skip the choice")
    parser.add_argument(
        "--ablate", choices=["exact", "order", "flags"], action="append", default=[]
    )
    parser.add_argument(
        "--hold-out",
        action="append",
        default=[],
        metavar="SOURCE",
        help="leave out every pair of this source (e.g. authored-dev/coding, paws-wiki/dev)",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_WEIGHTS)
    parser.add_argument(
        "--embed-cache", type=Path, default=None, help="pickle of embeddings kept across runs"
    )
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args()

    started = time.perf_counter()
    torch.set_num_threads(1)
    rng = random.Random(args.seed)  # noqa: S311 - seeded data generation
    config = replace(VerifierConfig(), **{f"use_{name}": False for name in args.ablate})

    # float32, as the shipped weights were fitted (the gateway's int8 default is near it).
    encoder = load_embedder(device="cpu", precision="float32")
    table = flag_table(encoder)
    examples = build_examples(args, rng)
    log(f"{len(examples)} pairs: {dict(Counter(e.kind for e in examples))}")
    t0 = time.perf_counter()
    texts = [t for e in examples for t in (e.a, e.b)]
    sides, vectors = embed_texts(encoder, texts, table, args.embed_cache)
    embed_s = time.perf_counter() - t0
    log(f"embedded {len(sides)} texts in {embed_s:.1f} s")

    summary: dict[str, object] = {"pairs": len(examples), "embed_s": round(embed_s, 1)}
    threshold = args.threshold
    if args.folds > 1:
        t0 = time.perf_counter()
        scores, scored = out_of_fold(config, examples, sides, args)
        labels = np.asarray([e.label for e in scored])
        summary["oof"] = precision_recall_table(scores, labels)
        summary["oof_s"] = round(time.perf_counter() - t0, 1)
        log(json.dumps(summary["oof"]))
        if threshold is None:
            cosines = np.asarray([float(vectors[e.a] @ vectors[e.b]) for e in scored])
            threshold, oof_table = choose_threshold(scores, scored, cosines)
            shown = (0.5, 0.8, 0.9, 0.95, 0.99)
            summary["decision_oof"] = [r for r in oof_table if r["threshold"] in shown]
    t0 = time.perf_counter()
    network = train(config, examples, sides, args)
    train_s = time.perf_counter() - t0
    summary.update(train_s=round(train_s, 1), threshold=threshold, ablate=args.ablate)
    summary["hold_out"] = args.hold_out
    summary["weights_sha256"] = _digest(network)
    summary["total_s"] = round(time.perf_counter() - started, 1)
    log(f"final fit {train_s:.1f} s, total {summary['total_s']} s")
    if not args.no_save:
        kept = ("pairs", "train_s", "total_s", "ablate", "hold_out", "weights_sha256")
        info = {k: summary[k] for k in kept}
        info.update(seed=args.seed, epochs=args.epochs)
        save(network, table, float(threshold if threshold is not None else 0.9), info, args.out)
    print(json.dumps(summary))


def choose_threshold(
    scores: np.ndarray, scored: list[Example], cosines: np.ndarray
) -> tuple[float, list[dict[str, object]]]:
    """The verifier threshold for the whole decision (tier 2, then floor, guards and the
    verifier at their defaults), from out-of-fold scores of the training pairs: the best
    recall whose precision reaches SCORED_KINDS's level on each kind of pair. Pairwise, own
    pair only: the benchmark measures the retrieval setting."""
    settings = DecisionSettings()
    passes = np.zeros(len(scored), dtype=bool)
    tier2 = np.zeros(len(scored), dtype=bool)
    strict = np.zeros(len(scored), dtype=bool)  # has a word without a counterpart
    for i, e in enumerate(scored):
        a, b = normalize(e.a).split(), normalize(e.b).split()
        tier2[i] = a == b
        unexplained = unexplained_words(a, b)
        vetoed = any(GUARDS[g](a, b) for g in settings.guards - {"content"})
        vetoed |= unexplained > settings.content_tolerance
        passes[i] = cosines[i] >= settings.similarity_floor and not vetoed
        strict[i] = unexplained > 0
    labels = np.asarray([e.label for e in scored]) == 1
    kinds = np.asarray([e.kind for e in scored])
    table: list[dict[str, object]] = []
    for t in (round(float(t), 2) for t in np.arange(0.50, 1.0, 0.01)):
        needed = np.where(strict, max(t, settings.unexplained_threshold), t)
        hit = tier2 | (passes & (scores >= needed))
        row: dict[str, object] = {"threshold": t}
        for kind in SCORED_KINDS:
            mine = kinds == kind
            tp, n = int((hit & labels & mine).sum()), int((hit & mine).sum())
            row[kind] = {
                "pairs": int(mine.sum()),
                "precision": round(tp / max(n, 1), 3),
                "hits": n,
                "recall": round(tp / max(int((labels & mine).sum()), 1), 3),
            }
        table.append(row)
    # The best recall that meets the precision targets; of the thresholds that tie, the
    # highest (the most careful one that costs nothing on these pairs).
    meeting = [r for r in table if _meets(r)]
    if not meeting:
        return 0.99, table
    best = max(meeting, key=lambda r: (_recall(r), r["threshold"]))
    return float(best["threshold"]), table  # type: ignore[arg-type]


def _digest(network: torch.nn.Module) -> str:
    """A hash of the trained tensors: equal across runs when training is deterministic."""
    digest = hashlib.sha256()
    for name, tensor in sorted(network.state_dict().items()):
        digest.update(name.encode() + tensor.detach().numpy().tobytes())
    return digest.hexdigest()[:16]


def _recall(row: dict[str, object]) -> float:
    return sum(row[kind]["recall"] for kind in SCORED_KINDS)  # type: ignore[index]


def _meets(row: dict[str, object]) -> bool:
    """Every kind of pair reaches its precision (a kind all held out has no pair)."""
    return all(
        row[kind]["pairs"] == 0 or row[kind]["precision"] >= p  # type: ignore[index]
        for kind, p in SCORED_KINDS.items()
    )


if __name__ == "__main__":
    main()
