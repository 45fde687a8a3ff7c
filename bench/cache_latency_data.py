"""Prompts and pre-filled cache snapshots for bench/cache_latency.py.

Real prompts: "How do I <task> in <language>?" for a few dozen programming tasks and
languages. They are stored through the gateway (real misses), and asked again with the
same words (exact hits) or reworded ("How can I ...?", "In <language>, how do I ...?"):
the rewordings the decision accepts are the semantic hits.

Filler entries bring a namespace to 10k or 100k entries without embedding that many
prompts (100k forward passes would take hours on this CPU): synthetic prompts with random
unit vectors. A random 384-d unit vector has a cosine of about N(0, 0.05) with any real
prompt's, far below the 0.80 similarity floor, so a filler is never a candidate; it costs
what an entry costs in the index (a flat search scans it, an HNSW graph holds it), in
memory and in the snapshot. Their token features are random too, of a realistic size
(`filler_features(12)`: 12 word pieces, about 9 KB, like the real prompts here) where the
gateway keeps them, since it rewrites its whole snapshot file while hits keep the store
dirty; or one word piece (`filler_features(1)`) for the in-process store, which never
writes one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from cache.codec import StoredEntry, read_snapshot, write_snapshot
from cache.embedder import Embedded
from cache.entry import CacheEntry
from cache.features import TokenFeatures
from cache.policy import CacheInputs, cache_key

TENANT = "bench"
MODEL = "echo"
FILLER_PREFIX = "filler question "

TASKS = [
    "reverse a list",
    "sort a list of numbers",
    "read a file line by line",
    "parse a JSON string",
    "remove duplicates from an array",
    "merge two dictionaries",
    "convert a string to an integer",
    "check whether a file exists",
    "split a string on commas",
    "get the current date and time",
    "make an HTTP GET request",
    "write text to a file",
    "create a new directory",
    "generate a random number",
    "measure how long a function takes",
    "read environment variables",
    "start a background thread",
    "format a number with two decimals",
    "find the length of a string",
    "iterate over the keys of a map",
    "catch an exception",
    "define a constant",
    "concatenate two strings",
    "round a float to the nearest integer",
    "count the words in a sentence",
]
LANGUAGES = ["Python", "JavaScript", "Go", "Rust", "Java", "Ruby", "C#", "Kotlin"]
# Rewordings of "How do I {task} in {language}?"; the decision accepts most of them.
REWORDINGS = [
    "How can I {task} in {language}?",
    "In {language}, how do I {task}?",
    "How do you {task} in {language}?",
]


def stored_prompt(task: str, language: str) -> str:
    return f"How do I {task} in {language}?"


def real_prompts(count: int) -> list[tuple[str, list[str]]]:
    """`count` stored prompts, each with its rewordings (spread over tasks and languages)."""
    pairs = [(t, lang) for lang in LANGUAGES for t in TASKS]
    if count > len(pairs):
        raise ValueError(f"at most {len(pairs)} real prompts")
    step = len(pairs) / count
    chosen = [pairs[int(i * step)] for i in range(count)]
    return [
        (stored_prompt(t, lang), [r.format(task=t, language=lang) for r in REWORDINGS])
        for t, lang in chosen
    ]


def chat_body(prompt: str) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": prompt}]}


def namespace() -> str:
    """The namespace the gateway gives these requests: computed as gateway/cache_http.py
    does (scope `tenant:<name>`, no cache group). The benchmark checks it with an exact hit
    on a filler entry."""
    key = cache_key(f"tenant:{TENANT}", MODEL, CacheInputs.of("chat", chat_body("x")))
    assert key is not None
    return key.namespace


def filler_features(tokens: int, dim: int = 384, seed: int = 7) -> bytes:
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, 30000, tokens).astype(np.uint16)
    ids[0], ids[-1] = 101, 102  # [CLS] ... [SEP], as the model's would be
    vectors = rng.standard_normal((tokens, dim)).astype(np.float16)
    return TokenFeatures(ids, vectors, False).to_bytes()


def answer_body(prompt: str) -> bytes:
    """An answer shaped like the fake upstream's (an echo of the prompt)."""
    content = f"echo: {prompt}"
    return orjson.dumps(
        {
            "id": "fake-1",
            "object": "chat.completion",
            "created": 0,
            "model": MODEL,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 9, "completion_tokens": 9, "total_tokens": 18},
        }
    )


