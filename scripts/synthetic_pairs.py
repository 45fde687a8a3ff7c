"""Synthetic labelled prompt pairs for training the pair verifier.

Every pair is one seed prompt and an edited copy of it. Harmless edits (case, punctuation,
politeness, an article, a typo, a synonym, a moved context phrase) make positives; edits
that change the request (a one-word contrast, a swapped direction, a changed or swapped
number, a negation, a dropped word) make negatives. Surface noise is also stacked on
negatives, so that "looks tidied up" never implies "same request".
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from verifier_lexicon import (
    ARTICLES,
    CONTRAST_GROUPS,
    FILLER_PREFIXES,
    FILLER_SUFFIXES,
    SYNONYM_PAIRS,
)


def _words(text: str) -> list[str]:
    """A word list written as one string (long lists stay readable)."""
    return text.split()


_TOKEN = re.compile(r"[A-Za-z][A-Za-z']*|\d+(?:[.,]\d+)*|\s+|.", re.DOTALL)
_STOP = frozenset(
    _words(
        """a an the of in on at for to into from by with without about as is are was were be
been do does did i you we my your our me it its this that these those and or but if
how what why when where which who can could would should will shall may might must
not no there here than then so very just also any some all each every per up out off
over under"""
    )
)
_NEGATION_FLIPS = (("with", "without"), ("can", "cannot"), ("does", "doesn't"), ("is", "isn't"))


@dataclass(frozen=True)
class SyntheticPair:
    a: str
    b: str
    duplicate: bool
    kind: str  # which edit made it, for the training report
    group: str  # the seed it came from: pairs of one seed stay in one fold


Edit = Callable[[str, random.Random], str | None]


def _tokens(text: str) -> list[str]:
    return _TOKEN.findall(text)


def _is_word(token: str) -> bool:
    return token[:1].isalpha()


def _match_case(template: str, word: str) -> str:
    if template.isupper() and len(template) > 1:
        return word.upper()
    if template[:1].isupper():
        return word[:1].upper() + word[1:]
    return word


def _substitute(text: str, rng: random.Random, table: dict[str, list[str]]) -> str | None:
    tokens = _tokens(text)
    spots = [i for i, t in enumerate(tokens) if t.lower() in table]
    if not spots:
        return None
    i = rng.choice(spots)
    tokens[i] = _match_case(tokens[i], rng.choice(table[tokens[i].lower()]))
    return _fix_articles("".join(tokens))


def _table(groups: Iterable[tuple[str, ...]]) -> dict[str, list[str]]:
    table: dict[str, list[str]] = {}
    for group in groups:
        for word in group:
            table.setdefault(word, []).extend(w for w in group if w != word)
    return table


CONTRASTS = _table(CONTRAST_GROUPS)
SYNONYMS = _table(SYNONYM_PAIRS)
NEGATIONS = _table(_NEGATION_FLIPS)


def _fix_articles(text: str) -> str:
    def fix(match: re.Match[str]) -> str:
        article, word = match.group(1), match.group(2)
        wanted = "an" if word[:1].lower() in "aeiou" else "a"
        return _match_case(article, wanted) + " " + word

    return re.sub(r"\b([Aa]n?) ([A-Za-z]+)", fix, text)


# ---- negatives ------------------------------------------------------------------------


def contrast(text: str, rng: random.Random) -> str | None:
    return _substitute(text, rng, CONTRASTS)


def negation(text: str, rng: random.Random) -> str | None:
    flipped = _substitute(text, rng, NEGATIONS)
    if flipped is not None:
        return flipped
    match = re.search(r"\b(is|are|do|does|can|should|will)\b", text, re.IGNORECASE)
    if match is None:
        return None
    return text[: match.end()] + " not" + text[match.end() :]


def change_number(text: str, rng: random.Random) -> str | None:
    tokens = _tokens(text)
    spots = [i for i, t in enumerate(tokens) if t[:1].isdigit()]
    if not spots:
        return None
    i = rng.choice(spots)
    digits = tokens[i].replace(",", "")
    try:
        value = float(digits)
    except ValueError:
        return None
    new = rng.choice([value + 1, value * 2, max(value - 1, 0) or value + 2, value * 10])
    shown = str(int(new)) if new.is_integer() else f"{new:g}"
    if shown == digits:
        return None
    tokens[i] = shown
    return "".join(tokens)


def swap_numbers(text: str, rng: random.Random) -> str | None:
    tokens = _tokens(text)
    spots = [i for i, t in enumerate(tokens) if t[:1].isdigit()]
    pairs = [(i, j) for i in spots for j in spots if i < j and tokens[i] != tokens[j]]
    if not pairs:
        return None
    i, j = rng.choice(pairs)
    tokens[i], tokens[j] = tokens[j], tokens[i]
    return "".join(tokens)


_VERBS = (
    "convert|cast|turn|change|translate|move|copy|transfer|map|migrate|switch|upgrade"
    "|downgrade|pass|send|export|import|read|write|save|upload|download|attach|append"
    "|push|pull|go|get|fly|drive|redirect|forward|port|rewrite|compare|prefer"
)
_WORD = r"[A-Za-z][A-Za-z0-9.#+-]*"
_PHRASE = rf"((?:{_WORD} )?{_WORD})"
_DET = r"(?:(?:an?|the|my|our|this|\d[\d.,]*) )?"
_DIRECTIONS = (
    re.compile(rf"\b(from {_DET}){_PHRASE}( (?:to|into) {_DET}){_PHRASE}\b", re.I),
    re.compile(rf"\b((?:{_VERBS}) {_DET}){_PHRASE}( (?:to|into|over|vs) {_DET}){_PHRASE}\b", re.I),
    re.compile(rf"\b((?:is|are) {_DET}){_PHRASE}( \w+er than {_DET}){_PHRASE}\b", re.I),
)


def swap_direction(text: str, rng: random.Random) -> str | None:
    matches = [m for d in _DIRECTIONS for m in d.finditer(text) if _swappable(m)]
    if not matches:
        return None
    m = rng.choice(matches)
    lead, x, mid, y = m.groups()
    return _fix_articles(f"{text[: m.start()]}{lead}{y}{mid}{x}{text[m.end() :]}")


def _swappable(match: re.Match[str]) -> bool:
    x, y = match.group(2), match.group(4)
    words = f"{x} {y}".lower().split()
    return x.lower() != y.lower() and not any(w in _STOP for w in words)


def drop_word(text: str, rng: random.Random) -> str | None:
    tokens = _tokens(text)
    spots = [i for i, t in enumerate(tokens) if _is_word(t) and t.lower() not in _STOP]
    if len(spots) < 3:
        return None
    i = rng.choice(spots)
    del tokens[i]
    return re.sub(r"\s+", " ", "".join(tokens)).strip()


_MODIFIERS = _words(
    """large small new old free public private local remote empty nested root default
