"""vLLM's sleep mode over HTTP, on one replica: the engine's own endpoints, at its root.

    POST /sleep?level=1   weights copied to host memory, KV cache dropped; 200 when done
    POST /wake_up         weights back on the GPU, scheduling resumed; 200 when done
    GET  /is_sleeping     {"is_sleeping": true|false}

vLLM serves them with `VLLM_SERVER_DEV_MODE=1` and `--enable-sleep-mode`
(vllm/entrypoints/serve/sleep/api_router.py). Level 1, not 2: level 2 drops the weights
too, and waking would then need them reloaded. vLLM's V0 frontend answered these calls
before the engine was done (a FIXME beside them), so each call is followed by
GET /is_sleeping until the engine reports the state asked for. Errors are
`EngineSleepError`, translated here from the HTTP client's. Each call has a session of its
own: they come minutes apart, and nothing is left to close.
"""

from __future__ import annotations

import time

import aiohttp
import anyio
import orjson

from backends.errors import EngineSleepError
from backends.http import server_root
from backends.providers.replicas import Replica

POLL_S = 0.02  # between GET /is_sleeping while the engine gets there


class VllmSleep:
    """A backend's replicas' sleep endpoints; `timeout_s` bounds each sleep or wake."""

    def __init__(self, timeout_s: float, api_key: str | None = None) -> None:
        self._timeout_s = timeout_s
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    async def sleep(self, replica: Replica) -> None:
        await self._reach(replica, "/sleep?level=1", asleep=True)

    async def wake_up(self, replica: Replica) -> None:
        await self._reach(replica, "/wake_up", asleep=False)

    async def _reach(self, replica: Replica, path: str, *, asleep: bool) -> None:
        deadline = time.monotonic() + self._timeout_s
        async with self._session() as session:
            await _call(session, "POST", server_root(replica.base_url) + path, self._headers)
            while await _is_sleeping(session, replica, self._headers) != asleep:
                if time.monotonic() > deadline:
                    raise EngineSleepError(f"{replica.id}: {path} done, still not there")
                await anyio.sleep(POLL_S)

    def _session(self) -> aiohttp.ClientSession:
        timeout = aiohttp.ClientTimeout(total=self._timeout_s)
        return aiohttp.ClientSession(timeout=timeout, cookie_jar=aiohttp.DummyCookieJar())


async def _is_sleeping(
    session: aiohttp.ClientSession, replica: Replica, headers: dict[str, str]
) -> bool:
    body = await _call(session, "GET", server_root(replica.base_url) + "/is_sleeping", headers)
    state = body.get("is_sleeping") if isinstance(body, dict) else None
    if not isinstance(state, bool):
        raise EngineSleepError(f"{replica.id}: /is_sleeping answered {body!r}")
    return state


async def _call(
    session: aiohttp.ClientSession, method: str, url: str, headers: dict[str, str]
) -> object:
    try:
        async with session.request(method, url, headers=headers) as response:
            if response.status != 200:
                text = (await response.text(errors="replace"))[:200]
                message = f"{method} {url}: HTTP {response.status}: {text}"
                # 404/405: no such endpoint (no sleep mode, no VLLM_SERVER_DEV_MODE)
                raise EngineSleepError(message, refused=response.status in (404, 405))
            data = await response.read()
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise EngineSleepError(f"{method} {url}: {type(exc).__name__}: {exc}") from exc
    return _json(data)


def _json(data: bytes) -> object:
    """The body as JSON; vLLM answers /sleep and /wake_up with an empty one."""
    try:
        return orjson.loads(data) if data.strip() else None
    except orjson.JSONDecodeError as exc:
        raise EngineSleepError(f"not JSON: {data[:100]!r}") from exc
