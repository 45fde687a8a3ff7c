"""The error-bounded mode on the cache's path: cache/error_bound.py is its pure policy,
this is what feeds it (README "Error-bounded mode").

    Explored     a would-be hit the model answers too: the entry, and the signal it was
                 decided on, to be labelled once the fresh answer is in
    Ledger       a namespace's evidence in the cache store: read it, add a label, write it
                 back; and the signals of the hits served under the bound on this replica,
                 so that a client's bad-hit report can be labelled where it was served
    agree        do the cached and the fresh answers say the same? (pure, given vectors)

The signal is the pair verifier's score of the best candidate the shipped guards pass
(bench/error_bound.py's `gate=guards`): of the variants benched it kept the errors furthest
under the bound. The bound then takes the place of the verifier's fixed threshold.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import numpy as np
import orjson

from cache.entry import CacheEntry, Vector
from cache.error_bound import NO_EVIDENCE, BoundModel, Evidence, update
from cache.store import CacheStore

_log = logging.getLogger("cache.bounded")

# The verifier's score has no floor of its own (the guards screened the candidate) and
# centres mid-scale: the model bench/error_bound.py ran, unchanged.
SIGNAL_MODEL = BoundModel(floor=0.0, centre=0.5)
# Two sampled answers to one question "agree" at this cosine of their MiniLM embeddings.
# Strict on purpose: a comparison that calls a right answer wrong costs hits, one that
# calls a wrong answer right lets the bound leak. 0.9 sits well above what answers on the
# same topic that say different things usually reach with MiniLM (0.6-0.85), and below a
# rewording of one answer (0.93 and up); chosen by judgment, not measured on answer pairs.
AGREE_COSINE = 0.9
_REMEMBERED = 10_000  # served hits whose signal a bad-hit report can still find


@dataclass(frozen=True)
class Explored:
    entry: CacheEntry  # the would-be hit
    signal: float  # the verifier's score it was decided on


class Ledger:
    """The evidence of each namespace, in the store (shared by replicas with Redis)."""

    def __init__(self, store: CacheStore, ttl_s: float) -> None:
        self._store = store
        self._ttl_s = ttl_s
        # One update at a time on this replica; across replicas the later write wins and
        # one label is lost, which only slows the learning.
        self._lock = anyio.Lock()
        self._served: OrderedDict[str, float] = OrderedDict()

    async def evidence(self, namespace: str) -> Evidence:
        """Raises CacheUnavailable."""
        data = await self._store.evidence(namespace)
        if data is None:
            return NO_EVIDENCE
        try:
            return Evidence.from_bytes(data)
        except (ValueError, KeyError, TypeError):  # another version, or damaged: start over
            _log.warning("ignoring unreadable evidence of a cache namespace")
            return NO_EVIDENCE

    async def label(self, namespace: str, signal: float, correct: bool) -> Evidence:
        """Adds one labelled near match to the namespace's evidence. Raises CacheUnavailable."""
        async with self._lock:
            state = update(await self.evidence(namespace), signal, correct, SIGNAL_MODEL)
            await self._store.put_evidence(namespace, state.to_bytes(), self._ttl_s)
        return state

    def served(self, entry_id: str, signal: float) -> None:
        self._served[entry_id] = signal
        self._served.move_to_end(entry_id)
        while len(self._served) > _REMEMBERED:
            self._served.popitem(last=False)

    def served_signal(self, entry_id: str) -> float | None:
        """The signal `entry_id` was last served at under the bound here, or None."""
        return self._served.pop(entry_id, None)


def answer_text(body: bytes) -> str | None:
    """What an answer says, for comparing: each choice's text, refusal or tool calls, in
    order (ids, timestamps and usage differ between two answers that say the same)."""
    try:
        answer = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    choices = answer.get("choices") if isinstance(answer, dict) else None
    if not isinstance(choices, list) or not choices:
        return None
    return "\n".join(_said(choice) for choice in choices)


def agree(cached: str, fresh: str, vectors: Sequence[Vector] | None) -> bool:
    """Exact text when the request is deterministic (no `vectors`), else the cosine of the
    two answers' embeddings (L2-normalised) at or above AGREE_COSINE."""
    if vectors is None or cached == fresh:
        return cached == fresh
    first, second = vectors
    return float(np.dot(first, second)) >= AGREE_COSINE


def _said(choice: Any) -> str:
    if not isinstance(choice, dict):
        return ""
    message = choice.get("message")
    if not isinstance(message, dict):  # a completion
        return str(choice.get("text") or "")
    calls = message.get("tool_calls")
    if isinstance(calls, list) and calls:  # what is called, not the calls' random ids
        named = [c.get("function") if isinstance(c, dict) else c for c in calls]
        return orjson.dumps(named, option=orjson.OPT_SORT_KEYS).decode()
    return str(message.get("content") or message.get("refusal") or "")
