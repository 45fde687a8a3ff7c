"""The cache quality benchmark's pair files and its scoring of a hit (bench/pair_data.py,
bench/pairs/, bench/cache_quality.py's Query.correct)."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np

from bench.cache_quality import Counts, Outcome, Query, counts
from bench.pair_data import AUTHORED_KINDS, Pair, load_pairs, training_pairs
from cache.embedder import Embedded


def _query(pair: Pair, texts: list[str]) -> Query:
    embedded = Embedded(np.zeros(4, dtype=np.float32), b"")
    return Query(pair, embedded, [], list(range(len(texts))), texts)


def test_a_hit_on_the_own_prompt_is_correct_whichever_pair_stored_it() -> None:
    texts = ["make it shorter", "make it longer", "make it shorter"]
    duplicate = Pair("make it shorter", "pls shorten it", True, "s")
    assert _query(duplicate, texts).correct(2)
    assert _query(duplicate, texts).correct(0)  # the same text, stored by another pair
    assert not _query(duplicate, texts).correct(1)
    assert not _query(duplicate, texts).correct(None)


def test_a_hit_on_the_own_prompt_of_a_pair_labelled_different_is_false() -> None:
    texts = ["make it shorter", "make it longer"]
    different = Pair("make it shorter", "make it longer please", False, "s")
    assert not _query(different, texts).correct(0)


def test_a_hit_on_an_entry_holding_the_query_s_very_text_is_correct() -> None:
    texts = ["tip in Japan?", "tip in the US?"]
    different = Pair("tip in Japan?", "tip in the US?", False, "s")
    assert _query(different, texts).correct(1)
    assert not _query(different, texts).correct(0)


def test_the_authored_kinds_file_is_balanced_and_never_training_data() -> None:
    pairs = load_pairs(AUTHORED_KINDS)
    assert not training_pairs(pairs)
    counts = Counter((p.source, p.duplicate) for p in pairs)
    assert len(counts) == 14
    assert set(counts.values()) == {18}
    with AUTHORED_KINDS.open(encoding="utf-8") as handle:
        keys = {tuple(sorted(json.loads(line))) for line in handle}
    assert keys == {("a", "b", "duplicate", "source", "why")}


def test_recall_counts_duplicate_pairs_only_and_precision_counts_every_right_answer() -> None:
    texts = ["tip in Japan?", "tip in the US?", "tip in Japan?"]
    different = Pair("tip in Japan?", "tip in the US?", False, "s")
    duplicate = Pair("tip in Japan?", "tipping in Japan?", True, "s")
    wrong = Pair("tip in the US?", "tipping in the US, how much?", True, "s")
    queries = [_query(different, texts), _query(duplicate, texts), _query(wrong, texts)]
    outcomes = [Outcome(1, 1.0), Outcome(0, 1.0), Outcome(0, 1.0)]
    assert counts(queries, outcomes) == Counts(correct=2, false=1, duplicates=2, recalled=1)
