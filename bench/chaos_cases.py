"""The fault cases, each run against a live `Deployment` while traffic flows.

Each case sends a burst through the harness (`bench.chaos`), injects its fault
while the burst runs, and returns the Burst(s). Checks specific to the case (which status
each request must get, what the upstream saw, what leaked) raise AssertionError; the
tests let them fail, bench/reliability.py records them as notes. `n` sizes the bursts.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import httpx
import orjson

from bench.chaos import (
    Burst,
    Shot,
    chat,
    fire,
    open_fds,
    wait_logged_once,
)
from bench.chaos_deployment import (
    KEYS,
    MAX_BODY,
    NEVER_STARTS_MODEL,
    QUOTA_RPM,
    READ_TIMEOUT_S,
    Deployment,
    restart_upstream,
    upstream_stats,
)
from bench.processes import OPERATOR
from gateway.server import HEADERS_TIMEOUT_S

Expect = frozenset[tuple[int, str | None]]  # the (status, error code) pairs allowed
OK: Expect = frozenset({(200, None)})
BAD_GATEWAY: Expect = frozenset({(502, "bad_gateway")})
RATE_LIMITED: Expect = frozenset({(429, "rate_limit_exceeded")})
UNSTARTABLE: Expect = frozenset({(503, "backend_unavailable")})

# What each upstream fault must turn into, plain and streamed.
FAULTS: dict[tuple[str, bool], Expect] = {
    ("echo", False): OK,
    ("echo", True): OK,
    ("die-midstream", True): BAD_GATEWAY,
    ("hang-midstream", True): frozenset({(504, "upstream_timeout")}),
    ("no-done", True): BAD_GATEWAY,
    ("malformed-json", False): BAD_GATEWAY,
    ("malformed-json", True): BAD_GATEWAY,
    ("broken-sse", True): BAD_GATEWAY,
    ("error-500", False): BAD_GATEWAY,
    ("error-500", True): BAD_GATEWAY,
    # An upstream's 503 is relayed as it is (its own error JSON), not turned into 502.
    ("always-503", False): frozenset({(503, "server_error")}),
}


def tag() -> str:
    return uuid.uuid4().hex[:8]


def check_each(burst: Burst, expected: Sequence[Expect]) -> None:
    """Each request got one of the answers its own fault allows; `(status, None)` allows
    any error code with that status (a 200 answer has no code)."""
    wrong = [
        (r.request_id, r.status, r.code, sorted(map(str, e)))
        for r, e in zip(burst.results, expected, strict=True)
        if r.kind != "lost" and (r.status, r.code) not in e and (r.status, None) not in e
    ]
    assert not wrong, f"{burst.name}: {len(wrong)} wrong answers: {wrong[:5]}"


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 8.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        time.sleep(0.05)


def fds_settle(d: Deployment, baseline: list[int], slack: int = 6) -> None:
    """Each replica's open descriptors come back to what it had before the case."""
    pids = [g.server.process.pid for g in d.replicas if g.server.process is not None]

    def settled() -> bool:
        return all(open_fds(pid) <= base + slack for pid, base in zip(pids, baseline, strict=True))

    wait_until(settled, f"descriptors back to {baseline} (+{slack})")


def fds_now(d: Deployment) -> list[int]:
    return [open_fds(g.server.process.pid) for g in d.replicas if g.server.process is not None]


# Every burst the cases sent, in order: a report can still count the requests of a case
# whose checks failed (bench/reliability.py clears and reads it).
SENT: list[Burst] = []


def run(coroutine: Any) -> Burst:
    burst: Burst = asyncio.run(coroutine)
    SENT.append(burst)
    return burst


