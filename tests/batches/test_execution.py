"""One job's run against a fake request path (the seam: `Context.serve`): lines refused for
load go again, a cancel lets lines in flight finish, a window that passes cuts them, and a
shutdown gives them time to finish and be recorded."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import anyio
import orjson
import pytest
from starlette.responses import Response

from gateway.batches.execution import Context, JobRun
from gateway.batches.lines import InputLine
from gateway.batches.models import BatchJob
from gateway.batches.store import FileBatchStore
from gateway.openai_schema import Kind
from gateway.settings import BatchSettings

NOW = 1_000_000.0


def lines(n: int) -> list[InputLine]:
    return [
        InputLine(i, f"c{i}", "/v1/chat/completions", "m", orjson.dumps({"n": i})) for i in range(n)
    ]


def job(total: int) -> BatchJob:
    return BatchJob(
        id="batch_t",
        tenant="acme",
        input_file_id="file-1",
        endpoint="/v1/chat/completions",
        completion_window="24h",
        created_at=int(NOW),
        expires_at=int(NOW) + 60,
        total=total,
        status="in_progress",
    )


class Upstream:
    """Answers each line by the script `answer(line, attempt)`; counts what it was sent."""

    def __init__(self, answer: Callable[[int, int], tuple[int, dict[str, str]]], delay_s: float):
        self.answer = answer
        self.delay_s = delay_s
        self.sent: Counter[int] = Counter()
        self.finished: Counter[int] = Counter()

    async def __call__(self, owner: str, raw: bytes, kind: Kind, path: str) -> Response:
        index = orjson.loads(raw)["n"]
        self.sent[index] += 1
        await anyio.sleep(self.delay_s)
        status, headers = self.answer(index, self.sent[index])
        self.finished[index] += 1
        body = orjson.dumps({"line": index, "status": status})
        return Response(body, status, {**headers, "x-request-id": f"req_{index}"})


async def context(
    tmp_path: Path, upstream: Upstream, clock: Callable[[], float] = lambda: NOW, **settings: float
) -> tuple[Context, Counter[str]]:
    outcomes: Counter[str] = Counter()
    config = BatchSettings.model_validate(
        {"concurrency": 2, "retry_base_s": 0.01, "retry_cap_s": 0.02, **settings}
    )
    store = await FileBatchStore.open(tmp_path)
    shared = anyio.Semaphore(4)
    count = lambda outcome: outcomes.update([outcome])  # noqa: E731
    return Context(
        store, upstream, config, shared, "runner_t", count, clock, random.Random(1)
    ), outcomes


async def test_lines_refused_for_load_go_again_and_each_is_recorded_once(tmp_path: Path) -> None:
    def answer(index: int, attempt: int) -> tuple[int, dict[str, str]]:
        if index == 3:
            return 429, {}  # over a quota on its own: a result, not a retry
        return (503, {"retry-after": "0"}) if attempt <= 2 else (200, {})

    upstream = Upstream(answer, 0.001)
    ctx, outcomes = await context(tmp_path, upstream)
    assert await JobRun(job(6), lines(6), ctx).run() == "completed"
    assert upstream.sent == Counter({0: 3, 1: 3, 2: 3, 3: 1, 4: 3, 5: 3})
    results = await ctx.store.results("batch_t")
    assert [(r.index, r.status_code) for r in results] == [
        (0, 200),
        (1, 200),
        (2, 200),
        (3, 429),
        (4, 200),
        (5, 200),
    ]
    assert results[0].body == {"line": 0, "status": 200} and results[0].request_id == "req_0"
    assert outcomes == Counter({"retried": 10, "completed": 5, "failed": 1})


async def test_a_run_resumes_after_the_recorded_lines(tmp_path: Path) -> None:
    upstream = Upstream(lambda index, attempt: (200, {}), 0.001)
    ctx, _ = await context(tmp_path, upstream)
    first = JobRun(job(4), lines(4), ctx)
    first._pending.clear()  # a run that stopped after line 1: as the store says
    for index in (0, 1):
        await first._send(lines(4)[index])
    upstream.sent.clear()
    assert await JobRun(job(4), lines(4), ctx).run() == "completed"
    assert upstream.sent == Counter({2: 1, 3: 1})


async def test_a_cancel_lets_lines_in_flight_finish_and_starts_no_more(tmp_path: Path) -> None:
    upstream = Upstream(lambda index, attempt: (200, {}), 0.3)
    ctx, _ = await context(tmp_path, upstream)
    run = JobRun(job(10), lines(10), ctx)
    async with anyio.create_task_group() as group:

        async def cancel_soon() -> None:
            await anyio.sleep(0.1)  # lines 0 and 1 are in flight
            await ctx.store.request_cancel("batch_t", int(NOW))
            run._checked_at = -1.0  # look now rather than within a second

        group.start_soon(cancel_soon)
        assert await run.run() == "cancelled"
    assert upstream.finished == Counter({0: 1, 1: 1})
    assert await ctx.store.done("batch_t") == {0, 1}


async def test_the_window_passing_cuts_lines_in_flight(tmp_path: Path) -> None:
    now = [NOW]
    upstream = Upstream(lambda index, attempt: (200, {}), 5.0)
    ctx, outcomes = await context(tmp_path, upstream, clock=lambda: now[0])
    run = JobRun(job(4), lines(4), ctx)
    async with anyio.create_task_group() as group:

        async def expire_soon() -> None:
            await anyio.sleep(0.1)
            now[0] = NOW + 61
            run._checked_at = -1.0

        group.start_soon(expire_soon)
        with anyio.fail_after(2):
            assert await run.run() == "expired"
    assert not upstream.finished and await ctx.store.done("batch_t") == set()
    assert outcomes["interrupted"] == 2


@pytest.mark.parametrize(("drain_s", "recorded"), [(2.0, {0, 1}), (0.0, set())])
async def test_a_shutdown_drains_lines_in_flight(
    tmp_path: Path, drain_s: float, recorded: set[int]
) -> None:
    upstream = Upstream(lambda index, attempt: (200, {}), 0.3)
    ctx, _ = await context(tmp_path, upstream, drain_s=drain_s)
    with anyio.move_on_after(0.1):  # the lifespan's task group, cancelled at shutdown
        await JobRun(job(10), lines(10), ctx).run()
    assert await ctx.store.done("batch_t") == recorded
    assert set(upstream.sent) == {0, 1}
