"""The pair verifier's training-data generators (scripts/): one-detail negatives made from
the licence-clean corpora, and the grammar of intents (scripts/verifier_templates.py, with
its data in scripts/verifier_intents.yaml)."""

from __future__ import annotations

import random
import re
import sys
from collections import Counter
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
if str(SCRIPTS) not in sys.path:
    sys.path.insert(0, str(SCRIPTS))

from synthetic_pairs import change_question, corpus_pairs, swap_two_words, swap_word  # noqa: E402
from verifier_templates import (  # noqa: E402
    INTENTS,
    TemplateDataError,
    load_intents,
    template_pairs,
)

from cache.normalize import normalize  # noqa: E402


def _word_diff(a: str, b: str) -> int:
    return sum(x != y for x, y in zip(a.split(), b.split(), strict=True))


def test_a_swapped_word_changes_one_word_of_five_letters_or_more_in_any_language() -> None:
    rng = random.Random(3)
    text = "Pourrais-tu fermer la fenêtre de la cuisine ?"
    for _ in range(20):
        edited = swap_word(text, rng, ["porte", "voiture", "maison"])
        assert edited is not None
        assert _word_diff(text, edited) == 1
        new = set(re.findall(r"[^\W\d_]+", edited.lower())) - set(
            re.findall(r"[^\W\d_]+", text.lower())
        )
        assert len(new) == 1 and new <= {"porte", "voiture", "maison"}
    assert swap_word("a la de", rng, ["porte"]) is None  # nothing long enough to swap


def test_each_corpus_positive_also_gives_a_one_detail_negative() -> None:
    rows: list[dict[str, object]] = [
        {
            "a": f"How many rivers flow through city {i}?",
            "b": f"Rivers in city {i}: how many?",
            "duplicate": True,
            "source": "toy/pos",
        }
        for i in range(6)
    ] + [
        {
            "a": "Who founded Rome?",
            "b": "When did Rome fall?",
            "duplicate": False,
            "source": "toy/neg",
        },
    ]
    pairs = corpus_pairs(rows, random.Random(1), per_source=4)
    kinds = Counter(p.kind.split("/")[0] for p in pairs)
    assert kinds["corpus"] == 5  # four of toy/pos, the one toy/neg
    made = [p for p in pairs if p.kind.startswith("corpus-")]
    assert len(made) == 4
    for p in made:
        assert not p.duplicate
        source = next(r for r in rows if r["b"] == p.b)
        assert _word_diff(str(source["a"]), p.a) == 1  # side a edited, b is the corpus text


def test_a_noun_swap_keeps_the_words_and_moves_two_likely_nouns() -> None:
    rng = random.Random(2)
    text = "What are the names of instructors who teach the database course?"
    seen = set()
    for _ in range(20):
        swapped = swap_two_words(text, rng)
        assert swapped is not None and swapped != text
        assert sorted(swapped.split()) == sorted(text.split())
        moved = {w for w, v in zip(text.split(), swapped.split(), strict=True) if w != v}
        assert len(moved) == 2
        assert moved <= {"names", "instructors", "database", "course?"}
        seen |= moved
    assert len(seen) >= 3  # not always the same two
    assert swap_two_words("Laisse-moi te poser quelques questions.", rng) is None
    assert swap_two_words("What is the time?", rng) is None  # one candidate only


def test_another_question_changes_the_asking_word_or_whose_it_is() -> None:
    rng = random.Random(4)
    made = {change_question("How do I renew my passport?", rng) for _ in range(30)}
    assert "How do I renew my passport?" not in made
    assert "Why do I renew my passport?" in made  # the asking word
    assert "How do I renew your passport?" in made  # whose
    for text in made:
        assert text is not None and _word_diff("How do I renew my passport?", text) == 1
    assert change_question("What is the capital of France?", rng) == (
        "Why is the capital of France?"
    )
    assert change_question("List the employees in office 3.", rng) is None


def test_swaps_add_a_swapped_negative_per_corpus_positive_only_when_asked() -> None:
    rows: list[dict[str, object]] = [
        {
            "a": f"Show the names of the employees in office {i}.",
            "b": "x",
            "duplicate": True,
            "source": "toy/pos",
        }
        for i in range(5)
    ]
    plain = corpus_pairs(rows, random.Random(1), per_source=5)
    swapped = corpus_pairs(rows, random.Random(1), per_source=5, swaps=True)
    assert not [p for p in plain if p.kind.startswith("corpus-swap/")]
    made = [p for p in swapped if p.kind.startswith("corpus-swap/")]
    assert len(made) == 5
    for p in made:
        assert not p.duplicate and p.a != p.group
        assert sorted(p.a.split()) == sorted(p.group.split())  # the same words, moved


def test_the_grammar_is_deterministic_balanced_and_covers_every_category() -> None:
    first = template_pairs(random.Random(5), 2)
    assert first == template_pairs(random.Random(5), 2)
    assert len(first) == 4 * len(INTENTS)
    assert sum(p.duplicate for p in first) == 2 * len(INTENTS)
    categories = {p.kind.split("/")[1] for p in first}
    assert categories == {
        "everyday",
        "long-constraints",
        "non-english",
        "code",
        "support-ids",
        "short-casual",
        "format-instructions",
    }
    for p in first:
        assert normalize(p.a) != normalize(p.b), p


_GOOD_INTENTS = """\
slots:
  city: {label: city, gen: pick, values: Lisbon|Oslo}
  days: {label: number, gen: num, lo: 2, hi: 9}
intents:
  - name: trip
    category: everyday
    phrasings:
      en: ["{days} days in {city}?", "What to do in {city} for {days} days?"]
      fr: ["{days} jours à {city} ?", "Que faire à {city} en {days} jours ?"]
"""


def test_the_intents_loader_reads_a_data_file(tmp_path: Path) -> None:
    path = tmp_path / "intents.yaml"
    path.write_text(_GOOD_INTENTS, encoding="utf-8")
    [trip] = load_intents(path)
    assert (trip.name, trip.category, list(trip.slots)) == ("trip", "everyday", ["city", "days"])
    assert trip.phrasings["fr"][0] == "{days} jours à {city} ?"


@pytest.mark.parametrize(
    ("old", "new", "error"),
    [
        ("gen: pick", "gen: pik", r"intent 'trip': slot 'city': unknown generator 'pik'"),
        ("{city}", "{town}", r"intent 'trip': template field \{town\} has no slot"),
        ("fr: [", "xx: [", r"intent 'trip': language 'xx' is not one of en, fr, de"),
        ("{days} days in {city}?", "{days} days?", r"intent 'trip': en phrasing .* uses the"),
        ("lo: 2, ", "", r"intent 'trip': slot 'days': generator 'num': missing .* 'lo'"),
    ],
)
def test_the_intents_loader_rejects_a_malformed_intent_and_names_it(
    tmp_path: Path, old: str, new: str, error: str
) -> None:
    assert old in _GOOD_INTENTS
    path = tmp_path / "intents.yaml"
    path.write_text(_GOOD_INTENTS.replace(old, new), encoding="utf-8")
    with pytest.raises(TemplateDataError, match=error):
        load_intents(path)
