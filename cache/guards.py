"""Cheap text checks that veto a semantic hit before the verifier runs.

Each guard names one way two similar prompts ask for different things, and fires (returns
True) only on positive evidence of it. They read the tier-2 normal form (cache/normalize.py),
so case and punctuation never trigger them. Which ones run is a setting
(cache/decision.py); bench/cache_quality.py measures what each is worth.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence


def _words(text: str) -> list[str]:
    """A word list written as one string (long lists stay readable)."""
    return text.split()


_NUMBER_WORDS = {
    w: str(i)
    for i, w in enumerate(
        _words(
            """zero one two three four five six seven eight nine ten eleven twelve thirteen
fourteen fifteen sixteen seventeen eighteen nineteen twenty"""
        )
    )
}
_NUMBER_WORDS.update({"thirty": "30", "forty": "40", "fifty": "50", "sixty": "60", "seventy": "70"})
_NUMBER_WORDS.update({"eighty": "80", "ninety": "90", "hundred": "100", "dozen": "12"})
_NEGATIONS = frozenset(
    _words(
        """not no never without none nor neither cannot cant dont doesnt didnt isnt arent wasnt
werent wont wouldnt shouldnt couldnt havent hasnt hadnt nothing nobody nowhere
except excluding exclude"""
    )
)
_DIRECTIONS = frozenset(_words("""to into from than onto toward towards before after"""))
_DETERMINERS = frozenset(_words("""a an the my your our their its his her this that these those"""))
_OPERATORS = frozenset(_words("""+ - * / = < > ^ %"""))
# Names that are never interchangeable: another language, format, platform or product
# means another answer. Aliases map to one name.
_ALIASES = {
    "golang": "go",
    "js": "javascript",
    "ts": "typescript",
    "postgres": "postgresql",
    "psql": "postgresql",
    "k8s": "kubernetes",
    "mac": "macos",
    "osx": "macos",
    "py": "python",
    "gsheets": "sheets",
    "yml": "yaml",
}
_ENTITIES = frozenset(
    _words(
        """python javascript typescript java go rust ruby php swift kotlin scala bash
powershell perl haskell lua dart elixir sql nosql react vue angular svelte django
flask fastapi rails node postgresql mysql sqlite mongodb redis cassandra dynamodb
oracle json yaml xml csv toml markdown html pdf png jpg jpeg gif svg mp3 mp4 windows
macos linux ubuntu android ios iphone ipad excel sheets word powerpoint outlook
gmail slack teams zoom whatsapp facetime telegram instagram linkedin twitter
facebook tiktok youtube aws azure gcp docker kubernetes english spanish french
german italian portuguese dutch japanese chinese mandarin korean russian arabic
hindi polish swedish greek turkish"""
    )
)

Tokens = Sequence[str]


def numbers_differ(a: Tokens, b: Tokens) -> bool:
    """Other numbers, or the same numbers in other places ("6 workers ... 5 workers")."""
    if Counter(_numbers(a, b)) != Counter(_numbers(b, a)):
        return True
    return _slots_conflict(_number_slots(a), _number_slots(b))


def negation_differs(a: Tokens, b: Tokens) -> bool:
    return _count(a, _NEGATIONS) != _count(b, _NEGATIONS)


def operators_differ(a: Tokens, b: Tokens) -> bool:
    return Counter(t for t in a if t in _OPERATORS) != Counter(t for t in b if t in _OPERATORS)


def entities_differ(a: Tokens, b: Tokens) -> bool:
    """Another language, format, platform or product is named."""
    return _entities(a) != _entities(b)


def direction_swapped(a: Tokens, b: Tokens) -> bool:
    """The same direction word with traded ends: "km to miles" vs "miles to km"."""
    shared = set(a) & set(b)
    after_a, after_b = _after(a), _after(b)
    for word in after_a.keys() & after_b.keys():
        moved = (after_a[word] ^ after_b[word]) & shared
        if len(moved) >= 2:
            return True
    return False


def order_swapped(a: Tokens, b: Tokens) -> bool:
    """The very same words in another order: "DD/MM/YYYY" vs "MM/DD/YYYY"."""
    return list(a) != list(b) and Counter(a) == Counter(b)


def roles_swapped(a: Tokens, b: Tokens) -> bool:
    """The content words both sides share come in another order: "lucrative lands and many
    offices" vs "many lands and lucrative offices". Also refuses some reordered
    paraphrases; that is the price of catching swapped roles."""
    once_a = {t for t, n in Counter(a).items() if n == 1 and _is_content(t)}
    once_b = {t for t, n in Counter(b).items() if n == 1 and _is_content(t)}
    shared = (once_a & once_b) - _FUNCTION_WORDS
    return [t for t in a if t in shared] != [t for t in b if t in shared]


def person_differs(a: Tokens, b: Tokens) -> bool:
    """Whose question it is changed: "what do you think of my channel" vs "... of this
    channel", "what should we do" vs "what do you do", "should I learn Python" vs "learn
    Python". A "you" right after "can", "would", "do" or "thank" addresses the model and
    does not count. Also refuses some paraphrases that trade "I" for "you" ("how do I" /
    "how do you"); on the QQP pairs half the hits with another person were false ones."""
    ours, theirs = _persons(a), _persons(b)
    if _how_to(a) or _how_to(b):  # "how to check X" asks what "how do I check X" asks
        ours, theirs = ours - {"i"}, theirs - {"i"}
    return ours != theirs


def alternatives_differ(a: Tokens, b: Tokens) -> bool:
    """One side asks to choose between alternatives ("X or Y"), the other does not. Not a
    default: on the dev pairs the strict `unexplained_threshold` already refuses what it
    catches (bench/cache_quality.py, variant `with_alternatives`)."""
    return _count(a, _ALTERNATIVES) != _count(b, _ALTERNATIVES)


def unexplained_words(a: Tokens, b: Tokens) -> int:
    """Content words of either side with no counterpart on the other: not the same word,
    not another form of it ("summarize"/"summary"), not a typo of it ("pyhton")."""
    return len(_unexplained(a, b)) + len(_unexplained(b, a))


def content_differs(a: Tokens, b: Tokens) -> bool:
    return unexplained_words(a, b) > 0


GUARDS: dict[str, Callable[[Tokens, Tokens], bool]] = {
    "content": content_differs,
    "numbers": numbers_differ,
    "negation": negation_differs,
    "operators": operators_differ,
    "entities": entities_differ,
    "direction": direction_swapped,
    "order": order_swapped,
    "roles": roles_swapped,
    "person": person_differs,
    "alternatives": alternatives_differ,
}


# Words that carry no request of their own: changing them never changes the answer.
_FUNCTION_WORDS = frozenset(
    _words(
        """a an the of in on at for by with as i me my mine you your we us our it its this that
