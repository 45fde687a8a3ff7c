"""A starting worker over real HTTP: 503 while it loads, 200 only once every model answered.

The worker is held (test-only flag) after it has read its weights and built its model but
before the probe, so the test sees that state for certain rather than by timing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import torch

from backends.worker.startup import SPAWNED_AT_ENV
from backends.worker.weights import weight_files
from bench.processes import ROOT, free_port

PHASE_ORDER = ["starting", "importing", "reading_weights", "building", "probing", "ready"]
DURATIONS = ["process_start_s", "imports_s", "weights_read_s", "model_built_s", "first_forward_s"]
MESSAGES = [{"role": "user", "content": "Hello"}]


@dataclass
class StartingWorker:
    process: subprocess.Popen[bytes]
    url: str
    release: Path
    log_path: Path

    def get(self, path: str) -> httpx.Response:
        return httpx.get(self.url + path, timeout=5)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for(self, path: str, done: object, timeout_s: float = 120) -> list[httpx.Response]:
        """Poll `path` until `done(response)`; return every answer seen."""
        answers: list[httpx.Response] = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log()
            try:
                answers.append(self.get(path))
            except httpx.TransportError:
                time.sleep(0.02)
                continue
            if done(answers[-1]):  # type: ignore[operator]
                return answers
            time.sleep(0.05)
        raise AssertionError(f"{path} never got there:\n{self.log()}")

    def stop(self) -> int:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        return self.process.returncode


def _start(tmp_path: Path, chat_model: str, *extra: str) -> StartingWorker:
    port = free_port()
    release = tmp_path / "release"
    log_path = tmp_path / "worker.log"
    command = [
        sys.executable,
        "-m",
        "backends.worker",
        "--port",
        str(port),
        "--chat-model",
        chat_model,
        "--max-tokens",
        "4",
        "--test-hold-before-probe",
        str(release),
        *extra,
    ]
    env = {**os.environ, SPAWNED_AT_ENV: repr(time.time())}
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True
        )
    return StartingWorker(process, f"http://127.0.0.1:{port}", release, log_path)


@pytest.fixture
def starting_worker(tmp_path: Path, synthetic_model_dir: Path) -> Iterator[StartingWorker]:
    worker = _start(tmp_path, f"syn={synthetic_model_dir}")
    yield worker
    worker.stop()


def _phase(response: httpx.Response) -> str:
    return str(response.json()["phase"])


def test_health_is_503_until_the_probe_has_answered(
    starting_worker: StartingWorker, synthetic_model_dir: Path
) -> None:
    worker = starting_worker
    seen = worker.wait_for("/health", lambda r: r.status_code != 503 or _phase(r) == "probing")
    phases = [_phase(answer) for answer in seen]
    assert all(answer.status_code == 503 for answer in seen), worker.log()
    assert phases == sorted(phases, key=PHASE_ORDER.index)
    assert seen[-1].json() == {"status": "loading", "phase": "probing"}
    assert seen[-1].headers["Retry-After"] == "1"

    # Weights read and model built, probe not yet run: still not ready.
    report = worker.get("/startup").json()
    assert (report["ready"], report["phase"], report["total_s"]) == (False, "probing", None)
    assert report["phases"]["weights_read_s"] is not None
    assert report["phases"]["first_forward_s"] is None
    syn = report["models"]["syn"]
    # On CUDA the loader reads in chunks through pinned buffers (backends/worker/weights.py):
    # seen on an H200, where this test had expected mmap.
    loader = "chunked" if torch.cuda.is_available() else "mmap"
    assert syn["loader"] == loader and syn["kind"] == "chat" and "first_forward_s" not in syn
    on_disk = sum(path.stat().st_size for path in weight_files(synthetic_model_dir))
    assert 0.99 * on_disk < syn["bytes"] <= on_disk and syn["load_gbps"] > 0

    body = {"model": "syn", "messages": MESSAGES}
    for answer in (
        httpx.post(worker.url + "/v1/chat/completions", json=body),
        worker.get("/v1/models"),
    ):
        assert answer.status_code == 503 and answer.headers["Retry-After"] == "1"
        error = answer.json()["error"]
        assert (error["type"], error["code"]) == ("server_error", "models_loading")

    worker.release.touch()
    worker.wait_for("/health", lambda r: r.status_code == 200)
    assert worker.get("/health").json() == {"status": "ok"}
    answer = httpx.post(worker.url + "/v1/chat/completions", json=body, timeout=30)
    assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"]
    _assert_plausible_report(worker.get("/startup").json())


def _assert_plausible_report(report: dict[str, object]) -> None:
    assert (report["ready"], report["phase"], report["error"]) == (True, "ready", None)
    assert report["spawned_from"] == SPAWNED_AT_ENV
    phases = report["phases"]
    assert isinstance(phases, dict) and list(phases) == DURATIONS
    assert all(isinstance(value, float) and value >= 0 for value in phases.values()), phases
    timeline = list(report["timeline"].values())  # type: ignore[attr-defined]
    assert timeline == sorted(timeline) and len(timeline) == len(DURATIONS)
    total = report["total_s"]
    assert isinstance(total, float)
    assert sum(phases.values()) <= total + 1e-3 and total <= report["elapsed_s"]  # type: ignore[operator]
    assert total < 120  # spawned moments before, by this test
    syn = report["models"]["syn"]  # type: ignore[index]
    assert syn["first_forward_s"] > 0 and syn["model_built_s"] > 0
    assert syn["weights_read_s"] <= phases["weights_read_s"]


@pytest.mark.serial  # a 10 s bound on a worker that is loading torch
def test_sigterm_while_loading_stops_the_worker_cleanly(starting_worker: StartingWorker) -> None:
    starting_worker.wait_for("/health", lambda r: _phase(r) == "probing")
    started = time.monotonic()
    assert starting_worker.stop() == 0, starting_worker.log()
    assert time.monotonic() - started < 10


def test_a_model_that_cannot_load_ends_the_worker_with_status_1(tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "no-such-architecture"}')
    worker = _start(tmp_path, f"broken={broken}")
    try:
        assert worker.process.wait(timeout=120) == 1, worker.log()
    finally:
        worker.stop()
    assert "loading the models failed" in worker.log()