def upstream_faults(d: Deployment, n: int = 2) -> Burst:
    """Every fault model, plain and streamed, interleaved with healthy requests, `n` each."""
    t = tag()
    shots, expected = [], []
    for i in range(n):
        for (model, streamed), expect in FAULTS.items():
            prompt = f"{t} hello {i % 2}" if model == "echo" else f"{t} {model} {i} {streamed}"
            shots.append(Shot(chat(prompt, model, stream=streamed), KEYS["a"]))
            expected.append(expect)
    burst = run(fire("upstream-faults", d.base_urls, shots, {200, 502, 503, 504}))
    check_each(burst, expected)
    wait_logged_once(burst, d.log_paths())
    wait_until(lambda: upstream_stats(d.faulty_url)["active_streams"] == 0, "no stream left open")
    return burst


def upstream_killed(d: Deployment, n: int = 12) -> list[Burst]:
    """The faulty upstream dies with requests waiting for headers and streams half sent;
    it comes back on its port, and the next requests succeed (no stale pooled socket)."""
    t = tag()
    healthy = Shot(chat(f"{t} still fine"), KEYS["b"])
    waiting = Shot(chat(f"{t} slow", "slow", x_delay=1.0), KEYS["a"])
    shots: list[Shot] = []
    expected: list[Expect] = []
    for i in range(n):
        streaming = Shot(chat(f"{t} hang {i}", "hang-midstream", stream=True), KEYS["a"])
        shots += [waiting, streaming, healthy]
        # Sent after the upstream is back, a hanging stream times out; a slow one succeeds.
        # While the health probe sees it down: no replica to send to.
        down = BAD_GATEWAY | {(503, "backend_unavailable")}
        expected += [OK | down, down | {(504, "upstream_timeout")}, OK]

    async def kill() -> None:
        await asyncio.sleep(0.4)
        with contextlib.suppress(httpx.HTTPError):  # it dies answering: that is the point
            await asyncio.to_thread(httpx.get, d.faulty_url.removesuffix("/v1") + "/_crash")
        await asyncio.to_thread(restart_upstream, d.faulty)

    urls = d.base_urls
    statuses = {200, 502, 503, 504}
    burst = run(fire("upstream-killed", urls, shots, statuses, during=kill, spacing_s=0.02))
    check_each(burst, expected)
    killed = sum(r.code == "bad_gateway" for r in burst.results)
    burst.notes.append(f"{killed} cut by the kill")
    assert killed > 0, "the kill hit no request: the case tested nothing"
    wait_logged_once(burst, d.log_paths())
    wait_until(lambda: backend_ready(d, "faulty"), "the faulty upstream probed up again")
    again = [Shot(chat(f"{t} after {i}", "slow", x_delay=0.01), KEYS["a"]) for i in range(n)]
    recovery = run(fire("upstream-back", urls, again))
    return [burst, recovery]


def slow_upstream(d: Deployment, n: int = 4) -> Burst:
    """An upstream slower than the client's deadline (`x-request-timeout`, shorter than the
    read timeout): 504 `deadline_exceeded` just before that deadline, not when it answers."""
    t = tag()
    delay = READ_TIMEOUT_S + 1.5
    shots = [
        Shot(chat(f"{t} {i}", "slow", x_delay=delay), KEYS["a"], headers={"x-request-timeout": "1"})
        for i in range(n)
    ]
    before = upstream_stats(d.faulty_url).get("model:slow", 0)
    burst = run(fire("upstream-slower-than-deadline", d.base_urls, shots, {504}))
    check_each(burst, [frozenset({(504, "deadline_exceeded")})] * n)
    slowest = max(r.seconds for r in burst.results)
    assert slowest < READ_TIMEOUT_S, f"answered after {slowest:.1f} s: deadline not kept"
    calls = upstream_stats(d.faulty_url)["model:slow"] - before
    burst.notes.append(f"{calls} upstream calls for {n} requests")
    return burst


