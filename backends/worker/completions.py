"""Writing one completion, whole or as a stream of server-sent events.

Each token is one call into the compute thread, so the event loop stays free, concurrent
answers take turns token by token, and when a client goes away (Starlette cancels the
stream) no further token is computed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import orjson

from backends.worker.answers import AnswerShape, Envelope, Json, Usage
from backends.worker.detokenizer import IncrementalDecoder
from backends.worker.errors import error_payload
from backends.worker.sampling import SamplingParams

if TYPE_CHECKING:
    from backends.worker.generator import ChatModel

logger = logging.getLogger(__name__)

DONE_EVENT = b"data: [DONE]\n\n"


@dataclass(frozen=True)
class Piece:
    text: str
    completion_tokens: int  # so far
    finish_reason: str | None = None  # set on the last piece only


class AnswerWriter:
    """One token per `advance` call (blocking); ends on an end token, a stop or the budget."""

    def __init__(self, model: ChatModel, prompt_ids: Sequence[int], params: SamplingParams):
        self._model = model
        self._params = params
        self._generation = model.start(prompt_ids, params)
        self._decoder = IncrementalDecoder(model.decode, params.stop)
        self._tokens = 0

    def advance(self) -> Piece:
        token = self._generation.step()
        self._tokens += 1
        if self._model.is_end(token):
            return Piece(self._decoder.flush(), self._tokens, "stop")
        text = self._decoder.push(token)
        if self._decoder.stopped:
            return Piece(text, self._tokens, "stop")
        if self._tokens >= self._params.max_tokens:
            return Piece(text + self._decoder.flush(), self._tokens, "length")
        return Piece(text, self._tokens)


@dataclass(frozen=True)
class CompletionJob:
    model: ChatModel
    prompt_ids: list[int]
    params: SamplingParams
    shape: AnswerShape
    compute: Executor

    async def pieces(self) -> AsyncIterator[Piece]:
        loop = asyncio.get_running_loop()
        writer = AnswerWriter(self.model, self.prompt_ids, self.params)
        while True:
            piece = await loop.run_in_executor(self.compute, writer.advance)
            yield piece
            if piece.finish_reason is not None:
                return

    def usage(self, piece: Piece) -> Usage:
        return Usage(len(self.prompt_ids), piece.completion_tokens)


async def complete(job: CompletionJob) -> Json:
    texts: list[str] = []
    async for piece in job.pieces():
        texts.append(piece.text)
    envelope = Envelope.new(job.shape.id_prefix, job.model.name)
    choice = job.shape.choice("".join(texts), piece.finish_reason or "stop")
    return envelope.wrap(job.shape.answer_object, [choice], job.usage(piece))


async def stream(job: CompletionJob, include_usage: bool) -> AsyncIterator[bytes]:
    """Server-sent events in OpenAI's chunk format, ending with `data: [DONE]`."""
    envelope = Envelope.new(job.shape.id_prefix, job.model.name)

    def event(choices: list[Json], usage: Usage | None = None) -> bytes:
        chunk = envelope.wrap(job.shape.chunk_object, choices, usage)
        if not include_usage:
            del chunk["usage"]
        return b"data: " + orjson.dumps(chunk) + b"\n\n"

    opening = job.shape.opening_choice()
    if opening is not None:
        yield event([opening])
    try:
        async for piece in job.pieces():
            if piece.text:
                yield event([job.shape.chunk_choice(piece.text)])
        yield event([job.shape.chunk_choice(None, piece.finish_reason)])
        if include_usage:
            yield event([], job.usage(piece))
    except Exception:
        # The status line has gone out already, so the error can only travel as an event.
        logger.exception("generation failed in a stream")
        yield b"data: " + orjson.dumps(error_payload("generation failed", "server_error")) + b"\n\n"
    yield DONE_EVENT
