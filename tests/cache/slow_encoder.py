"""A slower model in front of the real encoder, for tests of the embedder's timing."""

from __future__ import annotations

import time
from collections.abc import Sequence

from cache.embedder import Embedded
from cache.torch_encoder import SentenceEncoder


class SlowEncoder:
    """The real encoder behind a model that takes `per_pass_s` a pass plus `per_text_s` a
    text (it sleeps in the embedder's thread, so the event loop stays free), recording each
    pass's size. `one_answer`: every text gets the real embedding of one text, for tests of
    scheduling alone, where the real pass's own time would blur the cost set."""

    def __init__(
        self,
        encoder: SentenceEncoder,
        *,
        per_pass_s: float = 0.0,
        per_text_s: float = 0.0,
        one_answer: bool = False,
    ) -> None:
        self._encoder = encoder
        self._per_pass_s, self._per_text_s = per_pass_s, per_text_s
        self._answer = encoder.encode(["one text"])[0] if one_answer else None
        self.sizes: list[int] = []
        self.forward_passes = 0
        self.backend, self.precision = encoder.backend, encoder.precision
        self.dimension, self.max_tokens = encoder.dimension, encoder.max_tokens

    def tokenizer_vocab(self) -> dict[str, int]:
        return self._encoder.tokenizer_vocab()

    def encode(self, texts: Sequence[str]) -> list[Embedded]:
        time.sleep(self._per_pass_s + self._per_text_s * len(texts))
        self.sizes.append(len(texts))
        self.forward_passes += 1
        if self._answer is not None:
            return [self._answer] * len(texts)
        return self._encoder.encode(texts)