def _steady(t: str, n: int) -> tuple[list[Shot], list[Expect]]:
    """Hits, misses and a quota-limited tenant: what runs while Redis misbehaves."""
    shots: list[Shot] = []
    expected: list[Expect] = []
    for i in range(n):
        if i % 3 == 0:
            shots.append(Shot(chat(f"{t} repeated {i % 4}"), KEYS["a"]))
            expected.append(OK)
        elif i % 3 == 1:
            shots.append(Shot(chat(f"{t} fresh {i}", stream=True), KEYS["b"]))
            expected.append(OK)
        else:
            shots.append(Shot(chat(f"{t} quota {i}"), KEYS["q"]))
            expected.append(OK | RATE_LIMITED)
    return shots, expected


def cache_shared_again(d: Deployment, what: str) -> None:
    """An answer stored through one replica is served by the other: Redis is back in use."""
    prompt = chat(f"{tag()} after the {what}, what is a monad?")
    headers = {"Authorization": f"Bearer {KEYS['a']}"}
    first = httpx.post(d.base_urls[0] + "/chat/completions", json=prompt, headers=headers)
    assert first.status_code == 200, first.text

    def hit() -> bool:
        answer = httpx.post(d.base_urls[1] + "/chat/completions", json=prompt, headers=headers)
        return answer.status_code == 200 and answer.headers.get("x-cache") == "hit"

    wait_until(hit, f"the cache shared between replicas after the {what}", timeout_s=15)


def _redis_fault(
    d: Deployment, name: str, fault: Callable[[], Any], n: int, seconds: float, what: str
) -> Burst:
    """Steady traffic for `seconds` while `fault` runs; every request answered as its
    tenant allows, logged once, and the cache shared again after the `what`."""
    shots, expected = _steady(tag(), n)
    burst = run(fire(name, d.base_urls, shots, {200, 429}, during=fault, spacing_s=seconds / n))
    check_each(burst, expected)
    wait_logged_once(burst, d.log_paths())
    cache_shared_again(d, what)
    return burst


def redis_outage(d: Deployment, n: int = 45, seconds: float = 3.0) -> Burst:
    """Redis killed while traffic runs, then started again (empty) on its port: the cache
    fails open, quotas fall back to each replica's share, nothing is refused for want of
    Redis, and the cache is shared again once Redis is back."""

    async def outage() -> None:
        await asyncio.sleep(seconds * 0.2)
        d.redis.stop()
        await asyncio.sleep(seconds * 0.4)
        await asyncio.to_thread(d.redis.start)

    return _redis_fault(d, "redis-stopped-restarted", outage, n, seconds, "restart")


def redis_flush(d: Deployment, n: int = 30, seconds: float = 2.0) -> Burst:
    """FLUSHALL while traffic runs: cache entries, quota buckets and replication streams
    vanish at once; every request is still answered and the cache recovers."""

    async def flush() -> None:
        await asyncio.sleep(seconds * 0.4)
        await asyncio.to_thread(d.redis.flush)

    return _redis_fault(d, "redis-flushed", flush, n, seconds, "flush")


def replica_killed(d: Deployment, n: int = 60, seconds: float = 2.0) -> Burst:
    """A third replica is SIGKILLed under load; clients retry a failed connection on the
    surviving replica. The shared quota (QUOTA_RPM a minute for tenant `k`) admits at most
    its limit (plus what refills during the burst), and loses at most one unit for each
    request that died with the victim."""
    # Without the cache (no MiniLM to load): it starts in seconds, and it shares the
    # quota store, which is what this case is about.
    victim = d.add_replica({**d.config, "cache": {"enabled": False}})
    try:
        survivor = d.replicas[0]
        t = tag()
        shots = [Shot(chat(f"{t} k {i}"), KEYS["k"]) for i in range(n)]

        async def kill() -> None:
            await asyncio.sleep(seconds * 0.3)
            victim.server.kill()

        burst = run(
            fire(
                "replica-killed",
                [survivor.base_url, victim.base_url],
                shots,
                {200, 429},
                retry_other_replica=True,
                during=kill,
                spacing_s=seconds / n,
            )
        )
    finally:
        victim.server.kill()
        d.replicas.remove(victim)
    ok = sum(r.status == 200 for r in burst.results)
    retried = sum(r.attempts > 1 for r in burst.results)
    refill = int(seconds * 2 * QUOTA_RPM / 60) + 1
    burst.notes.append(f"{retried} retried on the survivor; {ok} admitted of {QUOTA_RPM}/min")
    assert retried > 0, "the kill hit no request: the case tested nothing"
    assert ok <= QUOTA_RPM + refill, f"{ok} admitted: quota over-counted"
    assert ok >= min(n, QUOTA_RPM) - retried - refill, f"only {ok} admitted: double-counted"
    on_survivor = [r.request_id for r in burst.results if r.replica == 0]
    wait_logged_once(burst, [survivor.server.log_path], on_survivor)
    return burst


