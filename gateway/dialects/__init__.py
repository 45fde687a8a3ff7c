"""APIs other than OpenAI's chat completions, served through the same pipeline.

    anthropic   Anthropic's Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`);
                its request's translation in anthropic_request
    responses   OpenAI's Responses API (`POST /v1/responses`); its request's translation
                in responses_request
    stored      the Responses API's stored responses, and their routes
    translated  the ASGI wrapper that sends the pipeline's chat answers in a dialect's shape

A request in a dialect becomes a chat completions request once its tenant is known
(`Dialect.to_chat`), so keys, quotas, the cache, coalescing, fair queueing, shedding,
retries and fallbacks treat it as any chat request, and every backend that serves chat
completions serves it. The answer, whole or streamed, is translated back on its way out
(`Translated`).

A backend that serves a dialect's route itself (`native_messages`, for vLLM's
`/v1/messages`) gets the request as the client sent it instead, and the client its answer
as the backend sent it (`Dialect.pass_through`): the translation still routes it and sizes
its quota reservation, but the cache and coalescing, which keep chat answers, pass it by.
"""

from __future__ import annotations

from typing import Protocol

from gateway.dialects.translated import Translator


class Dialect(Translator, Protocol):
    """One request in a dialect, from its body to its answer (one object per request)."""

    # The backend route that serves the dialect itself (`Pool.native_paths`), where its
    # requests may go unchanged; None: always translated.
    native_path: str | None

    async def to_chat(self, raw: bytes, owner: str) -> bytes:
        """The chat completions body for the request `raw` of the tenant whose data `owner`
        names (`Tenant.owner`); raises a GatewayError (400) for a request the dialect's
        API would refuse."""
        ...

    def pass_through(self) -> None:
        """The request goes unchanged to a backend that serves the dialect itself: its
        answer is the dialect's already, and only the gateway's own errors (chat-shaped)
        are translated."""
        ...
