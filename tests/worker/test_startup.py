"""The start-up report: phases as consecutive intervals, and where the spawn time comes from."""

from __future__ import annotations

import time

import pytest

from backends.worker.startup import SPAWNED_AT_ENV, StartupReport, spawn_time

PHASES = ("process_start_s", "imports_s", "weights_read_s", "model_built_s", "first_forward_s")


class FakeClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_phases_are_consecutive_and_add_up_to_the_total() -> None:
    clock = FakeClock(100.5)
    report = StartupReport(100.0, "test", clock)
    for phase, step in [
        ("importing", 0.0),
        ("reading_weights", 2.0),
        ("building", 0.25),
        ("probing", 1.0),
        ("ready", 0.5),
    ]:
        clock.now += step
        report.begin(phase)  # type: ignore[arg-type]
    answer = report.as_json()
    assert answer["ready"] is True and answer["phase"] == "ready"
    assert answer["phases"] == dict(zip(PHASES, [0.5, 2.0, 0.25, 1.0, 0.5], strict=True))
    assert answer["total_s"] == 4.25
    assert list(answer["timeline"].values()) == [0.5, 2.5, 2.75, 3.75, 4.25]  # type: ignore[attr-defined]


def test_phases_not_yet_reached_are_null() -> None:
    clock = FakeClock(10.0)
    report = StartupReport(9.0, "test", clock)
    report.begin("importing")
    clock.now = 12.0
    answer = report.as_json()
    assert answer["phases"] == {"process_start_s": 1.0, **dict.fromkeys(PHASES[1:])}
    assert (answer["ready"], answer["total_s"], answer["elapsed_s"]) == (False, None, 3.0)


def test_a_failure_is_final_and_says_why() -> None:
    report = StartupReport(0.0, "test", FakeClock(1.0))
    report.begin("importing")
    report.fail("OSError: no config.json")
    report.begin("ready")
    answer = report.as_json()
    assert (answer["phase"], answer["ready"], answer["error"]) == (
        "failed",
        False,
        "OSError: no config.json",
    )
    assert report.failed


def test_models_collect_their_facts() -> None:
    report = StartupReport(0.0, "test", FakeClock(1.0))
    report.record("m", kind="chat", bytes=10)
    report.record("m", first_forward_s=0.1)
    assert report.as_json()["models"] == {
        "m": {"kind": "chat", "bytes": 10, "first_forward_s": 0.1}
    }


def test_spawn_time_comes_from_the_launcher_when_it_says() -> None:
    assert spawn_time({SPAWNED_AT_ENV: "1700000000.25"}) == (1700000000.25, SPAWNED_AT_ENV)


@pytest.mark.parametrize("env", [{}, {SPAWNED_AT_ENV: "soon"}])
def test_spawn_time_falls_back_to_the_process_start(env: dict[str, str]) -> None:
    started, source = spawn_time(env)
    assert source == "/proc/self/stat"
    # This test process started before now, and not days ago.
    assert 0 <= time.time() - started < 24 * 3600
