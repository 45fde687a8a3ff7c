"""The semantic cache's orchestration: look a key up through the tiers within a budget,
store complete answers in the background. Free of HTTP: `gateway/cache_http.py` turns
what it finds into responses and headers.

    lookup(key, delta)        exact key, then normalized key, then (when the key allows it)
                              embedding similarity verified by the decision rules, or,
                              with an error bound `delta`, served, explored or missed as
                              the namespace's evidence says (cache/bounded.py)
    store_later(...)          in the owner's task group, never on the request path; until
                              it is stored, the answer is served to an identical request
                              from memory (a client repeating a request at once hits)
    record_hit_later(entry)   likewise
    judge_later(explored, a)  an explored lookup's fresh answer: compare it with the entry's,
                              label the namespace's evidence, store it if they differ
    delete(entry_id, tenants) one entry, on every replica (the store tells the others)
    report_bad_hit(...)       a client says a hit was wrong: delete it, label the evidence
                              when it was served under a bound, tell the `on_bad_hit` hook

Lookups fail open: past `budget_s`, when the embedder is too busy to embed the prompt
within what is left of it (cache/batching.py), or when the store or the embedder fails,
`Lookup.failed` says why and the request goes to the model. `NullCache` is the disabled
cache: every lookup misses, nothing is stored.

Over 400 lines: the lookup through the tiers within one budget, the store behind it and
the judging of explored answers are one orchestration over the same store, embedder, budget
and work under way (cache/in_flight.py); what each step decides lives in its own module
(cache/decision.py, bounded.py, batching.py, scoring.py).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import anyio
import numpy as np
import orjson
from anyio.abc import TaskGroup

from cache import error_bound
from cache.batching import EmbedderBusy
from cache.bounded import SIGNAL_MODEL, Explored, Ledger, agree, answer_text
from cache.entry import CacheEntry, new_entry_id
from cache.in_flight import InFlight
from cache.lateness import Lateness
from cache.policy import CacheKey
from cache.scoring import BatchingScorer, PairScorer
from cache.store import CacheStore, CacheUnavailable

if TYPE_CHECKING:  # the model-backed parts load only when the cache is enabled
    from cache.batching import BatchingEmbedder
    from cache.decision import Decision, DecisionSettings, Scoring, Verifier
    from cache.embedder import Embedded

_log = logging.getLogger("cache.semantic")
_STORE_TIMEOUT_S = 10.0
# The share of the budget the pair model's second opinion leaves for the rest of a lookup.
_PAIR_MODEL_MARGIN = 0.1
_AFTER_EMBED_HALF_LIFE_S = 1.0  # the search and decision time reserved halves each second
_NO_VECTOR = np.zeros(0, dtype=np.float32)  # a pending entry's, until it is embedded

# (stage, seconds): "embed", "search", "pair_model", "pair_model_late", "total", and
# "shared" (a lookup answered by an identical one in flight: how long it waited)
StageHook = Callable[[str, float], None]
FailHook = Callable[[str], None]  # why a lookup or store failed open
ExploreHook = Callable[[str, str], None]  # (tenant, "agreed" | "disagreed" | "unjudged")


@dataclass(frozen=True)
class Found:
    entry: CacheEntry
    tier: str  # "exact", "normalized", "semantic"
    similarity: float


class LookupFailure(StrEnum):
    """Why a lookup failed open: the request goes to the model as if it had missed."""

    BUDGET = "budget"  # the lookup's time budget ran out
    EMBEDDER_BUSY = "embedder_busy"  # the embedder would not reach it within the budget
    STORE = "store"  # the cache's store was out of reach
    ERROR = "error"  # anything else that went wrong


@dataclass(frozen=True)
class Lookup:
    """What one lookup found, or why not."""

    found: Found | None = None
    similarity: float | None = None  # the hit's, or the best the semantic tier saw
    embedded: Embedded | None = None  # the prompt's embedding, reused when storing
    failed: LookupFailure | None = None  # why it failed open
    # why a completed lookup missed: "no_entry" (exact tiers only), "no_candidate" (nothing
    # similar enough), "refused:<rule>" (the decision refused the best candidate),
    # "explore" (under an error bound: the model answers, and is compared with `explored`)
    reason: str | None = None
    explored: Explored | None = None

    @property
    def missed(self) -> bool:
        """It ran and found nothing to serve, so a lookup of the same key now would miss
        too; not "explore", which found a candidate a later draw may serve."""
        return self.reason is not None and self.reason != "explore"


@dataclass(frozen=True)
class BadHit:
    """A hit a client reported wrong, after its entry was deleted: no prompt text."""

    entry_id: str
    namespace: str
    model: str
    tenant: str  # who reported it (a member of the entry's scope)
    stored_for: str  # the tenant the entry was stored for
    at: float  # unix seconds
    # a "wrong" label was added to the namespace's evidence: the entry was served under an
    # error bound on this replica, at a signal it remembers
    labelled: bool = False


BadHitHook = Callable[[BadHit], None]


@dataclass(frozen=True)
class Answer:
    """A complete answer to store, with the identity it is stored under."""

    key: CacheKey
    tenant: str
    model: str
    body: bytes
    embedded: Embedded | None = None


class SemanticCache:
    enabled = True

    def __init__(
        self,
        store: CacheStore,
        embedder: BatchingEmbedder,
        verifier: PairScorer | None,
        decision: DecisionSettings,
        tasks: TaskGroup,
        *,
        pair_model: Verifier | None = None,
        budget_s: float,
        ttl_s: float,
        semantic: bool = True,
        on_stage: StageHook | None = None,
        on_fail: FailHook | None = None,
        on_bad_hit: BadHitHook | None = None,
        on_explored: ExploreHook | None = None,
        rng: error_bound.Uniform | None = None,
        in_flight: InFlight[Lookup, Any] | None = None,
    ) -> None:
        self._store = store
        self._embedder = embedder
        # Lookups resumed by one embedder pass share one verifier pass (cache/scoring.py).
        self._scorer = BatchingScorer(verifier) if verifier is not None else None
        self._pair_model = pair_model
        # One pair-model pass at a time, in a worker thread: 3-4 ms a pair of numpy, which
        # on the event loop would hold up every request behind it.
        self._pair_model_slot = anyio.CapacityLimiter(1)
        self._decision = decision
        self._tasks = tasks
        self._budget_s = budget_s
        self._lateness = Lateness(budget_s)  # the budget's timer, early on a late loop
        self._ttl_s = ttl_s
        self._semantic = semantic
        self._on_stage = on_stage or (lambda stage, seconds: None)
        self._on_fail = on_fail or (lambda reason: None)
        self._on_bad_hit = on_bad_hit or (lambda hit: None)
        self._on_explored = on_explored or (lambda tenant, outcome: None)
        # The error-bounded mode's draws (compose passes one): nothing secret rides on them.
        self._rng = rng or random.Random()  # noqa: S311
        self._ledger = Ledger(store, ttl_s)
        # Lookups and stores under way, by exact key; shared with the flights (compose).
        self._in_flight: InFlight[Lookup, Any] = in_flight or InFlight()
        self._after_embed_s = 0.0  # recent search and decision time (see _after_embed)
        self._after_embed_at = 0.0  # when it was last measured (perf_counter)
        self._deleted: set[str] = set()  # ids of pending answers deleted before stored

    def lookup_timer_s(self) -> float:
        """The timer a lookup starting now gets: the budget less the margin a late event
        loop has made it keep (cache/lateness.py)."""
        return self._lateness.timer_s

    async def lookup(self, key: CacheKey, delta: float | None = None) -> Lookup:
        """`delta`: the tenant's error bound on semantic hits; None: the fixed decision."""
        pending = self._in_flight.storing(key.exact_key)
        if pending is not None:
            return Lookup(Found(pending, "exact", 1.0), 1.0)
        started = time.perf_counter()
        timer_s = self._lateness.timer_s
        if delta is None:
            found = await self._shared(key, started, timer_s)
        else:  # each draws its own exploration: never shared
            found = await self._within(key, started, timer_s, delta)
        ended = time.perf_counter()
        if _semantic_or_failed(found):  # the lookups the timer is for
            self._lateness.ended(ended - started)
        if found.failed is None:
            self._on_stage("total", ended - started)
        return found

    async def _shared(self, key: CacheKey, started: float, timer_s: float) -> Lookup:
        """The lookup of `key`, or the result of an identical one in flight: requests with
        the same exact key (scope, model, every field that changes the answer, prompt)
        would find the same, so the ones that come while a lookup runs wait for it within
        their own timer instead of embedding the prompt again. As gateway/coalesce.py
        shares a miss's upstream call, one stage later. A lookup whose first request left
        (cancelled, no result) is done again by the next, within the time it has left."""
        looking = self._in_flight.lookup(key.exact_key)
        if looking is None:
            looking = self._in_flight.begin_lookup(key.exact_key)
            try:
                looking.result = await self._within(key, started, timer_s, None)
                return looking.result
            finally:
                self._in_flight.end_lookup(key.exact_key, looking)
        with anyio.move_on_after(started + timer_s - time.perf_counter()):
            await looking.done.wait()
        now = time.perf_counter()
        if looking.result is not None:
            self._on_stage("shared", now - started)
            return looking.result
        if now >= started + timer_s:
            return Lookup(failed=LookupFailure.BUDGET)
        return await self._shared(key, now, started + timer_s - now)

    async def _within(
        self, key: CacheKey, started: float, timer_s: float, delta: float | None
    ) -> Lookup:
        """The lookup, failed open past `timer_s`: the budget less the margin a late event
        loop has made it keep (cache/lateness.py), so that the caller resumes within it."""
        try:
            with anyio.fail_after(timer_s):
                return await self._find(key, started + timer_s, delta)
        except TimeoutError:
            return Lookup(failed=LookupFailure.BUDGET)
        except EmbedderBusy:
            return Lookup(failed=LookupFailure.EMBEDDER_BUSY)
        except CacheUnavailable:
            return Lookup(failed=LookupFailure.STORE)
        except Exception:
            _log.exception("cache lookup failed; answering from the model")
            return Lookup(failed=LookupFailure.ERROR)

    def store_later(self, answer: Answer) -> None:
        if not _storable(answer.body):
            return
        entry = self._entry(answer, answer.embedded)
        self._in_flight.store(entry)
        self._tasks.start_soon(self._store_answer, answer, entry)

    def judge_later(self, explored: Explored, answer: Answer, deterministic: bool) -> None:
        """Labels the namespace's evidence with whether `answer` (the model's, to an
        explored lookup) says what `explored`'s entry says: the same text when the request
        is `deterministic`, else answers whose embeddings are close (cache/bounded.py).
        A differing answer is stored as a new entry."""
        self._tasks.start_soon(self._judge, explored, answer, deterministic)

    def record_hit_later(self, entry_id: str) -> None:
        # A hit on an answer still being stored counts if the store is done by then; the
        # stores ignore an id they do not hold.
        self._tasks.start_soon(self._record_hit, entry_id)

    async def flush(self, tenants: Collection[str]) -> tuple[int, int]:
        return await flush_tenants(self._store, tenants)

    async def delete(
        self, entry_id: str, tenants: Collection[str] | None = None
    ) -> CacheEntry | None:
        """Removes one entry from every replica; the entry, or None when there is none or
        it was stored for none of `tenants` (None: anyone's, as the admin API asks), so
        that another scope's id reads as unknown. Raises CacheUnavailable."""
        pending = self._in_flight.storing_id(entry_id)
        entry = pending or await self._store.entry(entry_id)
        if entry is None or (tenants is not None and entry.tenant not in tenants):
            return None
        if pending is not None:  # not stored yet: _store_answer deletes it once it is
            self._in_flight.stored(pending)
            self._deleted.add(entry_id)
        await self._store.delete(entry_id)
        return entry

    async def report_bad_hit(
        self, entry_id: str, tenant: str, tenants: Collection[str]
    ) -> CacheEntry | None:
        """`tenant` says the hit on `entry_id` was wrong: deletes the entry (as `delete`
        with `tenants`, its cache scope's members) and feeds `on_bad_hit`."""
        entry = await self.delete(entry_id, tenants)
        if entry is not None:
            labelled = await self._label_bad_hit(entry)
            at = time.time()
            hit = BadHit(entry_id, entry.namespace, entry.model, tenant, entry.tenant, at, labelled)
            self._on_bad_hit(hit)
        return entry

    async def _label_bad_hit(self, entry: CacheEntry) -> bool:
        """A wrong label at the signal the entry was served at under a bound, if this
        replica served it so. Otherwise (served by the fixed rules or an exact tier, by
        another replica, or long ago) the signal is unknown and no label is made up: the
        report is counted unlabelled. Reports only ever say "wrong", so these labels lean
        the evidence toward refusing, never toward serving."""
        signal = self._ledger.served_signal(entry.entry_id)
        if signal is None:
            return False
        try:
            await self._ledger.label(entry.namespace, signal, False)
        except CacheUnavailable:
            self._on_fail("evidence")
            return False
        return True

    async def _find(self, key: CacheKey, deadline: float, delta: float | None) -> Lookup:
        for tier, lookup_key in (("exact", key.exact_key), ("normalized", key.normalized_key)):
            entry = await self._store.get_by_key(key.namespace, lookup_key)
            if entry is not None:
                return Lookup(Found(entry, tier, 1.0), 1.0)
        if not (self._semantic and key.semantic):
            return Lookup(reason="no_entry")
        return await self._nearest(key, deadline, delta)

    async def _nearest(self, key: CacheKey, deadline: float, delta: float | None) -> Lookup:
        from cache.decision import Candidate, Decision, conclude, prepare

        started = time.perf_counter()
        # The embedding must leave the search and the decision their time in the budget.
        within = max(0.0, deadline - started - self._reserved_after_embed(started))
        embedded = await self._embedder.embed(key.prompt, within)
        searched = time.perf_counter()
        self._on_stage("embed", searched - started)
        decision = self._decision
        near = await self._store.nearest(
            key.namespace, embedded.vector, decision.top_k, decision.similarity_floor
        )
        self._on_stage("search", time.perf_counter() - searched)
        best = max((score for _, score in near), default=None)
        candidates = [Candidate(e.prompt, e.features, score) for e, score in near]
        if delta is not None:  # the bound takes the verifier threshold's place
            decision = replace(decision, verifier_threshold=0.0, unexplained_threshold=0.0)
        scorer = self._scorer
        decided = prepare(key.prompt, embedded, candidates, decision, scorer is not None)
        opinion_s = 0.0  # the pair model's time: bounded by its own timer, not reserved
        if not isinstance(decided, Decision):  # scores wanted: prepare() saw a scorer
            assert scorer is not None
            asked = decided.features()
            scores = await scorer.score_many(decided.query, asked) if asked else []
            step, decided = decided, conclude(decided, scores, decision, scorer.threshold)
            if delta is None:  # the bound learns the verifier's signal: no second opinion
                opinion_started = time.perf_counter()
                decided = await self._second_opinion(step, decided, decision, deadline)
                opinion_s = time.perf_counter() - opinion_started
        if decided.index is None:
            looked = Lookup(None, best, embedded, reason=_miss_reason(decided.reason))
        else:
            entry, similarity = near[decided.index]
            looked = Lookup(Found(entry, "semantic", similarity), similarity, embedded)
            if delta is not None and decided.tier == "semantic":  # normalised: no bound
                looked = await self._bounded(looked, decided.verifier_score or 0.0, delta)
        ended = time.perf_counter()
        self._after_embed(ended - searched - opinion_s, ended)  # the evidence's read included
        return looked

    async def _second_opinion(
        self, step: Scoring, decided: Decision, settings: DecisionSettings, deadline: float
    ) -> Decision:
        """`decided`, or the pair model's hit (cache/decision.py). Only within the budget's
        time left, less a margin for the rest of the lookup: past it the verifier's miss
        stands (a miss answered by the model, and stored, not a failed-open lookup)."""
        from cache.decision import reconsider

        chosen = step.second_opinion(decided)
        model = self._pair_model
        if chosen is None or model is None:
            return decided
        started = time.perf_counter()
        features = step.candidates[chosen].features
        with anyio.move_on_after(deadline - started - self._budget_s * _PAIR_MODEL_MARGIN):
            score = await anyio.to_thread.run_sync(
                model.score_many,
                step.query,
                [features],
                limiter=self._pair_model_slot,
                abandon_on_cancel=True,
            )
            self._on_stage("pair_model", time.perf_counter() - started)
            return reconsider(step, decided, score[0], settings, model.threshold)
        self._on_stage("pair_model_late", time.perf_counter() - started)
        return decided

    async def _bounded(self, found: Lookup, signal: float, delta: float) -> Lookup:
        """Serves the would-be hit, or explores it, as the namespace's evidence says."""
        assert found.found is not None
        entry = found.found.entry
        state = await self._ledger.evidence(entry.namespace)
        action = error_bound.decide(state, signal, delta, self._rng, SIGNAL_MODEL)
        if action == "serve":
            self._ledger.served(entry.entry_id, signal)  # for a bad-hit report's label
            return found
        if action == "miss":  # below the model's floor (none with the verifier's signal)
            return replace(found, found=None, reason="no_candidate")
        return replace(found, found=None, reason="explore", explored=Explored(entry, signal))

    async def _judge(self, explored: Explored, answer: Answer, deterministic: bool) -> None:
        outcome = "unjudged"
        try:
            with anyio.fail_after(_STORE_TIMEOUT_S):
                correct = await self._agrees(explored.entry.response, answer.body, deterministic)
                if correct is not None:
                    await self._ledger.label(answer.key.namespace, explored.signal, correct)
                    outcome = "agreed" if correct else "disagreed"
        except (TimeoutError, CacheUnavailable):
            self._on_fail("evidence")
        except Exception:
            _log.exception("comparing an explored answer failed")
            self._on_fail("evidence_error")
        self._on_explored(answer.tenant, outcome)
        # An agreeing answer is the entry's again: a second entry would only crowd the
        # namespace, and the rewording's next ask adds evidence again.
        if outcome != "agreed":
            self.store_later(answer)

    async def _agrees(self, cached: bytes, fresh: bytes, deterministic: bool) -> bool | None:
        """None when either answer has nothing to compare."""
        first, second = answer_text(cached), answer_text(fresh)
        if first is None or second is None:
            return None
        vectors = None
        if not deterministic and first != second:  # embedded off the loop, behind lookups
            vectors = [(await self._embedder.embed(text)).vector for text in (first, second)]
        return agree(first, second, vectors)

    def _after_embed(self, seconds: float, now: float) -> None:
        """Keeps an upper estimate of the search and decision time: the longest recent."""
        self._after_embed_s = max(seconds, self._decayed_after_embed(now))
        self._after_embed_at = now

    def _decayed_after_embed(self, now: float) -> float:
        age = max(0.0, now - self._after_embed_at)
        return self._after_embed_s * float(0.5 ** (age / _AFTER_EMBED_HALF_LIFE_S))

    def _reserved_after_embed(self, now: float) -> float:
        """What the embedding leaves of the budget for the search and decision. It falls
        with time, not per lookup, and is at most half the budget: only admitted lookups
        measure it, so an estimate that a burst made too high (an event loop busy with a
        flood of failed-open requests resumes each step late) would otherwise have the
        embedder refuse nearly every lookup, none of which would ever lower it (measured:
        3 of 64 rewordings served at concurrency 4 after such a burst)."""
        return min(self._decayed_after_embed(now), self._budget_s / 2)

    async def _record_hit(self, entry_id: str) -> None:
        try:
            await self._store.record_hit(entry_id)
        except CacheUnavailable:
            self._on_fail("record_hit")

    async def _store_answer(self, answer: Answer, entry: CacheEntry) -> None:
        try:
            with anyio.fail_after(_STORE_TIMEOUT_S):
                if answer.embedded is None:
                    embedded = await self._embedder.embed(answer.key.prompt)
                    entry = replace(entry, vector=embedded.vector, features=embedded.features)
                await self._store.put(entry)
                if entry.entry_id in self._deleted:  # reported bad while being stored
                    await self._store.delete(entry.entry_id)
        except (TimeoutError, CacheUnavailable):
            self._on_fail("store")
        except Exception:
            _log.exception("cache store failed")
            self._on_fail("store_error")
        finally:
            self._deleted.discard(entry.entry_id)
            self._in_flight.stored(entry)

    def _entry(self, answer: Answer, embedded: Embedded | None) -> CacheEntry:
        """The entry to store; its vector comes later when the lookup embedded nothing."""
        key = answer.key
        return CacheEntry(
            entry_id=new_entry_id(),
            namespace=key.namespace,
            prompt=key.prompt,
            exact_key=key.exact_key,
            normalized_key=key.normalized_key,
            vector=embedded.vector if embedded is not None else _NO_VECTOR,
            features=embedded.features if embedded is not None else b"",
            response=answer.body,
            model=answer.model,
            tenant=answer.tenant,
            created_at=time.time(),
            ttl_s=self._ttl_s,
        )


