"""Writing completions (`n` answers to each of one or more prompts), whole or streamed.

Each token (for all of one prompt's answers at once) is one call into the compute thread, so
the event loop stays free, concurrent requests take turns token by token, and when a client
goes away (Starlette cancels the stream) no further token is computed.
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
    """The `n` answers to one prompt, written together: one token each per `advance` call.

    `advance` blocks; it returns a piece for each answer still being written, by its number
    (0 to n - 1). An answer ends on an end token, a stop string or the token budget; the
    others go on without it.
    """

    def __init__(
        self, model: ChatModel, prompt_ids: Sequence[int], params: SamplingParams, n: int = 1
    ):
        self._model = model
        self._params = params
        self._generation = model.start(prompt_ids, params, n)
        self._decoders = [IncrementalDecoder(model.decode, params.stop) for _ in range(n)]
        self._writing = list(range(n))  # the answers in the generation's rows, in row order
        self._tokens = 0  # per answer still being written: they all started together

    @property
    def done(self) -> bool:
        return not self._writing

    def advance(self) -> list[tuple[int, Piece]]:
        tokens = self._generation.step()
        self._tokens += 1
        pieces = [
            (answer, self._piece(self._decoders[answer], token))
            for answer, token in zip(self._writing, tokens, strict=True)
        ]
        going_on = [row for row, (_, piece) in enumerate(pieces) if piece.finish_reason is None]
        if len(going_on) < len(pieces):
            self._writing = [self._writing[row] for row in going_on]
            if going_on:
                self._generation.keep(going_on)
        return pieces

    def _piece(self, decoder: IncrementalDecoder, token: int) -> Piece:
        if self._model.is_end(token):
            return Piece(decoder.flush(), self._tokens, "stop")
        text = decoder.push(token)
        if decoder.stopped:
            return Piece(text, self._tokens, "stop")
        if self._tokens >= self._params.max_tokens:
            return Piece(text + decoder.flush(), self._tokens, "length")
        return Piece(text, self._tokens)


@dataclass(frozen=True)
class Prompt:
    ids: list[int]
    params: SamplingParams  # its token budget depends on its length


@dataclass(frozen=True)
class CompletionJob:
    """`n` answers to each prompt. Prompt i's answer j is choice `i * n + j`, as OpenAI has it."""

    model: ChatModel
    prompts: list[Prompt]
    n: int
    shape: AnswerShape
    compute: Executor

    @property
    def choices(self) -> int:
        return len(self.prompts) * self.n

    async def pieces(self) -> AsyncIterator[tuple[int, Piece]]:
        """Each choice's pieces, with its index: one prompt after another, and each prompt's
        answers together (one forward pass per token for all of them)."""
        loop = asyncio.get_running_loop()
        for number, prompt in enumerate(self.prompts):
            writer = AnswerWriter(self.model, prompt.ids, prompt.params, self.n)
            while not writer.done:
                for answer, piece in await loop.run_in_executor(self.compute, writer.advance):
                    yield number * self.n + answer, piece

    def usage(self, last_pieces: dict[int, Piece]) -> Usage:
        """Each prompt counted once, however many answers it has; every answer's tokens."""
        completion = sum(piece.completion_tokens for piece in last_pieces.values())
        return Usage(sum(len(prompt.ids) for prompt in self.prompts), completion)


async def complete(job: CompletionJob) -> Json:
    texts: dict[int, list[str]] = {index: [] for index in range(job.choices)}
    last: dict[int, Piece] = {}
    async for index, piece in job.pieces():
        texts[index].append(piece.text)
        last[index] = piece
    envelope = Envelope.new(job.shape.id_prefix, job.model.name)
    choices = [
        job.shape.choice(index, "".join(texts[index]), last[index].finish_reason or "stop")
        for index in range(job.choices)
    ]
    return envelope.wrap(job.shape.answer_object, choices, job.usage(last))


async def stream(job: CompletionJob, include_usage: bool) -> AsyncIterator[bytes]:
    """Server-sent events in OpenAI's chunk format, ending with `data: [DONE]`.

    Each chunk carries one choice, named by its `index`; each choice ends with a chunk of its
    own that has its `finish_reason`.
    """
    envelope = Envelope.new(job.shape.id_prefix, job.model.name)

    def event(choices: list[Json], usage: Usage | None = None) -> bytes:
        chunk = envelope.wrap(job.shape.chunk_object, choices, usage)
        if not include_usage:
            del chunk["usage"]
        return b"data: " + orjson.dumps(chunk) + b"\n\n"

    for index in range(job.choices):
        opening = job.shape.opening_choice(index)
        if opening is not None:
            yield event([opening])
    last: dict[int, Piece] = {}
    try:
        async for index, piece in job.pieces():
            last[index] = piece
            if piece.text:
                yield event([job.shape.chunk_choice(index, piece.text)])
            if piece.finish_reason is not None:
                yield event([job.shape.chunk_choice(index, None, piece.finish_reason)])
        if include_usage:
            yield event([], job.usage(last))
    except Exception:
        # The status line has gone out already, so the error can only travel as an event.
        logger.exception("generation failed in a stream")
        yield b"data: " + orjson.dumps(error_payload("generation failed", "server_error")) + b"\n\n"
    yield DONE_EVENT
