"""Each guard fires on its own kind of difference and stays quiet on harmless ones."""

from __future__ import annotations

import pytest

from cache.guards import GUARDS, unexplained_words
from cache.normalize import normalize


def fires(name: str, a: str, b: str) -> bool:
    return GUARDS[name](normalize(a).split(), normalize(b).split())


FIRES = [
    ("numbers", "Convert 5 km to miles", "Convert 8 km to miles"),
    (
        "numbers",
        "If 3 cooks bake 12 pies, how many do 4 cooks bake?",
        "If 4 cooks bake 12 pies, how many do 3 cooks bake?",
    ),
    ("numbers", "Explain it in three sentences", "Explain it in 4 sentences"),
    ("negation", "Can I take ibuprofen with food?", "Can I take ibuprofen without food?"),
    ("negation", "List files, don't delete them", "List files and delete them"),
    ("operators", "Simplify 3x + 4", "Simplify 3x - 4"),
    ("direction", "Convert a Python list to a tuple", "Convert a Python tuple to a list"),
    (
        "direction",
        "Move files from the laptop to the phone",
        "Move files from the phone to the laptop",
    ),
    ("order", "Format dates as DD/MM/YYYY", "Format dates as MM/DD/YYYY"),
    ("roles", "Did Alice call Bob before the trial?", "Did Bob call Alice before the trial?"),
    ("entities", "Reverse a string in Ruby", "Reverse a string in Perl"),
    ("person", "What do you think of my YouTube channel?", "What do you think of this channel?"),
    ("person", "What should we do after the first date?", "What do you do after the first date?"),
    ("person", "Should I learn Python?", "Learn Python?"),
    ("alternatives", "Is light the absence of darkness?", "Is light or darkness the absence?"),
]
QUIET = [
    ("numbers", "Explain it in three sentences", "Explain it in 3 sentences"),
    (
        "numbers",
        "My car does 40 mpg, I drive 200 miles",
        "I drive 200 miles and my car does 40 mpg",
    ),
    ("negation", "no jargon, under 50 words", "without jargon, under 50 words"),
    (
        "direction",
        "How do I get from the station to the museum?",
        "How do I get to the museum from the station?",
    ),
    ("direction", "Convert 3 hours to minutes", "How many minutes in 3 hours?"),
    ("order", "Compare tea and coffee", "Compare coffee and tea briefly"),
    ("roles", "How do I rename a file?", "how can i rename the file"),
    ("entities", "Sort a list in golang", "Sort a list in Go"),
    ("person", "How do I reset my password?", "how can i reset my password"),
    ("person", "Translate 'merci' into German", "How would you translate 'merci' to German?"),
    ("person", "What do you recommend for back pain?", "What helps with back pain?"),
    ("alternatives", "Is Pluto a planet or a moon?", "Is Pluto a moon or a planet?"),
]


@pytest.mark.parametrize(("name", "a", "b"), FIRES)
def test_guard_fires(name: str, a: str, b: str) -> None:
    assert fires(name, a, b)
    assert fires(name, b, a)


@pytest.mark.parametrize(("name", "a", "b"), QUIET)
def test_guard_stays_quiet(name: str, a: str, b: str) -> None:
    assert not fires(name, a, b)


@pytest.mark.parametrize(
    ("a", "b", "count"),
    [
        ("How do I rename a file?", "How can I rename a file", 0),  # do/can: one class
        ("What's the formula for compound interest?", "formula for compound interest", 0),
        ("How do I initialize a repository?", "how do i initialise a repositry", 0),  # typos
        ("Summarize this memo", "Summary of this memo", 0),  # another form of the word
        ("Why did the bridge collapse?", "When did the bridge collapse?", 2),
        ("Who is the mayor of Lyon?", "Who was the mayor of Lyon?", 2),
        ("Boil an egg", "Boil a duck egg", 1),
        ("Open the file for reading", "Open the file for writing", 2),
        ("Photos of cats from 2019", "Photos of cats from x2019", 1),
        # against a yes/no question, an added question word asks something else
        ("When did the Vikings reach Iceland?", "Did the Vikings reach Iceland?", 1),
        # a name with digits is compared whole, never as another form of a word
        ("We run farms2stores.com in India", "We run farm2stores.com in India", 2),
    ],
)
def test_unexplained_words(a: str, b: str, count: int) -> None:
    assert unexplained_words(normalize(a).split(), normalize(b).split()) == count
