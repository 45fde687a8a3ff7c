"""Rule-based labelled prompt pairs from a grammar of intents, for training the pair verifier.

Each INTENT is one kind of request a user sends to a chat LLM API ("how do I reverse a list
in {lang}?", "refund for order {order_id}", a 60-word writing brief, a question in French).
It has slots (value generators, many procedural: ids, amounts, dates, numbers, code
snippets) and several genuinely different phrasings, in one or more natural languages.

* Positives: one intent, the same slot values, two different phrasings in one language
  (about a third with casual noise: lowercase, dropped punctuation, "pls", "thx", a typo,
  a greeting). One cached answer answers both.
* Negatives (hard): mostly the same phrasing with exactly one slot value changed (a number,
  date, id, city, language, library, format, length limit, tone, audience, task verb, one
  token of a code snippet, ...); a swapped direction (A->B vs B->A, included vs avoided);
  a different intent with the same slot values; or the same request in another natural
  language (the answer language differs, so it is not a duplicate).

kind is "template/<category>/pos" or "template/<category>/neg-<what-changed>"; group is the
intent name plus its slot values, so pairs of one filled request stay in one fold.

The grammar is split between data and code. scripts/verifier_intents.yaml, next to this
file, holds what is written rather than computed: every intent (name, category, phrasings
per language, swaps), the slot table (each slot names a generator below, with its arguments:
value lists, ranges) and the clauses of the long writing briefs. Adding an intent, a
phrasing or a value is an edit there. This module keeps what has to be code: the value
generators and one-edit mutators (GENERATORS, MUTATORS: ids, amounts, dates, code
snippets), casual noise, filling, rendering and pair making, and load_intents, which builds
INTENTS from the data file on import and rejects a malformed one with a TemplateDataError
naming the intent or slot at fault (an unknown generator, a template field with no slot, a
language not in LANGS, ...).

Written from scratch without reading any evaluation data (bench/ or the dev pair files).
Standard library plus PyYAML (a project dependency) to read the data file; deterministic
given the random.Random passed in.
"""

from __future__ import annotations

import inspect
import random
import re
import string
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml
from synthetic_pairs import SyntheticPair

LANGS: tuple[str, ...] = ("en", "fr", "de", "es", "pt", "it", "nl")
DATA_FILE = Path(__file__).with_name("verifier_intents.yaml")
Val = str | tuple[str, ...]  # a tuple holds one form per entry of LANGS
Gen = Callable[[random.Random], Val]
Mutate = Callable[[random.Random, str], str]


@dataclass(frozen=True)
class Slot:
    label: str  # the <what-changed> of a negative that changes this slot
    gen: Gen
    mutate: Mutate | None = None  # a one-edit change (code); else a fresh draw


@dataclass(frozen=True)
class Intent:
    name: str
    category: str
    phrasings: dict[str, tuple[str, ...]]  # language -> templates
    slots: dict[str, Slot]
    swaps: tuple[tuple[str, str, str], ...]  # (slot, slot, label): swapping changes the request


# --------------------------------------------------------------------------- value generators


def _pick(values: str) -> Gen:
    """Values separated by "|" (whitespace around each is dropped)."""
    if not isinstance(values, str):
        raise ValueError("values must be one string, the choices separated by |")
    options = tuple(v.strip() for v in values.split("|"))
    return lambda rng: rng.choice(options)


def _pick_loc(rows: list[str]) -> Gen:
    """Each row holds one value in every language of LANGS, separated by "|"."""
    if not isinstance(rows, list) or not all(isinstance(r, str) for r in rows):
        raise ValueError("rows must be a list of strings")
    options = tuple(tuple(f.strip() for f in row.split("|")) for row in rows)
    for row in options:
        if len(row) != len(LANGS):
            raise ValueError(f"row {'|'.join(row)!r} has {len(row)} forms, not {len(LANGS)}")
    return lambda rng: rng.choice(options)


def _num(lo: int, hi: int, step: int = 1) -> Gen:
    return lambda rng: str(rng.randrange(lo, hi + 1, step))


def _alnum(rng: random.Random, n: int) -> str:
    letters, digits = "ABCDEFGHJKLMNPQRSTUVWXYZ", "23456789"
    chars = [rng.choice(letters + digits) for _ in range(n)]
    chars[rng.randrange(n)] = rng.choice(digits)  # at least one digit
    return "".join(chars)


def _order_id(rng: random.Random) -> str:
    digits = str(rng.randrange(10000, 9999999))
    return rng.choice(["#" + digits, "ORD-" + digits, digits, "#" + digits[:5]])


