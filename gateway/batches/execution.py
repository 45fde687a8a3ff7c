"""One job's lines, sent through the request path until each has a result or the job ends.

    run = JobRun(job, lines, context)
    ending = await run.run()        # "completed", "cancelled", "expired", or "lost"

Lines go in file order, at most `concurrency` of the job's at once and `max_concurrency`
over all jobs (`Context.shared`). A line refused for load waits (gateway/batches/policy.py)
and goes again; any other answer is its result, recorded in the store before it counts as
done (gateway/batches/store.py says what a crash can lose). Once a second the job is looked
at again: a cancel asked for stops new lines (those in flight finish, as OpenAI's do), its
window passing stops them all, and a lease lost to another replica (Redis) stops them all
and leaves the job to that replica.

A line runs in a shielded scope: when the gateway shuts down, lines in flight get
`drain_s` to finish and be recorded, instead of being cut and sent again after the restart.
"""

from __future__ import annotations

import heapq
import logging
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

import anyio
import orjson
from anyio.abc import TaskGroup
from starlette.responses import Response

from common.backoff import Backoff
from gateway.batches.errors import BatchStoreError
from gateway.batches.lines import InputLine
from gateway.batches.models import BatchJob, LineResult, new_id
from gateway.batches.policy import backoff_s, retryable
from gateway.batches.store import BatchStore
from gateway.openai_schema import Kind
from gateway.settings import BatchSettings
from gateway.traffic.retry import parse_retry_after

_log = logging.getLogger("gateway.batches")
Ending = Literal["completed", "cancelled", "expired", "lost"]
# The batch pipeline's entry point (`Pipeline.line`): owner, body, kind, path.
Serve = Callable[[str, bytes, Kind, str], Awaitable[Response]]
CHECK_S = 1.0  # how often a running job looks for a cancel, its expiry, its lease
RECORD_ATTEMPTS = 5
RECORD_BACKOFF = Backoff(base_s=0.4, cap_s=5.0, jitter="none")  # 0.4, 0.8, 1.6, 3.2, 5 s


@dataclass
class Context:
    """What every job's run shares."""

    store: BatchStore
    serve: Serve
    settings: BatchSettings
    shared: anyio.Semaphore  # lines in flight over all jobs
    owner: str  # this runner, as the lease names it
    outcome: Callable[[str], None] = lambda outcome: None  # counts line outcomes (metrics)
    clock: Callable[[], float] = time.time
    rng: random.Random = field(default_factory=random.Random)


