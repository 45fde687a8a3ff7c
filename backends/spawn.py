"""Starting a child process from the gateway without running fork handlers.

The event loop's own subprocess support (uvloop's, through libuv) starts a child with
fork(), and fork() first runs, in the parent, every `pthread_atfork` handler a loaded
library registered. NumPy's OpenBLAS registers one that shuts its thread pool down. With
the cache's pair model in a matrix product in a worker thread, that handler was seen to
wait forever, and the whole event loop with it: in the chaos suite a gateway replica
stopped answering at an engine's start (py-spy: the main thread in OpenBLAS's
`blas_thread_shutdown_` under `open_process`, the pair model's thread waiting inside a
NumPy matmul). tests/backends/test_spawn.py reproduces it.

`subprocess.Popen` starts the child with vfork() (CPython on Linux, when there is no
`preexec_fn`, user or group to set), which runs no fork handlers. It runs in a worker
thread, so the event loop does not wait for the exec; the exit is polled, as the gateway
starts few processes and learns of an exit within `POLL_S`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator, Mapping, Sequence, Set
from pathlib import Path
from typing import IO

import anyio

POLL_S = 0.05

# What a model server inherits of the gateway's environment: what a process needs to run,
# and the settings of CUDA, the engines, their thread pools and model hubs. Not the rest:
# it holds the gateway's secrets (admin and tenant keys, the Redis password, cloud
# credentials). A child needs a credential of its own (AWS keys for the Run:ai streamer)
# given in its `launch.env`. `HF_TOKEN` is inherited: it is the model hub's, for the
# model server to download gated weights.
INHERITED = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "TERM",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TMPDIR",
        "VIRTUAL_ENV",
        "LD_LIBRARY_PATH",
        "AWS_REGION",
        "AWS_DEFAULT_REGION",
        "AWS_ENDPOINT_URL",
        "AWS_ROLE_ARN",  # IRSA: a role and the path of its token file, no secret
        "AWS_WEB_IDENTITY_TOKEN_FILE",
    }
)
INHERITED_PREFIXES = (
    "LC_",
    "PYTHON",  # PYTHONPATH, PYTHONUNBUFFERED, ...
    "XDG_",
    "CUDA_",
    "NVIDIA_",
    "NCCL_",
    "VLLM_",
    "SGLANG_",
    "OMP_",
    "MKL_",
    "OPENBLAS_",
    "TORCH",  # TORCH_*, TORCHINDUCTOR_*
    "PYTORCH_",
    "HF_",
    "HUGGINGFACE_",
    "TRANSFORMERS_",
    "TOKENIZERS_",
    "RUNAI_",
    "COVERAGE_",  # `make coverage` measures the children too
)


def child_environment(
    extra: Mapping[str, str], environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment of a child the gateway starts: the allowlisted part of the
    gateway's own (`environ`, default os.environ), then `extra` (its `launch.env`)."""
    source = os.environ if environ is None else environ
    inherited = {
        name: value
        for name, value in source.items()
        if name in INHERITED or name.startswith(INHERITED_PREFIXES)
    }
    return {**inherited, **extra}


def first_cpus(count: int | None) -> set[int] | None:
    """The first `count` of the CPUs this process may run on, where it has more than that,
    so that at least one stays for everything else; None otherwise (no count, too few
    CPUs, or a platform without CPU affinity): the child may run anywhere this one may."""
    if count is None or not hasattr(os, "sched_getaffinity"):
        return None
    mine = sorted(os.sched_getaffinity(0))
    return set(mine[:count]) if len(mine) > count else None


@contextlib.contextmanager
def on_cpus(cpus: Set[int] | None) -> Iterator[None]:
    """Within it, processes this thread starts run on `cpus` alone (a child inherits the
    CPU set of the thread that forks it, and its own children inherit it from it); None:
    wherever this thread may. Only this thread's set changes, and it is restored after."""
    if cpus is None:
        yield
        return
    everything = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, everything)


class Child:
    """A started process: its pid, its exit status once it has exited, and waits for it."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self._popen = popen

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def returncode(self) -> int | None:
        """None while it runs; the exit code, or minus the signal that ended it."""
        return self._popen.poll()

    async def wait(self) -> int:
        # Polled: the exit of a child the event loop did not start is no event it delivers.
        while (code := self._popen.poll()) is None:  # noqa: ASYNC110
            await anyio.sleep(POLL_S)
        return code

    async def aclose(self) -> None:
        """Waits for the exit; cancelled while waiting, kills the process and reaps it."""
        try:
            await self.wait()
        except BaseException:
            self._popen.kill()
            with anyio.CancelScope(shield=True):
                await self.wait()
            raise


async def spawn(
    command: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    stdout: IO[bytes] | None = None,
    stderr: IO[bytes] | None = None,
    start_new_session: bool = False,
    cpus: Set[int] | None = None,
) -> Child:
    """Starts `command` (raises OSError when it cannot). Not cancellable halfway: a process
    that was started is always returned, so that its caller can reap it.

    `cpus`: the child and its own children run on these CPUs alone (`on_cpus`, around the
    start in the worker thread: a `preexec_fn` would cost the vfork above)."""

    def start() -> subprocess.Popen[bytes]:
        with on_cpus(cpus):
            return subprocess.Popen(
                list(command),
                env=None if env is None else dict(env),
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                start_new_session=start_new_session,
            )

    with anyio.CancelScope(shield=True):
        popen = await anyio.to_thread.run_sync(start)
    return Child(popen)


def signal_group(pid: int, sig: signal.Signals) -> None:
    """Sends `sig` to the process group `pid` leads (children are started in a session of
    their own), if it is still there."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