def _ticket_id(rng: random.Random) -> str:
    n = rng.randrange(1000, 999999)
    return rng.choice([f"TCK-{n}", f"#{n}", f"INC{n:07d}", f"SR-{n}", f"case {n}"])


def _booking_ref(rng: random.Random) -> str:
    return _alnum(rng, 6)


def _account_id(rng: random.Random) -> str:
    return rng.choice(["ACC-", "CUST-", "U", "#"]) + str(rng.randrange(10000, 9999999))


def _invoice_id(rng: random.Random) -> str:
    return f"INV-{rng.randrange(2021, 2027)}-{rng.randrange(1, 99999):05d}"


def _amount(rng: random.Random) -> str:
    value = rng.choice([rng.randrange(5, 500), rng.randrange(500, 5000) / 100 * 10])
    cents = f"{value:.2f}" if rng.random() < 0.6 else f"{int(value)}"
    return rng.choice(["$", "€", "£", "USD ", "EUR "]) + cents


_MONTHS = "January February March April May June July August September October November December"
MONTHS = tuple(_MONTHS.split())


def _date(rng: random.Random) -> str:
    y, m, d = rng.randrange(2024, 2027), rng.randrange(1, 13), rng.randrange(1, 29)
    style = rng.randrange(4)
    if style == 0:
        return f"{y}-{m:02d}-{d:02d}"
    if style == 1:
        return f"{MONTHS[m - 1]} {d}"
    if style == 2:
        return f"{d} {MONTHS[m - 1]} {y}"
    return f"{d:02d}/{m:02d}/{y}"


def _mutate_date(rng: random.Random, old: str) -> str:
    """Another day of the same month, written in the same style."""
    spot = re.search(r"(?<=-)\d{2}$", old) or re.search(r"\b\d{1,2}\b", old)
    assert spot is not None, old
    day = int(spot.group())
    new = rng.choice([d for d in range(1, 29) if d != day])
    text = f"{new:02d}" if ("-" in old or "/" in old) else str(new)
    return old[: spot.start()] + text + old[spot.end() :]


def _iso_date(rng: random.Random) -> str:
    return f"{rng.randrange(2023, 2027)}-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}"


_FIRST = _pick(
    "anna|ben|carlos|dana|eva|farid|grace|hugo|ines|jonas|kim|leila|marco|nina|omar|"
    "priya|quentin|rosa|sam|tomas|uma|victor|wen|yusuf|zoe"
)
_LAST = _pick("smith|garcia|mueller|rossi|dubois|kowalski|tanaka|silva|jensen|okafor|novak|chen")


def _email(rng: random.Random) -> str:
    user = f"{_FIRST(rng)}{rng.choice(['.', '_', ''])}{_LAST(rng)}"
    if rng.random() < 0.4:
        user += str(rng.randrange(1, 99))
    domain = rng.choice(["gmail.com", "outlook.com", "proton.me", "yahoo.com", "web.de", "acme.io"])
    return f"{user}@{domain}"


def _street(rng: random.Random) -> str:
    name = rng.choice(["Oak", "Maple", "Elm", "High", "Station", "Park", "Mill", "Church"])
    return f"{rng.randrange(1, 400)} {name} {rng.choice(['Street', 'Road', 'Avenue', 'Lane'])}"


def _person(rng: random.Random) -> str:
    return str(_FIRST(rng)).capitalize()


def _decimal(lo: float, hi: float, step: float) -> Gen:
    lo, hi, step = float(lo), float(hi), float(step)
    count = round((hi - lo) / step) + 1
    return lambda rng: f"{lo + step * rng.randrange(count):g}"


def _clock(rng: random.Random) -> str:
    return rng.choice(
        [
            f"{rng.randrange(6, 23)}:{rng.choice(['00', '15', '30', '45'])}",
            f"{rng.randrange(1, 13)} {rng.choice(['am', 'pm'])}",
        ]
    )


def _port(rng: random.Random) -> str:
    return str(
        rng.choice([80, 443, 3000, 5432, 6379, 8000, 8080, 8443, 9090, rng.randrange(1024, 65000)])
    )


def _big_number(rng: random.Random) -> str:
    return str(rng.choice([rng.randrange(20, 400), rng.randrange(400, 20000, 10)]))


def _keys(pool: str, k: int) -> Gen:
    names = tuple(pool.split())
    return lambda rng: ", ".join(rng.sample(names, k))


def _swap_one_key(pool: str, **_: object) -> Mutate:
    """Replace one of the keys by a key of the pool not yet used (a mutator of keys)."""
    names = tuple(pool.split())

    def mutate(rng: random.Random, old: str) -> str:
        keys = old.split(", ")
        fresh = [n for n in names if n not in keys]
        keys[rng.randrange(len(keys))] = rng.choice(fresh)
        return ", ".join(keys)

    return mutate


