"""The semantic cache on the request path, as HTTP: which requests probe it, hits as
responses (whole or replayed as SSE), the `x-cache` headers, a client's report of a bad
hit (`POST /v1/cache/feedback` with the hit's `x-cache-key`), and the cache metrics.
What is looked up and stored, and how, is `cache.semantic`'s.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import orjson
from starlette.responses import Response

from cache.entry import CacheEntry, is_entry_id
from cache.policy import CacheKey, Mode, PolicySettings, cache_key, mode_for
from cache.semantic import Answer, AnswerCache, Found, Lookup, LookupFailure
from cache.sse import StreamRecorder, replay
from cache.store import CacheUnavailable
from gateway.errors import BadRequest, CacheEntryNotFound, StateUnavailable
from gateway.metrics import Metrics
from gateway.openai_schema import OpenAIRequest
from gateway.settings import Tenant


class CacheOutcome(StrEnum):
    """What the cache did for one request, as its report event and trace record it."""

    EXACT = "exact"  # a hit, by tier
    NORMALIZED = "normalized"
    SEMANTIC = "semantic"
    MISS = "miss"  # looked up, found nothing to serve
    BYPASS = "bypass"  # cacheable, but the client's Cache-Control kept it out
    COALESCED = "coalesced"  # answered by an identical request's upstream call
    NONE = "none"  # not cacheable, or no cache
    REPORTED = "reported"  # a client's report of a bad hit (`POST /v1/cache/feedback`)


@dataclass
class Probe:
    """One request's cache identity, and what its lookup found (for its report event)."""

    mode: Mode
    key: CacheKey
    tenant: str
    model: str
    kind: str
    include_usage: bool
    delta: float | None = None  # the tenant's error bound on semantic hits, if it opted in
    deterministic: bool = False  # temperature 0 or a seed: answers compare as text
    lookup: Lookup = field(default_factory=Lookup)
    waited_s: float = 0.0  # how long the request waited on the lookup
    outcome: CacheOutcome = CacheOutcome.MISS  # then what a hit saved
    saved_prompt_tokens: int = 0
    saved_completion_tokens: int = 0

    @property
    def similarity(self) -> float | None:
        return self.lookup.similarity

    @property
    def miss_reason(self) -> str | None:
        """Why a lookup missed: its failure ("budget", "store", "error") or its reason."""
        if self.outcome is not CacheOutcome.MISS:
            return None
        return self.lookup.failed or self.lookup.reason


