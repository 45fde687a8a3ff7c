"""The embedder's async face: dynamic batching within the lookup budget, and admission.

Concurrent `embed` calls share one forward pass, run in the embedder's own thread so the
event loop never waits on the model. A lookup says how long it may wait (`within_s`, what
is left of its budget). The embedder keeps the measured seconds per text of recent passes
and estimates when a new text's pass would end: after the pass running now and the
lookups queued ahead. A text it would not reach in time is refused at once
(`EmbedderBusy`): the lookup fails open, a counted miss, instead of queueing behind a
saturated model past its budget. An idle embedder always takes a text (a first, slow
pass must not lock it out).

Batches are sized the same way, as Triton's dynamic batcher bounds a batch by its queue
delay: a batch takes waiting lookups in order while its pass would still end before the
earliest deadline among them, at most `max_batch`. The first text of a batch opens a
window of `window_ms` for company when others are already waiting (alone, it runs at
once); texts that arrive while a pass runs join the next one, so under load batches fill
without any added delay. Texts without a deadline (stores, in the background) wait behind
every lookup and fill what room a batch has left.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from cache.embedder import Embedded, Encoder, embed_many

_SMOOTHING = 0.3  # weight of the latest pass in the seconds-per-text estimate


class EmbedderBusy(Exception):
    """The embedder would not reach this text within the time the caller has left."""


@dataclass(eq=False)
class _Request:
    text: str
    future: asyncio.Future[Embedded]
    deadline: float  # loop time by which its pass must end; inf: background


class BatchingEmbedder:
    """Micro-batches concurrent `embed` calls into one forward pass, within deadlines."""

    def __init__(self, encoder: Encoder, *, window_ms: float = 2.0, max_batch: int = 32) -> None:
        if max_batch < 1 or window_ms < 0:
            raise ValueError("max_batch must be >= 1 and window_ms >= 0")
        self.encoder = encoder
        self._window_s = window_ms / 1000.0
        self._max_batch = max_batch
        self._lookups: deque[_Request] = deque()
        self._background: deque[_Request] = deque()
        self._arrived = asyncio.Event()
        self._executor: ThreadPoolExecutor | None = None
        self._dispatcher: asyncio.Task[None] | None = None
        self._per_text_s: float | None = None  # recent passes, smoothed
        self._running_until: float | None = None  # expected end of the pass in progress
        self.refused = 0  # texts refused with EmbedderBusy

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
        for queue in (self._lookups, self._background):
            while queue:
                queue.popleft().future.cancel()
        if self._executor is not None:
            # A pass still running finishes in its thread; nothing waits for it.
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    async def __aenter__(self) -> BatchingEmbedder:
        await self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    @property
    def per_text_s(self) -> float | None:
        """Seconds per text of recent passes (None before the first)."""
        return self._per_text_s

    def expected_wait_s(self) -> float:
        """How long a lookup's text would take from now: the pass running, the lookups
        queued ahead, its own share. 0 when idle or before any pass was measured."""
        per_text = self._per_text_s
        if per_text is None or self._idle():
            return 0.0
        now = asyncio.get_running_loop().time()
        running = max(0.0, self._running_until - now) if self._running_until else 0.0
        return running + per_text * (len(self._lookups) + 1)

    async def embed(self, text: str, within_s: float | None = None) -> Embedded:
        """The text's embedding. `within_s`: the most this lookup may wait; raises
        EmbedderBusy at once when the queue says it would wait longer. None: background
        work, which waits behind every lookup."""
        if self._dispatcher is None:
            raise RuntimeError("BatchingEmbedder.start() was not awaited")
        loop = asyncio.get_running_loop()
        if within_s is not None and self.expected_wait_s() > within_s:
            self.refused += 1
            raise EmbedderBusy(f"the embedder would take {self.expected_wait_s():.3f} s")
        deadline = math.inf if within_s is None else loop.time() + within_s
        request = _Request(text, loop.create_future(), deadline)
        (self._background if within_s is None else self._lookups).append(request)
        self._arrived.set()
        return await request.future

    def embed_many(self, texts: Sequence[str]) -> list[Embedded]:
        """Blocking, for scripts and benchmarks: batches of `max_batch`, in order."""
        return embed_many(self.encoder, texts, self._max_batch)

    def _idle(self) -> bool:
        return self._running_until is None and not self._lookups and not self._background

    async def _dispatch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._collect(loop)
            if batch:
                await self._run(loop, batch)

    async def _collect(self, loop: asyncio.AbstractEventLoop) -> list[_Request]:
        while not self._lookups and not self._background:
            self._arrived.clear()
            await self._arrived.wait()
        await asyncio.sleep(0)  # requests issued in the same turn of the loop join at once
        batch: list[_Request] = []
        self._take(loop.time(), batch)
        if len(batch) <= 1:
            return batch  # alone: waiting for company would only add latency
        closes = loop.time() + self._window_s
        while len(batch) < self._max_batch and (remaining := closes - loop.time()) > 0:
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), remaining)
            except TimeoutError:
                break
            if not self._take(loop.time(), batch):
                break
        return batch

    def _take(self, now: float, batch: list[_Request]) -> bool:
        """Moves waiting texts into `batch`, lookups first, while its pass would end before
        the earliest deadline in it; False when the batch is full."""
        for queue in (self._lookups, self._background):
            while queue and len(batch) < self._max_batch:
                if queue[0].future.done():  # given up (the lookup's own budget ran out)
                    queue.popleft()
                    continue
                if batch and not self._fits(now, batch, queue[0]):
                    return False
                batch.append(queue.popleft())
        return len(batch) < self._max_batch

    def _fits(self, now: float, batch: list[_Request], request: _Request) -> bool:
        if self._per_text_s is None:
            return True
        earliest = min(request.deadline, *(r.deadline for r in batch))
        return now + self._per_text_s * (len(batch) + 1) <= earliest

    async def _run(self, loop: asyncio.AbstractEventLoop, batch: list[_Request]) -> None:
        live = [r for r in batch if not r.future.done()]
        if not live:
            return
        started = loop.time()
        self._running_until = started + (self._per_text_s or 0.0) * len(live)
        try:
            results = await loop.run_in_executor(
                self._executor, self.encoder.encode, [r.text for r in live]
            )
        except asyncio.CancelledError:  # closing: nobody will answer these callers
            for r in live:
                r.future.cancel()
            raise
        except Exception as exc:  # the callers get the error, the dispatcher goes on
            for r in live:
                if not r.future.done():
                    r.future.set_exception(exc)
            return
        finally:
            self._running_until = None
        self._observe((loop.time() - started) / len(live))
        for r, result in zip(live, results, strict=True):
            if not r.future.done():
                r.future.set_result(result)

    def _observe(self, per_text_s: float) -> None:
        last = self._per_text_s
        self._per_text_s = per_text_s if last is None else last + _SMOOTHING * (per_text_s - last)