class NullCache:
    """The cache turned off: nothing is looked up or stored."""

    enabled = False

    async def lookup(self, key: CacheKey, delta: float | None = None) -> Lookup:
        return Lookup()

    def store_later(self, answer: Answer) -> None:
        pass

    def judge_later(self, explored: Explored, answer: Answer, deterministic: bool) -> None:
        pass

    def record_hit_later(self, entry_id: str) -> None:
        pass

    async def flush(self, tenants: Collection[str]) -> tuple[int, int]:
        return 0, 0

    async def delete(
        self, entry_id: str, tenants: Collection[str] | None = None
    ) -> CacheEntry | None:
        return None

    async def report_bad_hit(
        self, entry_id: str, tenant: str, tenants: Collection[str]
    ) -> CacheEntry | None:
        return None


AnswerCache = SemanticCache | NullCache


async def flush_tenants(store: CacheStore, tenants: Collection[str]) -> tuple[int, int]:
    """Drops every namespace holding an entry stored for one of `tenants` (a tenant's own
    scope, or all members of its cache group); (namespaces, entries) removed.
    Raises CacheUnavailable."""
    namespaces = await store.namespaces_of(tenants)
    removed = 0
    for namespace in sorted(namespaces):
        removed += await store.flush_namespace(namespace)
    return len(namespaces), removed