class HttpCache:
    def __init__(self, cache: AnswerCache, policy: PolicySettings, metrics: Metrics) -> None:
        self.cache = cache
        self._policy = policy
        self._metrics = metrics

    def probe(
        self, tenant: Tenant, request: OpenAIRequest, cache_control: str | None
    ) -> Probe | None:
        """The request's cache identity; None when it neither looks up nor stores."""
        if not self.cache.enabled:
            return None
        inputs = request.cache_inputs()
        mode = mode_for(inputs, cache_control, self._policy)
        # The scope comes from the operator's config, never from the request; a tenant's
        # own is its owner's, so a tenant created again under a deleted one's name starts
        # with an empty cache (`Tenant.owner`).
        scope = f"group:{tenant.cache_group}" if tenant.cache_group else f"tenant:{tenant.owner}"
        key = cache_key(scope, request.model, inputs) if mode is not Mode.BYPASS else None
        if key is None:
            self._metrics.cache_lookup(tenant.name, request.model, "bypass", "-")
            return None
        bound = tenant.cache_error_bound
        delta = None if bound is None else bound.delta
        deterministic = inputs.temperature == 0 or inputs.body.get("seed") is not None
        return Probe(
            mode,
            key,
            tenant.name,
            request.model,
            request.kind,
            request.include_usage,
            delta,
            deterministic,
        )

    def skipped(self, request: OpenAIRequest) -> CacheOutcome:
        """Why a request got no probe, for its report event: BYPASS when only the client's
        Cache-Control kept it out of the cache, else NONE (not cacheable)."""
        if not self.cache.enabled:
            return CacheOutcome.NONE
        if mode_for(request.cache_inputs(), None, self._policy) is Mode.BYPASS:
            return CacheOutcome.NONE
        return CacheOutcome.BYPASS

    def miss_headers(self, probe: Probe | None) -> dict[str, str]:
        if not self.cache.enabled:
            return {}
        if probe is None or probe.mode is Mode.STORE_ONLY:
            return {"x-cache": "bypass"}
        headers = {"x-cache": "miss", "server-timing": _timing(probe)}
        if probe.miss_reason is not None:
            headers["x-cache-miss-reason"] = probe.miss_reason
        return headers

    async def lookup(self, probe: Probe, streamed: bool, request_id: str) -> Response | None:
        """The cached answer as a response, or None (go to the model)."""
        if probe.mode is not Mode.FULL:
            probe.outcome = CacheOutcome.BYPASS
            self._metrics.cache_lookup(probe.tenant, probe.model, "bypass", "-")
            return None
        started = time.perf_counter()
        probe.lookup = lookup = await self.cache.lookup(probe.key, probe.delta)
        probe.waited_s = time.perf_counter() - started
        if lookup.failed is not None:
            self._metrics.cache_fail_open(lookup.failed)
        if lookup.explored is not None:
            self._metrics.cache_explored(probe.tenant, "explored")
        if lookup.found is None:
            self._metrics.cache_lookup(probe.tenant, probe.model, "miss", "-")
            return None
        found = lookup.found
        self._metrics.cache_lookup(probe.tenant, probe.model, "hit", found.tier)
        probe.outcome = CacheOutcome(found.tier)
        self.cache.record_hit_later(found.entry.entry_id)
        return self._answer(probe, found, streamed, request_id)

    def recorder(self, probe: Probe | None) -> StreamRecorder | None:
        return None if probe is None else StreamRecorder(probe.kind)

    def store(self, probe: Probe, body: bytes) -> None:
        """Stores a complete answer in the background (only complete, successful ones)."""
        if probe.lookup.failed in (LookupFailure.BUDGET, LookupFailure.EMBEDDER_BUSY):
            return  # the cache is overloaded: a store would add the embedding it declined
        answer = Answer(probe.key, probe.tenant, probe.model, body, probe.lookup.embedded)
        explored = probe.lookup.explored
        if explored is not None:  # compared first; stored only if it differs
            self.cache.judge_later(explored, answer, probe.deterministic)
        else:
            self.cache.store_later(answer)

    async def report_bad_hit(self, tenant: str, members: list[str], body: bytes) -> CacheEntry:
        """`tenant` reports a hit wrong (`{"id": its x-cache-key}`): deletes the entry, on
        every replica, if it belongs to the tenant's cache scope (`members`), and counts it.
        Raises CacheEntryNotFound (also for an entry of another scope: no oracle),
        BadRequest, StateUnavailable."""
        entry_id = _reported_id(body)
        try:
            found = await self.cache.report_bad_hit(entry_id, tenant, members)
        except CacheUnavailable as exc:
            message = "The cache store is unreachable; try again shortly."
            raise StateUnavailable(message, retry_after=1) from exc
        if found is None:
            raise CacheEntryNotFound(f"No cache entry with id '{entry_id}'.", param="id")
        self._metrics.cache_deleted(tenant, "bad_hit")
        return found

    def count_coalesced(self, probe: Probe) -> None:
        """The request was answered by an identical one's upstream call (a follower)."""
        probe.outcome = CacheOutcome.COALESCED
        self._metrics.cache_coalesced(probe.tenant)

    @classmethod
    def coalesced(
        cls, probe: Probe, body: bytes, streamed: bool, request_id: str
    ) -> Response | None:
        """The answer an identical request got from the model, as a hit is answered
        (gateway/coalesce.py); None when it is no answer (then the request goes on)."""
        try:
            answer = orjson.loads(body)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(answer, dict):
            return None
        headers = {
            "x-request-id": request_id,
            "x-cache": "coalesced",
            "x-cache-saved-tokens": str(_saved_tokens(answer)),
            "server-timing": _timing(probe),
        }
        own = probe.lookup.failed or probe.lookup.reason  # why its own lookup did not answer
        if own is not None:  # None: it followed without looking up
            headers["x-cache-miss-reason"] = own
        return cls._hit(probe, answer, headers, streamed)

    def _answer(self, probe: Probe, found: Found, streamed: bool, request_id: str) -> Response:
        answer = orjson.loads(found.entry.response)
        headers = {
            "x-request-id": request_id,
            "x-cache": "hit",
            "x-cache-tier": found.tier,
            "x-cache-key": found.entry.entry_id,  # to report it: POST /v1/cache/feedback
            "x-cache-similarity": f"{found.similarity:.4f}",
            "x-cache-saved-tokens": str(_saved_tokens(answer)),
            "age": str(max(0, int(time.time() - found.entry.created_at))),
            "server-timing": _timing(probe),
        }
        return self._hit(probe, answer, headers, streamed)

    @staticmethod
    def _hit(
        probe: Probe, answer: dict[str, Any], headers: dict[str, str], streamed: bool
    ) -> Response:
        """`answer` as a cache hit: no usage (what it saved instead), whole or as SSE."""
        probe.saved_prompt_tokens, probe.saved_completion_tokens = saved_split(answer)
        answer["usage"] = hit_usage(answer)
        if streamed:
            events = b"".join(replay(probe.kind, answer, probe.include_usage))
            headers["cache-control"] = "no-cache"
            return Response(events, 200, headers, media_type="text/event-stream")
        return Response(orjson.dumps(answer), 200, headers, media_type="application/json")


def reported(entry: CacheEntry, request_id: str) -> Response:
    """The answer to a bad-hit report: the entry is gone."""
    body = {"object": "cache.feedback", "id": entry.entry_id, "deleted": True}
    return Response(orjson.dumps(body), 200, {"x-request-id": request_id}, "application/json")


def _reported_id(body: bytes) -> str:
    """The `id` of a feedback body; a malformed one reads as an unknown entry."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"We could not parse the JSON body of your request: {exc}") from exc
    entry_id = parsed.get("id") if isinstance(parsed, dict) else None
    if not isinstance(entry_id, str):
        raise BadRequest("Missing required parameter: 'id' (a hit's x-cache-key).", param="id")
    if not is_entry_id(entry_id):
        raise CacheEntryNotFound("No cache entry with that id.", param="id")
    return entry_id


def _timing(probe: Probe) -> str:
    """The Server-Timing header: the request's wait on the cache lookup, in ms."""
    return f"cache;dur={probe.waited_s * 1000:.3f}"


def hit_usage(answer: dict[str, Any]) -> dict[str, int]:
    """The usage of an answer served without the model: none, and what it saved."""
    saved = _saved_tokens(answer)
    return {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0, "saved_tokens": saved}


def saved_split(answer: dict[str, Any]) -> tuple[int, int]:
    """The (prompt, completion) tokens an answer's usage says the model spent on it."""
    usage = answer.get("usage")
    if not isinstance(usage, dict):
        return 0, 0
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    return (
        prompt if isinstance(prompt, int) else 0,
        completion if isinstance(completion, int) else 0,
    )


def _saved_tokens(answer: dict[str, Any]) -> int:
    usage = answer.get("usage")
    total = usage.get("total_tokens") if isinstance(usage, dict) else None
    return total if isinstance(total, int) else 0
