"""What the gateway adds to a request body on its way to the engine, and takes back out of
the answer.

- **Usage on every stream.** Quotas must be charged what the engine counted, not an estimate
  (characters/4 undercounts CJK text and counts images as nothing), so every streamed
  request asks for `stream_options.include_usage`; for a client that did not ask, the
  usage chunk (`choices: []` with `usage`) is taken out of the stream it receives
  (`without_usage_chunks`), so it sees what it asked for.
- **A per-tenant `cache_salt`** for vLLM backends: vLLM's prefix cache is shared by every
  request, so a tenant could time another's prompts by their cache hits. The salt is a keyed
  hash (HMAC-SHA256) of a server secret and the tenant's cache scope: requests of one scope
  share prefix-cache entries, two scopes never do; a client's own value is replaced, since
  a client that chose its salt could pick another tenant's.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

import orjson

from cache.sse import event_data, split_events


@dataclass(frozen=True, slots=True)
class Rewrite:
    """How one request's body changes for its backend."""

    stream_usage: bool  # ask a stream for its usage chunk
    cache_salt: str | None = None  # vLLM's cache_salt, or None to leave the field alone


def cache_salt(secret: bytes, scope: str) -> str:
    """The salt of a cache scope (`tenant:NAME` or `group:NAME`): the same across gateway
    replicas that share the secret, unguessable without it."""
    return hmac.new(secret, scope.encode(), hashlib.sha256).hexdigest()


def for_engine(raw: bytes, rewrite: Rewrite) -> tuple[bytes, bool]:
    """The body the backend gets, and whether the client did not ask for the usage chunk
    the backend will now send (so it must be stripped from what the client receives)."""
    if not rewrite.stream_usage and rewrite.cache_salt is None:
        return raw, False
    fields = orjson.loads(raw)  # parsed already by the schema: a JSON object
    strip = False
    streamed = fields.get("stream") is True
    if rewrite.cache_salt is None and not streamed:
        return raw, False
    if rewrite.stream_usage and streamed:
        options = fields.get("stream_options")
        options = dict(options) if isinstance(options, dict) else {}
        strip = options.get("include_usage") is not True
        options["include_usage"] = True
        fields["stream_options"] = options
    if rewrite.cache_salt is not None:
        fields["cache_salt"] = rewrite.cache_salt
    return orjson.dumps(fields), strip


def without_usage_chunks(events: bytes) -> bytes:
    """Complete SSE events with the usage-only chunks left out (the last chunk OpenAI-style
    servers send under `include_usage`: no choices, only usage); every other event's
    bytes unchanged."""
    if b'"usage"' not in events:
        return events
    complete, _ = split_events(events)
    kept = [event for event in complete if not _usage_only(event)]
    return b"".join(event + b"\n\n" for event in kept)


def _usage_only(event: bytes) -> bool:
    data = event_data(event)
    if data is None or b'"usage"' not in data:
        return False
    try:
        chunk = orjson.loads(data)
    except orjson.JSONDecodeError:
        return False
    return isinstance(chunk, dict) and chunk.get("choices") == [] and bool(chunk.get("usage"))
