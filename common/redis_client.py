"""The one place that builds Redis clients: the composition root makes one `RedisFactory`
from `state.url` and hands it to every part that talks to Redis.

Every client gets the same defaults: connecting may take as long as one command
(`connect_timeout_s` defaults to `timeout_s`, not redis-py's own default, which has changed
between its versions), a dropped connection is retried at most `retries` times and at once,
a timed-out command never (it may have run), and the connection is named `{name}:{use}` so
that `CLIENT LIST` says which part of which process holds it. Each caller keeps its own
timeout: how long it may wait is a decision of the caller's, not of the transport.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.retry import Retry


@dataclass(frozen=True)
class RedisFactory:
    """Clients of one Redis (`url`, which may hold a password: never in repr)."""

    url: str = field(repr=False)
    name: str = "gateway"

    def client(
        self,
        use: str,
        timeout_s: float,
        *,
        connect_timeout_s: float | None = None,
        retries: int = 0,
        decode_responses: bool = False,
    ) -> aioredis.Redis:
        """An asyncio client for `use` (a short word: "quotas", "cache-tail")."""
        retry = AsyncRetry(NoBackoff(), retries, supported_errors=(RedisConnectionError,))
        return aioredis.Redis.from_url(
            self.url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s if connect_timeout_s is None else connect_timeout_s,
            retry=retry,
            decode_responses=decode_responses,
            client_name=f"{self.name}:{use}",
        )

    def blocking_client(
        self, use: str, timeout_s: float, *, connect_timeout_s: float | None = None
    ) -> redis.Redis:
        """A blocking client, for a worker thread (the reports read whole streams in one)."""
        return redis.Redis.from_url(
            self.url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s if connect_timeout_s is None else connect_timeout_s,
            retry=Retry(NoBackoff(), 0),
            client_name=f"{self.name}:{use}",
        )

    def __repr__(self) -> str:
        return f"RedisFactory({redacted_url(self.url)!r}, name={self.name!r})"


def redacted_url(url: str) -> str:
    """`url` without its user and password, for logs."""
    scheme, sep, rest = url.partition("://")
    _credentials, at, host = rest.rpartition("@")
    return f"{scheme}{sep}{host}" if at else url
