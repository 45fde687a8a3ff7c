"""Listeners: callbacks the manager's parts tell of a change; one that fails is logged, so
it never breaks the change itself or the listeners after it."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

log = logging.getLogger(__name__)


def notify(listeners: Iterable[Callable[..., None]], *args: object) -> None:
    for listener in listeners:
        try:
            listener(*args)
        except Exception:
            log.exception("cold-start listener %r failed", listener)
