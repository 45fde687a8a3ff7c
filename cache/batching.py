"""The embedder's async face: dynamic batching within the lookup budget, and admission.

Concurrent `embed` calls share one forward pass, run in the embedder's own thread so the
event loop never waits on the model. A lookup says how long it may wait (`within_s`, what
is left of its budget). The embedder fits the time of recent passes as a fixed cost plus
a cost per text (`PassTimes`: a batch of eight costs far less than eight lone passes)
and estimates when a new text's pass would end: after the pass running now and the
lookups queued ahead. A text it would not reach in time is refused at once
(`EmbedderBusy`): the lookup fails open, a counted miss, instead of queueing behind a
saturated model past its budget. An idle embedder always takes a text (a first, slow
pass must not lock it out). Pass times are measured in the embedder's thread, the model's
work alone; what the event loop adds is learned apart, as how long after its pass ended a
lookup's caller resumed (`resume_s`): a busy event loop resumes the callers of a batch one
after the other, each doing its search and decision, so the last resumes well after the
pass ended. Added, not multiplied: an earlier version scaled the whole estimate by how
much longer lookups waited than predicted for them, and since a text predicted to end
alone then waited for the texts that joined its batch, that ratio sat near 2 with no load
on the loop, and the embedder refused lookups it would have served in time.

Batches are sized the same way, as Triton's dynamic batcher bounds a batch by its queue
delay: a batch takes waiting lookups in order while its pass would still end before the
earliest deadline among them, at most `max_batch`. The first text of a batch opens a
window of `window_ms` for company when others are already waiting (alone, it runs at
once); texts that arrive while a pass runs join the next one, which the embedder's thread
takes itself as the pass ends (not waiting for the event loop's next turn), so under load
batches fill, and follow each other, without any added delay. Texts without a deadline
(stores, in the background) wait behind every lookup and fill what room a batch has left; a
batch of them alone is kept to the time of two lone passes, so that a lookup arriving
meanwhile soon has its turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from cache.embedder import Embedded, Encoder, embed_many

_PASSES_FITTED = 32  # recent passes the time estimate is fitted to
_RESUME_SMOOTHING = 0.1  # weight of the latest lookup in the resume delay's average
# A pass of background texts alone lasts at most this many lone passes: a lookup that
# arrives during it waits for it whole (a pass cannot be cut), and under load stores of
# failed-open misses kept the embedder in passes of 32 (~260 ms with int8, one pass per
# text), longer than any lookup budget, so every lookup failed open and was stored in turn.
_BACKGROUND_PASSES = 2


class EmbedderBusy(Exception):
    """The embedder would not reach this text within the time the caller has left."""


class PassTimes:
    """Seconds a pass over n texts takes, least squares over recent passes:
    `fixed_s + per_text_s * n` (a plain rate when the sizes do not tell them apart)."""

    def __init__(self) -> None:
        self._passes: deque[tuple[int, float]] = deque(maxlen=_PASSES_FITTED)
        self._first = True
        self.fixed_s = 0.0
        self.per_text_s: float | None = None  # None: no pass measured yet

    def observe(self, texts: int, seconds: float) -> None:
        if not self._first and len(self._passes) == 1 and self._passes[0][0] == 0:
            self._passes.clear()  # the first pass (allocations, kernel choice) is dropped
        self._passes.append((0 if self._first else texts, seconds))
        self._first = False
        self.fixed_s, self.per_text_s = _fit([(max(n, 1), s) for n, s in self._passes])

    def seconds(self, texts: int, passes: int = 1) -> float:
        """Estimated time of `texts` in `passes` passes (0 before any pass)."""
        return passes * self.fixed_s + (self.per_text_s or 0.0) * texts


def _fit(passes: list[tuple[int, float]]) -> tuple[float, float]:
    sizes = [n for n, _ in passes]
    mean_n = sum(sizes) / len(passes)
    mean_s = sum(s for _, s in passes) / len(passes)
    spread = sum((n - mean_n) ** 2 for n in sizes)
    rate = sum(s / n for n, s in passes) / len(passes)
    if spread == 0:
        return 0.0, rate
    per_text = sum((n - mean_n) * (s - mean_s) for n, s in passes) / spread
    fixed = mean_s - per_text * mean_n
    if per_text <= 0 or fixed < 0:  # noise: fall back to a plain rate
        return 0.0, rate
    return fixed, per_text


@dataclass(eq=False)
class _Request:
    text: str
    future: asyncio.Future[Embedded]
    deadline: float  # time.monotonic() by which its pass must end; inf: background
    ended: float | None = None  # when its pass ended (time.monotonic(), in the thread)


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
        self.times = PassTimes()
        self._running_until: float | None = None  # expected end of the pass in progress
        self._resume_s = 0.0  # how late callers resume after their pass ended, smoothed
        self.refused = 0  # texts refused with EmbedderBusy
        self._closing = False  # read by the embedder's thread between passes
        self._handed_over = False  # the thread has passes to run (see `passing`)
        # What the passes did, for `stats()`: their time in the embedder's thread (the
        # model's work alone), the texts they embedded, how many there were.
        self.busy_s = 0.0
        self.texts = 0
        self.passes = 0

    async def start(self) -> None:
        if self._dispatcher is not None:
            return
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embedder")
        self._dispatcher = asyncio.get_running_loop().create_task(self._dispatch())

    async def close(self) -> None:
        """Stop batching; requests still waiting fail with CancelledError."""
        self._closing = True
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
    def passing(self) -> bool:
        """Whether passes are under way: from the dispatcher's hand-over of a batch until
        the embedder's thread finds nothing more to take."""
        return self._handed_over

    @property
    def resume_s(self) -> float:
        """How long after their pass ended lookups' callers resumed, recently."""
        return self._resume_s

    def expected_wait_s(self) -> float:
        """How long a lookup's text would take from now: the pass running, the lookups
        queued ahead, its own share, and the event loop's delay in resuming it. 0 when
        idle or before any pass was measured."""
        if self.times.per_text_s is None or self._idle():
            return 0.0
        now = time.monotonic()
        running = max(0.0, self._running_until - now) if self._running_until else 0.0
        texts = len(self._lookups) + 1
        passes = math.ceil(texts / self._max_batch)
        # A loop's delay to start each pass (the dispatcher resumes too), and the caller's.
        return running + self.times.seconds(texts, passes) + (passes + 1) * self._resume_s

    async def embed(self, text: str, within_s: float | None = None) -> Embedded:
        """The text's embedding. `within_s`: the most this lookup may wait; raises
        EmbedderBusy at once when the queue says it would wait longer. None: background
        work, which waits behind every lookup."""
        if self._dispatcher is None:
            raise RuntimeError("BatchingEmbedder.start() was not awaited")
        if within_s is None:
            return await self._queue(self._background, self._request(text, math.inf))
        expected = self.expected_wait_s()
        if expected > within_s:
            self.refused += 1
            raise EmbedderBusy(f"the embedder would take {expected:.3f} s")
        request = self._request(text, time.monotonic() + within_s)
        try:
            return await self._queue(self._lookups, request)
        finally:  # given up past its budget too: it resumed at least this late
            if request.ended is not None:
                self._resumed(time.monotonic() - request.ended)

    def stats(self) -> dict[str, float]:
        """Totals since start: `busy_s` over wall time is how busy the embedder was, and
        `busy_s / texts` what a text cost: with lookups failing open (`refused`) while the
        embedder was mostly idle, the lookups came in bursts or the event loop resumed
        them late; with it busy, the model is the limit."""
        return {
            "busy_s": self.busy_s,
            "texts": self.texts,
            "passes": self.passes,
            "refused": self.refused,
        }

    def _resumed(self, seconds: float) -> None:
        self._resume_s += _RESUME_SMOOTHING * (max(0.0, seconds) - self._resume_s)

    def _request(self, text: str, deadline: float) -> _Request:
        return _Request(text, asyncio.get_running_loop().create_future(), deadline)

    async def _queue(self, queue: deque[_Request], request: _Request) -> Embedded:
        queue.append(request)
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
            batch = await self._collect()
            if batch:
                await self._run(loop, batch)

    async def _collect(self) -> list[_Request]:
        while not self._lookups and not self._background:
            self._arrived.clear()
            await self._arrived.wait()
        await asyncio.sleep(0)  # requests issued in the same turn of the loop join at once
        batch: list[_Request] = []
        self._take(time.monotonic(), batch)
        if len(batch) <= 1:
            return batch  # alone: waiting for company would only add latency
        closes = time.monotonic() + self._window_s
        while len(batch) < self._max_batch and (remaining := closes - time.monotonic()) > 0:
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), remaining)
            except TimeoutError:
                break
            if not self._take(time.monotonic(), batch):
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
        earliest = min(request.deadline, *(r.deadline for r in batch))
        if math.isinf(earliest):  # background texts only: keep the pass short
            return self.times.seconds(len(batch) + 1) <= _BACKGROUND_PASSES * self.times.seconds(1)
        return now + self.times.seconds(len(batch) + 1) + self._resume_s <= earliest

    async def _run(self, loop: asyncio.AbstractEventLoop, batch: list[_Request]) -> None:
        live = [r for r in batch if not r.future.done()]
        if not live:
            return
        self._handed_over = True
        self._running_until = time.monotonic() + self.times.seconds(len(live))
        try:
            await loop.run_in_executor(self._executor, self._passes, loop, live)
        except asyncio.CancelledError:  # closing: nobody will answer these callers
            for r in live:
                r.future.cancel()
            raise
        finally:
            self._handed_over = False
            self._running_until = None

    def _passes(self, loop: asyncio.AbstractEventLoop, live: list[_Request]) -> None:
        """In the embedder's thread: the pass over `live`, then, as long as texts wait,
        the next batch, taken here as the dispatcher would take it. Handed over by the
        event loop instead, a batch waited for a whole turn of a busy loop: at concurrency
        64 (bench/cache_latency.py --quick --model-ms 200, a throwaway trace) the model sat
        idle with lookups waiting 19% of the time it was in demand, two thirds of that
        between passes, and lookups were refused meanwhile. The results go to their
        callers through the loop, which they resume on anyway."""
        while live and not self._closing:
            started = time.monotonic()
            self._running_until = started + self.times.seconds(len(live))
            try:
                results = self.encoder.encode([r.text for r in live])
            except Exception as exc:  # the callers get the error, the embedder goes on
                self._running_until = None
                self._post(loop, self._failed, live, exc)
            else:
                ended = time.monotonic()
                self._running_until = None  # before its callers can see it: none runs
                for r in live:
                    r.ended = ended
                self._post(loop, self._deliver, live, results, ended - started)
            if self._closing:
                return
            batch: list[_Request] = []
            self._take(time.monotonic(), batch)
            live = [r for r in batch if not r.future.done()]

    @staticmethod
    def _post(loop: asyncio.AbstractEventLoop, callback: Callable[..., None], *args: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
            loop.call_soon_threadsafe(callback, *args)

    def _deliver(self, live: list[_Request], results: list[Embedded], seconds: float) -> None:
        self.times.observe(len(live), seconds)
        self.busy_s += seconds
        self.texts += len(live)
        self.passes += 1
        for r, result in zip(live, results, strict=True):
            if not r.future.done():
                r.future.set_result(result)

    @staticmethod
    def _failed(live: list[_Request], exc: Exception) -> None:
        for r in live:
            if not r.future.done():
                r.future.set_exception(exc)
