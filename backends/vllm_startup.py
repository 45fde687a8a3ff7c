"""Where a vLLM start goes, read from the engine's own log: an operator who sees a 70 s cold
start must know whether to fix imports, weights, compilation or the KV cache, and the
gateway's own timeline sees only "launched" and "ready".

vLLM logs each step of its start (0.32.0: `non-default args`, `Starting to load model`,
`Loading weights took X seconds`, `Warming up model for the compilation...`, `Warming up
done.`, `init engine (profile, create kv cache, warmup model) took X s`, `Starting vLLM
server on ...`). Its lines carry local time to the second (`INFO 12-03 16:19:31`), so the
phases below are whole seconds, except `weights`, which vLLM times itself:

    imports_and_processes  launch -> `Starting to load model` (the API server's imports,
                           the engine-core and worker processes, the model's config)
    weights                the load, as vLLM timed it
    compile_and_warmup     `Warming up model` -> `Warming up done.` (torch.compile, CPU
                           kernels; on a GPU CUDA graphs); none without compilation (`-O0`,
                           as backends/local_vllm.py starts the CPU build)
    kv_cache               `Warming up done.` -> `init engine ... took` (the KV cache's
                           allocation; on a GPU its memory profiling comes first); without
                           a warm-up, from `Starting to load model` (the weights with it)
    api_server             -> `Starting vLLM server on` (the OpenAI server's routes)

Nothing here reads a clock: the caller gives the launch time.
"""

from __future__ import annotations

import re
from datetime import datetime

_STAMP = re.compile(r"(?:INFO|WARNING|DEBUG|ERROR) (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d) ")
_MARKS = {
    "load_model": "Starting to load model",
    "warmup_begun": "Warming up model",
    "warmup_done": "Warming up done",
    "engine_ready": "init engine (",
    "server_started": "Starting vLLM server on",
}
_WEIGHTS = re.compile(r"Loading weights took ([0-9.]+) seconds")


def events(log: str, year: int) -> dict[str, float]:
    """Each mark's first time in the log, as a POSIX timestamp (local time, `year` since
    vLLM leaves it out), and `weights_s` as vLLM timed it."""
    found: dict[str, float] = {}
    for line in log.splitlines():
        weights = _WEIGHTS.search(line)
        if weights is not None and "weights_s" not in found:
            found["weights_s"] = float(weights.group(1))
        stamp = _STAMP.search(line)
        if stamp is None:
            continue
        for name, text in _MARKS.items():
            if name not in found and text in line:
                found[name] = _timestamp(stamp, year)
    return found


def _timestamp(stamp: re.Match[str], year: int) -> float:
    month, day, hour, minute, second = (int(part) for part in stamp.groups())
    return datetime(year, month, day, hour, minute, second).timestamp()


def phases(log: str, launched_at: float) -> dict[str, float]:
    """The start's phases in seconds (see the module's docstring); a phase whose ends the
    log does not show is left out. `launched_at`: the POSIX time the process started."""
    year = datetime.fromtimestamp(launched_at).year
    marks = events(log, year)
    # The log's seconds are truncated: the launch to the second, too, so that a phase is
    # never negative.
    marks["launched"] = float(int(launched_at))
    warmed_up = "warmup_begun" in marks  # none with `-O0`
    spans = {
        "imports_and_processes": ("launched", "load_model"),
        "compile_and_warmup": ("warmup_begun", "warmup_done"),
        "kv_cache": ("warmup_done" if warmed_up else "load_model", "engine_ready"),
        "api_server": ("engine_ready", "server_started"),
    }
    result = {
        name: max(0.0, marks[end] - marks[begin])
        for name, (begin, end) in spans.items()
        if begin in marks and end in marks
    }
    if "weights_s" in marks:
        result["weights"] = marks["weights_s"]
    return result
