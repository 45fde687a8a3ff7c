"""The sleep tier's cycle under traffic, on the chaos deployment's `sleepy` backend
(bench.fake_engine in vLLM's sleep mode, one per gateway replica, started on demand):

    start ─► asleep (idle_s) ─► woken by a burst that arrives while it dozes
          ─► asleep again ─► stopped (sleep_s) ─► started by the next burst

Every request of every burst gets the model's answer: none lost, none refused, none
answered twice. Each engine is woken once per burst (one wake for concurrent requests),
and it is the same process before and after its wake.
"""

from __future__ import annotations

import contextlib

import httpx

from bench.chaos import Burst, Shot, chat, fire, wait_logged_once
from bench.chaos_cases import OK, check_each, run, tag, wait_until
from bench.chaos_deployment import KEYS, Deployment
from bench.processes import OPERATOR

MODEL = "sleepy-llm"


def sleep_cycles(d: Deployment, n: int = 8) -> list[Burst]:
    wait_until(lambda: not engines(d), "no sleepy engine ready before the case", timeout_s=20)
    t = tag()
    started = burst(d, f"{t} start", n)
    known = engines(d)
    assert len(known) == len(d.replicas), f"one engine per gateway replica: {known}"
    # The moment they leave the ready set they doze (0.6 s): the burst meets a sleep under
    # way, and its wake must wait for the sleep to finish.
    wait_until(lambda: not engines(d), "the idle engines leave the ready set", timeout_s=20)
    dozing = sum(not sleeping(url) for url in known)  # /is_sleeping flips once it is asleep
    woken = burst(d, f"{t} wake", n)
    woken.notes.append(f"{dozing} of {len(known)} engines still falling asleep at the burst")
    for url in known:
        stats = engine_stats(url)
        assert (stats["sleeps"], stats["wakes"]) == (1, 1), f"{url}: {stats}"
    assert sorted(engines(d)) == sorted(known), "woken, not started anew"
    wait_until(lambda: all(sleeping(u) for u in known), "asleep again", timeout_s=20)
    wait_until(lambda: not any(answers(u) for u in known), "stopped after sleep_s", 20)
    restarted = burst(d, f"{t} restart", n)
    fresh = [engine_stats(url) for url in engines(d)]
    assert all(s["sleeps"] == s["wakes"] == 0 for s in fresh), f"new processes: {fresh}"
    for made in (started, woken, restarted):
        wait_logged_once(made, d.log_paths())
    return [started, woken, restarted]


def burst(d: Deployment, prompt: str, n: int) -> Burst:
    shots = [
        Shot(chat(f"{prompt} {i}", MODEL, max_tokens=4, stream=i % 2 == 0), KEYS["b"])
        for i in range(n)
    ]
    made = run(fire(f"sleep-{prompt.split()[-1]}", d.base_urls, shots, timeout_s=60))
    check_each(made, [OK] * n)
    made.check()
    return made


def engines(d: Deployment) -> list[str]:
    """The sleepy engines the gateway replicas have ready (not asleep, not stopped)."""
    urls: list[str] = []
    for gateway in d.replicas:
        ready = httpx.get(gateway.url + "/readyz", timeout=5, headers=OPERATOR).json()
        urls += [str(u).removesuffix("/v1") for u in ready["replicas"].get("sleepy", [])]
    return urls


def engine_stats(url: str) -> dict[str, int]:
    return dict(httpx.get(url + "/_stats", timeout=5).json())


def sleeping(url: str) -> bool:
    return bool(httpx.get(url + "/is_sleeping", timeout=5).json()["is_sleeping"])


def answers(url: str) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(url + "/health", timeout=2).status_code == 200
    return False
