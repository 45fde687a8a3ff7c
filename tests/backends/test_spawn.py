"""backends.spawn: child processes started while another thread multiplies matrices.

The gateway runs under uvloop, and the cache's pair model scores in a worker thread with
NumPy's OpenBLAS. A child started with fork() runs OpenBLAS's fork handler, which can wait
forever for that thread (backends/spawn.py says why): the event loop froze. The scenario
runs in a child interpreter with a deadline, since a frozen one holds the GIL and cannot
time itself out.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import anyio
import pytest

from backends.spawn import first_cpus, spawn

ROOT = Path(__file__).resolve().parents[2]

# Starts `SPAWNS` processes under uvloop with backends.spawn while a thread scores pairs
# with the packaged pair model, as the cache does; prints how many scores overlapped them.
SCENARIO = textwrap.dedent(
    """
    import threading
    import anyio, numpy as np
    from cache.cross import PairModel
    from cache.features import TokenFeatures

    SPAWNS = 60
    model, rng = PairModel.load(), np.random.default_rng(0)

    def features(n):
        ids = rng.integers(0, 30000, n).astype(np.uint16)
        return TokenFeatures(ids, rng.standard_normal((n, 384)).astype(np.float16), False)

    query, cached = features(24).to_bytes(), [features(30).to_bytes() for _ in range(4)]
    scored, first, done = [0], threading.Event(), threading.Event()

    def score():
        while not done.is_set():
            model.score_many(query, cached)
            scored[0] += 1
            first.set()

    async def start_children():
        from backends.spawn import spawn
        before = scored[0]
        for _ in range(SPAWNS):
            child = await spawn(["true"])
            assert await child.wait() == 0
        return scored[0] - before

    scorer = threading.Thread(target=score, daemon=True)
    scorer.start()
    first.wait()
    overlapped = anyio.run(start_children, backend_options={"use_uvloop": True})
    done.set()
    scorer.join()  # one CI run hung at exit, after its output, with this thread still scoring
    print("overlapped", overlapped)
    """
)


def test_children_start_while_a_thread_multiplies_matrices_under_uvloop() -> None:
    result = subprocess.run(
        [sys.executable, "-c", SCENARIO],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,  # with anyio.open_process (uvloop's fork) it froze in 4 runs of 5
    )
    assert result.returncode == 0, result.stderr[-2000:]
    overlapped = int(result.stdout.split()[-1])
    assert overlapped > 0, "no score ran while the children started: the case tested nothing"


async def test_exit_codes_and_signals_as_subprocess_reports_them() -> None:
    ok = await spawn([sys.executable, "-c", "import sys; sys.exit(3)"])
    assert await ok.wait() == 3
    assert ok.returncode == 3
    sleeper = await spawn([sys.executable, "-c", "import time; time.sleep(30)"])
    assert sleeper.returncode is None
    started = time.monotonic()
    os.kill(sleeper.pid, signal.SIGTERM)
    assert await sleeper.wait() == -signal.SIGTERM
    assert time.monotonic() - started < 5


async def test_a_cancelled_close_kills_and_reaps_the_child() -> None:
    child = await spawn([sys.executable, "-c", "import time; time.sleep(30)"])
    with anyio.move_on_after(0.2):
        await child.aclose()
    assert child.returncode == -signal.SIGKILL


async def test_a_missing_program_raises_oserror(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        await spawn([str(tmp_path / "no-such-program")])


async def test_output_goes_to_the_file_given(tmp_path: Path) -> None:
    log = tmp_path / "out.log"
    with log.open("ab") as out:
        child = await spawn(
            [sys.executable, "-c", "import sys; print('hello'); print('oops', file=sys.stderr)"],
            stdout=out,
            stderr=out,
            env={"PATH": "/usr/bin:/bin"},
            cwd=tmp_path,
        )
    assert await child.wait() == 0
    assert sorted(log.read_text().split()) == ["hello", "oops"]


PRINT_CPUS = "import os; print(' '.join(map(str, sorted(os.sched_getaffinity(0)))))"


async def test_a_child_started_on_cpus_runs_on_them_and_the_starter_keeps_its_own(
    tmp_path: Path,
) -> None:
    mine = os.sched_getaffinity(0)
    first = {min(mine)}  # a set this machine has, whatever its size
    log = tmp_path / "cpus.log"
    with log.open("ab") as out:
        child = await spawn([sys.executable, "-c", PRINT_CPUS], stdout=out, cpus=first)
    assert await child.wait() == 0
    assert {int(cpu) for cpu in log.read_text().split()} == first
    assert os.sched_getaffinity(0) == mine  # the worker thread's set was restored
    assert await anyio.to_thread.run_sync(os.sched_getaffinity, 0) == mine


def test_first_cpus_leaves_at_least_one_cpu_to_the_gateway(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {7, 3, 5})
    assert first_cpus(1) == {3}
    assert first_cpus(2) == {3, 5}
    assert first_cpus(3) is None  # none would be left: the child shares them all
    assert first_cpus(None) is None