hidden main annual weekly raw organic used broken shared mobile cheap advanced
simple short long whole half extra external internal senior junior daily frozen
fresh dry wet electric manual wireless"""
)


def insert_modifier(text: str, rng: random.Random) -> str | None:
    """A constraint added: "cube of 27" / "cube root of 27", "egg" / "large egg"."""
    tokens = _tokens(text)
    spots = [i for i, t in enumerate(tokens) if _is_word(t) and t.lower() not in _STOP and i > 0]
    if not spots:
        return None
    i = rng.choice(spots)
    word = rng.choice(_MODIFIERS)
    if rng.random() < 0.5:
        tokens[i:i] = [word, " "]
    else:
        tokens[i + 1 : i + 1] = [" ", word]
    return _fix_articles("".join(tokens))


# ---- positives ------------------------------------------------------------------------


def synonym(text: str, rng: random.Random) -> str | None:
    return _substitute(text, rng, SYNONYMS)


def surface(text: str, rng: random.Random) -> str | None:
    choice = rng.randrange(5)
    if choice == 0:
        return text.lower()
    if choice == 1:
        return text.rstrip("?.!") if text[-1:] in "?.!" else text + "?"
    if choice == 2:
        return text.replace(",", "") if "," in text else None
    if choice == 3:
        return re.sub(r"(?<=[a-z])-(?=[a-z])", " ", text) if "-" in text else None
    return text[:1].lower() + text[1:] if text[:1].isupper() else text.capitalize()


def filler(text: str, rng: random.Random) -> str | None:
    if rng.random() < 0.5:
        prefix = rng.choice(FILLER_PREFIXES)
        return prefix + text[:1].lower() + text[1:]
    return text.rstrip(".") + rng.choice(FILLER_SUFFIXES)


def article(text: str, rng: random.Random) -> str | None:
    tokens = _tokens(text)
    spots = [i for i, t in enumerate(tokens) if t.lower() in ARTICLES]
    if not spots:
        return None
    i = rng.choice(spots)
    del tokens[i : i + 2]  # the article and the space after it
    return "".join(tokens)


def typo(text: str, rng: random.Random) -> str | None:
    tokens = _tokens(text)
    spots = [i for i, t in enumerate(tokens) if t.isalpha() and len(t) >= 6]
    if not spots:
        return None
    i = rng.choice(spots)
    word, k = tokens[i], rng.randrange(1, len(tokens[i]) - 2)
    edits = (
        word[:k] + word[k + 1] + word[k] + word[k + 2 :],  # swapped letters
        word[:k] + word[k + 1 :],  # a letter dropped
        word[:k] + word[k] + word[k:],  # a letter doubled
    )
    tokens[i] = rng.choice(edits)
    return "".join(tokens)


_QUESTION_FORMS = (
    (r"^How do I\b", ("How can I", "how to", "What's the way to", "How would I")),
    (r"^How can I\b", ("How do I", "how to")),
    (r"^What is\b", ("What's",)),
    (r"^Give me\b", ("I need", "Please give me", "Provide")),
    (r"^Write\b", ("Please write", "Can you write", "Help me write")),
    (r"^Explain\b", ("Can you explain", "Please explain", "I need you to explain")),
)


def question_form(text: str, rng: random.Random) -> str | None:
    for pattern, replacements in _QUESTION_FORMS:
        if re.search(pattern, text):
            return re.sub(pattern, rng.choice(replacements), text, count=1)
    return None


def move_context(text: str, rng: random.Random) -> str | None:
    match = re.match(r"^([A-Z][\w.#+ ]{1,20}): (.+?)([?.]?)$", text, re.DOTALL)
    if match:
        head, rest, end = match.groups()
        return f"{rest[:1].upper()}{rest[1:]} in {head}{end}"
    match = re.match(r"^In ([\w.#+ ]{1,20}), (.+?)([?.]?)$", text, re.DOTALL)
    if match:
        head, rest, end = match.groups()
        return f"{rest[:1].upper()}{rest[1:]} in {head}{end}"
    return None


NEGATIVE_EDITS: dict[str, tuple[Edit, float]] = {
    "contrast": (contrast, 4.0),
    "direction": (swap_direction, 2.0),
    "number": (change_number, 1.5),
    "number_swap": (swap_numbers, 1.0),
    "negation": (negation, 1.0),
    "dropped_word": (drop_word, 1.5),
    "added_word": (insert_modifier, 1.5),
}
POSITIVE_EDITS: dict[str, tuple[Edit, float]] = {
    "surface": (surface, 1.0),
    "filler": (filler, 1.5),
    "article": (article, 1.5),
    "typo": (typo, 2.0),
    "synonym": (synonym, 1.5),
    "question_form": (question_form, 1.5),
    "move_context": (move_context, 1.0),
}
_NOISE = (surface, filler, article, question_form)


def _noisy(text: str, rng: random.Random, edits: int) -> str:
    for _ in range(edits):
        edited = rng.choice(_NOISE)(text, rng)
        text = edited if edited else text
    return text


def pairs_from_seed(
    seed: str, group: str, rng: random.Random, per_seed: int
) -> list[SyntheticPair]:
    """Up to `per_seed` positives and as many negatives from one seed prompt."""
    out: list[SyntheticPair] = []
    for duplicate, edits in ((True, POSITIVE_EDITS), (False, NEGATIVE_EDITS)):
        names = list(edits)
        weights = [edits[n][1] for n in names]
        for _ in range(per_seed):
            kind = rng.choices(names, weights)[0]
            edited = edits[kind][0](seed, rng)
            if edited is None or edited.strip() == seed.strip():
                continue
            edited = _noisy(edited, rng, rng.choice((0, 0, 1, 2)))
            a, b = (seed, edited) if rng.random() < 0.5 else (edited, seed)
            out.append(SyntheticPair(a, b, duplicate, kind, group))
    return out


def unrelated_pairs(seeds: list[str], rng: random.Random, n: int) -> list[SyntheticPair]:
    """Easy negatives: two different seeds."""
    out = []
    for _ in range(n):
        a, b = rng.sample(seeds, 2)
        out.append(SyntheticPair(a, b, False, "unrelated", f"{a}|{b}"))
    return out


# ---- direction templates --------------------------------------------------------------
# Swaps need many examples: the model must learn that a direction word's neighbours
# trading places changes the request, while a reordered sentence that keeps the
# direction ("convert 5 km to miles" / "how many miles is 5 km") does not.

_DIRECTION_SLOTS = {
    "unit": _words(
        """km miles meters feet inches centimeters kilograms pounds liters gallons celsius
