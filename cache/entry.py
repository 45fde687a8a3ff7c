"""A cache entry: one stored answer, and what it is found by."""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Vector = npt.NDArray[np.float32]
_ENTRY_ID = re.compile(r"[0-9a-f]{32}")


def new_entry_id() -> str:
    """Random: a hit's `x-cache-key` says nothing of the prompt, and cannot be guessed."""
    return secrets.token_hex(16)


def is_entry_id(value: str) -> bool:
    return _ENTRY_ID.fullmatch(value) is not None


@dataclass(frozen=True)
class CacheEntry:
    entry_id: str  # new_entry_id(): random hex, unique across replicas
    namespace: str  # opaque partition key from cache/policy.py: tenant (or shared group),
    # model and a hash of everything but the last user turn; never chosen by a client
    prompt: str  # the final user message: the only text that is embedded
    exact_key: str  # tier 1: hash of the canonical request
    normalized_key: str  # tier 2: hash of namespace + strictly normalised prompt
    vector: Vector  # float32, L2-normalised sentence embedding of `prompt`
    features: bytes  # what the pair verifier needs of `prompt` (opaque, cache/verifier.py)
    response: bytes  # the upstream's complete non-streamed JSON answer
    model: str
    tenant: str
    created_at: float  # unix seconds
    ttl_s: float

    def expired(self, now: float) -> bool:
        return now >= self.created_at + self.ttl_s
