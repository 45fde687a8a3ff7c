"""A plain-terminal progress bar for `gateway stage MODEL`: `\\r` updates on stderr.

    [##########..........]  52%  1.3/2.5 GB  312.4 MB/s

Redrawn at most 10 times a second (every 2 s, one line each, when the stream is not a
terminal, so that logs stay readable). Writing a short line to a terminal is cheap enough to
do on the event loop.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from warmpool.staged import StagedModel
from warmpool.staging import WeightStager

WIDTH = 30


def render(done: int, total: int, mb_per_s: float, width: int = WIDTH) -> str:
    fraction = min(1.0, done / total) if total > 0 else 0.0
    filled = int(fraction * width)
    return (
        f"[{'#' * filled}{'.' * (width - filled)}] {fraction:4.0%}  "
        f"{_size(done)}/{_size(total)}  {mb_per_s:.1f} MB/s"
    )


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


class ProgressBar:
    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._tty = stream.isatty()
        self._interval = 0.1 if self._tty else 2.0
        self._started = time.monotonic()
        self._drawn_at = float("-inf")
        self._resumed: int | None = None

    def update(self, done: int, total: int) -> None:
        if self._resumed is None:
            self._resumed = done  # the first report: bytes kept from an earlier run
        now = time.monotonic()
        if now - self._drawn_at < self._interval and done < total:
            return
        self._drawn_at = now
        rate = (done - self._resumed) / max(now - self._started, 1e-9) / 1e6
        line = render(done, total, rate)
        self._stream.write(("\r" + line) if self._tty else line + "\n")
        self._stream.flush()

    def finish(self, summary: str) -> None:
        self._stream.write(("\r\033[K" if self._tty else "") + summary + "\n")
        self._stream.flush()


async def stage_with_progress(
    stager: WeightStager, model: str, uri: str, stream: TextIO = sys.stderr
) -> StagedModel:
    bar = ProgressBar(stream)
    try:
        staged = await stager.stage(model, uri, progress=bar.update)
    except BaseException:
        bar.finish(f"staging {model} failed")
        raise
    bar.finish(summary(staged))
    return staged


def summary(staged: StagedModel) -> str:
    if staged.from_cache:
        return f"{staged.model}: already staged at {staged.path} ({_size(staged.total_bytes)})"
    text = f"{staged.model}: staged {_size(staged.total_bytes)} at {staged.path}"
    if staged.download is not None:
        text += f"; downloaded {staged.download}"
    if staged.resumed_bytes:
        text += f" ({_size(staged.resumed_bytes)} resumed)"
    if staged.readahead is not None and staged.readahead.bytes > 0:
        text += f"; read ahead at {staged.readahead.mb_per_s:.0f} MB/s"
    return text
