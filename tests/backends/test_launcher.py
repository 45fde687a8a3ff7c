"""backends/launcher.py's `LocalProcess`: a `cpus` the gateway cannot spare is said, not
silently dropped, and the process then runs wherever the gateway does."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import pytest

from backends.launcher import LocalProcess, free_port
from tests.backends.support import MINI_SERVER, servers


async def test_cpus_the_gateway_cannot_spare_leave_the_process_on_all_and_say_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    mine = os.sched_getaffinity(0)
    port = free_port()
    command = [sys.executable, str(MINI_SERVER), "--port", str(port), "--state-dir", str(tmp_path)]
    process = LocalProcess(command, {}, f"http://127.0.0.1:{port}/health", cpus=len(mine))
    with caplog.at_level(logging.WARNING, logger="backends.launcher"):
        await process.start(10.0)
    try:
        (pid,) = servers(tmp_path)
        assert os.sched_getaffinity(pid) == mine
        assert "shares every CPU with the gateway" in caplog.text
    finally:
        await process.stop()