OUT_OF_RANGE: Expect = frozenset(
    {(400, "integer_below_min_value"), (400, "integer_above_max_value")}
)


def hostile_bodies(d: Deployment, n: int = 2) -> Burst:
    """Bodies over the limit (declared and chunked), invalid UTF-8, deeply nested JSON,
    integers too big for JSON parsers, huge `max_tokens`, a body trickled in slowly."""
    t = tag()
    big = b'{"model": "echo", "messages": [{"role": "user", "content": "' + b"x" * MAX_BODY
    nested = b'{"model": "echo", "messages": [{"role": "user", "content": "hi"}], "x": '
    nested += b"[" * 20_000 + b"]" * 20_000 + b"}"
    too_big_int = b'{"model": "echo", "messages": [{"role": "user", "content": "hi"}], '
    too_big_int += b'"max_tokens": 1180591620717411303424}'  # 2**70
    utf8 = b'{"model": "echo", "messages": [{"role": "user", "content": "\xff\xfe\xc3"}]}'
    cases: list[tuple[Shot, Expect]] = [
        (Shot(big + b'"}]}', KEYS["a"]), frozenset({(413, "request_too_large")})),
        (Shot(big + b'"}]}', KEYS["a"], trickle_s=0.3), frozenset({(413, "request_too_large")})),
        (Shot(utf8, KEYS["a"]), frozenset({(400, "invalid_request_error")})),
        # Deeper than limits allow (128 levels): its own code since #37.
        (Shot(nested, KEYS["a"]), frozenset({(400, "json_too_deep")})),
        (Shot(chat(f"{t} huge", max_tokens=10**9), KEYS["a"]), OK),
        # More than `q`'s tokens per minute: refused at once as never fitting.
        (Shot(chat(f"{t} huge", max_tokens=10**9), KEYS["q"]), RATE_LIMITED),
        # Out of OpenAI's ranges (max_tokens 1 to 2^31 - 1): refused before the quotas.
        (Shot(chat(f"{t} huge", max_tokens=10**15), KEYS["a"]), OUT_OF_RANGE),
        (Shot(too_big_int, KEYS["a"]), OUT_OF_RANGE),
        (Shot(chat(f"{t} neg", max_tokens=-5), KEYS["a"]), OUT_OF_RANGE),
        (Shot(chat(f"{t} trickled"), KEYS["b"], trickle_s=1.0), OK),
    ]
    shots = [shot for _ in range(n) for shot, _ in cases]
    expected = [expect for _ in range(n) for _, expect in cases]
    burst = run(fire("hostile-bodies", d.base_urls, shots, {200, 400, 413, 429}))
    check_each(burst, expected)
    wait_logged_once(burst, d.log_paths())
    return burst