# --------------------------------------------------------------------------- code snippets

_PY_SNIPPETS = (
    "def %F%(items):\n    total = 0\n    for x in items:\n        if x > %N%:\n            total "
    "+= x\n    return total",
    "def %F%(nums):\n    out = []\n    for i in range(len(nums) - %K%):\n        "
    "out.append(nums[i] + nums[i + %K%])\n    return out",
    "def %F%(d, key):\n    if key in d:\n        return d[key] * %N%\n    return None",
    "def %F%(n):\n    if n <= %K%:\n        return n\n    return %F%(n - 1) + %F%(n - 2)",
    "def %F%(words):\n    counts = {}\n    for w in words:\n        counts[w] = counts.get(w, 0) "
    "+ %K%\n    return sorted(counts, key=counts.get)[:%N%]",
    "def %F%(path):\n    with open(path) as f:\n        lines = f.readlines()\n    return "
    "[l.strip() for l in lines if len(l) > %N%]",
)
_JS_SNIPPETS = (
    "function %F%(arr) {\n  return arr.filter(x => x % %K% === 0).map(x => x * %N%);\n}",
    "const %F% = async (url) => {\n  const res = await fetch(url);\n  if (res.status !== %C%) "
    'throw new Error("bad status");\n  return res.json();\n};',
    "for (var i = 0; i < %N%; i++) {\n  setTimeout(() => console.log(i), %M%);\n}",
    "function %F%(a, b) {\n  if (a == null || b.length < %K%) return false;\n  return a.id === "
    "b[%K%].id;\n}",
    'const %F% = (s) => s.split("").reverse().join("").slice(0, %N%);',
)
_GO_SNIPPETS = (
    "func %F%(xs []int) int {\n\tbest := xs[0]\n\tfor _, x := range xs {\n\t\tif x > best "
    "{\n\t\t\tbest = x\n\t\t}\n\t}\n\treturn best\n}",
    "func %F%(n int) []int {\n\tout := make([]int, 0, n)\n\tfor i := 0; i < n; i++ {\n\t\tif "
    "i%%K% == 0 {\n\t\t\tout = append(out, i*%N%)\n\t\t}\n\t}\n\treturn out\n}",
    "for i := 0; i < %N%; i++ {\n\tgo func() {\n\t\tfmt.Println(i)\n\t}()\n}\ntime.Sleep(%M% * "
    "time.Millisecond)",
)
_RUST_SNIPPETS = (
    "fn %F%(v: &Vec<i32>) -> i32 {\n    v.iter().filter(|x| **x > %N%).sum()\n}",
    "fn %F%(s: String) -> String {\n    let mut out = s.clone();\n    out.truncate(%N%);\n    "
    "out\n}",
    "fn %F%(v: Vec<u32>) -> Option<u32> {\n    v.into_iter().map(|x| x * %K%).find(|x| *x >= "
    "%N%)\n}",
)
_SQL_SNIPPETS = (
    "SELECT customer_id, COUNT(*) AS orders\nFROM orders\nWHERE created_at >= '%Y%-01-01'\nGROUP "
    "BY customer_id\nHAVING COUNT(*) > %K%;",
    "SELECT p.name, SUM(o.qty) AS sold\nFROM products p\nLEFT JOIN order_items o ON o.product_id "
    "= p.id\nGROUP BY p.name\nORDER BY sold DESC\nLIMIT %N%;",
    "UPDATE accounts\nSET balance = balance - %N%\nWHERE id = %C% AND balance >= %N%;",
    "SELECT name FROM employees\nWHERE salary > (SELECT AVG(salary) FROM employees)\nAND dept_id "
    "= %K%;",
)
_SH_SNIPPETS = (
    'for f in *.log; do\n  gzip -%K% "$f"\ndone',
    'find . -name "*.tmp" -mtime +%K% -delete',
    "tail -n %N% app.log | grep -c ERROR",
    'if [ "$count" -gt %N% ]; then\n  echo "too many"\n  exit %K%\nfi',
    "ps aux | sort -k %K% -r | head -n %N%",
)
_FN_NAMES = (
    "process",
    "compute",
    "helper",
    "get_data",
    "transform",
    "calc",
    "run",
    "handle",
    "parse_items",
    "top_words",
    "summarize",
    "load",
    "check",
    "merge_rows",
)


