"""Which replica a request would rather go to: the one whose engine already holds its
prompt's prefix in its KV cache.

    key = affinity_key(headers, fields)          # None: no preference
    home = choose(candidates, key, load_bound(in_flight))   # None: each is too busy

A key names a session or a prefix, in this order: a session header the client sends
(`x-session-id`, `session_id` as Codex sends it, `x-claude-code-session-id`), OpenAI's
`prompt_cache_key` body field, the body's `user` (Anthropic's `metadata.user_id`, which
Claude Code fills per session), else the prompt's start (its first two messages, or a
completion prompt's first characters): the turns of one conversation share it.

Replicas are ranked per key by rendezvous hashing (highest random weight): each key has
its own order of replicas, a replica that leaves moves only its own keys, and one that
joins takes a fair share. The request goes to the first in its key's order that is not
loaded past `LOAD_BOUND` times the mean (consistent hashing with bounded loads, Mirrokni,
Thorup and Zadimoghaddam 2018) and has headroom under its learned limit: a hot session
spills to the next replica instead of overloading its own. Without one, the caller falls
back to the replica with the most headroom.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import orjson

SESSION_HEADERS = ("x-session-id", "session_id", "x-claude-code-session-id")
LOAD_BOUND = 1.25  # a replica takes its keys while at most 25% above the mean in flight
PREFIX_CHARS = 4096  # of the first two messages (or the prompt): what the turns share


class Candidate(Protocol):
    id: str
    in_flight: int

    def has_headroom(self) -> bool: ...


def affinity_key(headers: Mapping[str, str], fields: Mapping[str, Any]) -> str:
    """The session or prefix a request belongs to, hashed with its model."""
    session = next((headers[h] for h in SESSION_HEADERS if headers.get(h)), None)
    for value in (session, fields.get("prompt_cache_key"), fields.get("user")):
        if isinstance(value, str) and value:
            return _digest(fields.get("model"), "session", value)
    return _digest(fields.get("model"), "prefix", _prefix(fields))


def load_bound(in_flight: Sequence[int]) -> int:
    """The most requests a replica may hold to take one more of its keys: `LOAD_BOUND`
    times the mean over every replica, this request counted."""
    return math.ceil(LOAD_BOUND * (sum(in_flight) + 1) / max(1, len(in_flight)))


def choose(candidates: Sequence[Candidate], key: str, bound: int) -> Candidate | None:
    """The first replica in `key`'s order within `bound` and with headroom."""
    for candidate in sorted(candidates, key=lambda c: _weight(key, c.id), reverse=True):
        if candidate.in_flight + 1 <= bound and candidate.has_headroom():
            return candidate
    return None


def _prefix(fields: Mapping[str, Any]) -> str:
    messages = fields.get("messages")
    if isinstance(messages, list):
        return orjson.dumps(messages[:2]).decode()[:PREFIX_CHARS]
    return str(fields.get("prompt") or fields.get("input") or "")[:PREFIX_CHARS]


def _digest(model: Any, kind: str, value: str) -> str:
    text = f"{model}\x00{kind}\x00{value}"
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def _weight(key: str, replica: str) -> int:
    digest = hashlib.blake2b(f"{key}\x00{replica}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")
