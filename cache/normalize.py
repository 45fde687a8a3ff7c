"""Tier 2 of the hit decision: a strict normal form of a prompt.

Two prompts with the same normal form get the same answer. It folds only what never
changes an answer: case, runs of spaces, prose punctuation, hyphens that join words,
thousands separators, and politeness set off from the request (a leading "hi," or
"can you", "please" anywhere, a trailing ", thanks"). It keeps everything that can:
digits, operators and signs (`2x - 5` is not `2x + 5`), brackets, negations, direction
words, line breaks and indentation (YAML, code). Quoted text is content: nothing is
dropped inside quotes.
"""

from __future__ import annotations

import re
import unicodedata
from typing import NamedTuple


def _words(text: str) -> list[str]:
    """A word list written as one string (long lists stay readable)."""
    return text.split()


# One token: a name with digits after its first letters ("farm2stores", "ipv4", "x86": one
# token, so the guards compare it whole), a number (thousands separators, decimals, dates
# and times stay inside it), a word (apostrophes dropped: "I'm" -> "im"), or one symbol
# that can change meaning.
# `brk` is prose punctuation, kept only to know where a clause ends.
_TOKEN = re.compile(
    r"""(?P<name>[^\W\d_]+\d[^\W_]*)
      | (?P<num>\d+(?:[.,:/]\d+)*)
      | (?P<word>[^\W\d_]+(?:['\u2019][^\W\d_]+)*)
      | (?P<hyphen>-(?=[^\W\d_]))
      | (?P<quote>["\u201c\u201d\u2018\u2019'`])
      | (?P<sym>[-+*/=<>^%$€£#@&|~\\{}\[\]()→←_])
      | (?P<brk>[.,!?;:…\u2014\u2013])""",
    re.VERBOSE,
)
_THOUSANDS = re.compile(r"^\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_ALWAYS_FILLER = frozenset({"please", "pls", "plz", "kindly"})
_GREETINGS = frozenset({"hi", "hello", "hey", "hiya", "greetings"})
_MODALS = frozenset({"can", "could", "would", "will"})
_TRAILING_THANKS = (
    ("thanks", "in", "advance"),
    ("thank", "you", "in", "advance"),
    ("thanks", "a", "lot"),
    ("thank", "you"),
    ("many", "thanks"),
    ("thanks",),
    ("thx",),
    ("ty",),
    ("cheers",),
)
# Words that open a request: after them a greeting without a comma was still a greeting.
_OPENERS = frozenset(
    {"how", "what", "why", "where", "when", "who", "which", "is", "are", "do", "does", "i"}
)
# After "can you": these make the phrase a request, not a question of ability.
_REQUEST_VERBS = frozenset(
    _words(
        """write explain give tell show help summarize summarise translate rewrite list suggest
recommend create make generate draft convert compare describe fix correct check plan
find calculate compute provide define paraphrase proofread outline design build
implement solve name"""
    )
)


class _Token(NamedTuple):
    text: str
    quoted: bool  # inside quotes: content, never filler
    after_break: bool  # prose punctuation (or the line start) comes right before it


def normalize(prompt: str) -> str:
    """The strict normal form: equal forms mean one cached answer fits both prompts."""
    text = unicodedata.normalize("NFC", prompt).casefold()
    lines = (_normalize_line(line) for line in text.splitlines())
    return "\n".join(line for line in lines if line)


def _normalize_line(line: str) -> str:
    tokens = _strip_politeness(_tokens(line))
    body = " ".join(token.text for token in tokens)
    # Indentation is kept: in YAML and code it is meaning.
    indent = len(line) - len(line.lstrip(" \t"))
    return f"{' ' * indent}{body}" if body else ""


def _tokens(line: str) -> list[_Token]:
    out: list[_Token] = []
    quoted, after_break = False, True
    for match in _TOKEN.finditer(line):
        kind, text = match.lastgroup, match.group()
        if kind == "brk":
            after_break = True
            continue
        if kind == "quote":  # an apostrophe inside a word went to the word pattern
            quoted = not quoted
            after_break = True
            continue
        if kind == "hyphen":  # a hyphen before a letter joins words: "deep-clone"
            continue
        text = _number(text) if kind == "num" else text.replace("'", "").replace("\u2019", "")
        out.append(_Token(text, quoted, after_break))
        after_break = False
    return out


def _number(text: str) -> str:
    return text.replace(",", "") if _THOUSANDS.match(text) else text


def _strip_politeness(tokens: list[_Token]) -> list[_Token]:
    tokens = [t for t in tokens if t.quoted or t.text not in _ALWAYS_FILLER]
    return _strip_trailing(_strip_leading(tokens))


def _strip_leading(tokens: list[_Token]) -> list[_Token]:
    if len(tokens) > 2 and tokens[0].text in _GREETINGS and not tokens[0].quoted:
        rest = tokens[2:] if tokens[1].text in {"there", "team", "all"} else tokens[1:]
        # "hello in Spanish" is a question about "hello"; "hi, where is ..." is a greeting.
        if rest and (rest[0].after_break or rest[0].text in _OPENERS):
            tokens = rest
    words = [t.text for t in tokens[:3]]
    request = len(tokens) > 3 and words[0] in _MODALS and words[1] in {"you", "u"}
    if request and words[2] in _REQUEST_VERBS and not tokens[0].quoted:
        tokens = tokens[2:]
    return tokens


def _strip_trailing(tokens: list[_Token]) -> list[_Token]:
    words = tuple(t.text for t in tokens)
    for phrase in _TRAILING_THANKS:
        n = len(phrase)
        # Only thanks set off by punctuation: "how do you say thanks" keeps its word.
        if len(words) > n and words[-n:] == phrase:
            first = tokens[-n]
            if first.after_break and not first.quoted:
                return tokens[:-n]
    return tokens