fahrenheit hours minutes seconds days weeks bytes megabytes gigabytes"""
    ),
    "format": _words("""JSON YAML XML CSV TOML Markdown HTML PDF Excel"""),
    "type": _words("""list tuple set dict string integer float array bytes DataFrame"""),
    "lang": _words("""English Spanish French German Italian Portuguese Japanese Korean Dutch"""),
    "place": _words("""Paris London Berlin Madrid Lisbon Rome Tokyo Chicago Boston Seattle"""),
    "db": ["PostgreSQL", "MySQL", "SQLite", "MongoDB", "Redis", "DynamoDB"],
    "side": ["host", "container", "parent", "child", "client", "server"],
    "plan": ["Basic", "Pro", "Team", "Business", "Enterprise"],
}
_SAME_DIRECTION = {
    "unit": (
        ("Convert {n} {x} to {y}", "How many {y} is {n} {x}?"),
        ("Convert {n} {x} to {y}", "{n} {x} in {y}"),
        ("Convert {n} {x} into {y}", "What is {n} {x} in {y}?"),
    ),
    "format": (
        ("Convert this {x} to {y}", "Turn this {x} into {y}"),
        ("How do I convert {x} to {y}?", "{x} to {y} conversion"),
    ),
    "type": (
        ("Python: convert a {x} to a {y}", "How do I turn a {x} into a {y} in Python?"),
        ("Convert a {x} to a {y} in Python", "Python {x} to {y}"),
    ),
    "lang": (
        ("Translate this from {x} to {y}: 'good morning'", "{x} to {y}: 'good morning'"),
        ("Translate 'thank you' from {x} into {y}", "How do you say 'thank you' in {y}? It's {x}"),
    ),
    "place": (
        (
            "Cheapest way to get from {x} to {y}",
            "What's the cheapest way to travel from {x} to {y}?",
        ),
        ("How long is the flight from {x} to {y}?", "Flight time {x} to {y}"),
    ),
    "db": (("How do I migrate from {x} to {y}?", "Steps to move our database from {x} to {y}"),),
    "side": (
        ("Copy a file from the {x} to the {y}", "How do I copy a file from the {x} to the {y}?"),
        ("Send a message from the {x} to the {y}", "How does the {x} send a message to the {y}?"),
    ),
    "plan": (
        (
            "Can I switch from the {x} plan to the {y} plan?",
            "How do I change from {x} to {y} plan?",
        ),
    ),
}


def direction_pairs(rng: random.Random, n: int) -> list[SyntheticPair]:
    """`n` swapped-direction negatives and `n // 2` same-direction positives."""
    out: list[SyntheticPair] = []
    kinds = list(_SAME_DIRECTION)
    for i in range(n + n // 2):
        kind = rng.choice(kinds)
        x, y = rng.sample(_DIRECTION_SLOTS[kind], 2)
        if kind == "side":
            x, y = rng.choice((("host", "container"), ("parent", "child"), ("client", "server")))
        first, second = rng.choice(_SAME_DIRECTION[kind])
        values = {"n": str(rng.choice((2, 5, 10, 12, 30, 100, 250))), "x": x, "y": y}
        a = first.format(**values)
        if i < n:  # the same wording or the other one, with x and y traded
            template = rng.choice((first, second))
            b = template.format(**{**values, "x": y, "y": x})
            out.append(SyntheticPair(a, b, False, "direction_template", a))
        else:
            out.append(SyntheticPair(a, second.format(**values), True, "direction_kept", a))
    return out


# ---- licence-clean corpora (../shared/data/train/) ---------------------------------------
# Their negatives differ by topic (two questions on one paragraph or database), which
# teaches "same topic, high overlap = same request": each sampled positive also gives a
# rule-made one-detail negative (one word or number changed), in any language.

_LETTERS = re.compile(r"[^\W\d_]{5,}")  # five letters: few function words in any language


def swap_word(text: str, rng: random.Random, pool: list[str]) -> str | None:
    """One word of five letters or more replaced by another text's word (any language)."""
    spots = [m for m in _LETTERS.finditer(text) if m.group().lower() not in _STOP]
    if not spots or not pool:
        return None
    spot = rng.choice(spots)
    word = rng.choice(pool)
    if word.lower() == spot.group().lower():
        return None
    return text[: spot.start()] + _match_case(spot.group(), word) + text[spot.end() :]


