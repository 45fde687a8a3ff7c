"""Train the cross-attention pair model (scripts/cross_model.py; the gateway runs it as
cache/cross.py) and measure it. The shipped weights, cache/weights/cross.safetensors, are

    python scripts/train_cross.py --swaps --questions --template-pairs 20

(seed 13; about 24 minutes on this 2-core machine: 3.5 to embed the texts, 20 to train;
cache/weights/README.md). `--input-layer 4` reads MiniLM's fourth-layer states instead
(docs/cache-quality.md "How the pair model got here": better on some sets, but the embedder
does not store them).

Training data: what scripts/train_verifier.py's `build_examples` makes (the training halves
of prompt-pairs-dev and of the PAWS pairs, synthetic pairs from our seeds), plus
`--corpus-pairs` per source of ../shared/data/train/ with a rule-made one-detail negative
per positive (and with `--swaps` one with two likely nouns swapped, PAWS's kind of
negative; with `--questions` one asking another question), plus `--template-pairs` per
intent of scripts/verifier_templates.py. Never QQP, never bench/pairs/authored-kinds.jsonl.
Fold 0 of the authored and PAWS training pairs is kept out as the validation set.

What the model reads (`--input-layer`): 6, the last-layer token vectors the cache stores
(from the gateway's default embedder, as cache entries have them); or 4, the packaged
MiniLM's token states after its fourth layer (torch, float32), which its top two layers
were trained to read, but which the embedder does not keep.

Prints one JSON object: per threshold, precision / recall / false hits of the model alone
(pairs under the 0.80 cosine floor are misses, as in the gateway) on the validation set and
on sets no training step read: the held-out halves of prompt-pairs-dev and PAWS, all QQP
pairs, all of authored-kinds. Saves the float16 weights (`--out`), whose scores those are,
with `--threshold` (the bar the gateway's second opinion uses: chosen leave-one-source-out
with bench/cache_quality.py's `pair_model_<bar>` variants, not here) and the arguments.
"""

from __future__ import annotations

import argparse
import json
import math
import pickle
import random
import sys
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for folder in (ROOT, ROOT / "scripts"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from cross_model import Cross, Side, round_to_half, save, torch_batch  # noqa: E402
from train_verifier import (  # noqa: E402
    Example,
    build_examples,
    embed_cached,
    log,
    precision_recall_table,
)

from bench.pair_data import (  # noqa: E402
    AUTHORED_KINDS,
    PARAPHRASES,
    PROMPT_PAIRS,
    Pair,
    held_out_pairs,
    load_pairs,
)
from cache.embedder import default_model_path, load_embedder  # noqa: E402
from cache.features import TokenFeatures  # noqa: E402

THRESHOLDS = (0.5, 0.8, 0.9, 0.95, 0.98, 0.99, 0.995)
FLOOR = 0.80  # the gateway's cosine floor: pairs under it never reach a pair model


def evaluation_sets() -> dict[str, list[Pair]]:
    return {
        "prompt-pairs-heldout": held_out_pairs(load_pairs(PROMPT_PAIRS)),
        "paws-heldout": [
            p for p in held_out_pairs(load_pairs(PARAPHRASES)) if p.source.startswith("paws")
        ],
        "qqp": [p for p in load_pairs(PARAPHRASES) if p.source == "qqp"],
        "authored-kinds": load_pairs(AUTHORED_KINDS),
    }


def stored_features(embedded: dict[str, Any]) -> dict[str, Side]:
    out: dict[str, Side] = {}
    for text, e in embedded.items():
        features = TokenFeatures.from_bytes(e.features)
        out[text] = (features.ids, features.embeddings)
    return out


def layer_states(texts: list[str], layer: int, cache: Path | None) -> dict[str, Side]:
    """text -> (ids, the packaged MiniLM's token states after `layer` layers), in torch."""
    from sentence_transformers import SentenceTransformer

    known: dict[str, Side] = {}
    if cache is not None and cache.exists():
        with cache.open("rb") as handle:
            known = pickle.load(handle)  # noqa: S301 - a file this script wrote
    missing = sorted({t for t in texts if t not in known}, key=len)
    if missing:
        model = SentenceTransformer(str(default_model_path()), device="cpu")
        tokenizer, bert = model.tokenizer, model[0].auto_model
        with torch.inference_mode():
            for start in range(0, len(missing), 64):
                chunk = missing[start : start + 64]
                enc = tokenizer(
                    chunk,
                    padding=True,
                    truncation=True,
                    max_length=model.max_seq_length,
                    return_tensors="pt",
                )
                states = bert(**enc, output_hidden_states=True).hidden_states[layer]
                for i, text in enumerate(chunk):
                    n = int(enc["attention_mask"][i].sum())
                    ids = enc["input_ids"][i, :n].numpy().astype(np.uint16)
                    known[text] = (ids, states[i, :n].numpy().astype(np.float16))
        if cache is not None:
            with cache.open("wb") as handle:
                pickle.dump(known, handle)
    log(f"layer {layer} states: {len(missing)} computed")
    return {t: known[t] for t in texts}


def batches(items: list[Example], size: int, rng: random.Random) -> list[list[Example]]:
    """Batches of similar lengths (little padding), in random order."""
    ordered = sorted(items, key=lambda e: (len(e.a) + len(e.b), rng.random()))
    chunks = [ordered[i : i + size] for i in range(0, len(ordered), size)]
    rng.shuffle(chunks)
    return chunks


def train(
    model: Cross, examples: list[Example], sides: dict[str, Side], args: argparse.Namespace
) -> None:
    rng = random.Random(args.seed)  # noqa: S311 - seeded shuffling
    fresh = [model.segment, model.shared, *model.head.parameters()]
    groups = [
        {"params": list(model.layers.parameters()), "lr": args.lr},
        {"params": fresh, "lr": args.lr * args.head_lr},  # new parameters learn faster
    ]
    optimizer = torch.optim.AdamW(groups, weight_decay=0.01)
    steps = args.epochs * math.ceil(len(examples) / args.batch)
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, [args.lr, args.lr * args.head_lr], total_steps=steps, pct_start=0.1
    )
    for epoch in range(args.epochs):
        model.train()
        started, total = time.perf_counter(), 0.0
        for chunk in batches(examples, args.batch, rng):
            # Either prompt may be the cached one: train on both orders.
            flips = [rng.random() < 0.5 for _ in chunk]
            pairs = [
                (sides[e.b], sides[e.a]) if flip else (sides[e.a], sides[e.b])
                for e, flip in zip(chunk, flips, strict=True)
            ]
            labels = torch.tensor([e.label for e in chunk])
            weights = torch.tensor([e.weight for e in chunk])
            loss = torch.nn.functional.binary_cross_entropy_with_logits(
                model(torch_batch(pairs)), labels, weight=weights
            )
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
            total += float(loss.detach()) * len(chunk)
        seconds = time.perf_counter() - started
        log(f"epoch {epoch}: loss {total / len(examples):.4f}, {seconds:.0f} s")
    model.eval()