these those there here and so if then just actually really basically exactly some
any tell give please thanks hi hey hello ok okay also very"""
    )
)


# Question words, auxiliaries, "to" and "from": adding one is harmless ("what's the
# formula for X" / "formula for X", "how to count" / "count"), trading one for another of
# a different class is not ("why" / "when", "is" / "was", "can" / "should", "to" / "from").
# ("before", "after" and "than" are never harmless: they bring a constraint.)
_CLASSES = (
    {"how"},
    {"what", "whats", "which"},
    {"why"},
    {"when"},
    {"where"},
    {"who", "whom", "whose"},
    {"do", "does", "can", "could", "would"},
    {"is", "are", "am", "be", "isnt", "arent"},
    {"was", "were", "did", "had"},
    {"will", "shall", "wont"},
    {"should", "must", "shouldnt"},
    {"may", "might"},
    {"has", "have"},
    {"to", "into", "onto", "toward", "towards"},
    {"from"},
)
_CLASS_OF = {word: i for i, words in enumerate(_CLASSES) for word in words}


def _unexplained(a: Tokens, b: Tokens) -> list[str]:
    others = set(b)
    other_classes = {_CLASS_OF[t] for t in others if t in _CLASS_OF}
    # "When did X happen?" is not "Did X happen?": against a yes/no question, an added
    # question word asks something else.
    yes_no = bool(b) and b[0] in _AUXILIARIES
    return [
        t
        for t in set(a)
        if _is_content(t)
        and t not in _FUNCTION_WORDS
        and t not in others
        and ((yes_no and t in _QUESTION_WORDS) or not _class_explained(t, other_classes))
        and not any(_variant(t, o) for o in others)
    ]


def _is_content(token: str) -> bool:
    # Words, and names with digits in them ("farm2stores", "x86", "ipv4"); bare numbers
    # are the numbers guard's.
    return token.isalnum() and not token.isdigit() and not token[:1].isdigit()


def _class_explained(word: str, other_classes: set[int]) -> bool:
    """A question word or auxiliary is harmless unless the other side has a rival one."""
    group = _CLASS_OF.get(word)
    if group is None:
        return False
    rivals = {c for c in other_classes if _CLASSES[c] & _RIVALRY[group]}
    return group in other_classes or not rivals


# Which classes compete: question words, auxiliaries, direction words, each among their own.
_QUESTION_WORDS = set().union(*_CLASSES[:6])
_AUXILIARIES = set().union(*_CLASSES[6:13])
_DIRECTION_WORDS = set().union(*_CLASSES[13:])
_RIVALRY = [
    _QUESTION_WORDS if i < 6 else _AUXILIARIES if i < 13 else _DIRECTION_WORDS
    for i in range(len(_CLASSES))
]


def _variant(word: str, other: str) -> bool:
    """Another form or a misspelling of the same word (names with digits must match)."""
    if not (word.isalpha() and other.isalpha()):
        return False
    if _stem(word) == _stem(other) and min(len(word), len(other)) >= 4:
        return True
    return min(len(word), len(other)) >= 5 and _edit_distance_at_most_one(word, other)


def _stem(word: str) -> str:
    for suffix in (
        "ization",
        "isation",
        "ation",
        "ings",
        "ing",
        "ies",
        "ied",
        "es",
        "ed",
        "s",
        "ize",
        "ise",
        "y",
        "e",
    ):
        if word.endswith(suffix) and len(word) - len(suffix) >= 4:
            return word[: -len(suffix)]
    return word


def _edit_distance_at_most_one(a: str, b: str) -> bool:
    """Levenshtein distance <= 1, or one swap of neighbouring letters."""
    if a == b:
        return True
    if abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        diff = [i for i in range(len(a)) if a[i] != b[i]]
        if len(diff) == 1:
            return True
        i, j = diff[0], diff[-1]
        return len(diff) == 2 and j == i + 1 and a[i] == b[j] and a[j] == b[i]
    short, long = (a, b) if len(a) < len(b) else (b, a)
    i = next((k for k in range(len(short)) if short[k] != long[k]), len(short))
    return short[i:] == long[i + 1 :]


def _numbers(tokens: Tokens, other: Tokens) -> list[str]:
    found = [t for t in tokens if t[:1].isdigit()]
    for t in tokens:
        word = _NUMBER_WORDS.get(t)
        # "one" is mostly a pronoun ("the one with"): a number only if the other side has 1.
        if word is not None and (t != "one" or "1" in other):
            found.append(word)
    return found


def _number_slots(tokens: Tokens) -> dict[str, set[str]]:
    slots: dict[str, set[str]] = {}
    for i, t in enumerate(tokens):
        value = t if t[:1].isdigit() else _NUMBER_WORDS.get(t)
        if value is None or t == "one":
            continue
        for j in (i - 1, i + 1):
            if 0 <= j < len(tokens) and tokens[j].isalpha() and tokens[j] not in _DETERMINERS:
                slots.setdefault(tokens[j], set()).add(value)
    return slots


def _slots_conflict(a: dict[str, set[str]], b: dict[str, set[str]]) -> bool:
    return any(a[word] != b[word] for word in a.keys() & b.keys())


def _after(tokens: Tokens) -> dict[str, set[str]]:
    slots: dict[str, set[str]] = {}
    for i, t in enumerate(tokens):
        if t in _DIRECTIONS:
            obj = _next_content(tokens, i + 1, 1)
            if obj is not None:
                slots.setdefault(t, set()).add(obj)
    return slots


def _next_content(tokens: Tokens, start: int, step: int) -> str | None:
    i = start
    while 0 <= i < len(tokens):
        if tokens[i] not in _DETERMINERS and not tokens[i][:1].isdigit():
            return tokens[i]
        i += step
    return None


def _count(tokens: Tokens, words: frozenset[str]) -> int:
    return sum(1 for t in tokens if t in words)


_PERSONS = {
    **dict.fromkeys(_words("i im ive my mine myself"), "i"),
    **dict.fromkeys(_words("we our ours ourselves"), "we"),
    **dict.fromkeys(_words("you your yours yourself youre u ur"), "you"),
}
_ADDRESSING = frozenset(_words("can could would will do does thank"))
_ALTERNATIVES = frozenset({"or"})


def _persons(tokens: Tokens) -> frozenset[str]:
    return frozenset(
        _PERSONS[t]
        for i, t in enumerate(tokens)
        if t in _PERSONS and not (t == "you" and i > 0 and tokens[i - 1] in _ADDRESSING)
    )


def _how_to(tokens: Tokens) -> bool:
    return any(t == "how" and tokens[i + 1] == "to" for i, t in enumerate(tokens[:-1]))


def _entities(tokens: Tokens) -> frozenset[str]:
    names = (_ALIASES.get(t, t) for t in tokens)
    return frozenset(n for n in names if n in _ENTITIES)