def one_detail(text: str, rng: random.Random, pool: list[str]) -> tuple[str, str] | None:
    """(the edited text, the edit's name): a number, a lexicon contrast, or a word."""
    for name, edit in (("number", change_number), ("contrast", contrast)):
        if rng.random() < 0.5:
            edited = edit(text, rng)
            if edited and edited != text:
                return edited, name
    edited = swap_word(text, rng, pool)
    return (edited, "word") if edited and edited != text else None


_BEFORE_NOUN = frozenset(_words("the a an of in to from for with by on at than"))


def swap_two_words(text: str, rng: random.Random) -> str | None:
    """Two likely nouns trade places (PAWS's kind of negative: the same words, other
    roles): words right after a determiner or preposition, or capitalised words past the
    first, so the result mostly stays grammatical. None when there are fewer than two."""
    tokens = _tokens(text)
    words = [i for i, t in enumerate(tokens) if _is_word(t)]
    spots = [
        i
        for k, i in enumerate(words)
        if tokens[i].lower() not in _STOP
        and k > 0
        and (tokens[words[k - 1]].lower() in _BEFORE_NOUN or tokens[i][:1].isupper())
    ]
    if len({tokens[i].lower() for i in spots}) < 2:
        return None
    for _ in range(8):
        i, j = sorted(rng.sample(spots, 2))
        if tokens[i].lower() != tokens[j].lower():
            tokens[i], tokens[j] = tokens[j], tokens[i]
            return "".join(tokens)
    return None


