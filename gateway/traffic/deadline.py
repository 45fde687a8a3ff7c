"""A request's class and deadline: which priority class it runs in, and when its client
gives up (on the monotonic clock)."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass

from gateway.settings import Priority

# The gateway gives up this long before the client's deadline (at most `_MARGIN_MAX_S`),
# so that the client reads a 504 saying why rather than timing out with nothing.
_MARGIN = 0.1
_MARGIN_MAX_S = 0.5


@dataclass(frozen=True)
class Deadline:
    at: float  # time.monotonic() when the client stops waiting
    length_s: float  # the whole deadline, from when the request arrived
    # The client said when it stops waiting for the whole answer (`x-request-timeout`),
    # not for its first byte or between reads (the SDKs' headers, the class's default).
    whole: bool = False

    @classmethod
    def after(cls, length_s: float, elapsed_s: float = 0.0, *, whole: bool = False) -> Deadline:
        """A deadline `length_s` after a start `elapsed_s` ago (the client's clock started
        when it sent the request, not when the gateway got round to it)."""
        return cls(time.monotonic() - elapsed_s + length_s, length_s, whole)

    def left_s(self) -> float:
        return max(0.0, self.at - time.monotonic())

    def answer_by(self) -> float:
        """When the upstream's first byte must have arrived (monotonic)."""
        return self.at - min(_MARGIN_MAX_S, _MARGIN * self.length_s)

    def stream_cut(self) -> float | None:
        """When a stream still flowing is ended (monotonic), or None: never.

        At the client's own deadline when it covers the whole answer: the client is gone
        then, so the gateway ends the stream with a `deadline_exceeded` event it can still
        read, and the engine stops computing tokens no one will read. Not before it: the
        tokens up to then are the client's. A first-token or read deadline (the SDKs'
        timeouts are per read) says nothing of how long a flowing stream may take.
        """
        return self.at if self.whole else None


_CLASSES: tuple[Priority, ...] = ("interactive", "batch")
# Deadlines a client may ask for: our own header, and the ones the `openai` SDKs send
# (openai-python sends `x-stainless-read-timeout`; some versions `x-stainless-timeout`).
_TIMEOUT_HEADERS = ("x-request-timeout", "x-stainless-timeout", "x-stainless-read-timeout")


def request_class(headers: Mapping[str, str], default: Priority, header_allowed: bool) -> Priority:
    """The priority class a request runs in: `x-priority` when its tenant may choose."""
    asked = headers.get("x-priority")
    if header_allowed:
        for priority in _CLASSES:
            if asked == priority:
                return priority
    return default


def deadline_s(headers: Mapping[str, str], default_s: float, max_s: float) -> float:
    """The request's deadline in seconds: what the client asked for (its SDK's timeout),
    at most `max_s`; the class's default when it says nothing usable."""
    for header in _TIMEOUT_HEADERS:
        value = headers.get(header)
        if value is None:
            continue
        try:
            asked = float(value)
        except ValueError:
            continue
        if 0 < asked < math.inf:
            return min(asked, max_s)
    return default_s


def client_deadline(
    headers: Mapping[str, str], default_s: float, max_s: float, elapsed_s: float
) -> Deadline:
    """The deadline of a request that arrived `elapsed_s` ago: its length (`deadline_s`),
    covering the whole answer when `x-request-timeout` set it (`whole_deadline`)."""
    length_s = deadline_s(headers, default_s, max_s)
    return Deadline.after(length_s, elapsed_s, whole=whole_deadline(headers, max_s))


def whole_deadline(headers: Mapping[str, str], max_s: float) -> bool:
    """Whether the deadline covers the whole answer: `x-request-timeout` said so, within
    `max_s` (past it the gateway's own cap is the deadline, which is no client's)."""
    asked = _asked_s(headers, _TIMEOUT_HEADERS[:1])
    return asked is not None and asked <= max_s


def held_deadline_s(
    headers: Mapping[str, str],
    default_s: float,
    max_s: float,
    start_remaining_s: float | None,
    margin: float,
    *,
    streamed: bool,
) -> float:
    """The deadline of a request held for a start (no replica ready), in seconds.

    `x-request-timeout` is the client's whole-request deadline: as asked, at most `max_s`.
    Without it the default grows to cover the start, `start_remaining_s` (None: no start
    measured yet) times `margin`, within `max_s`. The SDKs' headers are read timeouts (the
    longest silence they bear): they bound a held non-streamed request, which sends nothing
    until its answer; a held stream is sent keep-alives (gateway/held.py), so they cannot
    time out on it, and it gets the longer of what they say and the default.
    """
    asked = _asked_s(headers, _TIMEOUT_HEADERS[:1])
    if asked is not None:
        return min(asked, max_s)
    if start_remaining_s is not None:
        default_s = max(default_s, min(start_remaining_s * margin, max_s))
    read = _asked_s(headers, _TIMEOUT_HEADERS[1:])
    if read is None:
        return default_s
    return max(min(read, max_s), default_s) if streamed else min(read, max_s)


def _asked_s(headers: Mapping[str, str], names: tuple[str, ...]) -> float | None:
    """The first of `names` holding a usable number of seconds."""
    for header in names:
        try:
            asked = float(headers.get(header, "nan"))
        except ValueError:
            continue
        if 0 < asked < math.inf:
            return asked
    return None
