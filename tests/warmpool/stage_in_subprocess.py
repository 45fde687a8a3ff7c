"""Stage one model in a process of its own, printing progress, so a test can SIGKILL it.

Each progress report sleeps a little, so that the kill lands in the middle of the staging.

Run: python -m tests.warmpool.stage_in_subprocess ENDPOINT CACHE_DIR MODEL URI
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

from tests.warmpool.conftest import source_factory
from warmpool.staging import WeightStager


def report(done: int, total: int) -> None:
    print(done, total, flush=True)
    time.sleep(0.02)


async def main(endpoint: str, cache_dir: str, model: str, uri: str) -> None:
    stager = WeightStager(
        Path(cache_dir),
        source_factory(endpoint),
        1 << 30,
        chunk_bytes=256 * 1024,
        parallelism=2,
        checkpoint_s=0.0,  # a sidecar write per chunk: the kill finds some on disk
    )
    async with stager:
        await stager.stage(model, uri, report)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
