"""The JSON shapes of OpenAI's answers: whole, streamed in chunks, and embeddings."""

from __future__ import annotations

import base64
import time
import uuid
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from backends.worker.embedder import Embeddings

Json = dict[str, object]


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int = 0

    def as_json(self) -> Json:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }


@dataclass(frozen=True)
class Envelope:
    """What every answer and chunk of one completion shares."""

    id: str
    created: int
    model: str

    @classmethod
    def new(cls, prefix: str, model: str) -> Envelope:
        return cls(f"{prefix}-{uuid.uuid4().hex}", int(time.time()), model)

    def wrap(self, object_name: str, choices: list[Json], usage: Usage | None) -> Json:
        return {
            "id": self.id,
            "object": object_name,
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": None if usage is None else usage.as_json(),
        }


class ChatShape:
    id_prefix = "chatcmpl"
    answer_object = "chat.completion"
    chunk_object = "chat.completion.chunk"

    def choice(self, index: int, text: str, finish_reason: str) -> Json:
        message = {"role": "assistant", "content": text, "refusal": None}
        return {
            "index": index,
            "message": message,
            "logprobs": None,
            "finish_reason": finish_reason,
        }

    def chunk_choice(self, index: int, text: str | None, finish_reason: str | None = None) -> Json:
        delta = {} if text is None else {"content": text}
        return {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}

    def opening_choice(self, index: int) -> Json | None:
        delta = {"role": "assistant", "content": ""}
        return {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}


class TextShape:
    id_prefix = "cmpl"
    answer_object = "text_completion"
    chunk_object = "text_completion"

    def choice(self, index: int, text: str, finish_reason: str) -> Json:
        return {"index": index, "text": text, "logprobs": None, "finish_reason": finish_reason}

    def chunk_choice(self, index: int, text: str | None, finish_reason: str | None = None) -> Json:
        return {
            "index": index,
            "text": text or "",
            "logprobs": None,
            "finish_reason": finish_reason,
        }

    def opening_choice(self, index: int) -> Json | None:
        return None


AnswerShape = ChatShape | TextShape


def embedding_answer(
    model: str, embeddings: Embeddings, encoding: Literal["float", "base64"]
) -> Json:
    data = [
        {"object": "embedding", "index": index, "embedding": _encode_vector(vector, encoding)}
        for index, vector in enumerate(embeddings.vectors)
    ]
    usage = {"prompt_tokens": embeddings.prompt_tokens, "total_tokens": embeddings.prompt_tokens}
    return {"object": "list", "data": data, "model": model, "usage": usage}


def _encode_vector(vector: npt.NDArray[np.float32], encoding: Literal["float", "base64"]) -> object:
    if encoding == "float":
        return vector.tolist()
    # OpenAI's format is little-endian float32 (the openai client reads it with numpy).
    return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")


def model_card(name: str, created: int) -> Json:
    return {"id": name, "object": "model", "created": created, "owned_by": "worker"}