class JobRun:
    def __init__(self, job: BatchJob, lines: list[InputLine], context: Context) -> None:
        self._job = job
        self._lines = lines
        self._c = context
        self._slots = anyio.Semaphore(context.settings.concurrency)
        self._pending: deque[int] = deque()
        self._retries: list[tuple[float, int]] = []  # (due, monotonic; line index)
        self._attempts: dict[int, int] = {}
        self._backoff = Backoff(context.settings.retry_base_s, context.settings.retry_cap_s)
        self._in_flight: dict[int, anyio.CancelScope] = {}
        self._changed = anyio.Event()
        self._checked_at = -CHECK_S
        self._cancelled = False  # asked for: no new line starts, those in flight finish

    async def run(self) -> Ending:
        done = await self._c.store.done(self._job.id)
        self._pending.extend(line.index for line in self._lines if line.index not in done)
        async with anyio.create_task_group() as lines:
            try:
                ending = await self._dispatch(lines)
            except BaseException:  # the gateway shuts down, or the store failed
                self._stop_in_flight(self._c.settings.drain_s)
                raise
            if ending in ("expired", "lost"):
                self._stop_in_flight(0)
        return ending

    async def _dispatch(self, lines: TaskGroup) -> Ending:
        while True:
            ending = await self._check()
            if ending is not None:
                return ending
            if not self._in_flight and (self._cancelled or not self._waiting()):
                return "cancelled" if self._cancelled else "completed"
            if self._cancelled or not self._due():
                await self._wait()
                continue
            if not await self._acquire():
                continue
            ending = await self._check()  # it may have waited for a slot: is the job still on?
            if ending is not None or self._cancelled:
                self._release()
                if ending is not None:
                    return ending
                continue
            self._start(lines)

    def _start(self, lines: TaskGroup) -> None:
        index = self._take()
        # In flight from now (not from when its task first runs), and shielded: see module.
        scope = self._in_flight[index] = anyio.CancelScope(shield=True)
        lines.start_soon(self._line, index, scope)

    def look_now(self) -> None:
        """A cancel was asked for here: see it at once, not within CHECK_S."""
        self._checked_at = -CHECK_S
        self._changed.set()

    async def _check(self) -> Ending | None:
        now = time.monotonic()
        if now - self._checked_at < CHECK_S:
            return None
        self._checked_at = now
        job, store = self._job, self._c.store
        if self._c.clock() >= job.expires_at:
            return "expired"
        if not await store.claim(job.id, self._c.owner, self._c.settings.lease_s):
            return "lost"
        if not self._cancelled and await store.cancel_requested(job.id) is not None:
            self._cancelled = True
            self._pending.clear()
            self._retries.clear()
        return None

    def _waiting(self) -> bool:
        return bool(self._pending or self._retries)

    def _due(self) -> bool:
        return bool(self._pending) or (bool(self._retries) and self._retries[0][0] <= _now())

    def _take(self) -> int:
        if self._retries and self._retries[0][0] <= _now():
            return heapq.heappop(self._retries)[1]  # a line that waited goes before new ones
        return self._pending.popleft()

    async def _wait(self) -> None:
        """Until a line ends, the next retry is due, or it is time to check the job."""
        wait_s = CHECK_S
        if self._retries:
            wait_s = min(wait_s, max(0.0, self._retries[0][0] - _now()))
        with anyio.move_on_after(wait_s):
            await self._changed.wait()
        self._changed = anyio.Event()

    async def _acquire(self) -> bool:
        """A slot of the job's and one of all jobs'; False if none came within CHECK_S."""
        with anyio.move_on_after(CHECK_S):
            await self._slots.acquire()
            try:
                await self._c.shared.acquire()
            except BaseException:
                self._slots.release()
                raise
            return True
        return False

    def _release(self) -> None:
        self._slots.release()
        self._c.shared.release()

    async def _line(self, index: int, scope: anyio.CancelScope) -> None:
        with scope:
            try:
                await self._send(self._lines[index])
            finally:
                del self._in_flight[index]
                self._release()
                self._changed.set()
        if scope.cancelled_caught:
            self._c.outcome("interrupted")  # no result: it goes again when the job resumes

    async def _send(self, line: InputLine) -> None:
        response = await self._c.serve(self._job.tenant, line.body, line.kind, line.url)
        status, headers = response.status_code, response.headers
        if retryable(status, headers):
            self._retry(line.index, headers.get("retry-after"))
            return
        result = LineResult(
            index=line.index,
            id=new_id("batch_req_"),
            custom_id=line.custom_id,
            status_code=status,
            request_id=headers.get("x-request-id", ""),
            body=_json(bytes(response.body)),
        )
        if await self._record(result):
            self._c.outcome("completed" if result.succeeded else "failed")

    def _retry(self, index: int, retry_after: str | None) -> None:
        if self._cancelled:
            return  # not run: the error file says so
        attempt = self._attempts[index] = self._attempts.get(index, 0) + 1
        after_s = parse_retry_after(retry_after, time.time())
        wait_s = backoff_s(attempt, after_s, self._backoff, self._c.rng.random())
        heapq.heappush(self._retries, (_now() + wait_s, index))
        self._c.outcome("retried")

    async def _record(self, result: LineResult) -> bool:
        """The result, written before the line counts as done; if the store stays away, the
        answer is lost and the line goes again later (never counted twice: the store keeps
        the first result of a line)."""
        for attempt in range(1, RECORD_ATTEMPTS + 1):
            try:
                await self._c.store.record(self._job.id, result)
                return True
            except BatchStoreError as exc:
                _log.warning("batch %s: recording a result failed: %s", self._job.id, exc)
                await anyio.sleep(RECORD_BACKOFF.delay_s(attempt))
        self._retry(result.index, None)
        return False

    def _stop_in_flight(self, grace_s: float) -> None:
        deadline = anyio.current_time() + grace_s
        for scope in self._in_flight.values():
            scope.deadline = min(scope.deadline, deadline)


def _now() -> float:
    return time.monotonic()


def _json(body: bytes) -> object:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return body.decode("utf-8", "replace")  # not JSON (never from the gateway itself)