# Another question about the same thing: the asking word, or whose it is.
_ASKING = _table([("how", "why", "where", "when"), ("what", "why")])
_WHOSE = _table([("my", "your"), ("our", "their"), ("mine", "yours")])


def change_question(text: str, rng: random.Random) -> str | None:
    """The same words asking another question: one asking word (how / why / where ...) or
    one possessive (my / your ...) replaced; None when the text has neither."""
    tokens = _tokens(text)
    spots = [i for i, t in enumerate(tokens) if t.lower() in _ASKING or t.lower() in _WHOSE]
    if not spots:
        return None
    i = rng.choice(spots)
    word = tokens[i].lower()
    other = rng.choice(_ASKING.get(word) or _WHOSE[word])
    tokens[i] = _match_case(tokens[i], other)
    return "".join(tokens)


def corpus_pairs(
    rows: list[dict[str, object]],
    rng: random.Random,
    per_source: int,
    swaps: bool = False,
    questions: bool = False,
) -> list[SyntheticPair]:
    """`per_source` pairs of each corpus source, and a one-detail negative per positive
    (with `swaps`, also one with two likely nouns swapped; with `questions`, one asking
    another question: `change_question`)."""
    extras = [("swap", swap_two_words)] if swaps else []
    extras += [("question", change_question)] if questions else []
    by_source: dict[str, list[dict[str, object]]] = {}
    for row in rows:
        by_source.setdefault(str(row["source"]), []).append(row)
    out: list[SyntheticPair] = []
    for source in sorted(by_source):
        chosen = rng.sample(by_source[source], min(per_source, len(by_source[source])))
        pool = [w for r in chosen for w in _LETTERS.findall(str(r["a"]))]
        for row in chosen:
            a, b, duplicate = str(row["a"]), str(row["b"]), bool(row["duplicate"])
            out.append(SyntheticPair(a, b, duplicate, f"corpus/{source}", a))
            # Side a is edited: in disfl-qa it is the fluent question (b's retracted words
            # would make an edit there meaningless).
            made = one_detail(a, rng, pool) if duplicate else None
            if made is not None:
                out.append(SyntheticPair(made[0], b, False, f"corpus-{made[1]}/{source}", a))
            for name, edit in extras if duplicate else ():
                edited = edit(a, rng)
                if edited is not None and edited != a:
                    out.append(SyntheticPair(edited, b, False, f"corpus-{name}/{source}", a))
    return out
