"""The one vLLM that the real-engine tests share, started once per run however the run is
split: in this process, or, under pytest-xdist (`make test` runs two workers), by the first
worker to collect the tests, for whichever worker runs them.

Under xdist every worker collects every test, so each would start an engine of its own
(35-50 s of the two cores each). Instead the controller names a folder
(`GATEWAY_TEST_ENGINE_DIR`, inherited by the workers it spawns); the first worker to
create its lock file starts the engine and writes where it listens, the others read that,
and the controller stops it when the whole run ends: the worker that started it may finish
its own tests long before the one that runs the engine's.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from backends.local_vllm import ROOT, command_line, default_model, engine_python, environment
from backends.spawn import first_cpus, on_cpus
from backends.worker.tiny_model import VLLM, write_tiny_chat_model
from bench.processes import ServerProcess, free_port

SHARED_DIR = "GATEWAY_TEST_ENGINE_DIR"
# Engines started by this process: kept for its lifetime, so that a handle collected while
# its engine still runs for another worker does not warn (and fail the test it lands in).
_LAUNCHED: list[ServerProcess] = []
MODEL = "tiny-vllm"
BYTE_MODEL_DIR = "tiny-vllm-ascii"  # byte-level, writes printable ASCII
MAX_NUM_SEQS = 4
STOP_TIMEOUT_S = 15.0

# A tool parser: vLLM refuses a named tool_choice without one (it then constrains the
# output to the tool's schema itself; `pythonic` needs no special tokens). JSON without free
# whitespace: a schema's enum then bounds the arguments' length.
ENGINE_FLAGS = [
    *("--max-num-seqs", str(MAX_NUM_SEQS)),
    *("--enable-auto-tool-choice", "--tool-call-parser", "pythonic"),
    "--structured-outputs-config",
    json.dumps({"backend": "xgrammar", "disable_any_whitespace": True}),
]


class EngineMissing(RuntimeError):
    """`make engine` has not been run: the engine's venv is not there."""


@dataclass(frozen=True)
class Engine:
    url: str  # server root: /metrics, /health
    base_url: str  # .../v1
    pid: int  # its process group's leader (started in a session of its own)
    log_path: str

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not _alive(self.pid):
                raise RuntimeError(f"vLLM exited while starting:\n{self.log()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"vLLM not ready in {timeout_s} s:\n{self.log()}")

    def log(self) -> str:
        path = Path(self.log_path)
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def stop(self) -> None:
        """SIGTERM to its process group, SIGKILL if it is still there after 15 s."""
        try:
            os.killpg(self.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while _alive(self.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _alive(self.pid):
            os.killpg(self.pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)  # reaps it when it is our own child
    except ChildProcessError:  # another process's child: ask whether it is there
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return waited == 0


def engine_model(root: Path = ROOT) -> Path:
    """`make engine`'s model with a byte-level tokenizer, so that vLLM's grammar engine can
    constrain a tool call (it cannot read the WordPiece one: tiny_model.byte_tokenizer),
    written beside it. One engine for every test; the cold-start test starts another with
    the same model and flags."""
    folder = default_model(root).with_name(BYTE_MODEL_DIR)
    return write_tiny_chat_model(folder, shape=VLLM, byte_level=True)


def start_engine(root: Path, folder: Path) -> Engine:
    """Launches vLLM and returns at once (`Engine.wait_ready` waits for it)."""
    python = engine_python(root)
    if not python.exists():
        raise EngineMissing(f"{python} is missing: `make test` installs it (`make engine`)")
    model, port = engine_model(root), free_port()
    server = ServerProcess(
        command_line(python, model, port, name=MODEL, extra=ENGINE_FLAGS),
        f"http://127.0.0.1:{port}/health",
        folder / "vllm.log",
        env=environment(),
    )
    with on_cpus(engine_cpus()):
        server.launch()
    _LAUNCHED.append(server)
    assert server.process is not None
    url = f"http://127.0.0.1:{port}"
    return Engine(url, f"{url}/v1", server.process.pid, str(server.log_path))


def engine_cpus() -> set[int] | None:
    """The first CPU of this process's, where it has two or more; else None (all of them).

    vLLM's CPU build busy-polls in two processes, its engine core and its worker. Given
    both of this machine's cores they took both, and its API server, the gateway and the
    tests waited for CPU: 16 streams of 512 tokens, four at a time, came back in bursts
    seconds apart (the last three rounds' tokens all at once, 3-5 s late), so the order
    in which answers arrived no longer said in which order the engine ran them, and the
    priority test failed on a round where it did (2026-12-07). On one CPU of its own, as
    the benchmarks' `--pin on` runs it and as a GPU host would (its CPU processes beside
    the GPU), each round arrived as it ended, tokens 10-20 ms apart at most."""
    return first_cpus(1)  # as `make run-vllm` starts it (`launch.cpus: 1`)


def engine_for_this_run(root: Path) -> tuple[Engine, bool]:
    """The run's engine and whether this process must stop it: started here when the run is
    not split (or by the first worker, under xdist), else the one a sibling started."""
    shared = os.environ.get(SHARED_DIR)
    if shared is None:
        return start_engine(root, Path(tempfile.mkdtemp(prefix="vllm-engine-"))), True
    folder = Path(shared)
    try:
        os.close(os.open(folder / "lock", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return _read(folder / "engine.json"), False
    engine = start_engine(root, folder)
    written = folder / "engine.json.partial"
    written.write_text(json.dumps(asdict(engine)))
    written.rename(folder / "engine.json")  # whole, or not there yet
    return engine, False


def _read(path: Path, timeout_s: float = 120.0) -> Engine:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"no worker wrote {path} in {timeout_s} s")
        time.sleep(0.1)
    return Engine(**json.loads(path.read_text()))


def share_with_workers() -> Path:
    """The controller's side: the folder the workers it spawns will share."""
    folder = Path(tempfile.mkdtemp(prefix="vllm-engine-"))
    os.environ[SHARED_DIR] = str(folder)
    return folder


def stop_shared(folder: Path) -> None:
    """The controller's side, once every worker is done: stops the engine a worker started."""
    path = folder / "engine.json"
    if path.exists():
        Engine(**json.loads(path.read_text())).stop()
