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
    """An OpenAI `usage` object; None if absent or unreadable."""
    if not isinstance(value, dict):
        return None
    prompt, completion = value.get("prompt_tokens"), value.get("completion_tokens", 0)
    if not isinstance(prompt, int) or not isinstance(completion, int):
        return None
    details = value.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return TokenUsage(prompt, completion, cached if isinstance(cached, int) else 0)


class UsageTap:
    """Watches a relayed stream: the `usage` chunk if the upstream sends one
    (`stream_options.include_usage`), else one token per content event (OpenAI-style
    servers send about one token per chunk)."""

    def __init__(self) -> None:
        self.events = 0
        self.reported: TokenUsage | None = None

    def __call__(self, data: bytes) -> None:
        self.events += data.count(b"data: {")
        if b'"usage"' in data:  # the relay taps whole events only
            for event in split_events(data)[0]:
                payload = event_data(event)
                if payload is not None and b'"usage"' in payload:
                    self.reported = usage_of(payload) or self.reported

    def usage(self, prompt_estimate: int) -> TokenUsage:
        return self.reported or TokenUsage(prompt_estimate, max(0, self.events - 1))
