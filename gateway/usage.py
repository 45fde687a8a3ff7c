"""Tokens an answer used: from the upstream's `usage`, or estimated when it sent none."""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from cache.sse import event_data, split_events


@dataclass(frozen=True)
class TokenUsage:
    prompt: int
    completion: int
    cached: int = 0  # of the prompt, read from the engine's prefix cache

    @property
    def total(self) -> int:
        return self.prompt + self.completion


def usage_of(body: bytes) -> TokenUsage | None:
    """`usage` of a whole OpenAI answer; None if absent or unreadable."""
    if b'"usage"' not in body:
        return None
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return usage_in(parsed)


def usage_in(answer: object) -> TokenUsage | None:
    """`usage` of a parsed OpenAI answer; None if absent or unreadable."""
    return token_usage(answer.get("usage")) if isinstance(answer, dict) else None


def token_usage(value: object) -> TokenUsage | None:
    """An OpenAI `usage` object, or Anthropic's (a Messages answer passed through); None
    if absent or unreadable."""
    if not isinstance(value, dict):
        return None
    if "input_tokens" in value or "output_tokens" in value:
        return _anthropic_usage(value)
    prompt, completion = value.get("prompt_tokens"), value.get("completion_tokens", 0)
    if not isinstance(prompt, int) or not isinstance(completion, int):
        return None
    details = value.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return TokenUsage(prompt, completion, cached if isinstance(cached, int) else 0)


def _anthropic_usage(value: dict[str, object]) -> TokenUsage | None:
    """Anthropic's `input_tokens` leave out the prompt tokens read from the cache or
    written to it; the prompt is all three."""
    fields = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
    counts = [value.get(name) or 0 for name in (*fields, "output_tokens")]
    ints = [count for count in counts if isinstance(count, int)]
    if len(ints) != len(counts):
        return None
    fresh, read, written, output = ints
    return TokenUsage(fresh + read + written, output, read)


class UsageTap:
    """Watches a relayed stream: the `usage` chunk if the upstream sends one
    (`stream_options.include_usage`), else one token per content event (OpenAI-style
    servers send about one token per chunk). An Anthropic stream (passed through) counts
    over two events: `message_start`'s message (the input) and `message_delta` (the
    output so far, and with some servers the input again); the latest of each counts."""

    def __init__(self) -> None:
        self.events = 0
        self.reported: TokenUsage | None = None
        self._anthropic: dict[str, object] = {}

    def __call__(self, data: bytes) -> None:
        self.events += data.count(b"data: {")
        if b'"usage"' in data:  # the relay taps whole events only
            for event in split_events(data)[0]:
                payload = event_data(event)
                if payload is not None and b'"usage"' in payload:
                    self._read(payload)

    def _read(self, payload: bytes) -> None:
        try:
            chunk = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return
        if not isinstance(chunk, dict):
            return
        message = chunk.get("message")
        value = chunk.get("usage") or (message.get("usage") if isinstance(message, dict) else None)
        if isinstance(value, dict) and ("input_tokens" in value or "output_tokens" in value):
            self._anthropic = value = {**self._anthropic, **value}
        self.reported = token_usage(value) or self.reported

    def usage(self, prompt_estimate: int) -> TokenUsage:
        return self.reported or TokenUsage(prompt_estimate, max(0, self.events - 1))
