"""`backends[].launch.cpus`: the gateway starts its model server on the first CPUs of its own
and leaves it the rest (vLLM's CPU build busy-polls; README "A real vLLM on this machine")."""

from __future__ import annotations

import os
from pathlib import Path

from bench.processes import start_gateway
from tests.backends.support import MINI_SERVER, servers


def test_a_launched_server_runs_on_the_first_cpu_and_leaves_the_rest(tmp_path: Path) -> None:
    state = tmp_path / "server"
    state.mkdir()
    command = ["{python}", str(MINI_SERVER), "--port", "{port}", "--state-dir", str(state)]
    backend = {
        "name": "mini",
        "base_url": "http://127.0.0.1:{port}/v1",
        "models": ["mini"],
        "launch": {"command": command, "cpus": 1},
    }
    config = {
        "state": {"url": "memory", "path": str(tmp_path / "state.json")},
        "backends": [backend],
        "cache": {"enabled": False},
    }
    mine = os.sched_getaffinity(0)
    gateway = start_gateway(config, tmp_path)
    try:
        (pid,) = servers(state)
        # One CPU alone would leave the gateway none: then the server shares them all.
        expected = {min(mine)} if len(mine) > 1 else mine
        assert os.sched_getaffinity(pid) == expected
    finally:
        gateway.stop()