def _miss_reason(decision: str) -> str:
    if decision in ("no_candidates", "below_floor"):
        return "no_candidate"
    return f"refused:{decision}"


def _storable(body: bytes) -> bool:
    """Only complete answers: no errors, every choice finished with text, a refusal, or
    (the request's tools being ones the operator declared cacheable) tool calls."""
    try:
        answer = orjson.loads(body)
    except orjson.JSONDecodeError:
        return False
    choices = answer.get("choices") if isinstance(answer, dict) else None
    if not isinstance(choices, list) or not choices or "error" in answer:
        return False
    return all(_finished(choice) for choice in choices)


def _finished(choice: Any) -> bool:
    if not isinstance(choice, dict):
        return False
    message, finish = choice.get("message"), choice.get("finish_reason")
    if not isinstance(message, dict):  # a completion
        return isinstance(choice.get("text"), str) and finish in ("stop", "length")
    calls = message.get("tool_calls")
    if calls:
        return finish == "tool_calls" and isinstance(calls, list) and all(map(_whole_call, calls))
    said = message.get("content"), message.get("refusal")
    return any(isinstance(text, str) for text in said) and finish in ("stop", "length")


def _whole_call(call: Any) -> bool:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        return False
    return isinstance(function.get("name"), str) and isinstance(function.get("arguments"), str)


def _semantic_or_failed(found: Lookup) -> bool:
    """Whether a lookup reached the semantic tier (or failed open on the way): the exact
    tiers' answers take microseconds, and counted, a stream of them would have the budget's
    timer (cache/lateness.py) let the semantic lookups run late."""
    if found.found is not None:
        return found.found.tier == "semantic"
    return found.reason != "no_entry"