def slow_clients(d: Deployment, n: int = 30, loris: int = 40, seconds: float = 2.0) -> Burst:
    """Slowloris connections (headers dribbled a byte at a time) while ordinary traffic
    runs: it is all answered, the gateway hangs up on each slowloris once its headers are
    HEADERS_TIMEOUT_S late, and the descriptors are given back."""
    baseline = fds_now(d)
    port = int(d.base_urls[0].split(":")[2].split("/")[0])
    t = tag()
    shots = [Shot(chat(f"{t} {i % 5}"), KEYS["b"]) for i in range(n)]

    hung_up: list[bool] = []

    async def with_loris() -> Burst:
        stop = asyncio.Event()
        holders = [asyncio.create_task(_slowloris(port, stop)) for _ in range(loris)]
        try:
            burst = await fire("slow-clients", d.base_urls, shots, spacing_s=seconds / n)
            await asyncio.wait(holders, timeout=HEADERS_TIMEOUT_S + 5)
            return burst
        finally:
            stop.set()
            hung_up.extend(await asyncio.gather(*holders))

    burst = run(with_loris())
    check_each(burst, [OK] * n)
    wait_logged_once(burst, d.log_paths())
    fds_settle(d, baseline)
    burst.notes.append(f"{loris} slowloris connections, {sum(hung_up)} cut by the gateway")
    assert sum(hung_up) == loris, f"{loris - sum(hung_up)} slowloris connections still open"
    return burst


