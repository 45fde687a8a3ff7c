"""What may be cached, and what a cache entry is keyed by. Pure functions over the request.

The namespace is a hard partition applied before any similarity search. It hashes:
the scope (the tenant, or a shared group named in the operator's config; never anything a
client sends), the model, the endpoint, and every field of the body that can change the
answer except the last user turn: system prompt, earlier turns, tools, response format,
sampling parameters. Only the last user turn is embedded. So two requests can share an
entry only if everything but the wording of their final question is identical.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

import orjson

from cache.normalize import normalize

# Fields that never change the answer (delivery and bookkeeping); all others are keyed.
_DELIVERY_FIELDS = frozenset({"stream", "stream_options", "user", "metadata", "store"})
# The embedder reads at most this many characters meaningfully (MiniLM truncates at 256
# word pieces); longer prompts could differ after the cut, so they get exact tiers only.
MAX_SEMANTIC_CHARS = 800


class Mode(Enum):
    BYPASS = "bypass"  # neither look up nor store
    STORE_ONLY = "store_only"  # Cache-Control: no-cache: fresh answer, stored
    FULL = "full"


@dataclass(frozen=True)
class PolicySettings:
    max_temperature: float = 1.0
    cacheable_tools: frozenset[str] = frozenset()


@dataclass(frozen=True)
class CacheInputs:
    """What the policy reads of one request (the typed request builds it)."""

    kind: str  # "chat", "completions", "embeddings"
    temperature: float
    choices: int  # `n`
    tools: Any  # `tools` or `functions`, as sent
    body: Mapping[str, Any]  # the whole body as JSON values, as the client sent it

    @classmethod
    def of(cls, kind: str, body: Mapping[str, Any]) -> CacheInputs:
        """From a plain JSON body (benchmarks and tests)."""
        temperature = body.get("temperature")
        return cls(
            kind,
            1.0 if temperature is None else temperature,
            body.get("n") or 1,
            body.get("tools") or body.get("functions") or [],
            body,
        )


@dataclass(frozen=True)
class CacheKey:
    namespace: str
    prompt: str
    exact_key: str
    normalized_key: str
    semantic: bool  # may tier 3 (embedding similarity) be used for this prompt?


def mode_for(inputs: CacheInputs, cache_control: str | None, settings: PolicySettings) -> Mode:
    directives = {d.strip().lower() for d in (cache_control or "").split(",")}
    if "no-store" in directives or not _cacheable(inputs, settings):
        return Mode.BYPASS
    if "no-cache" in directives:
        return Mode.STORE_ONLY
    return Mode.FULL


def _cacheable(inputs: CacheInputs, settings: PolicySettings) -> bool:
    if inputs.kind not in ("chat", "completions"):
        return False
    temperature = inputs.temperature
    if not isinstance(temperature, int | float) or temperature > settings.max_temperature:
        return False
    if inputs.choices != 1:
        return False
    return _tools_are_safe(inputs.tools, settings)


def _tools_are_safe(tools: Any, settings: PolicySettings) -> bool:
    """Tools may act on the world; only those the operator declared side-effect free are cached."""
    if not isinstance(tools, list):
        return False
    names = {_tool_name(tool) for tool in tools}
    return names <= settings.cacheable_tools


def _tool_name(tool: Any) -> str | None:
    if not isinstance(tool, dict):
        return None
    function = tool.get("function", tool)
    name = function.get("name") if isinstance(function, dict) else None
    return name if isinstance(name, str) else None


def cache_key(scope: str, model: str, inputs: CacheInputs) -> CacheKey | None:
    """None when the request has no final user turn to key on (then it is not cached)."""
    kind = inputs.kind
    split = _split_last_turn(kind, inputs.body)
    if split is None:
        return None
    prompt, context = split
    context_fields = {k: v for k, v in context.items() if k not in _DELIVERY_FIELDS}
    canonical = orjson.dumps([scope, model, kind, context_fields], option=orjson.OPT_SORT_KEYS)
    namespace = hashlib.sha256(canonical).hexdigest()[:32]
    return CacheKey(
        namespace=namespace,
        prompt=prompt,
        exact_key="x:" + _digest(namespace, prompt),
        normalized_key="n:" + _digest(namespace, normalize(prompt)),
        semantic=0 < len(prompt) <= MAX_SEMANTIC_CHARS,
    )


def _split_last_turn(kind: str, body: Mapping[str, Any]) -> tuple[str, dict[str, Any]] | None:
    if kind == "completions":
        prompt = body.get("prompt")
        return (prompt, {**body, "prompt": None}) if isinstance(prompt, str) else None
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return None
    last = messages[-1]
    if not isinstance(last, dict) or last.get("role") != "user" or set(last) - {"role", "content"}:
        return None
    text = _text_of(last.get("content"))
    if text is None:
        return None
    return text, {**body, "messages": messages[:-1]}


def _text_of(content: Any) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        for p in content
    ):
        return "\n".join(p["text"] for p in content)
    return None  # images, audio, files: not keyed on, not cached


def _digest(namespace: str, text: str) -> str:
    return hashlib.sha256(f"{namespace}\x00{text}".encode()).hexdigest()