def _snippet_gen(templates: tuple[str, ...], camel: bool = False) -> Gen:
    def gen(rng: random.Random) -> str:
        name = rng.choice(_FN_NAMES)
        if camel:
            head, *rest = name.split("_")
            name = head + "".join(p.capitalize() for p in rest)
        code = rng.choice(templates)
        fills = {
            "%F%": name,
            "%N%": str(rng.randrange(2, 60)),
            "%K%": str(rng.randrange(1, 6)),
            "%C%": str(rng.choice([200, 201, 204, 404, rng.randrange(10, 999)])),
            "%M%": str(rng.choice([0, 10, 100, 500, 1000])),
            "%Y%": str(rng.randrange(2019, 2027)),
        }
        for key, value in fills.items():
            code = code.replace(key, value)
        return code

    return gen


_SNIPPETS = {
    "python": _PY_SNIPPETS,
    "js": _JS_SNIPPETS,
    "go": _GO_SNIPPETS,
    "rust": _RUST_SNIPPETS,
    "sql": _SQL_SNIPPETS,
    "shell": _SH_SNIPPETS,
}


def _snippet(pool: str, camel: bool = False) -> Gen:
    """A snippet of one language's pool; camel writes the function name in camelCase."""
    if pool not in _SNIPPETS:
        raise ValueError(f"unknown snippet pool {pool!r} (known: {', '.join(_SNIPPETS)})")
    return _snippet_gen(_SNIPPETS[pool], camel)


_OP_FLIPS = {
    ">": ">=",
    "<": "<=",
    ">=": ">",
    "<=": "<",
    "==": "!=",
    "!=": "==",
    "===": "!==",
    "!==": "===",
    "+": "-",
    "-": "+",
    "*": "+",
    "&&": "||",
    "||": "&&",
    "and": "or",
    "or": "and",
    "-gt": "-lt",
    "-lt": "-gt",
    "+=": "-=",
    "-=": "+=",
    "DESC": "ASC",
    "ASC": "DESC",
    "LEFT": "INNER",
    "True": "False",
    "False": "True",
}
_CODE_TOKEN = re.compile(
    r"(?<=[ (\[])(?:===|!==|==|!=|>=|<=|\+=|-=|&&|\|\||-gt|-lt|[<>+*-]|and|or|DESC|ASC|LEFT)(?=[ "
    r")])"
    r"|\b\d+\b"
)


def _mutate_code(rng: random.Random, code: str) -> str:
    """Change exactly one token: a number or an operator."""
    spots = list(_CODE_TOKEN.finditer(code))
    spot = rng.choice(spots)
    token = spot.group()
    if token.isdigit():
        new = (
            str(int(token) + rng.choice([-2, -1, 1, 2, 3, 10]))
            if int(token) > 2
            else str(int(token) + rng.randrange(1, 4))
        )
    else:
        new = _OP_FLIPS[token]
    return code[: spot.start()] + new + code[spot.end() :]


# --------------------------------------------------------------------------- casual noise

_PROTECTED = re.compile(r"(```[\s\S]*|`[^`\n]*`|\"[^\"\n]*\")")  # code and quoted literals
_GREETINGS = {
    "en": ("hi, ", "hey! ", "Hello, ", "hi there. ", "yo "),
    "fr": ("Bonjour, ", "Salut ! "),
    "de": ("Hallo, ", "Hi! "),
    "es": ("Hola, ", "Buenas, "),
    "pt": ("Olá, ", "Oi, "),
    "it": ("Ciao, ", "Salve, "),
    "nl": ("Hoi, ", "Hallo, "),
}
_PLEASE = {
    "en": (" pls", " please", " plz"),
    "fr": (" stp", " s'il te plaît"),
    "de": (" bitte",),
    "es": (" por favor", " porfa"),
    "pt": (" por favor", " pf"),
    "it": (" per favore", " grazie"),
    "nl": (" alsjeblieft", " aub"),
}
_THANKS = {
    "en": (" thx", " thanks!", " ty"),
    "fr": (" merci", " merci !"),
    "de": (" danke", " Danke!"),
    "es": (" gracias",),
    "pt": (" obrigado", " valeu"),
    "it": (" grazie",),
    "nl": (" bedankt", " thx"),
}
_TYPOS = {
    "the": "teh",
    "you": "u",
    "your": "ur",
    "please": "pls",
    "what": "wat",
    "receive": "recieve",
    "separate": "seperate",
    "because": "bc",
    "tomorrow": "tmrw",
    "with": "wiht",
    "about": "abt",
    "should": "shoud",
    "which": "wich",
    "really": "realy",
    "language": "langauge",
    "definitely": "definately",
    "function": "funtion",
    "people": "ppl",
    "and": "adn",
}


