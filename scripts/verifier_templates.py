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

Written from scratch without reading any evaluation data (bench/ or the dev pair files).
Pure standard library; deterministic given the random.Random passed in.
"""

from __future__ import annotations

import random
import re
import string
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from synthetic_pairs import SyntheticPair

LANGS: tuple[str, ...] = ("en", "fr", "de", "es", "pt", "it", "nl")
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
    """Values separated by "|"."""
    options = tuple(v.strip() for v in values.split("|"))
    return lambda rng: rng.choice(options)


def _pick_loc(*rows: str) -> Gen:
    """Each row holds one value in every language of LANGS, separated by "|"."""
    options = tuple(tuple(f.strip() for f in row.split("|")) for row in rows)
    for row in options:
        assert len(row) == len(LANGS), row
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
    count = round((hi - lo) / step) + 1
    return lambda rng: f"{lo + step * rng.randrange(count):g}"


def _clock(rng: random.Random) -> str:
    return rng.choice(
        [
            f"{rng.randrange(6, 23)}:{rng.choice(['00', '15', '30', '45'])}",
            f"{rng.randrange(1, 13)} {rng.choice(['am', 'pm'])}",
        ]
    )


def _keys(pool: str, k: int) -> Gen:
    names = tuple(pool.split())
    return lambda rng: ", ".join(rng.sample(names, k))


def _swap_one_key(pool: str) -> Mutate:
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


# --------------------------------------------------------------------------- slots

_CITIES = _pick(
    "Lisbon|Tokyo|Kyoto|Reykjavik|Marrakech|Cape Town|Buenos Aires|Mexico City|Vancouver|Chicago|"
    "New "
    "Orleans|Hanoi|Bangkok|Bali|Seoul|Istanbul|Athens|Prague|Budapest|Krakow|Dubrovnik|Edinburgh|"
    "Dublin|Copenhagen|Stockholm|Oslo|Helsinki|Vienna|Florence|Naples|Seville|Porto|Amsterdam|Berlin|"
    "Munich|Zurich|Montreal|Lima|Cusco|Nairobi|Cairo|Dubai|Singapore|Sydney|Auckland|Havana|Boston"
)
_COUNTRIES = _pick(
    "Japan|Brazil|India|the United States|Canada|Australia|Turkey|Vietnam|Kenya|Egypt|Indonesia|"
    "Mexico|Argentina|South Africa|China|Russia|the United Kingdom|Thailand|Morocco|Peru|Chile|"
    "South Korea|New Zealand|Iceland|Cuba|Nigeria|Saudi Arabia|Sri Lanka|Colombia|Georgia"
)
_LOC_CITIES = _pick_loc(
    "London|Londres|London|Londres|Londres|Londra|Londen",
    "Brussels|Bruxelles|Brüssel|Bruselas|Bruxelas|Bruxelles|Brussel",
    "Munich|Munich|München|Múnich|Munique|Monaco di Baviera|München",
    "Vienna|Vienne|Wien|Viena|Viena|Vienna|Wenen",
    "Milan|Milan|Mailand|Milán|Milão|Milano|Milaan",
    "Barcelona|Barcelone|Barcelona|Barcelona|Barcelona|Barcellona|Barcelona",
    "Lisbon|Lisbonne|Lissabon|Lisboa|Lisboa|Lisbona|Lissabon",
    "Rome|Rome|Rom|Roma|Roma|Roma|Rome",
    "Zurich|Zurich|Zürich|Zúrich|Zurique|Zurigo|Zürich",
    "Amsterdam|Amsterdam|Amsterdam|Ámsterdam|Amesterdão|Amsterdam|Amsterdam",
    "Geneva|Genève|Genf|Ginebra|Genebra|Ginevra|Genève",
    "Cologne|Cologne|Köln|Colonia|Colónia|Colonia|Keulen",
    "Venice|Venise|Venedig|Venecia|Veneza|Venezia|Venetië",
    "Paris|Paris|Paris|París|Paris|Parigi|Parijs",
    "Prague|Prague|Prag|Praga|Praga|Praga|Praag",
)
_WEEKDAYS = _pick_loc(
    "Monday|lundi|Montag|lunes|segunda-feira|lunedì|maandag",
    "Tuesday|mardi|Dienstag|martes|terça-feira|martedì|dinsdag",
    "Wednesday|mercredi|Mittwoch|miércoles|quarta-feira|mercoledì|woensdag",
    "Thursday|jeudi|Donnerstag|jueves|quinta-feira|giovedì|donderdag",
    "Friday|vendredi|Freitag|viernes|sexta-feira|venerdì|vrijdag",
)
_LANGUAGES_CODE = "Python|JavaScript|TypeScript|Go|Rust|Java|C#|Ruby|PHP|Kotlin|Swift|C++"
_TONES = (
    "formal|casual|humorous|enthusiastic|serious|empathetic|persuasive|neutral and factual|playful"
)
_AUDIENCES = (
    "complete beginners|senior engineers|busy executives|high-school students|retired people|"
    "small business owners|parents of toddlers|university researchers|first-time home buyers|"
    "nurses|teenage gamers|non-native English speakers"
)
_ITEMS = (
    "pricing|a customer quote|statistics|emojis|technical jargon|the launch date|competitors' "
    "names|"
    "a call to action|a personal anecdote|safety warnings|a discount code|a link to the website|"
    "the company's history|rhetorical questions|a deadline|environmental impact"
)

SLOTS: dict[str, Slot] = {
    # everyday
    "meat": Slot(
        "food",
        _pick("whole chicken|turkey|pork shoulder|leg of lamb|beef joint|duck|chicken thighs"),
    ),
    "weight": Slot("number", _decimal(0.5, 6.0, 0.5)),
    "temp": Slot("number", _num(150, 230, 10)),
    "dish": Slot(
        "dish",
        _pick(
            "lasagna|pancakes|banana bread|chili|fried rice|brownies|carbonara|"
            "mac and cheese|meatballs|muffins|quiche|tiramisu|pad thai|risotto|cookies"
        ),
    ),
    "withx": Slot("negation", _pick("with|without")),
    "ingredient": Slot(
        "ingredient", _pick("eggs|butter|milk|sugar|cheese|garlic|onions|flour|cream|nuts")
    ),
    "qty": Slot("number", _decimal(0.25, 8.0, 0.25)),
    "unit": Slot("unit", _pick("cups|grams|ounces|tablespoons|milliliters|teaspoons|pounds")),
    "unit2": Slot("unit", _pick("cups|grams|ounces|tablespoons|milliliters|teaspoons|pounds")),
    "city": Slot("city", _CITIES),
    "city2": Slot("city", _CITIES),
    "country": Slot("country", _COUNTRIES),
    "nationality": Slot(
        "nationality",
        _pick(
            "US|Canadian|Indian|Brazilian|German|Nigerian|Mexican|Chinese|Australian|South African|"
            "Filipino|Turkish|British|Pakistani|Colombian"
        ),
    ),
    "transport": Slot("transport", _pick("train|bus|car|plane|ferry|bike")),
    "days": Slot("number", _num(2, 21)),
    "month": Slot("month", _pick(_MONTHS.replace(" ", "|"))),
    "hour": Slot("time", _clock),
    "drug": Slot(
        "drug",
        _pick("ibuprofen|paracetamol|aspirin|naproxen|cetirizine|loratadine|diphenhydramine"),
    ),
    "who": Slot(
        "audience",
        _pick(
            "an adult|a 6-year-old child|a teenager|someone over 65|a pregnant woman|"
            "a person with kidney disease"
        ),
    ),
    "condition": Slot(
        "condition",
        _pick(
            "iron deficiency|migraine|type 2 diabetes|hypothyroidism|Lyme disease|shingles|asthma|"
            "gout|celiac disease|sleep apnea|tonsillitis|vertigo|psoriasis|anemia"
        ),
    ),
    "amount": Slot("amount", _amount),
    "money": Slot("number", _num(500, 100000, 250)),
    "rate": Slot("number", _decimal(1.0, 12.0, 0.5)),
    "years": Slot("number", _num(2, 40)),
    "pct": Slot("number", _num(5, 95, 5)),
    "tip": Slot("number", _num(10, 25)),
    "bill": Slot("number", _decimal(12.0, 480.0, 0.5)),
    "cur": Slot(
        "currency",
        _pick(
            "US dollars|euros|British pounds|Japanese yen|Swiss francs|Canadian dollars|"
            "Indian rupees|Mexican pesos|Australian dollars"
        ),
    ),
    "cur2": Slot(
        "currency",
        _pick(
            "US dollars|euros|British pounds|Japanese yen|Swiss francs|Canadian dollars|"
            "Indian rupees|Mexican pesos|Australian dollars"
        ),
    ),
    "fin": Slot(
        "concept",
        _pick(
            "an index fund|a Roth IRA|compound interest|a credit score|an ETF|"
            "dollar-cost averaging|a bond yield|a mortgage APR|capital gains tax|"
            "an emergency fund|a stock split|inflation"
        ),
    ),
    "science": Slot(
        "topic",
        _pick(
            "photosynthesis|black holes|how vaccines work|inflation|the greenhouse effect|"
            "plate tectonics|how the internet works|DNA replication|quantum entanglement|"
            "supply and demand|how airplanes fly|the immune system|blockchain"
        ),
    ),
    "age_group": Slot(
        "audience",
        _pick(
            "a 5-year-old|a 10-year-old|a high-school student|a university student|"
            "a domain expert|my grandmother"
        ),
    ),
    "skill": Slot(
        "skill",
        _pick(
            "Spanish|the piano|Python|touch typing|chess|the guitar|Japanese|SQL|"
            "watercolor painting|sign language|data analysis|swimming"
        ),
    ),
    "hours": Slot("number", _num(1, 20)),
    "weeks": Slot("number", _num(2, 16)),
    "exam": Slot(
        "exam",
        _pick(
            "the GRE|the SAT|the AWS Solutions Architect exam|the IELTS|the CFA Level 1|"
            "the MCAT|the GMAT|the TOEFL|the PMP exam|the LSAT|a driving theory test"
        ),
    ),
    "minutes": Slot("number", _num(10, 120, 5)),
    "activity": Slot(
        "activity",
        _pick(
            "running|cycling|swimming|brisk walking|yoga|rowing|jumping rope|"
            "hiking|weightlifting|dancing"
        ),
    ),
    "kg": Slot("number", _num(45, 130)),
    "phenomenon": Slot(
        "topic",
        _pick(
            "the northern lights|hiccups|déjà vu|thunder|ocean tides|rainbows|"
            "yawning being contagious|leaves changing color|jet lag|brain freeze|"
            "static electricity|seasons"
        ),
    ),
    "plant": Slot(
        "plant",
        _pick(
            "a monstera|basil|a fiddle leaf fig|tomatoes|a snake plant|orchids|"
            "succulents|a bonsai|lavender|a peace lily"
        ),
    ),
    "room": Slot(
        "place",
        _pick(
            "a north-facing window|a dark bathroom|a sunny balcony|an office desk|"
            "a south-facing garden"
        ),
    ),
    "sleep_h": Slot("number", _num(4, 10)),
    "book": Slot(
        "book",
        _pick(
            "1984|Pride and Prejudice|The Great Gatsby|Sapiens|Atomic Habits|Dune|"
            "To Kill a Mockingbird|Thinking, Fast and Slow|The Hobbit|Moby-Dick|"
            "Crime and Punishment|Educated|The Road|Beloved"
        ),
    ),
    "n": Slot("number", _num(3, 12)),
    # code
    "lang": Slot("language", _pick(_LANGUAGES_CODE)),
    "coll": Slot(
        "data-structure", _pick("a list|an array|a string|a linked list|a dictionary's keys")
    ),
    "fmt": Slot("file-format", _pick("CSV|JSON|YAML|XML|Parquet|TOML|INI|Excel")),
    "pylib": Slot("library", _pick("requests|httpx|aiohttp|urllib3|urllib.request")),
    "method": Slot("http-method", _pick("GET|POST|PUT|DELETE|PATCH")),
    "db": Slot(
        "database", _pick("PostgreSQL|MySQL|SQLite|SQL Server|Oracle|MariaDB|Snowflake|BigQuery")
    ),
    "entities": Slot(
        "entity", _pick("customers|products|employees|authors|stores|cities|movies|sales reps")
    ),
    "metric": Slot(
        "metric",
        _pick(
            "total revenue|number of orders|average rating|salary|page views|"
            "units sold|profit margin"
        ),
    ),
    "size": Slot("number", _num(10, 2000, 10)),
    "ext": Slot("file-type", _pick(".txt|.py|.md|.html|.js|.csv|.yaml|.json|.conf")),
    "old_word": Slot("word", _pick("foo|localhost|http|colour|TODO|v1|staging|user_id|master")),
    "new_word": Slot(
        "word", _pick("bar|example.com|https|color|FIXME|v2|production|account_id|main")
    ),
    "git_action": Slot(
        "task",
        _pick(
            "undo the last commit but keep my changes|delete a remote branch|rename a local branch|"
            "squash the last 3 commits|discard all local changes|see who changed a specific line|"
            "move a commit to another branch|remove a file from the repo but keep it locally|"
            "change the message of the last commit|undo a git rebase"
        ),
    ),
    "type_a": Slot(
        "type",
        _pick(
            "a string|an integer|a float|a list|a dictionary|a date string|a byte array|a JSON "
            "string"
        ),
    ),
    "type_b": Slot(
        "type",
        _pick(
            "a string|an integer|a float|a list|a dictionary|a date string|a byte array|a JSON "
            "string"
        ),
    ),
    "regex_target": Slot(
        "pattern",
        _pick(
            "a US ZIP code|an IPv4 address|a hex color code|a date in YYYY-MM-DD format|an email "
            "address|"
            "a UK postcode|a time in 24-hour format|a semantic version number|a URL starting "
            "with https|"
            "a phone number like 555-123-4567|a word repeated twice in a row"
        ),
    ),
    "algo": Slot(
        "algorithm",
        _pick(
            "quicksort|merge sort|binary search|Dijkstra's algorithm|heap sort|"
            "breadth-first search|insertion sort|a hash map lookup|Kruskal's algorithm|"
            "the Floyd-Warshall algorithm"
        ),
    ),
    "pkg": Slot(
        "package",
        _pick("Docker|Node.js|PostgreSQL|Python 3.12|Redis|nginx|Go|Java 21|MongoDB|kubectl"),
    ),
    "os": Slot(
        "os", _pick("Ubuntu 22.04|macOS|Windows 11|Fedora|Arch Linux|Debian 12|a Raspberry Pi")
    ),
    "py_error": Slot(
        "error",
        _pick(
            "TypeError: 'NoneType' object is not subscriptable|IndexError: list index out of range|"
            "RecursionError: maximum recursion depth exceeded|ModuleNotFoundError: No module "
            "named 'numpy'|"
            "UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff|ValueError: too many "
            "values to unpack|"
            "AttributeError: 'list' object has no attribute 'split'|ZeroDivisionError: division "
            "by zero|"
            "TypeError: unhashable type: 'list'|RuntimeError: dictionary changed size during "
            "iteration"
        ),
    ),
    "workers": Slot("number", _num(2, 32)),
    "order": Slot("direction", _pick("ascending|descending")),
    "field": Slot("field", _pick("age|name|price|date|score|length|last login")),
    "verb": Slot(
        "task",
        _pick(
            "explain|find the bug in|optimise|write unit tests for|add comments to|"
            "refactor|simplify"
        ),
    ),
    "py_code": Slot("code", _snippet_gen(_PY_SNIPPETS), _mutate_code),
    "js_code": Slot("code", _snippet_gen(_JS_SNIPPETS, camel=True), _mutate_code),
    "go_code": Slot("code", _snippet_gen(_GO_SNIPPETS, camel=True), _mutate_code),
    "rust_code": Slot("code", _snippet_gen(_RUST_SNIPPETS), _mutate_code),
    "sql_code": Slot("code", _snippet_gen(_SQL_SNIPPETS), _mutate_code),
    "sh_code": Slot("code", _snippet_gen(_SH_SNIPPETS), _mutate_code),
    "framework": Slot("library", _pick("React|Vue|Svelte|Angular|Solid")),
    "state_thing": Slot(
        "feature",
        _pick(
            "a dark mode toggle|a search box with debounce|infinite scrolling|"
            "a modal dialog|form validation|a countdown timer|drag and drop"
        ),
    ),
    # support
    "action": Slot(
        "action", _pick("a refund|an exchange|a cancellation|a replacement|store credit")
    ),
    "order_id": Slot("order-id", _order_id),
    "ticket_id": Slot("ticket-id", _ticket_id),
    "booking_ref": Slot("booking-ref", _booking_ref),
    "account_id": Slot("account-id", _account_id),
    "invoice_id": Slot("invoice-id", _invoice_id),
    "date": Slot("date", _date, _mutate_date),
    "date2": Slot("date", _date, _mutate_date),
    "email": Slot("email", _email),
    "email2": Slot("email", _email),
    "plan": Slot("plan", _pick("Basic|Pro|Premium|Family|Business|Starter|Enterprise")),
    "bags": Slot("number", _num(1, 4)),
    "item": Slot(
        "product",
        _pick(
            "blue hoodie (size M)|wireless earbuds|coffee grinder|running shoes (size 42)|"
            "phone case|desk lamp|yoga mat|backpack|smart watch|kettle"
        ),
    ),
    "problem": Slot(
        "problem",
        _pick(
            "arrived damaged|is the wrong size|never arrived|is missing parts|"
            "stopped working after a week|is a different color than pictured"
        ),
    ),
    "street": Slot(
        "address",
        _street,
    ),
    # casual
    "topic_joke": Slot(
        "topic",
        _pick(
            "cats|programmers|dentists|pirates|coffee|math|dogs|accountants|"
            "vegetables|the moon|penguins|teachers"
        ),
    ),
    "word": Slot(
        "word",
        _pick(
            "ephemeral|ubiquitous|serendipity|petrichor|sonder|gaslighting|hygge|"
            "schadenfreude|quixotic|laconic|zeitgeist|nostalgia|liminal|rizz"
        ),
    ),
    "genre": Slot(
        "genre",
        _pick("horror|sci-fi|romcom|thriller|kids|documentary|war|western|fantasy|crime"),
    ),
    "animal": Slot(
        "animal",
        _pick(
            "octopuses|crows|sloths|axolotls|honeybees|orcas|capybaras|"
            "flamingos|tardigrades|elephants|owls"
        ),
    ),
    "food": Slot(
        "food",
        _pick(
            "oatmeal|avocado|peanut butter|dark chocolate|white rice|greek yogurt|"
            "popcorn|sushi|eggs|granola|coconut oil"
        ),
    ),
    "a": Slot("number", _num(12, 999)),
    "b": Slot("number", _num(2, 99)),
    "pet": Slot(
        "animal", _pick("black cat|golden retriever|hamster|parrot|bunny|goldfish|corgi|tortoise")
    ),
    "rhyme": Slot("word", _pick("orange|moon|heart|night|rain|dream|love|fire|home|time")),
    "artist": Slot(
        "artist",
        _pick(
            "Radiohead|Taylor Swift|Daft Punk|Kendrick Lamar|Adele|Arctic Monkeys|"
            "Billie Eilish|Fleetwood Mac|Bad Bunny|Coldplay|Nirvana"
        ),
    ),
    "kgs": Slot("number", _num(1, 150)),
    "mass": Slot("unit", _pick("kg|lbs|stone")),
    "mass2": Slot("unit", _pick("kg|lbs|stone")),
    # format
    "things": Slot(
        "topic",
        _pick(
            "programming languages|European capitals|planets|classic novels|"
            "board games|houseplants|cloud providers|cheeses|jazz albums|volcanoes"
        ),
    ),
    "fmt_keys": Slot(
        "keys",
        _keys("name year country rating description origin price category", 3),
        _swap_one_key("name year country rating description origin price category"),
    ),
    "columns": Slot(
        "columns",
        _keys("name pros cons price use_case difficulty popularity year", 3),
        _swap_one_key("name pros cons price use_case difficulty popularity year"),
    ),
    "list_topic": Slot(
        "topic",
        _pick(
            "tips for better sleep|ways to save money on groceries|"
            "icebreaker questions|habits of productive people|SQL interview questions|"
            "ideas for a rainy day|names for a coffee shop|mistakes new managers make|"
            "cheap date ideas|reasons to learn Rust"
        ),
    ),
    "concept": Slot(
        "topic",
        _pick(
            "recursion|machine learning|the stock market|climate change|"
            "the French Revolution|object-oriented programming|opportunity cost|"
            "a neural network|the theory of relativity|a REST API|cognitive dissonance"
        ),
    ),
    "shape": Slot(
        "output-format",
        _pick(
            "as a haiku|in three bullet points|as a numbered list "
            "of 5 steps|in a short paragraph|as a limerick|in exactly 20 words|"
            "as a tweet under 280 characters|as an analogy for a child"
        ),
    ),
    "poem": Slot("form", _pick("haiku|limerick|sonnet|four-line rhyming poem|free-verse poem")),
    "poem_topic": Slot(
        "topic",
        _pick(
            "autumn rain|a lost sock|Monday mornings|the ocean|coffee|"
            "a sleepy cat|city lights|the first snow|a broken umbrella"
        ),
    ),
    "out_fmt": Slot(
        "output-format",
        _pick(
            "a JSON array|CSV|YAML|a markdown table|a bullet list|"
            "a comma-separated line|an HTML list|XML"
        ),
    ),
    "words": Slot("length", _num(20, 200, 10)),
    "service": Slot(
        "service",
        _pick(
            "a Redis cache|an nginx reverse proxy|a Postgres database|"
            "a Node.js API|a RabbitMQ broker|a Grafana dashboard"
        ),
    ),
    "replicas": Slot("number", _num(1, 10)),
    "port": Slot(
        "number",
        lambda rng: str(
            rng.choice(
                [80, 443, 3000, 5432, 6379, 8000, 8080, 8443, 9090, rng.randrange(1024, 65000)]
            )
        ),
    ),
    "entity": Slot(
        "entity", _pick("customer|employee|product|patient|student|flight|hotel booking")
    ),
    "rows": Slot("number", _num(3, 25)),
    "tag": Slot("tag", _pick("catalog|items|library|inventory|data|collection")),
    "place": Slot(
        "place",
        _pick(
            "the Grand Canyon|a Tokyo train station at rush hour|a rainforest at night|"
            "an abandoned mall|a medieval market|the surface of Mars|a lighthouse in a storm"
        ),
    ),
    # long constraints
    "audience": Slot("audience", _pick(_AUDIENCES)),
    "tone": Slot("tone", _pick(_TONES)),
    "length": Slot(
        "length", lambda rng: str(rng.choice([100, 150, 200, 250, 300, 400, 500, 600, 800, 1000]))
    ),
    "sections": Slot("sections", _num(2, 7)),
    "include": Slot("include", _pick(_ITEMS)),
    "ending": Slot(
        "ending",
        _pick(
            "a question to the reader|a one-line summary|an invitation to reply|a famous quote|"
            "a list of further reading|a light joke|a clear next step"
        ),
    ),
    "channel": Slot(
        "channel",
        _pick(
            "our company website|the internal wiki|our email list|a printed brochure|"
            "my personal Medium account|the team Slack channel|a local newspaper"
        ),
    ),
    "avoid": Slot("avoid", _pick(_ITEMS)),
}


# --------------------------------------------------------------------------- the grammar

INTENTS: list[Intent] = []
_FORMATTER = string.Formatter()


def _fields(template: str) -> set[str]:
    names = {f for _, f, _, _ in _FORMATTER.parse(template) if f}
    return {n[:1].lower() + n[1:] for n in names}


def _intent(
    category: str,
    name: str,
    phrasings: list[str] | dict[str, list[str]],
    swaps: tuple[tuple[str, str, str], ...] = (),
) -> None:
    table = {"en": phrasings} if isinstance(phrasings, list) else phrasings
    slot_names = _fields(table["en"][0])
    for lang, templates in table.items():
        assert lang in LANGS and len(templates) >= 2, (name, lang)
        for t in templates:
            assert _fields(t) == slot_names, (name, t)
    INTENTS.append(
        Intent(
            name,
            category,
            {k: tuple(v) for k, v in table.items()},
            {n: SLOTS[n] for n in sorted(slot_names)},
            swaps,
        )
    )


_DIRECTION = ("city", "city2", "direction")

# everyday ---------------------------------------------------------------------
E = "everyday"
_intent(
    E,
    "roast-time",
    [
        "How long should I roast a {weight} kg {meat} at {temp}°C?",
        "Roasting a {meat} that weighs {weight} kg in the oven at {temp}°C - how many minutes "
        "does it need?",
        "What's the cooking time for a {weight}kg {meat} at {temp} degrees Celsius?",
        "I've got a {meat}, {weight} kg. Oven is at {temp}°C. How long do I leave it in?",
        "{Meat} ({weight} kg), oven at {temp}°C: how long to roast it?",
    ],
)
_intent(
    E,
    "recipe-with",
    [
        "Give me a recipe for {dish} {withx} {ingredient}.",
        "Can you share a {dish} recipe {withx} {ingredient}?",
        "I want to make {dish} {withx} {ingredient} - what's a good recipe?",
        "Looking for a {dish} recipe, {withx} {ingredient}. Any ideas?",
        "How do I make {dish} {withx} {ingredient}? I need the full recipe.",
    ],
)
_intent(
    E,
    "recipe-substitute",
    [
        "What can I use instead of {ingredient} in {dish}?",
        "I ran out of {ingredient}. What's a good substitute when making {dish}?",
        "Best replacement for {ingredient} in a {dish} recipe?",
        "Making {dish} and I have no {ingredient} - what can I swap in?",
        "Which ingredient can replace {ingredient} when I cook {dish}?",
    ],
)
_intent(
    E,
    "unit-convert",
    [
        "How many {unit2} are in {qty} {unit}?",
        "Convert {qty} {unit} to {unit2}.",
        "{qty} {unit} is how many {unit2}?",
        "What is {qty} {unit} in {unit2}? It's for a recipe.",
        "Can you turn {qty} {unit} into {unit2} for me?",
    ],
    swaps=(("unit", "unit2", "direction"),),
)
_intent(
    E,
    "best-time-visit",
    [
        "When is the best time of year to visit {city}?",
        "What's the ideal season for a trip to {city}?",
        "Which month would you recommend for visiting {city}?",
        "Planning a trip to {city} - when should I go?",
        "best time to go to {city}?",
    ],
)
_intent(
    E,
    "route",
    [
        "How do I get from {city} to {city2} by {transport}?",
        "What's the best way to travel from {city} to {city2} by {transport}?",
        "I need to go from {city} to {city2} and want to take the {transport}. How?",
        "Getting from {city} to {city2} by {transport} - what are my options?",
        "Can you explain how to travel {city} to {city2} using the {transport}?",
    ],
    swaps=(_DIRECTION,),
)
_intent(
    E,
    "packing",
    [
        "What should I pack for a {days}-day trip to {city} in {month}?",
        "Packing list for {days} days in {city} in {month}, please.",
        "I'm spending {days} days in {city} in {month}. What do I need to bring?",
        "Help me pack: {city}, {month}, {days} days.",
        "What clothes and gear should I take to {city} for {days} days in {month}?",
    ],
)
_intent(
    E,
    "visa",
    [
        "Do {nationality} citizens need a visa to visit {country}?",
        "I have a {nationality} passport. Do I need a visa for {country}?",
        "Is a visa required for {nationality} passport holders traveling to {country}?",
        "Visa requirements for {country} if I'm {nationality}?",
        "As a {nationality} citizen, can I enter {country} without a visa?",
    ],
)
_intent(
    E,
    "time-zone",
    [
        "If it's {hour} in {city}, what time is it in {city2}?",
        "When it's {hour} in {city}, what's the time in {city2}?",
        "{hour} in {city} is what time in {city2}?",
        "Convert {hour} {city} time to {city2} time.",
        "I have a call at {hour} {city} time. What time is that in {city2}?",
    ],
    swaps=(_DIRECTION,),
)
_intent(
    E,
    "max-dose",
    [
        "What's the maximum daily dose of {drug} for {who}?",
        "How much {drug} can {who} safely take in one day?",
        "What is the daily limit for {drug} for {who}?",
        "Max amount of {drug} per day for {who}?",
        "How many mg of {drug} per day is safe for {who}?",
    ],
)
_intent(
    E,
    "symptoms",
    [
        "What are the common symptoms of {condition}?",
        "How do I know if I have {condition}? What are the signs?",
        "What symptoms does {condition} usually cause?",
        "Signs and symptoms of {condition}?",
        "Can you list the typical symptoms of {condition}?",
    ],
)
_intent(
    E,
    "treatment",
    [
        "How is {condition} usually treated?",
        "What are the treatment options for {condition}?",
        "What do doctors normally do to treat {condition}?",
        "Treatment for {condition}?",
        "Can you explain how {condition} is treated?",
    ],
)
_intent(
    E,
    "compound-interest",
    [
        "If I invest ${money} at {rate}% annual interest for {years} years, how much will I have?",
        "How much will ${money} grow to in {years} years at {rate}% per year, compounded annually?",
        "Calculate the future value of ${money} after {years} years at an annual rate of {rate}%.",
        "${money} invested, {rate}% a year, {years} years: what's the final amount?",
        "What does ${money} become after {years} years if it earns {rate}% interest every year?",
    ],
)
_intent(
    E,
    "tip",
    [
        "How much is a {tip}% tip on a ${bill} bill?",
        "What's {tip} percent tip for ${bill}?",
        "My bill is ${bill}. How much should I leave for a {tip}% tip?",
        "Calculate a {tip}% tip on ${bill}.",
        "tip of {tip}% on ${bill} = ?",
    ],
)
_intent(
    E,
    "currency",
    [
        "How much is {money} {cur} in {cur2}?",
        "Convert {money} {cur} to {cur2}.",
        "What's {money} {cur} worth in {cur2}?",
        "I have {money} {cur}. How many {cur2} is that?",
        "{money} {cur} to {cur2} please",
    ],
    swaps=(("cur", "cur2", "direction"),),
)
_intent(
    E,
    "finance-concept",
    [
        "What is {fin} and how does it work?",
        "Can you explain {fin} in plain terms?",
        "I keep hearing about {fin}. What is it exactly?",
        "How does {fin} work?",
        "Explain {fin} to me like I'm new to personal finance.",
    ],
)
_intent(
    E,
    "explain-to",
    [
        "Explain {science} to {age_group}.",
        "How would you explain {science} to {age_group}?",
        "Can you describe {science} in a way {age_group} would understand?",
        "I need to explain {science} to {age_group}. What should I say?",
        "Break down {science} for {age_group}.",
    ],
)
_intent(
    E,
    "learn-time",
    [
        "How long will it take to learn {skill} if I practice {hours} hours a week?",
        "If I study {skill} for {hours} hours every week, how long until I'm decent?",
        "I can put {hours} hours per week into learning {skill}. How many months will it take?",
        "Learning {skill} at {hours} h/week - realistic timeline?",
        "With {hours} hours a week, how long does it take to get good at {skill}?",
    ],
)
_intent(
    E,
    "study-plan",
    [
        "Make me a {weeks}-week study plan for {exam}.",
        "I have {weeks} weeks to prepare for {exam}. Can you build a study schedule?",
        "Create a study plan to get ready for {exam} in {weeks} weeks.",
        "Study schedule for {exam}, {weeks} weeks until the test.",
        "Help me plan {weeks} weeks of preparation for {exam}.",
    ],
)
_intent(
    E,
    "calories",
    [
        "How many calories does {minutes} minutes of {activity} burn for a {kg} kg person?",
        "I weigh {kg} kg. How many calories do I burn doing {activity} for {minutes} minutes?",
        "Calories burned: {activity}, {minutes} min, body weight {kg} kg?",
        "Estimate the calories a {kg}kg person burns with {minutes} minutes of {activity}.",
        "If I do {minutes} minutes of {activity} and weigh {kg} kg, what's the calorie burn?",
    ],
)
_intent(
    E,
    "why-happens",
    [
        "What causes {phenomenon}?",
        "Can you explain what causes {phenomenon}?",
        "What's the science behind {phenomenon}?",
        "{Phenomenon}: what's actually going on there?",
        "I've always wondered - what is the cause of {phenomenon}?",
    ],
)
_intent(
    E,
    "plant-care",
    [
        "How often should I water {plant} next to {room}?",
        "Watering schedule for {plant} in {room}?",
        "I keep {plant} by {room}. How frequently does it need water?",
        "How much and how often do I water {plant} placed near {room}?",
        "What watering routine does {plant} need if it sits near {room}?",
    ],
)
_intent(
    E,
    "book-summary",
    [
        "Summarize {book} in {n} sentences.",
        "Give me a {n}-sentence summary of {book}.",
        "Can you sum up {book} using {n} sentences?",
        "What is {book} about? Answer in {n} sentences.",
        "{book} in {n} sentences, please.",
    ],
)

# long constraints: a task clause plus six constraint clauses, each worded several ways;
# each phrasing is one wording per clause in its own order (built once, deterministically).
L = "long-constraints"
_CLAUSES: dict[str, tuple[str, ...]] = {
    "audience": (
        "The readers are {audience}.",
        "It is aimed at {audience}.",
        "Write it for {audience}.",
        "Target audience: {audience}.",
    ),
    "length": (
        "Keep it under {length} words.",
        "It must not exceed {length} words.",
        "Length: {length} words at most.",
        "Stay within a {length}-word limit.",
    ),
    "tone": (
        "Keep the tone {tone}.",
        "The tone should be {tone}.",
        "Tone: {tone}.",
        "Make it sound {tone} throughout.",
    ),
    "sections": (
        "Split it into {sections} sections with headings.",
        "Organise it as {sections} headed sections.",
        "Structure: {sections} sections, each with a heading.",
        "Use exactly {sections} headed parts.",
    ),
    "include": (
        "Make sure to mention {include}.",
        "It has to include {include}.",
        "Be sure to work {include} into it.",
        "Don't forget {include}.",
    ),
    "avoid": (
        "Do not mention {avoid}.",
        "Leave out {avoid} entirely.",
        "Avoid any reference to {avoid}.",
        "Skip {avoid} completely.",
    ),
    "ending": (
        "Finish with {ending}.",
        "End it with {ending}.",
        "The last part should be {ending}.",
        "Close with {ending}.",
    ),
    "channel": (
        "It will be published on {channel}.",
        "This is going on {channel}.",
        "Context: it's for {channel}.",
        "We'll post it on {channel}.",
    ),
}
_LIST_LABELS = {
    "ending": "Ending: {ending}",
    "channel": "Where it appears: {channel}",
    "audience": "Audience: {audience}",
    "length": "Max length: {length} words",
    "tone": "Tone: {tone}",
    "sections": "Sections: {sections}, with headings",
    "include": "Must include: {include}",
    "avoid": "Must not include: {avoid}",
}


def _brief_phrasings(name: str, tasks: tuple[str, ...], count: int = 6) -> list[str]:
    # fixed seed: the phrasings are part of the grammar
    rng = random.Random(f"brief-{name}")  # noqa: S311
    out: list[str] = []
    for i in range(count):
        order = list(_CLAUSES)
        rng.shuffle(order)
        task = tasks[i % len(tasks)]
        if i % 3 == 2:  # a requirements list
            lines = "\n".join(f"- {_LIST_LABELS[c]}" for c in order)
            out.append(f"{task}\nRequirements:\n{lines}")
        else:
            out.append(" ".join([task] + [rng.choice(_CLAUSES[c]) for c in order]))
    return out


_BRIEFS: dict[str, tuple[str, ...]] = {
    "blog-post": (
        "Write a blog post about {topic_brief}.",
        "I need a blog article on {topic_brief}.",
        "Draft a post for our blog covering {topic_brief}.",
    ),
    "product-description": (
        "Write a product description for {product}.",
        "Create the product page copy for {product}.",
        "I need marketing text describing {product}.",
    ),
    "cover-letter": (
        "Write a cover letter for a {role} position.",
        "Draft my cover letter for a job as a {role}.",
        "I'm applying to be a {role}; write the cover letter.",
    ),
    "announcement-email": (
        "Write an email announcing {event}.",
        "Draft an announcement email about {event}.",
        "Compose the email that tells people about {event}.",
    ),
    "speech": (
        "Write a short speech for {occasion}.",
        "Draft a speech I can give at {occasion}.",
        "I have to speak at {occasion}; write my speech.",
    ),
    "newsletter": (
        "Write this month's newsletter about {topic_brief}.",
        "Draft a newsletter issue focused on {topic_brief}.",
        "Put together a newsletter on {topic_brief}.",
    ),
    "linkedin-post": (
        "Write a LinkedIn post about {achievement}.",
        "Draft a LinkedIn update sharing {achievement}.",
        "Compose a post for LinkedIn on {achievement}.",
    ),
    "lesson-plan": (
        "Write a lesson plan on {topic_brief}.",
        "Create a lesson plan teaching {topic_brief}.",
        "Draft a plan for one lesson about {topic_brief}.",
    ),
    "short-story": (
        "Write a short story about {story}.",
        "I want a short story in which {story}.",
        "Tell a short story: {story}.",
    ),
    "landing-page": (
        "Write landing page copy for {product}.",
        "Draft the text of a landing page for {product}.",
        "Create website landing copy selling {product}.",
    ),
    "faq-page": (
        "Write an FAQ page about {topic_brief}.",
        "Draft a set of frequently asked questions on {topic_brief}.",
        "Create FAQ content covering {topic_brief}.",
    ),
    "press-release": (
        "Write a press release about {event}.",
        "Draft a press release announcing {event}.",
        "Compose the official press release for {event}.",
    ),
}
SLOTS.update(
    {
        "topic_brief": Slot(
            "topic",
            _pick(
                "remote work burnout|composting at home|our new loyalty program|"
                "password hygiene|budget travel in Portugal|switching to electric cars|"
                "the basics of investing|urban beekeeping|learning a language after 40|"
                "cutting food waste in restaurants|AI tools for small teams"
            ),
        ),
        "product": Slot(
            "product",
            _pick(
                "a noise-cancelling headset|a reusable water bottle|a project management app|"
                "an electric cargo bike|a smart thermostat|a meal-kit subscription|"
                "a standing desk|a language-learning app|an organic dog food"
            ),
        ),
        "role": Slot(
            "role",
            _pick(
                "data analyst|nurse|junior software developer|marketing manager|primary school "
                "teacher|UX designer|warehouse supervisor|financial controller|barista"
            ),
        ),
        "event": Slot(
            "event",
            _pick(
                "our office move|a new parental leave policy|a product recall|"
                "the annual charity run|a merger with a competitor|a price increase|"
                "a four-day work week pilot|the opening of a new branch"
            ),
        ),
        "occasion": Slot(
            "occasion",
            _pick(
                "my sister's wedding|a retirement party|a graduation ceremony|"
                "a company all-hands|a funeral|a team award night|a school reunion"
            ),
        ),
        "achievement": Slot(
            "topic",
            _pick(
                "finishing a marathon|getting promoted|launching my startup|"
                "passing a certification|leaving my job|ten years at the company|"
                "hiring our 100th employee"
            ),
        ),
        "story": Slot(
            "topic",
            _pick(
                "a lighthouse keeper finds a message in a bottle|a robot learns to cook|"
                "two strangers share a stuck elevator|a town where it never stops raining|"
                "a child discovers her grandmother was a spy|a dog waits at a train station"
            ),
        ),
    }
)
for _name, _tasks in _BRIEFS.items():
    _intent(
        L,
        _name,
        _brief_phrasings(_name, _tasks),
        swaps=(("include", "avoid", "include-avoid-swap"),),
    )

# non-english: native phrasings per language; an English version too, for language switches
N = "non-english"
SLOTS.update(
    {
        "loc_city": Slot("city", _LOC_CITIES),
        "loc_city2": Slot("city", _LOC_CITIES),
        "day": Slot("day", _WEEKDAYS),
        "day2": Slot("day", _WEEKDAYS),
        "person": Slot("name", _person),
        "age": Slot("number", _num(4, 14)),
        "people": Slot("number", _num(2, 16)),
        "big": Slot(
            "number",
            lambda rng: str(rng.choice([rng.randrange(20, 400), rng.randrange(400, 20000, 10)])),
        ),
        "degrees": Slot("number", _num(-40, 250)),
        "scale": Slot("unit", _pick("Celsius|Fahrenheit|Kelvin")),
        "scale2": Slot("unit", _pick("Celsius|Fahrenheit|Kelvin")),
        "day_a": Slot("date", _iso_date),
        "day_b": Slot("date", _iso_date),
        "classic": Slot(
            "book",
            _pick(
                "Hamlet|Macbeth|Frankenstein|Dracula|Madame Bovary|Pinocchio|Faust|Candide|"
                "Don Quixote|Anna Karenina|Robinson Crusoe|Othello"
            ),
        ),
        "kid_topic": Slot(
            "topic",
            _pick_loc(
                "photosynthesis|la photosynthèse|die Photosynthese|la fotosíntesis|a "
                "fotossíntese|la fotosintesi|fotosynthese",
                "gravity|la gravité|die Schwerkraft|la gravedad|a gravidade|la gravità|de "
                "zwaartekracht",
                "inflation|l'inflation|die Inflation|la inflación|a inflação|l'inflazione|inflatie",
                "how vaccines work|le fonctionnement des vaccins|die Wirkung von Impfungen|cómo "
                "funcionan las vacunas|"
                "como funcionam as vacinas|come funzionano i vaccini|hoe vaccins werken",
                "rainbows|les arcs-en-ciel|Regenbögen|los arcoíris|os arco-íris|gli "
                "arcobaleni|regenbogen",
                "the tides|les marées|die Gezeiten|las mareas|as marés|le maree|eb en vloed",
                "the water cycle|le cycle de l'eau|den Wasserkreislauf|el ciclo del agua|o ciclo "
                "da água|"
                "il ciclo dell'acqua|de waterkringloop",
                "electricity|l'électricité|die Elektrizität|la electricidad|a "
                "eletricidade|l'elettricità|elektriciteit",
                "volcanoes|les volcans|Vulkane|los volcanes|os vulcões|i vulcani|vulkanen",
            ),
        ),
        "euro_dish": Slot(
            "dish",
            _pick(
                "risotto|paella|tiramisu|quiche|gazpacho|moussaka|ratatouille|guacamole|"
                "hummus|lasagne|goulash|tortilla"
            ),
        ),
        "phrase": Slot(
            "phrase",
            _pick_loc(
                "where is the train station|où est la gare|wo ist der Bahnhof|dónde está la "
                "estación de tren|"
                "onde fica a estação de comboios|dov'è la stazione|waar is het station",
                "I'm allergic to nuts|je suis allergique aux noix|ich bin allergisch gegen Nüsse|"
                "soy alérgico a los frutos secos|sou alérgico a nozes|sono allergico alla frutta "
                "secca|"
                "ik ben allergisch voor noten",
                "the bill, please|l'addition, s'il vous plaît|die Rechnung, bitte|la cuenta, por "
                "favor|"
                "a conta, por favor|il conto, per favore|de rekening, alstublieft",
                "how much does this cost|combien ça coûte|wie viel kostet das|cuánto cuesta "
                "esto|quanto custa isto|"
                "quanto costa questo|hoeveel kost dit",
                "I need a doctor|j'ai besoin d'un médecin|ich brauche einen Arzt|necesito un "
                "médico|"
                "preciso de um médico|ho bisogno di un medico|ik heb een dokter nodig",
                "nice to meet you|enchanté|freut mich|encantado de conocerte|muito "
                "prazer|piacere di conoscerti|"
                "aangenaam kennis te maken",
            ),
        ),
        "target": Slot(
            "language",
            _pick_loc(
                "Japanese|japonais|Japanisch|japonés|japonês|giapponese|het Japans",
                "Korean|coréen|Koreanisch|coreano|coreano|coreano|het Koreaans",
                "Turkish|turc|Türkisch|turco|turco|turco|het Turks",
                "Polish|polonais|Polnisch|polaco|polaco|polacco|het Pools",
                "Greek|grec|Griechisch|griego|grego|greco|het Grieks",
                "Swedish|suédois|Schwedisch|sueco|sueco|svedese|het Zweeds",
                "Russian|russe|Russisch|ruso|russo|russo|het Russisch",
                "Arabic|arabe|Arabisch|árabe|árabe|arabo|het Arabisch",
            ),
        ),
        "syn_word": Slot(
            "word",
            _pick_loc(
                "happy|heureux|glücklich|feliz|feliz|felice|blij",
                "fast|rapide|schnell|rápido|rápido|veloce|snel",
                "beautiful|beau|schön|bonito|bonito|bello|mooi",
                "difficult|difficile|schwierig|difícil|difícil|difficile|moeilijk",
                "important|important|wichtig|importante|importante|importante|belangrijk",
                "tired|fatigué|müde|cansado|cansado|stanco|moe",
                "big|grand|groß|grande|grande|grande|groot",
                "sad|triste|traurig|triste|triste|triste|verdrietig",
                "angry|fâché|wütend|enfadado|zangado|arrabbiato|boos",
            ),
        ),
        "request": Slot(
            "task",
            _pick_loc(
                "fix the heating|réparer le chauffage|die Heizung zu reparieren|que arregle la "
                "calefacción|"
                "arranjar o aquecimento|riparare il riscaldamento|de verwarming te repareren",
                "repair the leaking tap|réparer le robinet qui fuit|den tropfenden Wasserhahn zu "
                "reparieren|"
                "que arregle el grifo que gotea|arranjar a torneira que pinga|riparare il "
                "rubinetto che perde|"
                "de lekkende kraan te repareren",
                "return my deposit|me rendre ma caution|mir die Kaution zurückzuzahlen|que me "
                "devuelva la fianza|"
                "devolver-me a caução|restituirmi il deposito cauzionale|mijn borg terug te "
                "betalen",
                "let me keep a cat|m'autoriser à avoir un chat|mir zu erlauben, eine Katze zu "
                "halten|"
                "que me deje tener un gato|deixar-me ter um gato|permettermi di tenere un gatto|"
                "me toe te staan een kat te houden",
                "extend my lease by a year|prolonger mon bail d'un an|meinen Mietvertrag um ein "
                "Jahr zu verlängern|"
                "que me prorrogue el contrato un año|prolongar o meu contrato por um ano|"
                "prorogare il mio contratto di un anno|mijn huurcontract met een jaar te verlengen",
                "deal with the mould in the bathroom|traiter la moisissure dans la salle de bain|"
                "den Schimmel im Bad zu beseitigen|que solucione el moho del baño|tratar do "
                "bolor na casa de banho|"
                "eliminare la muffa in bagno|de schimmel in de badkamer aan te pakken",
            ),
        ),
    }
)
_intent(
    N,
    "explain-child",
    {
        "en": [
            "Explain {kid_topic} to a {age}-year-old.",
            "How would you describe {kid_topic} to a child who is {age}?",
            "Can you explain {kid_topic} so that a {age}-year-old kid understands it?",
        ],
        "fr": [
            "Explique {kid_topic} à un enfant de {age} ans.",
            "Comment expliquer {kid_topic} à un enfant de {age} ans ?",
            "Tu peux m'expliquer {kid_topic} comme si j'avais {age} ans ?",
        ],
        "de": [
            "Erkläre {kid_topic} einem {age}-jährigen Kind.",
            "Wie erkläre ich einem Kind mit {age} Jahren {kid_topic}?",
            "Kannst du {kid_topic} so erklären, dass ein Kind mit {age} Jahren es versteht?",
        ],
        "es": [
            "Explícale {kid_topic} a un niño de {age} años.",
            "¿Cómo le explicarías {kid_topic} a un niño de {age} años?",
            "Explica {kid_topic} de forma que lo entienda un niño de {age} años.",
        ],
        "pt": [
            "Explica {kid_topic} a uma criança de {age} anos.",
            "Como explicar {kid_topic} a uma criança de {age} anos?",
        ],
    },
)
_intent(
    N,
    "recipe-for-n",
    {
        "en": [
            "Give me a recipe for {euro_dish} for {people} people.",
            "How do I make {euro_dish} for {people}?",
            "I need a {euro_dish} recipe that serves {people}.",
        ],
        "fr": [
            "Donne-moi une recette de {euro_dish} pour {people} personnes.",
            "Recette de {euro_dish} pour {people} personnes, s'il te plaît.",
            "Je cuisine pour {people} personnes : tu as une recette de {euro_dish} ?",
        ],
        "es": [
            "Dame una receta de {euro_dish} para {people} personas.",
            "¿Cómo preparo {euro_dish} para {people} personas?",
            "Necesito una receta de {euro_dish} que alcance para {people} personas.",
        ],
        "it": [
            "Dammi una ricetta per {euro_dish} per {people} persone.",
            "Ricetta {euro_dish} per {people} persone?",
            "Mi serve una ricetta di {euro_dish} per {people} persone.",
        ],
        "nl": [
            "Geef me een recept voor {euro_dish} voor {people} personen.",
            "Hoe maak ik {euro_dish} voor {people} personen?",
            "Ik zoek een recept voor {euro_dish} voor {people} mensen.",
        ],
    },
)
_intent(
    N,
    "translate-phrase",
    {
        "en": [
            'How do you say "{phrase}" in {target}?',
            'Translate "{phrase}" into {target}.',
            'What is "{phrase}" in {target}?',
        ],
        "fr": [
            'Comment dit-on "{phrase}" en {target} ?',
            'Traduis "{phrase}" en {target}.',
            'Tu peux me traduire "{phrase}" en {target} ?',
        ],
        "de": [
            'Wie sagt man "{phrase}" auf {target}?',
            'Übersetze bitte "{phrase}" auf {target}.',
            'Was heißt "{phrase}" auf {target}?',
        ],
        "pt": [
            'Como se diz "{phrase}" em {target}?',
            'Traduz "{phrase}" para {target}.',
            'O que é "{phrase}" em {target}?',
        ],
        "nl": [
            'Hoe zeg je "{phrase}" in {target}?',
            'Vertaal "{phrase}" naar {target}.',
            'Wat is "{phrase}" in {target}?',
        ],
    },
)
_intent(
    N,
    "percent-of",
    {
        "en": [
            "What is {pct}% of {big}?",
            "Calculate {pct} percent of {big}.",
            "{pct}% of {big} = ?",
        ],
        "de": [
            "Wie viel sind {pct} Prozent von {big}?",
            "Berechne {pct} % von {big}.",
            "Was ergibt {pct} Prozent von {big}?",
        ],
        "fr": [
            "Combien font {pct} % de {big} ?",
            "Calcule {pct} pour cent de {big}.",
            "C'est combien, {pct} % de {big} ?",
        ],
        "it": [
            "Quanto fa il {pct}% di {big}?",
            "Calcola il {pct} per cento di {big}.",
            "Mi calcoli il {pct}% di {big}?",
        ],
        "es": ["¿Cuánto es el {pct}% de {big}?", "Calcula el {pct} por ciento de {big}."],
    },
)
_intent(
    N,
    "train-connection",
    {
        "en": [
            "What's the best train connection from {loc_city} to {loc_city2}?",
            "How do I get from {loc_city} to {loc_city2} by train?",
            "Going from {loc_city} to {loc_city2} by train - which connection should I take?",
        ],
        "fr": [
            "Quel est le meilleur trajet en train de {loc_city} à {loc_city2} ?",
            "Comment aller de {loc_city} à {loc_city2} en train ?",
            "Je vais de {loc_city} à {loc_city2} en train, quelle correspondance prendre ?",
        ],
        "de": [
            "Wie komme ich mit dem Zug von {loc_city} nach {loc_city2}?",
            "Was ist die beste Zugverbindung von {loc_city} nach {loc_city2}?",
            "Zug von {loc_city} nach {loc_city2} – welche Verbindung nehme ich am besten?",  # noqa: RUF001
        ],
        "es": [
            "¿Cómo voy de {loc_city} a {loc_city2} en tren?",
            "¿Cuál es la mejor conexión en tren de {loc_city} a {loc_city2}?",
            "Tengo que ir en tren de {loc_city} a {loc_city2}, ¿qué conexión me recomiendas?",
        ],
        "it": [
            "Come arrivo da {loc_city} a {loc_city2} in treno?",
            "Qual è il miglior collegamento in treno da {loc_city} a {loc_city2}?",
        ],
        "pt": [
            "Como vou de comboio de {loc_city} para {loc_city2}?",
            "Qual é a melhor ligação de comboio de {loc_city} para {loc_city2}?",
        ],
        "nl": [
            "Hoe kom ik met de trein van {loc_city} naar {loc_city2}?",
            "Wat is de beste treinverbinding van {loc_city} naar {loc_city2}?",
        ],
    },
    swaps=(("loc_city", "loc_city2", "direction"),),
)
_intent(
    N,
    "reschedule-message",
    {
        "en": [
            "Write a short message to {person} asking to move our meeting from {day} to {day2}.",
            "Draft a quick note to {person}: I'd like to reschedule our meeting from {day} to "
            "{day2}.",
            "Help me tell {person} that our meeting needs to move from {day} to {day2}.",
        ],
        "fr": [
            "Écris un court message à {person} pour déplacer notre réunion de {day} à {day2}.",
            "Rédige un mot rapide pour {person} : je voudrais décaler notre réunion de {day} à "
            "{day2}.",
        ],
        "de": [
            "Schreib eine kurze Nachricht an {person}, dass wir unser Meeting von {day} auf "
            "{day2} verschieben möchten.",
            "Formuliere eine kurze Mail an {person}: Ich möchte unser Treffen von {day} auf "
            "{day2} verlegen.",
        ],
        "es": [
            "Escribe un mensaje corto a {person} para mover nuestra reunión del {day} al {day2}.",
            "Redacta una nota breve para {person}: quiero cambiar la reunión del {day} al {day2}.",
        ],
        "pt": [
            "Escreve uma mensagem curta para {person} a pedir para mudar a nossa reunião de "
            "{day} para {day2}.",
            "Redige uma nota rápida para {person}: quero passar a nossa reunião de {day} para "
            "{day2}.",
        ],
        "it": [
            "Scrivi un breve messaggio a {person} per spostare la nostra riunione da {day} a "
            "{day2}.",
            "Prepara una nota veloce per {person}: vorrei spostare la riunione da {day} a {day2}.",
        ],
        "nl": [
            "Schrijf een kort bericht aan {person} om onze vergadering van {day} naar {day2} te "
            "verplaatsen.",
            "Stel een korte notitie op voor {person}: ik wil onze afspraak van {day} naar {day2} "
            "verzetten.",
        ],
    },
    swaps=(("day", "day2", "direction"),),
)
_intent(
    N,
    "synonyms",
    {
        "en": [
            'Give me {n} synonyms for "{syn_word}".',
            'What are {n} other words for "{syn_word}"?',
            'List {n} words that mean the same as "{syn_word}".',
        ],
        "fr": [
            'Donne-moi {n} synonymes de "{syn_word}".',
            'Quels sont {n} synonymes du mot "{syn_word}" ?',
            'Trouve {n} mots qui veulent dire "{syn_word}".',
        ],
        "es": [
            'Dame {n} sinónimos de "{syn_word}".',
            '¿Qué {n} palabras significan lo mismo que "{syn_word}"?',
            'Necesito {n} sinónimos para "{syn_word}".',
        ],
        "it": [
            'Dammi {n} sinonimi di "{syn_word}".',
            'Quali sono {n} sinonimi della parola "{syn_word}"?',
            'Elenca {n} parole che significano "{syn_word}".',
        ],
        "de": [
            'Nenne mir {n} Synonyme für "{syn_word}".',
            'Welche {n} anderen Wörter gibt es für "{syn_word}"?',
        ],
    },
)
_intent(
    N,
    "temperature",
    {
        "en": [
            "Convert {degrees} degrees {scale} to {scale2}.",
            "What is {degrees} degrees {scale} in {scale2}?",
            "{degrees} degrees {scale} to {scale2}, please.",
        ],
        "pt": [
            "Converte {degrees} graus {scale} para {scale2}.",
            "Quanto é {degrees} graus {scale} em {scale2}?",
        ],
        "nl": [
            "Reken {degrees} graden {scale} om naar {scale2}.",
            "Hoeveel is {degrees} graden {scale} in {scale2}?",
        ],
        "de": [
            "Rechne {degrees} Grad {scale} in {scale2} um.",
            "Wie viel sind {degrees} Grad {scale} in {scale2}?",
        ],
        "it": [
            "Converti {degrees} gradi {scale} in {scale2}.",
            "Quanto sono {degrees} gradi {scale} in {scale2}?",
        ],
    },
    swaps=(("scale", "scale2", "direction"),),
)
_intent(
    N,
    "landlord-email",
    {
        "en": [
            "Write an email to my landlord asking them to {request}.",
            "Help me write a polite email to my landlord to ask them to {request}.",
            "Draft a message to my landlord: I want them to {request}.",
        ],
        "fr": [
            "Écris un e-mail à mon propriétaire pour lui demander de {request}.",
            "Rédige un mail poli à mon propriétaire : je veux lui demander de {request}.",
        ],
        "de": [
            "Schreib eine E-Mail an meinen Vermieter, in der ich ihn bitte, {request}.",
            "Hilf mir, meinen Vermieter per E-Mail höflich zu bitten, {request}.",
        ],
        "es": [
            "Escribe un correo a mi casero para pedirle {request}.",
            "Ayúdame a redactar un email educado a mi casero pidiéndole {request}.",
        ],
        "nl": [
            "Schrijf een e-mail aan mijn huisbaas met de vraag om {request}.",
            "Help me een beleefde mail aan mijn verhuurder te schrijven met het verzoek om "
            "{request}.",
        ],
    },
)
_intent(
    N,
    "days-between",
    {
        "en": [
            "How many days are there between {day_a} and {day_b}?",
            "Count the days from {day_a} to {day_b}.",
        ],
        "es": [
            "¿Cuántos días hay entre el {day_a} y el {day_b}?",
            "Cuenta los días del {day_a} al {day_b}.",
        ],
        "pt": ["Quantos dias há entre {day_a} e {day_b}?", "Conta os dias de {day_a} até {day_b}."],
        "it": [
            "Quanti giorni ci sono tra il {day_a} e il {day_b}?",
            "Conta i giorni dal {day_a} al {day_b}.",
        ],
        "fr": [
            "Combien de jours y a-t-il entre le {day_a} et le {day_b} ?",
            "Compte les jours du {day_a} au {day_b}.",
        ],
    },
)
_intent(
    N,
    "best-season",
    {
        "en": [
            "When is the best time of year to visit {loc_city}?",
            "What's the ideal season for a trip to {loc_city}?",
        ],
        "fr": [
            "Quelle est la meilleure période pour visiter {loc_city} ?",
            "Quand est-ce qu'il vaut mieux aller à {loc_city} ?",
        ],
        "de": [
            "Wann ist die beste Reisezeit für {loc_city}?",
            "Wann sollte man am besten nach {loc_city} reisen?",
        ],
        "it": [
            "Qual è il periodo migliore per visitare {loc_city}?",
            "Quando conviene andare a {loc_city}?",
        ],
        "pt": [
            "Qual é a melhor altura do ano para visitar {loc_city}?",
            "Quando é melhor ir a {loc_city}?",
        ],
        "nl": [
            "Wat is de beste tijd van het jaar om {loc_city} te bezoeken?",
            "Wanneer kun je het beste naar {loc_city} gaan?",
        ],
        "es": [
            "¿Cuál es la mejor época para visitar {loc_city}?",
            "¿Cuándo conviene viajar a {loc_city}?",
        ],
    },
)
_intent(
    N,
    "plot-summary",
    {
        "en": [
            "Summarise the plot of {classic} in {n} sentences.",
            "Give me a {n}-sentence summary of {classic}.",
            "What happens in {classic}? Answer in {n} sentences.",
        ],
        "fr": [
            "Résume l'intrigue de {classic} en {n} phrases.",
            "Fais-moi un résumé de {classic} en {n} phrases.",
        ],
        "de": [
            "Fasse die Handlung von {classic} in {n} Sätzen zusammen.",
            "Worum geht es in {classic}? Antworte in {n} Sätzen.",
        ],
        "es": [
            "Resume el argumento de {classic} en {n} frases.",
            "¿De qué trata {classic}? Respóndeme en {n} frases.",
        ],
        "it": [
            "Riassumi la trama di {classic} in {n} frasi.",
            "Di cosa parla {classic}? Rispondi in {n} frasi.",
        ],
        "nl": [
            "Vat het verhaal van {classic} samen in {n} zinnen.",
            "Waar gaat {classic} over? Antwoord in {n} zinnen.",
        ],
        "pt": [
            "Resume o enredo de {classic} em {n} frases.",
            "Do que trata {classic}? Responde em {n} frases.",
        ],
    },
)

# code ---------------------------------------------------------------------------
C = "code"


def _snippet_intent(name: str, label: str, fence: str, slot: str) -> None:
    code = f"```{fence}\n{{{slot}}}\n```"
    _intent(
        C,
        name,
        [
            f"Can you {{verb}} this {label} code?\n{code}",
            f"{{Verb}} the following {label} snippet, please:\n{code}",
            f"{code}\nPlease {{verb}} this.",
            f"I need you to {{verb}} this bit of {label}:\n{code}",
            f"Here's some {label}. {{Verb}} it.\n{code}",
            f"{label} question - could you {{verb}} the code below?\n{code}",
        ],
    )


_snippet_intent("snippet-python", "Python", "python", "py_code")
_snippet_intent("snippet-js", "JavaScript", "js", "js_code")
_snippet_intent("snippet-go", "Go", "go", "go_code")
_snippet_intent("snippet-rust", "Rust", "rust", "rust_code")
_snippet_intent("snippet-sql", "SQL", "sql", "sql_code")
_snippet_intent("snippet-shell", "shell", "bash", "sh_code")
_intent(
    C,
    "reverse",
    [
        "How do I reverse {coll} in {lang}?",
        "{lang}: what's the way to reverse {coll}?",
        "reversing {coll} in {lang} - how?",
        "Show me how to flip the order of {coll} in {lang}.",
        "Can you tell me how {coll} gets reversed in {lang}?",
    ],
)
_intent(
    C,
    "read-file",
    [
        "How do I read {fmt} files in {lang}?",
        "What's the simplest way to load {fmt} files using {lang}?",
        "{lang}: parse {fmt} files - how?",
        "Show me {lang} code that reads {fmt} files.",
        "I need to open and read {fmt} files from {lang}. How do I do it?",
    ],
)
_intent(
    C,
    "http-request",
    [
        "How do I send a {method} request with {pylib} in Python?",
        "Python {pylib}: how to make a {method} request?",
        "Show me a {method} request example using {pylib}.",
        "What's the code for a {method} call with the {pylib} library in Python?",
        "Using {pylib}, how can I do an HTTP {method}?",
    ],
)
_intent(
    C,
    "sql-top-n",
    [
        "Write a SQL query that returns the top {n} {entities} by {metric}.",
        "SQL to get the {n} {entities} with the highest {metric}?",
        "I need a query listing the top {n} {entities} ranked by {metric}.",
        "How do I select the {n} best {entities} by {metric} in SQL?",
        "Query for top {n} {entities} ordered by {metric}, please.",
    ],
)
_intent(
    C,
    "sql-dedupe",
    [
        "How do I delete duplicate rows from a table in {db}?",
        "{db}: remove duplicate rows but keep one of each?",
        "What's the query to get rid of duplicate records in {db}?",
        "In {db}, how can I delete rows that are duplicates?",
        "Deleting duplicate rows in {db} - how?",
    ],
)
_intent(
    C,
    "shell-find",
    [
        "Find all files larger than {size} MB modified in the last {days} days - what's the "
        "shell command?",
        "Bash command to list files over {size} MB changed within the past {days} days?",
        "How do I find files bigger than {size} MB that were modified in the last {days} days on "
        "Linux?",
        "Which find command shows files > {size}MB modified less than {days} days ago?",
        "Give me a one-liner that finds files above {size} MB edited in the last {days} days.",
    ],
)
_intent(
    C,
    "sed-replace",
    [
        'How do I replace "{old_word}" with "{new_word}" in all {ext} files using sed?',
        'sed command to change "{old_word}" to "{new_word}" across every {ext} file?',
        'Replace every "{old_word}" by "{new_word}" in all {ext} files from the command line - '
        "how?",
        'In all my {ext} files, I want "{old_word}" turned into "{new_word}". What sed do I run?',
        'Give me a sed one-liner that swaps "{old_word}" for "{new_word}" in {ext} files.',
    ],
    swaps=(("old_word", "new_word", "direction"),),
)
_intent(
    C,
    "git-howto",
    [
        "How do I {git_action} in git?",
        "git: how to {git_action}?",
        "What's the git command to {git_action}?",
        "I want to {git_action}. Which git commands do I need?",
        "Quick git question - how can I {git_action}?",
    ],
)
_intent(
    C,
    "convert-type",
    [
        "How do I convert {type_a} to {type_b} in {lang}?",
        "{lang}: turn {type_a} into {type_b}?",
        "What's the way to cast {type_a} to {type_b} in {lang}?",
        "In {lang}, how can I change {type_a} into {type_b}?",
        "Converting {type_a} -> {type_b} in {lang}, how?",
    ],
    swaps=(("type_a", "type_b", "direction"),),
)
_intent(
    C,
    "regex",
    [
        "Write a regex that matches {regex_target}.",
        "What regular expression matches {regex_target}?",
        "I need a regex pattern for {regex_target}.",
        "Regex for {regex_target}?",
        "Can you give me a regular expression to validate {regex_target}?",
    ],
)
_intent(
    C,
    "complexity",
    [
        "What's the time complexity of {algo}?",
        "What is the Big-O running time of {algo}?",
        "How fast is {algo} in terms of time complexity?",
        "Time complexity of {algo}, best/average/worst?",
        "Can you explain the runtime complexity of {algo}?",
    ],
)
_intent(
    C,
    "install",
    [
        "How do I install {pkg} on {os}?",
        "What are the steps to install {pkg} on {os}?",
        "Installing {pkg} on {os} - how?",
        "I need {pkg} on my {os} machine. How do I set it up?",
        "Walk me through installing {pkg} on {os}.",
    ],
)
_intent(
    C,
    "python-error",
    [
        "What does this Python error mean: `{py_error}`?",
        "I'm getting `{py_error}` in Python. Why?",
        "Python throws `{py_error}` - how do I fix it?",
        "How do I fix `{py_error}`?",
        "Can you explain the error `{py_error}` and how to solve it?",
    ],
)
_intent(
    C,
    "concurrency",
    [
        "How do I run {workers} tasks concurrently in {lang}?",
        "{lang}: run {workers} jobs in parallel - how?",
        "Show me how to execute {workers} tasks at the same time in {lang}.",
        "What's the best way to process {workers} tasks concurrently using {lang}?",
        "In {lang}, how can I run {workers} workers concurrently and wait for them all?",
    ],
)
_intent(
    C,
    "sort-by",
    [
        "How do I sort a list of objects by {field} in {order} order in {lang}?",
        "{lang}: sort objects by {field}, {order}?",
        "What's the code to order a list of records by {field} ({order}) in {lang}?",
        "I have a list of objects in {lang}. How do I sort it by {field} in {order} order?",
        "Sorting by {field} in {order} order in {lang} - how?",
    ],
)
_intent(
    C,
    "frontend-feature",
    [
        "How do I build {state_thing} in {framework}?",
        "{framework}: how to implement {state_thing}?",
        "Show me how to make {state_thing} with {framework}.",
        "I want to add {state_thing} to my {framework} app. How?",
        "What's a clean way to implement {state_thing} using {framework}?",
    ],
)

# support ids --------------------------------------------------------------------
S = "support-ids"
_intent(
    S,
    "return-request",
    [
        "I'd like {action} for order {order_id} - the {item} {problem}.",
        "Order {order_id}: the {item} {problem}. Can I get {action}?",
        "Hi, my {item} from order {order_id} {problem}, so I'm requesting {action}.",
        "Please process {action} on order {order_id}. The {item} {problem}.",
        "The {item} I got (order {order_id}) {problem}. I want {action}, please.",
    ],
)
_intent(
    S,
    "order-status",
    [
        "Where is my order {order_id}? It was supposed to arrive on {date}.",
        "Order {order_id} was due on {date} and still hasn't shown up. What's going on?",
        "Can you check the status of order {order_id}? Expected delivery was {date}.",
        "My package for order {order_id} should have come by {date}. Where is it?",
        "Tracking update for {order_id} please - it was promised for {date}.",
    ],
)
_intent(
    S,
    "change-booking",
    [
        "Please change my booking {booking_ref} from {date} to {date2}.",
        "Can I move reservation {booking_ref} from {date} to {date2}?",
        "Booking ref {booking_ref}: I need to switch the date from {date} to {date2}.",
        "I want to reschedule booking {booking_ref}, currently {date}, to {date2}.",
        "Could you rebook {booking_ref} for {date2} instead of {date}?",
    ],
    swaps=(("date", "date2", "direction"),),
)
_intent(
    S,
    "ticket-update",
    [
        "Any update on ticket {ticket_id}? I opened it on {date}.",
        "I raised {ticket_id} on {date} and haven't heard back. What's the status?",
        "What's happening with my support ticket {ticket_id} from {date}?",
        "Following up on {ticket_id} (opened {date}) - is anyone looking at it?",
        "Can you give me the status of ticket {ticket_id}? It's been open since {date}.",
    ],
)
_intent(
    S,
    "double-charge",
    [
        "I was charged {amount} twice on {date} for order {order_id}. Please refund the duplicate.",
        "Order {order_id} shows two charges of {amount} on {date}. Can you reverse one?",
        "You billed me {amount} two times on {date} (order {order_id}). I need one charge "
        "refunded.",
        "Duplicate charge of {amount} on {date} for order {order_id} - please fix.",
        "There's a double payment of {amount} on my card from {date}, order {order_id}. Refund "
        "one please.",
    ],
)
_intent(
    S,
    "change-email",
    [
        "Please change the email on my account from {email} to {email2}.",
        "Can you update my login email? Old: {email}, new: {email2}.",
        "I want to switch my account email from {email} to {email2}.",
        "Update my email address {email} -> {email2}, please.",
        "My account uses {email} but I'd like it moved to {email2}.",
    ],
    swaps=(("email", "email2", "direction"),),
)
_intent(
    S,
    "cancel-subscription",
    [
        "Cancel my {plan} subscription on account {account_id}, effective {date}.",
        "Please end the {plan} plan for account {account_id} as of {date}.",
        "I want to stop my {plan} subscription ({account_id}) starting {date}.",
        "Account {account_id}: cancel {plan} from {date} on.",
        "Could you terminate the {plan} subscription on {account_id} effective {date}?",
    ],
)
_intent(
    S,
    "add-bags",
    [
        "Can I add {bags} checked bags to booking {booking_ref} for my flight on {date}?",
        "Booking {booking_ref}, flying {date}: I want to add {bags} checked bags.",
        "How do I add {bags} pieces of checked luggage to reservation {booking_ref} ({date} "
        "flight)?",
        "Please add {bags} checked bags to my {date} flight, reference {booking_ref}.",
        "I need {bags} extra checked bags on booking {booking_ref} for {date}. Is that possible?",
    ],
)
_intent(
    S,
    "resend-invoice",
    [
        "Please resend invoice {invoice_id} for {amount} to {email}.",
        "Can you email invoice {invoice_id} ({amount}) to {email} again?",
        "I need invoice {invoice_id} of {amount} sent to {email}.",
        "Send a copy of {invoice_id}, amount {amount}, to {email} please.",
        "Could you forward invoice {invoice_id} for {amount} to {email}? I can't find it.",
    ],
)
_intent(
    S,
    "change-address",
    [
        "Change the delivery address for order {order_id} to {street}.",
        "Can you ship order {order_id} to {street} instead?",
        "Please update the shipping address on {order_id} to {street}.",
        "Order {order_id} needs to go to {street}, not the old address.",
        "I moved - deliver order {order_id} to {street}, please.",
    ],
)
_intent(
    S,
    "password-reset",
    [
        "I can't log in to {email}, the password reset link never arrives. Account {account_id}.",
        "Password reset emails aren't reaching {email} (account {account_id}). Help?",
        "Account {account_id}: reset link never shows up at {email}. What can I do?",
        "I'm locked out of account {account_id}; no reset email comes to {email}.",
        "The reset password mail for {email} doesn't arrive - account {account_id}.",
    ],
)
_intent(
    S,
    "partial-refund",
    [
        "I was only refunded {amount} for order {order_id} on {date}, but I returned everything.",
        "Order {order_id}: the refund on {date} was just {amount}, not the full price. Why?",
        "You refunded {amount} on {date} for {order_id}, which is less than I paid. Please "
        "correct it.",
        "Refund for order {order_id} came through on {date} as {amount} - that's short.",
        "Why did I get only {amount} back on {date} for order {order_id}?",
    ],
)

# short casual ------------------------------------------------------------------
K = "short-casual"
_intent(
    K,
    "joke",
    [
        "tell me a joke about {topic_joke}",
        "joke about {topic_joke} pls",
        "got a {topic_joke} joke?",
        "make me laugh, {topic_joke} joke",
        "know any jokes about {topic_joke}?",
    ],
)
_intent(
    K,
    "weather",
    [
        "weather in {city} tomorrow?",
        "{city} weather tmrw",
        "will it rain in {city} tomorrow",
        "hows the weather tomorrow in {city}?",
        "forecast for {city} tomorrow?",
    ],
)
_intent(
    K,
    "define",
    [
        "what does {word} mean",
        "define {word}",
        "{word} meaning?",
        "meaning of {word}?",
        "wait what's {word}",
    ],
)
_intent(
    K,
    "arith",
    [
        "{a} times {b}?",
        "what's {a} x {b}",
        "{a}*{b}=?",
        "quick: {a} multiplied by {b}",
        "calc {a} × {b}",  # noqa: RUF001
    ],
)
_intent(
    K,
    "movie-rec",
    [
        "recommend a {genre} movie",
        "good {genre} film?",
        "any {genre} movies worth watching?",
        "need a {genre} movie for tonight",
        "suggest me a {genre} flick",
    ],
)
_intent(
    K,
    "fun-fact",
    [
        "fun fact about {animal}?",
        "tell me something cool about {animal}",
        "random {animal} fact pls",
        "give me a fun {animal} fact",
        "whats interesting about {animal}",
    ],
)
_intent(
    K,
    "healthy",
    [
        "is {food} healthy?",
        "{food} good for you?",
        "is eating {food} actually healthy",
        "{food} healthy or nah",
        "how healthy is {food}",
    ],
)
_intent(
    K,
    "capital",
    [
        "capital of {country}?",
        "whats the capital of {country}",
        "{country} capital city?",
        "what city is the capital of {country}",
        "capital city of {country} pls",
    ],
)
_intent(
    K,
    "pet-name",
    [
        "name ideas for my {pet}",
        "good names for a {pet}?",
        "what should I name my {pet}",
        "need a name for my new {pet}",
        "{pet} name suggestions?",
    ],
)
_intent(
    K,
    "rhymes",
    [
        "what rhymes with {rhyme}",
        "words that rhyme with {rhyme}?",
        "rhymes for {rhyme}",
        "anything rhyme with {rhyme}?",
        "gimme rhymes for {rhyme}",
    ],
)
_intent(
    K,
    "songs-like",
    [
        "songs like {artist}?",
        "music similar to {artist}",
        "bands like {artist} pls",
        "if I like {artist} what else should I listen to",
        "artists similar to {artist}?",
    ],
)
_intent(
    K,
    "mass-convert",
    [
        "{kgs} {mass} in {mass2}?",
        "convert {kgs} {mass} to {mass2}",
        "{kgs}{mass} to {mass2}",
        "how many {mass2} is {kgs} {mass}",
        "{kgs} {mass} = ? {mass2}",
    ],
    swaps=(("mass", "mass2", "direction"),),
)
_intent(
    K,
    "translate-word",
    [
        '"{word}" in spanish?',
        'how do u say "{word}" in spanish',
        'spanish word for "{word}"?',
        'translate "{word}" to spanish',
    ],
)

# format instructions -------------------------------------------------------------
F = "format-instructions"
_intent(
    F,
    "json-keys",
    [
        "List {n} {things} as JSON with the keys {fmt_keys}.",
        "Give me {n} {things} in JSON format; each object should have {fmt_keys}.",
        "Return a JSON array of {n} {things}, keys: {fmt_keys}.",
        "I need {n} {things} as JSON objects with fields {fmt_keys}.",
        "Output JSON only: {n} {things}, each with {fmt_keys}.",
    ],
)
_intent(
    F,
    "markdown-table",
    [
        "Make a markdown table of {n} {things} with columns {columns}.",
        "Compare {n} {things} in a markdown table; columns: {columns}.",
        "Create a table in markdown listing {n} {things} with the columns {columns}.",
        "I want {n} {things} in a markdown table with {columns} as columns.",
        "Markdown table, {n} rows of {things}, columns {columns}.",
    ],
)
_intent(
    F,
    "numbered-list",
    [
        "Give me a numbered list of {n} {list_topic}.",
        "List {n} {list_topic}, numbered.",
        "I need {n} {list_topic} as a numbered list.",
        "Write {n} {list_topic} in a numbered list.",
        "Numbered list please: {n} {list_topic}.",
    ],
)
_intent(
    F,
    "explain-shaped",
    [
        "Explain {concept} {shape}.",
        "Can you describe {concept} {shape}?",
        "{Concept}, explained {shape}, please.",
        "I want an explanation of {concept} {shape}.",
        "Describe what {concept} is {shape}.",
    ],
)
_intent(
    F,
    "poem",
    [
        "Write a {poem} about {poem_topic}.",
        "Can you compose a {poem} on {poem_topic}?",
        "I'd love a {poem} about {poem_topic}.",
        "Give me a {poem} whose subject is {poem_topic}.",
        "{poem_topic} - write me a {poem} about it.",
    ],
)
_intent(
    F,
    "list-as-format",
    [
        "Give me {n} {things} formatted as {out_fmt}.",
        "List {n} {things}. Output format: {out_fmt}.",
        "Return {n} {things} as {out_fmt}, nothing else.",
        "I need {n} {things}, and please format them as {out_fmt}.",
        "Output {n} {things} in the form of {out_fmt}.",
    ],
)
_intent(
    F,
    "word-limit",
    [
        "Describe {place} in under {words} words.",
        "Write a description of {place}, max {words} words.",
        "In no more than {words} words, describe {place}.",
        "Paint a picture of {place} using at most {words} words.",
        "Describe {place}. Keep it below {words} words.",
    ],
)
_intent(
    F,
    "yaml-config",
    [
        "Write a Kubernetes YAML for {service} with {replicas} replicas on port {port}.",
        "Give me a k8s deployment YAML: {service}, {replicas} replicas, port {port}.",
        "I need a Kubernetes manifest in YAML for {service} running {replicas} replicas and "
        "exposing port {port}.",
        "Generate the YAML to deploy {service} on Kubernetes with {replicas} replicas, port "
        "{port}.",
        "Kubernetes deployment for {service}: {replicas} replicas, container port {port}. YAML "
        "please.",
    ],
)
_intent(
    F,
    "csv-fake",
    [
        "Generate {rows} rows of fake {entity} data as CSV with columns {columns}.",
        "Give me a CSV of {rows} made-up {entity} records; columns: {columns}.",
        "Create sample {entity} data, {rows} rows, CSV format, with {columns}.",
        "I need {rows} dummy {entity} rows in CSV with the columns {columns}.",
        "CSV only: {rows} fake {entity} entries, columns {columns}.",
    ],
)
_intent(
    F,
    "bullet-summary",
    [
        "Summarize {book} in {n} bullet points.",
        "Give me {n} bullet points summarizing {book}.",
        "{book}: key ideas in {n} bullets.",
        "Break {book} down into {n} bullet points.",
        "Can you sum up {book} as {n} bullet points?",
    ],
)
_intent(
    F,
    "xml-list",
    [
        "Give me {n} {things} as XML with a <{tag}> root element.",
        "Return {n} {things} in XML; the root element should be <{tag}>.",
        "Output XML listing {n} {things}, wrapped in a <{tag}> root.",
        "I need an XML document of {n} {things} whose root tag is <{tag}>.",
        "XML please: {n} {things} under a <{tag}> root element.",
    ],
)
_intent(
    F,
    "one-line-answer",
    [
        "In one sentence, what is {concept}?",
        "Define {concept} in a single sentence.",
        "One sentence only: what's {concept}?",
        "Give me a one-sentence definition of {concept}.",
        "Sum up {concept} in just one sentence.",
    ],
)


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