def scores(model: Cross, pairs: list[tuple[Side, Side]]) -> np.ndarray:
    order = sorted(range(len(pairs)), key=lambda i: len(pairs[i][0][0]) + len(pairs[i][1][0]))
    out = np.zeros(len(pairs))
    with torch.inference_mode():
        for start in range(0, len(order), 256):
            index = order[start : start + 256]
            batch = torch_batch([pairs[i] for i in index])
            out[index] = torch.sigmoid(model(batch)).numpy()
    return out


def curve(score: np.ndarray, label: np.ndarray, cosine: np.ndarray) -> list[dict[str, float]]:
    """Per threshold, as the gateway would see it: a pair under the floor is never a hit."""
    return precision_recall_table(np.where(cosine >= FLOOR, score, 0.0), label, THRESHOLDS)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--head-lr", type=float, default=20.0, help="x lr for new parameters")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--fresh", action="store_true", help="random layers, not MiniLM's")
    parser.add_argument("--input-layer", type=int, default=6, choices=range(1, 7))
    parser.add_argument("--corpus-pairs", type=int, default=3000)
    parser.add_argument("--swaps", action="store_true", help="swapped-noun corpus negatives")
    parser.add_argument("--questions", action="store_true", help="other-question negatives")
    parser.add_argument("--template-pairs", type=int, default=0)
    parser.add_argument("--per-seed", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--embed-cache", type=Path, default=None, help="pickle, kept")
    parser.add_argument("--states-cache", type=Path, default=None, help="pickle, kept")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "cache" / "weights" / "cross.safetensors"
    )
    parser.add_argument(
        "--threshold", type=float, default=0.98, help="stored with the weights, not chosen here"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    data_args = SimpleNamespace(
        hold_out=[],
        authored_weight=3.0,
        paws_weight=1.0,
        folds=5,
        per_seed=args.per_seed,
        direction_pairs=300,
        corpus_pairs=args.corpus_pairs,
        template_pairs=args.template_pairs,
        swaps=args.swaps,
        questions=args.questions,
    )
    examples = build_examples(data_args, random.Random(args.seed))  # noqa: S311
    valid = [e for e in examples if e.fold == 0 and e.kind in ("authored", "paws")]
    training = [e for e in examples if e.fold != 0]
    log(f"{len(training)} training pairs, {len(valid)} validation pairs")
    log(json.dumps(Counter(e.kind.split("/")[0] for e in training)))
    evals = evaluation_sets()
    texts = sorted(
        {t for e in examples for t in (e.a, e.b)}
        | {t for pairs in evals.values() for p in pairs for t in (p.a, p.b)}
    )
    started = time.perf_counter()
    encoder = load_embedder(device="cpu")
    embedded = dict(zip(texts, embed_cached(encoder, texts, args.embed_cache), strict=True))
    if args.input_layer == 6:
        sides = stored_features(embedded)
    else:
        sides = layer_states(texts, args.input_layer, args.states_cache)
    log(f"{len(texts)} texts embedded in {time.perf_counter() - started:.0f} s")

    minilm = None if args.fresh else default_model_path() / "model.safetensors"
    model = Cross(args.layers, minilm)
    started = time.perf_counter()
    train(model, training, sides, args)
    train_s = time.perf_counter() - started
    round_to_half(model)  # what is saved: the scores below are the saved weights' scores

    def measured(a: list[str], b: list[str], label: list[float]) -> list[dict[str, float]]:
        score = scores(model, [(sides[x], sides[y]) for x, y in zip(a, b, strict=True)])
        cosine = [float(embedded[x].vector @ embedded[y].vector) for x, y in zip(a, b, strict=True)]
        return curve(score, np.asarray(label), np.asarray(cosine))

    result: dict[str, object] = {"train_s": round(train_s), "args": vars(args)}
    result["validation"] = measured(
        [e.a for e in valid], [e.b for e in valid], [e.label for e in valid]
    )
    for name, pairs in evals.items():
        result[name] = measured(
            [p.a for p in pairs], [p.b for p in pairs], [float(p.duplicate) for p in pairs]
        )
    info = {"train_s": round(train_s), "args": {k: str(v) for k, v in vars(args).items()}}
    save(model, args.threshold, info, args.out)
    print(json.dumps(result, default=str))


if __name__ == "__main__":
    main()
