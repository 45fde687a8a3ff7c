"""The semantic cache on the request path: probe, look up within a budget, replay, store.

Lookups fail open: past `lookup_budget_ms`, or when the store or the embedder fails, the
request goes to the model and `gateway_cache_fail_open_total` counts it. Only complete,
successful answers are stored, after the client has them (in the lifespan's task group).
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import orjson
from anyio.abc import TaskGroup
from starlette.requests import Request
from starlette.responses import Response

from cache.entry import CacheEntry
from cache.policy import CacheKey, Mode, PolicySettings, cache_key, mode_for
from cache.sse import StreamRecorder, replay
from cache.store import CacheStore, CacheUnavailable
from gateway.metrics import Metrics
from gateway.settings import CacheSettings, Tenant

if TYPE_CHECKING:  # the model-backed parts load only when the cache is enabled
    from cache.decision import DecisionSettings
    from cache.embedder import BatchingEmbedder, Embedded
    from cache.verifier import PairVerifier

_log = logging.getLogger("gateway.cache")


@dataclass
class Probe:
    """One request's cache identity, and what the lookup learnt on the way."""

    mode: Mode
    key: CacheKey
    tenant: str
    model: str
    kind: str
    include_usage: bool
    embedded: Embedded | None = None
    headers: dict[str, str] = field(default_factory=dict)
    # For the request's report event: the hit's tier, "miss", or "bypass" (no-cache); the
    # hit's similarity or the best one the semantic tier saw; what a hit saved.
    outcome: str = "miss"
    similarity: float | None = None
    saved_prompt_tokens: int = 0
    saved_completion_tokens: int = 0


@dataclass(frozen=True)
class Found:
    entry: CacheEntry
    tier: str
    similarity: float


