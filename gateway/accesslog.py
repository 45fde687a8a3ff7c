"""One structured JSON line per request. Only what is listed here is ever logged: no
headers, no bodies, no keys."""

from __future__ import annotations

import logging
import sys
import time

import orjson

_logger = logging.getLogger("gateway.access")


def configure_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    for name in ("gateway", "backends"):
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.setLevel(level.upper())
        logger.propagate = False


def log_request(
    request_id: str,
    method: str,
    path: str,
    tenant: str | None,
    model: str | None,
    status: int,
    seconds: float,
    error: str | None = None,
) -> None:
    if not _logger.isEnabledFor(logging.INFO):
        return
    line = {
        "ts": round(time.time(), 3),
        "request_id": request_id,
        "method": method,
        "path": path,
        "tenant": tenant,
        "model": model,
        "status": status,
        "latency_ms": round(seconds * 1000, 2),
    }
    if error is not None:
        line["error"] = error
    _logger.info(orjson.dumps(line).decode())
