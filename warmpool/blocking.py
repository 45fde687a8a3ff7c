"""A bounded thread pool for file I/O and hashing, so the event loop stays free.

`OSError`s from the work (disk full, permissions) come back as `LocalStorageError`.

A thread cannot be interrupted. When the awaiting task is cancelled, `run` still waits for
the thread to finish before letting the cancellation through: the caller may close the file
descriptor the thread is writing to as soon as `run` returns, and a sidecar must never claim
a chunk whose bytes are still being written.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

from warmpool.errors import LocalStorageError

P = ParamSpec("P")
T = TypeVar("T")


class BlockingPool:
    def __init__(self, max_workers: int, name: str = "warmpool-io") -> None:
        self._executor = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=name)

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._executor, lambda: fn(*args, **kwargs))
        try:
            return await asyncio.shield(future)
        except OSError as exc:
            raise LocalStorageError(f"{type(exc).__name__}: {exc}") from exc
        except asyncio.CancelledError:
            while not future.done():
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait([future])
            raise

    def close(self) -> None:
        # Every `run` waits for its thread, so no work is in flight when the owner closes.
        self._executor.shutdown(wait=False, cancel_futures=True)
