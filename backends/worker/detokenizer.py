"""Turns generated token ids into text pieces, one token at a time, honouring stop strings.

The whole answer is decoded again at each step (cheap for answers of a few hundred tokens),
because decoding token by token goes wrong for word pieces, byte-level BPE and multi-byte
characters. A piece is released only once it can no longer change: it must extend what was
already released, must not end in half a UTF-8 character, and must not end in what could be
the start of a stop string. Streamed and whole answers are both built from these pieces, so
they are equal by construction.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

# What tokenizers decode half a multi-byte character into.
REPLACEMENT_CHARACTER = "\ufffd"


class IncrementalDecoder:
    def __init__(self, decode: Callable[[Sequence[int]], str], stop: Sequence[str] = ()) -> None:
        self._decode = decode
        self._stop = tuple(stop)
        self._ids: list[int] = []
        self._released = ""
        self.stopped = False

    def push(self, token_id: int) -> str:
        """Add a token; return the text it releases (often empty). Sets `stopped` on a stop."""
        self._ids.append(token_id)
        text = self._decode(self._ids)
        cut = self._stop_position(text)
        if cut is not None:
            self.stopped = True
            return self._release(text[:cut])
        return self._release(text[: self._settled_end(text)])

    def flush(self) -> str:
        """The text still held back once the answer is over."""
        if self.stopped:
            return ""
        return self._release(self._decode(self._ids))

    def _release(self, text: str) -> str:
        if not text.startswith(self._released):
            # An earlier token decodes differently now; wait until it settles again.
            return ""
        piece = text[len(self._released) :]
        self._released = text
        return piece

    def _stop_position(self, text: str) -> int | None:
        positions = [index for stop in self._stop if (index := text.find(stop)) >= 0]
        return min(positions, default=None)

    def _settled_end(self, text: str) -> int:
        end = len(text.rstrip(REPLACEMENT_CHARACTER))
        held = max((_partial_stop(text[:end], stop) for stop in self._stop), default=0)
        return end - held


def _partial_stop(text: str, stop: str) -> int:
    """Length of the longest end of `text` that begins `stop` (a stop not yet complete)."""
    for size in range(min(len(stop) - 1, len(text)), 0, -1):
        if text.endswith(stop[:size]):
            return size
    return 0