_filler_keys: list[tuple[str, str, str]] = []  # (prompt, exact_key, normalized_key)


def filler_keys(count: int) -> list[tuple[str, str, str]]:
    """The fillers' prompts and keys, computed once (normalising 100k prompts takes ~10 s)."""
    ns = namespace()
    for i in range(len(_filler_keys), count):
        prompt = filler_prompt(i)
        key = cache_key(f"tenant:{TENANT}", MODEL, CacheInputs.of("chat", chat_body(prompt)))
        assert key is not None and key.namespace == ns
        _filler_keys.append((prompt, key.exact_key, key.normalized_key))
    return _filler_keys[:count]


def filler_entries(
    count: int, features: bytes, dim: int = 384, seed: int = 1
) -> Iterable[StoredEntry]:
    ns = namespace()
    keys = filler_keys(count)
    rng = np.random.default_rng(seed)
    created = time.time() - 60.0
    chunk = 8192
    for start in range(0, count, chunk):
        n = min(chunk, count - start)
        vectors = rng.standard_normal((n, dim), dtype=np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        for row in range(n):
            i = start + row
            yield _stored(f"f{seed:07x}{i:024x}", ns, keys[i], vectors[row], features, created)


def _stored(
    entry_id: str,
    namespace: str,
    keyed: tuple[str, str, str],  # prompt, exact key, normalized key (as filler_keys)
    vector: npt.NDArray[np.float32],
    features: bytes,
    created: float,
) -> StoredEntry:
    """An entry as the gateway stores an echo answer, never hit."""
    prompt, exact_key, normalized_key = keyed
    entry = CacheEntry(
        entry_id=entry_id,
        namespace=namespace,
        prompt=prompt,
        exact_key=exact_key,
        normalized_key=normalized_key,
        vector=vector,
        features=features,
        response=answer_body(prompt),
        model=MODEL,
        tenant=TENANT,
        created_at=created,
        ttl_s=7 * 86400.0,
    )
    return StoredEntry(entry, 0.0, 0)


def filler_prompt(i: int) -> str:
    return f"{FILLER_PREFIX}{i:06d}: what does setting {i % 997} of module {i // 997} do?"


def embedded_entries(
    embed: Callable[[list[str]], list[Embedded]], prompts: list[str]
) -> list[StoredEntry]:
    """`prompts` stored as the gateway would store them, embedded by `embed` (for the
    in-process store, which has no gateway to store them through)."""
    created = time.time() - 60.0
    stored = []
    for i, (prompt, embedded) in enumerate(zip(prompts, embed(prompts), strict=True)):
        key = cache_key(f"tenant:{TENANT}", MODEL, CacheInputs.of("chat", chat_body(prompt)))
        assert key is not None
        keyed = (prompt, key.exact_key, key.normalized_key)
        entry_id = f"e{i:031x}"
        stored.append(
            _stored(entry_id, key.namespace, keyed, embedded.vector, embedded.features, created)
        )
    return stored


def real_entries(snapshot: Path, dim: int = 384) -> list[StoredEntry]:
    """The entries a gateway stored through real requests (all but the fillers)."""
    return [s for s in read_snapshot(snapshot, dim) if not s.entry.prompt.startswith(FILLER_PREFIX)]


def write_namespace(
    path: Path, total: int, real: list[StoredEntry], filler_tokens: int, dim: int = 384
) -> None:
    """A snapshot holding `real` and enough fillers for `total` entries in the namespace."""
    fillers = filler_entries(max(0, total - len(real)), filler_features(filler_tokens, dim), dim)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_snapshot(path, dim, [*real, *fillers])
