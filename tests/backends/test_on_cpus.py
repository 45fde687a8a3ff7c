"""backends/spawn.py's `on_cpus`: where the processes the gateway, a benchmark or a test starts
run."""

from __future__ import annotations

import os
import subprocess
import sys

from backends.spawn import on_cpus

CHILD = "import os; print(sorted(os.sched_getaffinity(0)))"


def cpus_of_a_child() -> list[int]:
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, check=True)
    return [int(cpu) for cpu in out.stdout.decode().strip("[]\n").split(",")]


def test_a_process_started_within_runs_on_those_cpus_and_this_thread_gets_its_own_back() -> None:
    everything = os.sched_getaffinity(0)
    first = min(everything)
    with on_cpus({first}):
        assert cpus_of_a_child() == [first]
    assert os.sched_getaffinity(0) == everything
    assert cpus_of_a_child() == sorted(everything)


def test_none_leaves_them_where_they_were() -> None:
    everything = os.sched_getaffinity(0)
    with on_cpus(None):
        assert cpus_of_a_child() == sorted(everything)
    assert os.sched_getaffinity(0) == everything