def _outside(text: str, edit: Callable[[str], str]) -> str:
    """Apply edit to the text outside code blocks and quoted literals."""
    parts = _PROTECTED.split(text)
    return "".join(p if i % 2 else edit(p) for i, p in enumerate(parts))


def _lowercase(text: str) -> str:
    return re.sub(r"\b[^\W\d_]+\b", lambda m: m.group().lower(), text)


def _typo(text: str, rng: random.Random) -> str:
    words = [m for m in re.finditer(r"\b[a-z]+\b", text) if m.group() in _TYPOS]
    if not words:
        return text
    m = rng.choice(words)
    return text[: m.start()] + _TYPOS[m.group()] + text[m.end() :]


def _noise(text: str, lang: str, rng: random.Random) -> str:
    """One or two casual edits that do not change the request."""
    edits = rng.sample(
        ["lower", "punct", "greet", "please", "thanks", "typo"], rng.choice([1, 1, 2])
    )
    for edit in edits:
        if edit == "lower":
            text = _outside(text, _lowercase)
        elif edit == "punct":
            text = _outside(text, lambda s: re.sub(r"\s?[?!.;](?=\s|$)", "", s))
        elif edit == "greet":
            head = text[:1].lower() if text[1:2].islower() else text[:1]
            text = rng.choice(_GREETINGS[lang]) + head + text[1:]
        elif edit == "please":
            text = text.rstrip() + rng.choice(_PLEASE[lang])
        elif edit == "thanks":
            text = text.rstrip() + rng.choice(_THANKS[lang])
        elif lang == "en":
            text = _outside(text, lambda s: _typo(s, rng))
    return text


# --------------------------------------------------------------------------- the data file

# slot "gen:" name -> a factory called with the slot's other keys as arguments
GENERATORS: dict[str, Callable[..., Gen]] = {
    "pick": _pick,  # values: "a|b|c"
    "pick_loc": _pick_loc,  # rows: ["en|fr|de|es|pt|it|nl", ...]
    "num": _num,  # lo, hi[, step]
    "decimal": _decimal,  # lo, hi, step
    "keys": _keys,  # pool, k
    "snippet": _snippet,  # pool[, camel]
    "order_id": lambda: _order_id,
    "ticket_id": lambda: _ticket_id,
    "booking_ref": lambda: _booking_ref,
    "account_id": lambda: _account_id,
    "invoice_id": lambda: _invoice_id,
    "amount": lambda: _amount,
    "date": lambda: _date,
    "iso_date": lambda: _iso_date,
    "email": lambda: _email,
    "street": lambda: _street,
    "person": lambda: _person,
    "clock": lambda: _clock,
    "port": lambda: _port,
    "big_number": lambda: _big_number,
}
# slot "mutate:" name -> a factory called with the same arguments as the slot's generator
MUTATORS: dict[str, Callable[..., Mutate]] = {
    "one_code_token": lambda **_: _mutate_code,
    "other_day": lambda **_: _mutate_date,
    "swap_one_key": _swap_one_key,
}
_TOP_KEYS = ("slots", "briefs", "intents")
_SLOT_KEYS = ("label", "gen", "mutate")
_INTENT_KEYS = ("name", "category", "phrasings", "brief", "swaps")
_FORMATTER = string.Formatter()
_T = TypeVar("_T")