class AnswerCache:
    def __init__(
        self,
        settings: CacheSettings,
        store: CacheStore | None,
        embedder: BatchingEmbedder | None,
        verifier: PairVerifier | None,
        decision: DecisionSettings | None,
        metrics: Metrics,
    ) -> None:
        self._settings = settings
        self._store = store
        self._embedder = embedder
        self._verifier = verifier
        self._decision = decision
        self._metrics = metrics
        self._policy = PolicySettings(settings.max_temperature, frozenset(settings.cacheable_tools))
        self._budget_s = settings.lookup_budget_ms / 1000
        self._tasks: TaskGroup | None = None

    @property
    def enabled(self) -> bool:
        return self._store is not None

    def start(self, tasks: TaskGroup) -> None:
        self._tasks = tasks

    def probe(
        self, tenant: Tenant, model: str, kind: str, fields: dict[str, Any], request: Request
    ) -> Probe | None:
        if self._store is None:
            return None
        mode = mode_for(kind, fields, request.headers.get("cache-control"), self._policy)
        # The scope comes from the operator's config, never from the request.
        scope = f"group:{tenant.cache_group}" if tenant.cache_group else f"tenant:{tenant.name}"
        key = cache_key(scope, model, kind, fields) if mode is not Mode.BYPASS else None
        if key is None:
            self._metrics.cache_lookup(tenant.name, model, "bypass", "-")
            return None
        options = fields.get("stream_options")
        include_usage = isinstance(options, dict) and options.get("include_usage") is True
        return Probe(mode, key, tenant.name, model, kind, include_usage)

    def skipped(self, kind: str, fields: dict[str, Any]) -> str:
        """Why a request got no probe, for its report event: "bypass" when only the
        client's Cache-Control kept it out of the cache, else "none" (not cacheable)."""
        if self._store is None or mode_for(kind, fields, None, self._policy) is Mode.BYPASS:
            return "none"
        return "bypass"

    def miss_headers(self, probe: Probe | None) -> dict[str, str]:
        if not self.enabled:
            return {}
        if probe is None or probe.mode is Mode.STORE_ONLY:
            return {"x-cache": "bypass"}
        return {"x-cache": "miss"}

    async def lookup(self, probe: Probe, streamed: bool, request_id: str) -> Response | None:
        if probe.mode is not Mode.FULL:
            probe.outcome = "bypass"
            self._metrics.cache_lookup(probe.tenant, probe.model, "bypass", "-")
            return None
        started = time.perf_counter()
        try:
            with anyio.fail_after(self._budget_s):
                found = await self._find(probe)
        except TimeoutError:
            self._failed_open(probe, "budget")
            return None
        except CacheUnavailable:
            self._failed_open(probe, "store")
            return None
        except Exception:
            _log.exception("cache lookup failed; answering from the model")
            self._failed_open(probe, "error")
            return None
        self._metrics.cache_stage("total", time.perf_counter() - started)
        if found is None:
            self._metrics.cache_lookup(probe.tenant, probe.model, "miss", "-")
            return None
        self._metrics.cache_lookup(probe.tenant, probe.model, "hit", found.tier)
        probe.outcome = found.tier
        self._later(self._record_hit, found.entry.entry_id)
        return self._answer(probe, found, streamed, request_id)

    async def flush(self, tenants: Collection[str]) -> tuple[int, int]:
        """Drops every namespace holding an entry stored for one of `tenants` (a tenant's
        own scope, or all members of its cache group); (namespaces, entries) removed.
        Raises CacheUnavailable."""
        if self._store is None:
            return 0, 0
        namespaces = await self._store.namespaces_of(tenants)
        removed = 0
        for namespace in sorted(namespaces):
            removed += await self._store.flush_namespace(namespace)
        return len(namespaces), removed

    def recorder(self, probe: Probe | None) -> StreamRecorder | None:
        return None if probe is None else StreamRecorder(probe.kind)

    def store_later(self, probe: Probe, body: bytes) -> None:
        self._later(self._store_answer, probe, body)

    async def _find(self, probe: Probe) -> Found | None:
        assert self._store is not None
        key = probe.key
        for tier, lookup_key in (("exact", key.exact_key), ("normalized", key.normalized_key)):
            entry = await self._store.get_by_key(key.namespace, lookup_key)
            if entry is not None:
                return Found(entry, tier, 1.0)
        if not (self._settings.semantic and key.semantic and self._embedder is not None):
            return None
        return await self._semantic(probe)

    async def _semantic(self, probe: Probe) -> Found | None:
        from cache.decision import Candidate, decide

        assert self._store is not None and self._embedder is not None
        assert self._decision is not None
        started = time.perf_counter()
        probe.embedded = embedded = await self._embedder.embed(probe.key.prompt)
        searched = time.perf_counter()
        self._metrics.cache_stage("embed", searched - started)
        near = await self._store.nearest(
            probe.key.namespace,
            embedded.vector,
            self._decision.top_k,
            self._decision.similarity_floor,
        )
        self._metrics.cache_stage("search", time.perf_counter() - searched)
        probe.similarity = max((score for _, score in near), default=None)
        candidates = [Candidate(e.prompt, e.features, score) for e, score in near]
        decision = decide(probe.key.prompt, embedded, candidates, self._decision, self._verifier)
        if decision.index is None:
            return None
        entry, similarity = near[decision.index]
        probe.similarity = similarity
        return Found(entry, "semantic", similarity)

    def _answer(self, probe: Probe, found: Found, streamed: bool, request_id: str) -> Response:
        answer = orjson.loads(found.entry.response)
        saved = _saved_tokens(answer)
        probe.saved_prompt_tokens, probe.saved_completion_tokens = _saved_split(answer)
        answer["usage"] = {
            "prompt_tokens": 0,
            "completion_tokens": 0,
            "total_tokens": 0,
            "saved_tokens": saved,
        }
        headers = {
            "x-request-id": request_id,
            "x-cache": "hit",
            "x-cache-tier": found.tier,
            "x-cache-similarity": f"{found.similarity:.4f}",
            "x-cache-saved-tokens": str(saved),
            "age": str(max(0, int(time.time() - found.entry.created_at))),
        }
        if streamed:
            events = b"".join(replay(probe.kind, answer, probe.include_usage))
            headers["cache-control"] = "no-cache"
            return Response(events, 200, headers, media_type="text/event-stream")
        return Response(orjson.dumps(answer), 200, headers, media_type="application/json")

    def _failed_open(self, probe: Probe, reason: str) -> None:
        self._metrics.cache_fail_open(reason)
        self._metrics.cache_lookup(probe.tenant, probe.model, "miss", "-")

    def _later(self, job: Any, *args: Any) -> None:
        if self._tasks is not None:
            self._tasks.start_soon(job, *args)

    async def _record_hit(self, entry_id: str) -> None:
        assert self._store is not None
        try:
            await self._store.record_hit(entry_id)
        except CacheUnavailable:
            self._metrics.cache_fail_open("record_hit")

    async def _store_answer(self, probe: Probe, body: bytes) -> None:
        assert self._store is not None
        if not _storable(body):
            return
        try:
            with anyio.fail_after(10):
                embedded = probe.embedded or await self._embed(probe.key.prompt)
                await self._store.put(self._entry(probe, embedded, body))
        except (TimeoutError, CacheUnavailable):
            self._metrics.cache_fail_open("store")
        except Exception:
            _log.exception("cache store failed")
            self._metrics.cache_fail_open("store_error")

    async def _embed(self, prompt: str) -> Embedded:
        assert self._embedder is not None
        return await self._embedder.embed(prompt)

    def _entry(self, probe: Probe, embedded: Embedded, body: bytes) -> CacheEntry:
        key = probe.key
        return CacheEntry(
            entry_id=secrets.token_hex(16),
            namespace=key.namespace,
            prompt=key.prompt,
            exact_key=key.exact_key,
            normalized_key=key.normalized_key,
            vector=embedded.vector,
            features=embedded.features,
            response=body,
            model=probe.model,
            tenant=probe.tenant,
            created_at=time.time(),
            ttl_s=self._settings.ttl_s,
        )


def _storable(body: bytes) -> bool:
    """Only complete text answers: no errors, no tool calls, every choice finished."""
    try:
        answer = orjson.loads(body)
    except orjson.JSONDecodeError:
        return False
    choices = answer.get("choices") if isinstance(answer, dict) else None
    if not isinstance(choices, list) or not choices or "error" in answer:
        return False
    for choice in choices:
        if not isinstance(choice, dict):
            return False
        message = choice.get("message")
        text = message.get("content") if isinstance(message, dict) else choice.get("text")
        if not isinstance(text, str) or choice.get("finish_reason") not in ("stop", "length"):
            return False
        if isinstance(message, dict) and message.get("tool_calls"):
            return False
    return True


def _saved_split(answer: dict[str, Any]) -> tuple[int, int]:
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