async def _slowloris(port: int, stop: asyncio.Event) -> bool:
    """Dribbles a request's headers until `stop`; True if the gateway hung up first."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        while not stop.is_set():
            writer.write(b"X")
            await writer.drain()
            with contextlib.suppress(TimeoutError):
                if await asyncio.wait_for(reader.read(1), 0.2) == b"":
                    return True
    except ConnectionError:
        return True
    finally:
        writer.close()
    return False


def disconnects(d: Deployment, n: int = 12) -> Burst:
    """Clients that hang up mid-stream: every upstream stream is cancelled (none left
    open at the fake upstream), each is logged once (499), no descriptor leaks."""
    wait_until(lambda: upstream_stats(d.faulty_url)["active_streams"] == 0, "quiet upstream")
    baseline = fds_now(d)
    before = upstream_stats(d.faulty_url)["abandoned_streams"]
    t = tag()
    shots = [
        Shot(chat(f"{t} {i}", "hang-midstream", stream=True), KEYS["a"], leave_after_events=2)
        for i in range(n)
    ]
    burst = run(fire("client-disconnects", d.base_urls, shots))
    assert all(r.kind == "left" for r in burst.results), burst.results[:3]

    def cancelled() -> bool:
        stats = upstream_stats(d.faulty_url)
        return stats["abandoned_streams"] - before == n and stats["active_streams"] == 0

    wait_until(cancelled, f"{n} upstream streams cancelled", timeout_s=READ_TIMEOUT_S + 5)
    wait_logged_once(burst, d.log_paths())
    fds_settle(d, baseline)
    return burst


def backend_ready(d: Deployment, backend: str) -> bool:
    return all(
        httpx.get(g.url + "/readyz", timeout=5, headers=OPERATOR).json()["backends"].get(backend)
        is True
        for g in d.replicas
    )


def worker_urls(d: Deployment) -> list[str]:
    """The on-demand workers the replicas have ready now."""
    urls: list[str] = []
    for gateway in d.replicas:
        ready = httpx.get(gateway.url + "/readyz", timeout=5, headers=OPERATOR).json()
        urls += [str(u).removesuffix("/v1") for u in ready["replicas"].get("on-demand", [])]
    return urls


def cold_starts(d: Deployment, n: int = 8) -> list[Burst]:
    """Requests for a backend scaled to zero are held through its start and answered; its
    workers, killed while serving, fail what they held with a documented error and are
    started again for the next requests."""
    wait_until(lambda: not worker_urls(d), "the on-demand backend back at zero", timeout_s=20)
    t = tag()
    first = [Shot(chat(f"{t} cold {i}", "cold-echo"), KEYS["b"]) for i in range(n)]
    burst = run(fire("cold-start", d.base_urls, first, timeout_s=90))
    check_each(burst, [OK] * n)
    held = [r.cold_start_ms for r in burst.results if r.cold_start_ms is not None]
    assert held, "no answer waited for a cold start"
    burst.notes.append(f"{len(held)} held through a cold start of up to {max(held):.0f} ms")

    def serving() -> bool:
        urls = worker_urls(d)
        return bool(urls) and all(
            upstream_stats(u + "/v1").get("model:slow-cold", 0) > 0 for u in urls
        )

    async def crash() -> None:  # once every worker is serving a slow request
        await asyncio.to_thread(wait_until, serving, "the workers serving", 30.0)
        for url in await asyncio.to_thread(worker_urls, d):
            with contextlib.suppress(httpx.HTTPError):
                await asyncio.to_thread(httpx.get, url + "/_crash")

    slow = [Shot(chat(f"{t} slow {i}", "slow-cold", x_delay=1.0), KEYS["b"]) for i in range(n)]
    failed: Expect = frozenset({(502, None), (503, None)})
    killed = run(fire("worker-killed", d.base_urls, slow, {200, 502, 503}, during=crash))
    check_each(killed, [OK | failed] * n)
    cut = sum(r.status != 200 for r in killed.results)
    killed.notes.append(f"{cut} failed by the kill")
    assert cut > 0, "the kill hit no request: the case tested nothing"
    wait_logged_once(killed, d.log_paths())
    again = [Shot(chat(f"{t} again {i}", "cold-echo"), KEYS["b"]) for i in range(n)]
    restarted = run(fire("worker-restarted", d.base_urls, again, timeout_s=90))
    return [burst, killed, restarted]


def held_start_fails(d: Deployment, n: int = 6) -> Burst:
    """Streamed requests held for a start that fails (its weights cannot be staged): each
    ends with the start's 503 `backend_unavailable` (a final event after its keep-alives),
    none hangs; and the next one, while the failure's retry delay lasts, is refused at once."""
    body = chat(f"{tag()} never", NEVER_STARTS_MODEL, stream=True)
    shots = [Shot({**body, "user": str(i)}, KEYS["b"]) for i in range(n)]
    url, headers = d.base_urls[0] + "/chat/completions", {"Authorization": f"Bearer {KEYS['b']}"}
    watched: list[tuple[int, list[str]]] = []

    async def watch() -> None:  # one more, its lines kept: keep-alives, then the error
        async with (
            httpx.AsyncClient(timeout=20) as client,
            client.stream("POST", url, json=body, headers=headers) as response,
        ):
            watched.append((response.status_code, [line async for line in response.aiter_lines()]))

    burst = run(fire("held-start-fails", d.base_urls, shots, {503}, timeout_s=20, during=watch))
    check_each(burst, [UNSTARTABLE] * n)
    assert burst.p99_ms() < 10_000, "a held request waited on after its start failed"
    [(status, lines)] = watched
    comments = [line for line in lines if line.startswith(": waiting for model")]
    events = [line for line in lines if line.startswith("data:")]
    assert status == 200 and comments and len(events) == 1, lines
    assert orjson.loads(events[0][5:])["error"]["code"] == "backend_unavailable", events
    burst.notes.append(f"{len(comments)} keep-alives before the start's error")
    wait_logged_once(burst, d.log_paths())
    started = time.perf_counter()
    again = httpx.post(url, json=body, headers=headers, timeout=20)
    assert again.status_code == 503 and again.headers["retry-after"], again.text
    assert time.perf_counter() - started < 2.0, "refused only after a wait"
    return burst


def by_name() -> dict[str, Callable[..., Burst | list[Burst]]]:
    from bench.chaos_sleep import sleep_cycles  # it uses this module's helpers

    return {
        "upstream-faults": upstream_faults,
        "upstream-killed": upstream_killed,
        "upstream-slow": slow_upstream,
        "redis-outage": redis_outage,
        "redis-flush": redis_flush,
        "replica-killed": replica_killed,
        "hostile-bodies": hostile_bodies,
        "slow-clients": slow_clients,
        "disconnects": disconnects,
        "cold-starts": cold_starts,
        "held-start-fails": held_start_fails,
        "sleep-cycles": sleep_cycles,
    }
