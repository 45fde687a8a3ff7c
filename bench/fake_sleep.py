"""vLLM's sleep mode, faked for `bench.fake_engine --enable-sleep-mode`: vLLM's endpoints,
states and answers, with what a sleep and a wake take set by `--doze-s` and `--wake-s`
(vLLM wakes a small model in about 0.26 s, a large one in a few seconds).

    POST /sleep?level=1|2[&mode=abort|wait|keep]   200, empty body, once asleep
    POST /wake_up                                   200, empty body, once awake
    GET  /is_sleeping                               {"is_sleeping": true|false}

As vLLM since its pause/sleep rework (vllm/v1/engine/core.py: `sleep` pauses the scheduler
first): mode `abort`, the default, ends what the engine runs or queues at once, each with
finish_reason "abort"; `wait` lets running requests finish first; `keep` freezes them until
the wake. Requests that arrive while it sleeps are accepted and queued, not run, until the
wake resumes scheduling (older vLLM crashed on them instead: vllm-project/vllm#15483).
/health, /v1/models and /metrics answer as usual; /metrics adds
`vllm:engine_sleep_state{sleep_state="awake"|"weights_offloaded"|"discard_all"}`. Without
`--enable-sleep-mode` the endpoints are 404, as vLLM's are without VLLM_SERVER_DEV_MODE.
/_stats adds `sleeps`, `wakes` and `last_wake_s` (the last wake call's own duration).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from bench.asgi import send_json

if TYPE_CHECKING:
    from bench.fake_engine import Engine

ROUTES = {("GET", "/is_sleeping"), ("POST", "/sleep"), ("POST", "/wake_up")}
STATES = {0: "awake", 1: "weights_offloaded", 2: "discard_all"}  # by sleep level
MODES = ("abort", "wait", "keep")


class FakeSleep:
    def __init__(self, engine: Engine, enabled: bool, doze_s: float, wake_s: float) -> None:
        self.engine = engine
        self.enabled = enabled
        self.doze_s = doze_s
        self.wake_s = wake_s
        self.level = 0  # 0: awake
        self.stats: dict[str, Any] = {"sleeps": 0, "wakes": 0, "last_wake_s": None}
        self._lock = asyncio.Lock()  # one sleep or wake at a time, as the engine core runs them

    async def route(self, method: str, path: str, query: bytes, send: Any) -> bool:
        """Answers the sleep endpoints; False for any other request."""
        if not self.enabled or (method, path) not in ROUTES:
            return False
        if path == "/is_sleeping":
            await send_json(send, 200, {"is_sleeping": self.level > 0})
            return True
        if path == "/sleep":
            params = parse_qs(query.decode())
            level, mode = params.get("level", ["1"])[0], params.get("mode", ["abort"])[0]
            if level not in ("1", "2") or mode not in MODES:
                await send_json(send, 400, {"error": f"bad level {level!r} or mode {mode!r}"})
                return True
            await self.sleep(int(level), mode)
        else:
            await self.wake_up()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        return True

    async def sleep(self, level: int, mode: str) -> None:
        async with self._lock:
            if self.level:
                return
            self.engine.pause = "all" if mode == "keep" else "new"
            if mode == "abort":
                self._abort_all()
            elif mode == "wait":
                while self.engine.running:  # noqa: ASYNC110 (no drained event; a rare call)
                    await asyncio.sleep(0.005)
            await asyncio.sleep(self.doze_s)  # weights copied out, KV cache dropped
            self.level = level
            self.stats["sleeps"] += 1

    async def wake_up(self) -> None:
        async with self._lock:
            if not self.level:
                return
            began = time.monotonic()
            await asyncio.sleep(self.wake_s)  # weights back, KV cache allocated again
            self.level = 0
            self.engine.pause = ""
            self.engine.wake.set()  # what queued while it slept runs now
            self.stats["wakes"] += 1
            self.stats["last_wake_s"] = time.monotonic() - began

    def metrics(self, model: str) -> list[str]:
        if not self.enabled:
            return []
        name = "vllm:engine_sleep_state"
        lines = [
            f"# HELP {name} Engine sleep state; awake = 0 means engine is sleeping; "
            "awake = 1 means engine is awake; weights_offloaded = 1 means sleep level 1; "
            "discard_all = 1 means sleep level 2.",
            f"# TYPE {name} gauge",
        ]
        for level, state in STATES.items():
            value = 1.0 if level == self.level else 0.0
            labels = f'engine="0",model_name="{model}",sleep_state="{state}"'
            lines.append(f"{name}{{{labels}}} {value}")
        return lines

    def _abort_all(self) -> None:
        for request in [*self.engine.running, *self.engine.waiting_list()]:
            self.engine.abort(request)
            request.event.set()  # its answer ends now, finish_reason "abort"