class TemplateDataError(ValueError):
    """The intents data file is malformed; the message names the intent or slot at fault."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}: {problem}")


def _strings(value: object, least: int = 1) -> list[str] | None:
    """value if it is a list of at least `least` strings, else None."""
    if isinstance(value, list) and len(value) >= least and all(isinstance(v, str) for v in value):
        return value
    return None


def _fields(template: str, where: str) -> set[str]:
    """The slots a template uses; {Name} is the slot name, capitalised when rendered."""
    try:
        names = [f for _, f, _, _ in _FORMATTER.parse(template) if f is not None]
    except ValueError as exc:
        raise TemplateDataError(where, f"phrasing {template!r}: {exc}") from None
    if not all(names):
        raise TemplateDataError(where, f"phrasing {template!r} has an empty field {{}}")
    return {n[:1].lower() + n[1:] for n in names}


def _call(factory: Callable[..., _T], args: dict[str, Any], where: str) -> _T:
    try:
        inspect.signature(factory).bind(**args)
        return factory(**args)
    except (TypeError, ValueError) as exc:
        raise TemplateDataError(where, str(exc)) from None


def _slot(name: str, spec: object, where: str) -> Slot:
    where = f"{where}: slot {name!r}"
    if not isinstance(spec, dict):
        raise TemplateDataError(where, "wants a mapping with label and gen")
    label, gen, mutate = (spec.get(k) for k in _SLOT_KEYS)
    if not isinstance(label, str) or not label:
        raise TemplateDataError(where, "wants a label (a string)")
    if not isinstance(gen, str) or gen not in GENERATORS:
        known = ", ".join(sorted(GENERATORS))
        raise TemplateDataError(where, f"unknown generator {gen!r} (known: {known})")
    args = {k: v for k, v in spec.items() if k not in _SLOT_KEYS}
    made = _call(GENERATORS[gen], args, f"{where}: generator {gen!r}")
    if mutate is None:
        return Slot(label, made)
    if not isinstance(mutate, str) or mutate not in MUTATORS:
        known = ", ".join(sorted(MUTATORS))
        raise TemplateDataError(where, f"unknown mutate {mutate!r} (known: {known})")
    return Slot(label, made, _call(MUTATORS[mutate], args, f"{where}: mutate {mutate!r}"))


@dataclass(frozen=True)
class _Briefs:
    clauses: dict[str, tuple[str, ...]]  # constraint -> its wordings, in the written order
    list_labels: dict[str, str]  # constraint -> its line in a "Requirements:" list


def _briefs(raw: object) -> _Briefs:
    if not isinstance(raw, dict):
        raise TemplateDataError("briefs", "wants clauses and list_labels")
    clauses, labels = raw.get("clauses"), raw.get("list_labels")
    if not isinstance(clauses, dict) or not clauses:
        raise TemplateDataError("briefs", "clauses wants constraint: [wordings]")
    table: dict[str, tuple[str, ...]] = {}
    for name, wordings in clauses.items():
        checked = _strings(wordings)
        if checked is None:
            raise TemplateDataError("briefs", f"clause {name!r} wants a list of wordings")
        table[name] = tuple(checked)
    if (
        not isinstance(labels, dict)
        or set(labels) != set(table)
        or not all(isinstance(v, str) for v in labels.values())
    ):
        raise TemplateDataError("briefs", "list_labels wants one string per clause")
    return _Briefs(table, dict(labels))


def _brief_phrasings(name: str, tasks: list[str], briefs: _Briefs, count: int = 6) -> list[str]:
    # fixed seed: the phrasings are part of the grammar
    rng = random.Random(f"brief-{name}")  # noqa: S311
    out: list[str] = []
    for i in range(count):
        order = list(briefs.clauses)
        rng.shuffle(order)
        task = tasks[i % len(tasks)]
        if i % 3 == 2:  # a requirements list
            lines = "\n".join(f"- {briefs.list_labels[c]}" for c in order)
            out.append(f"{task}\nRequirements:\n{lines}")
        else:
            out.append(" ".join([task] + [rng.choice(briefs.clauses[c]) for c in order]))
    return out


def _phrasings(raw: dict[str, Any], name: str, briefs: _Briefs | None) -> dict[str, list[str]]:
    where = f"intent {name!r}"
    if ("phrasings" in raw) == ("brief" in raw):
        raise TemplateDataError(where, "wants either phrasings or brief")
    if "brief" in raw:
        tasks = _strings(raw["brief"])
        if tasks is None:
            raise TemplateDataError(where, "brief wants a list of task sentences")
        if briefs is None:
            raise TemplateDataError(where, "has a brief but the file has no briefs section")
        return {"en": _brief_phrasings(name, tasks, briefs)}
    table = raw["phrasings"]
    if not isinstance(table, dict) or not table:
        raise TemplateDataError(where, "phrasings wants language: [templates]")
    out: dict[str, list[str]] = {}
    for lang, templates in table.items():
        if lang not in LANGS:
            raise TemplateDataError(where, f"language {lang!r} is not one of {', '.join(LANGS)}")
        checked = _strings(templates, least=2)
        if checked is None:
            raise TemplateDataError(where, f"{lang} wants a list of at least two phrasings")
        out[lang] = checked
    return out


def _intent(
    raw: object, index: int, specs: dict[str, Any], built: dict[str, Slot], briefs: _Briefs | None
) -> Intent:
    name = raw.get("name") if isinstance(raw, dict) else None
    if not isinstance(raw, dict) or not isinstance(name, str) or not name:
        raise TemplateDataError(f"intent #{index + 1}", "wants a mapping with a name")
    where = f"intent {name!r}"
    extra = sorted(set(raw) - set(_INTENT_KEYS))
    if extra:
        raise TemplateDataError(where, f"unknown keys {extra} (known: {', '.join(_INTENT_KEYS)})")
    category = raw.get("category")
    if not isinstance(category, str) or not category:
        raise TemplateDataError(where, "wants a category")
    table = _phrasings(raw, name, briefs)
    first = next(iter(table.values()))[0]
    slot_names = _fields(first, where)
    for lang, templates in table.items():
        for t in templates:
            if (fields := _fields(t, where)) != slot_names:
                raise TemplateDataError(
                    where,
                    f"{lang} phrasing {t!r} uses the slots {sorted(fields)}, "
                    f"its first phrasing {sorted(slot_names)}",
                )
    for slot in sorted(slot_names):
        if slot not in specs:
            raise TemplateDataError(where, f"template field {{{slot}}} has no slot under slots:")
        if slot not in built:
            built[slot] = _slot(slot, specs[slot], where)
    swaps: list[tuple[str, str, str]] = []
    raw_swaps = raw.get("swaps", [])
    if not isinstance(raw_swaps, list):
        raise TemplateDataError(where, "swaps wants a list of [slot, slot, label]")
    for swap in raw_swaps:
        checked = _strings(swap, least=3)
        if checked is None or len(checked) != 3:
            raise TemplateDataError(where, f"swap {swap!r} wants [slot, slot, label]")
        x, y, label = checked
        if x == y or not {x, y} <= slot_names:
            raise TemplateDataError(where, f"swap {swap!r} wants two slots the intent uses")
        swaps.append((x, y, label))
    return Intent(
        name,
        category,
        {lang: tuple(templates) for lang, templates in table.items()},
        {slot: built[slot] for slot in sorted(slot_names)},
        tuple(swaps),
    )


def load_intents(path: Path = DATA_FILE) -> list[Intent]:
    """The intents of a data file (verifier_intents.yaml), in the order written.

    Raises TemplateDataError, naming the intent or slot at fault, for anything malformed.
    """
    where = str(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise TemplateDataError(where, f"not valid YAML: {exc}") from None
    if not isinstance(data, dict) or not {"slots", "intents"} <= set(data) <= set(_TOP_KEYS):
        raise TemplateDataError(where, "wants the top-level keys slots, intents, briefs (optional)")
    specs, raw_intents = data["slots"], data["intents"]
    if not isinstance(specs, dict) or not isinstance(raw_intents, list):
        raise TemplateDataError(where, "slots wants a mapping and intents a list")
    briefs = _briefs(data["briefs"]) if "briefs" in data else None
    built: dict[str, Slot] = {}  # slots are built once, by the first intent that uses them
    intents = [_intent(raw, i, specs, built, briefs) for i, raw in enumerate(raw_intents)]
    twice = sorted(n for n, count in Counter(i.name for i in intents).items() if count > 1)
    if twice:
        raise TemplateDataError(f"intent {twice[0]!r}", "the name is used by two intents")
    unused = sorted(set(specs) - set(built))
    if unused:
        raise TemplateDataError(f"slot {unused[0]!r}", "no intent uses it")
    return intents


INTENTS: list[Intent] = load_intents()


# --------------------------------------------------------------------------- pair generation

Values = dict[str, Val]


def _loc(value: Val, lang: str) -> str:
    return value if isinstance(value, str) else value[LANGS.index(lang)]


def _render(template: str, values: Values, lang: str) -> str:
    table: dict[str, str] = {}
    for name, value in values.items():
        text = _loc(value, lang)
        table[name] = text
        table[name[:1].upper() + name[1:]] = text[:1].upper() + text[1:]
    return template.format_map(table)


def _consistent(intent: Intent, values: Values) -> bool:
    """Slots of one label (city, city2) and swap partners must hold different values."""
    names = list(intent.slots)
    for i, x in enumerate(names):
        for y in names[i + 1 :]:
            related = intent.slots[x].label == intent.slots[y].label or any(
                {x, y} == {p, q} for p, q, _ in intent.swaps
            )
            if related and _loc(values[x], "en") == _loc(values[y], "en"):
                return False
    return True


def _fill(intent: Intent, rng: random.Random) -> Values:
    values: Values = {}
    for _ in range(50):
        values = {name: slot.gen(rng) for name, slot in intent.slots.items()}
        if _consistent(intent, values):
            break
    return values


def _group(intent: Intent, values: Values) -> str:
    parts = [f"{k}={_loc(v, 'en')[:40]}" for k, v in sorted(values.items())]
    return intent.name + "|" + "|".join(parts)


def _change_one(
    intent: Intent, values: Values, lang: str, rng: random.Random
) -> tuple[Values, str] | None:
    names = list(intent.slots)
    rng.shuffle(names)
    for name in names:
        slot, old = intent.slots[name], _loc(values[name], lang)
        for _ in range(15):
            new = slot.mutate(rng, old) if slot.mutate else slot.gen(rng)
            changed = {**values, name: new}
            if _loc(new, lang) != old and _consistent(intent, changed):
                return changed, slot.label
    return None


def _make(
    intent: Intent, a: str, b: str, duplicate: bool, what: str, group: str, rng: random.Random
) -> SyntheticPair:
    if rng.random() < 0.5:
        a, b = b, a
    return SyntheticPair(a, b, duplicate, f"template/{intent.category}/{what}", group)


def _positive(intent: Intent, rng: random.Random) -> SyntheticPair:
    lang = rng.choice(sorted(intent.phrasings))
    values = _fill(intent, rng)
    t1, t2 = rng.sample(intent.phrasings[lang], 2)
    a, b = _render(t1, values, lang), _render(t2, values, lang)
    if rng.random() < 0.35:
        b = _noise(b, lang, rng)
        if rng.random() < 0.3:
            a = _noise(a, lang, rng)
    return _make(intent, a, b, True, "pos", _group(intent, values), rng)


def _template_b(intent: Intent, lang: str, t1: str, rng: random.Random) -> str:
    """Mostly the same phrasing, sometimes another one (the change must carry the label)."""
    return rng.choice(intent.phrasings[lang]) if rng.random() < 0.3 else t1


def _negative(intent: Intent, rng: random.Random, siblings: list[Intent]) -> SyntheticPair:
    lang = rng.choice(sorted(intent.phrasings))
    values = _fill(intent, rng)
    t1 = rng.choice(intent.phrasings[lang])
    a = _render(t1, values, lang)
    options = ["slot"] * 6 + ["swap"] * (2 * bool(intent.swaps)) + ["intent"] * (2 * bool(siblings))
    options += ["language"] * (3 * (len(intent.phrasings) > 1))
    choice = rng.choice(options)
    b, what, lang_b = "", "", lang
    if choice == "swap":
        x, y, label = rng.choice(intent.swaps)
        b = _render(
            _template_b(intent, lang, t1, rng), {**values, x: values[y], y: values[x]}, lang
        )
        what = f"neg-{label}"
    elif choice == "intent" and (same_lang := [o for o in siblings if lang in o.phrasings]):
        other = rng.choice(same_lang)
        shared = {k: values.get(k, v) for k, v in _fill(other, rng).items()}
        b, what = _render(rng.choice(other.phrasings[lang]), shared, lang), "neg-intent"
    elif choice == "language":
        lang_b = rng.choice(sorted(x for x in intent.phrasings if x != lang))
        b, what = (
            _render(rng.choice(intent.phrasings[lang_b]), values, lang_b),
            "neg-answer-language",
        )
    if not b or b == a:
        changed = _change_one(intent, values, lang, rng)
        assert changed is not None, intent.name
        b, what = _render(_template_b(intent, lang, t1, rng), changed[0], lang), f"neg-{changed[1]}"
    if rng.random() < 0.25:  # noise on negatives too: "looks tidied up" must not mean "same"
        b = _noise(b, lang_b, rng)
    return _make(intent, a, b, False, what, _group(intent, values), rng)


def _siblings(intent: Intent) -> list[Intent]:
    """Other intents of the category sharing a slot: same values, a different request."""
    return [
        o
        for o in INTENTS
        if o.category == intent.category
        and o.name != intent.name
        and set(o.slots) & set(intent.slots)
        and set(o.phrasings) & set(intent.phrasings)
    ]


def template_pairs(rng: random.Random, per_intent: int) -> list[SyntheticPair]:
    """For every intent, per_intent positives and per_intent hard negatives."""
    pairs: list[SyntheticPair] = []
    for intent in INTENTS:
        siblings = _siblings(intent)
        for _ in range(per_intent):
            pairs.append(_positive(intent, rng))
            pairs.append(_negative(intent, rng, siblings))
    return pairs


if __name__ == "__main__":
    demo = template_pairs(random.Random(1), 3)  # noqa: S311
    by_category = Counter(i.category for i in INTENTS)
    print(f"{len(INTENTS)} intents: {dict(by_category)}; {len(demo)} pairs")
    for kind, count in sorted(Counter(p.kind for p in demo).items()):
        print(f"{count:5d}  {kind}")
    show = random.Random(1)  # noqa: S311
    for category in by_category:
        mine = [p for p in demo if p.kind.startswith(f"template/{category}/")]
        for p in show.sample(mine, 3):
            print(
                f"\n[{p.kind}] duplicate={p.duplicate} group={p.group[:80]}\n  A: {p.a}\n  B: {p.b}"
            )
