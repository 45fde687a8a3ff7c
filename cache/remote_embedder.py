"""The cache's embedder served by the deployment: an OpenAI-compatible embeddings endpoint
(`POST {base_url}/embeddings`: a vLLM or TEI server, or a backend of the gateway itself)
in place of the packaged MiniLM.

`RemoteEncoder` is an `Encoder` (cache/embedder.py): blocking, called from the batching
embedder's worker thread (cache/batching.py), so it gets the same micro-batching, the
same lookup budget and the same failing open (an error or a timeout is a miss, never a
failed request). It gives sentence vectors only, no token features: the pair verifier and
the pair model, which read MiniLM's token vectors, do not run behind it. The decision is
then the guards and a similarity threshold calibrated on the operator's own labelled pairs
(`gateway cache calibrate`, cache/calibration.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import httpx
import numpy as np

from cache.embedder import Embedded

PROBE = "What is the capital of France?"


class RemoteEmbedderError(RuntimeError):
    """The endpoint did not answer with embeddings."""


class RemoteEncoder:
    def __init__(
        self, base_url: str, model: str, api_key: str | None = None, timeout_s: float = 2.0
    ) -> None:
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(
            base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_s
        )
        self._model = model
        self.identity = embedder_identity(base_url, model)
        self.forward_passes = 0
        try:  # the dimension, and an early failure when the endpoint cannot embed
            self._dimension = len(self.encode([PROBE])[0].vector)
        except RemoteEmbedderError:
            self.close()
            raise

    @property
    def backend(self) -> str:
        return "remote"

    @property
    def precision(self) -> str:
        return "remote"

    @property
    def dimension(self) -> int:
        return self._dimension

    @property
    def max_tokens(self) -> int:
        return 512  # the policy keeps semantic prompts under 800 characters anyway

    def tokenizer_vocab(self) -> dict[str, int]:
        return {}

    def encode(self, texts: Sequence[str]) -> list[Embedded]:
        self.forward_passes += 1
        try:
            answer = self._client.post(
                "/embeddings", json={"model": self._model, "input": list(texts)}
            )
        except httpx.HTTPError as exc:
            raise RemoteEmbedderError(f"embeddings endpoint: {type(exc).__name__}") from exc
        if answer.status_code != 200:
            raise RemoteEmbedderError(f"embeddings endpoint: status {answer.status_code}")
        data = sorted(answer.json().get("data") or [], key=lambda d: d.get("index", 0))
        if len(data) != len(texts):
            raise RemoteEmbedderError(
                f"embeddings endpoint: {len(data)} vectors for {len(texts)} texts"
            )
        return [Embedded(_unit(d["embedding"]), b"") for d in data]

    def close(self) -> None:
        self._client.close()


def embedder_identity(base_url: str, model: str) -> str:
    """A short name for the embedder's vector space: entries made by one are never compared
    with another's (the cache keeps them apart by it)."""
    text = f"{base_url.rstrip('/')}\x00{model}"
    return "remote-" + hashlib.blake2b(text.encode(), digest_size=6).hexdigest()


def _unit(values: Sequence[float]) -> np.typing.NDArray[np.float32]:
    vector = np.asarray(values, dtype=np.float32)
    norm = float(np.linalg.norm(vector))
    return vector / norm if norm > 0 else vector
