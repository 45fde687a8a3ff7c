"""The models one worker serves, by the names clients ask for (built by `loading`)."""

from __future__ import annotations

from backends.worker.embedder import Embedder
from backends.worker.errors import ModelNotFound
from backends.worker.generator import ChatModel


class ModelRegistry:
    def __init__(self, embedders: dict[str, Embedder], chat_models: dict[str, ChatModel]) -> None:
        self._embedders = embedders
        self._chat_models = chat_models

    def names(self) -> list[str]:
        return [*self._embedders, *self._chat_models]

    def embedder(self, name: str) -> Embedder:
        if name not in self._embedders:
            raise ModelNotFound(name, "embeddings")
        return self._embedders[name]

    def chat_model(self, name: str) -> ChatModel:
        if name not in self._chat_models:
            raise ModelNotFound(name, "completions")
        return self._chat_models[name]
