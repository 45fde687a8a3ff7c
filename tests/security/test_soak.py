"""The hostile-tenant soak (issue 37, item 10), against a real gateway process and the fake
upstream: a well-behaved tenant sends well-formed chat requests at a steady rate, first
alone (the quiet phase), then while another tenant, in its own process
(tests/security/hostile_tenant.py), hammers every endpoint with malformed and oversized
input for about 10 s. Every well-formed request must be answered 200 with its own answer,
the well-behaved tenant's p99 under attack must stay within a generous bound of its quiet
p99 (a 2-core machine is noisy), and neither /metrics nor the gateway's memory may grow
with the attack. Run with `pytest -s` to read the two p99s."""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.processes import OPERATOR, ROOT, Gateway, start_gateway
from tests.conftest import fake_backend, hash_of

GOOD_KEY = "sk-test-soak-good-tenant-0123456789abcdef"
BAD_KEY = "sk-test-soak-hostile-tenant-0123456789abcdef"
RATE = 25.0  # the well-behaved tenant's requests per second, sent on a fixed schedule
QUIET_S = 5.0
ATTACK_S = 10.0
# The statuses a malformed or oversized request may get: refusals in the API's words.
REFUSALS = {400, 401, 403, 404, 405, 408, 413, 415, 422, 429, 431}


@dataclass
class Phase:
    latencies: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def p99(self) -> float:
        return statistics.quantiles(self.latencies, n=100, method="inclusive")[98]


def test_a_hostile_tenant_leaves_a_well_behaved_one_unchanged(
    fake_upstream: str, tmp_path: Path
) -> None:
    config = {
        "state": {"url": "memory", "path": str(tmp_path / "state.json")},
        "backends": [fake_backend(fake_upstream)],
        "cache": {"enabled": False},  # every well-formed request goes to the upstream
        "batches": {"max_file_bytes": 64 * 1024},
        "tenants": [
            {"name": "good", "keys": [{"sha256": hash_of(GOOD_KEY)}]},
            {"name": "hostile", "keys": [{"sha256": hash_of(BAD_KEY)}]},
        ],
    }
    gw = start_gateway(config, tmp_path)
    try:
        asyncio.run(well_behaved(gw, 1.0))  # warm up: connections, first-call paths
        quiet = asyncio.run(well_behaved(gw, QUIET_S))
        rss_before, metrics_before = rss_kib(gw), len(scrape(gw))

        hostile = ["--url", gw.url, "--key", BAD_KEY, "--seconds", str(ATTACK_S + 1)]
        attacker = subprocess.Popen(
            [sys.executable, "-m", "tests.security.hostile_tenant", *hostile],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert attacker.stdout is not None
            assert attacker.stdout.readline().strip() == "started"
            time.sleep(0.5)  # the attack in full swing
            attacked = asyncio.run(well_behaved(gw, ATTACK_S - 1))
            out, _ = attacker.communicate(timeout=30)
        finally:
            if attacker.poll() is None:
                attacker.kill()
                attacker.wait()
        assert attacker.returncode == 0
        report: dict[str, Any] = orjson.loads(out.strip().splitlines()[-1])
        rss_after, exposition = rss_kib(gw), scrape(gw)
    finally:
        gw.stop()

    statuses = Counter({k: int(v) for k, v in report["statuses"].items()})
    by_status = Counter[int]()
    for key, count in statuses.items():
        by_status[int(key.rsplit(" ", 1)[1])] += count
    sent = sum(statuses.values()) + sum(report["errors"].values())
    print(
        f"\nwell-behaved p99: quiet {quiet.p99() * 1000:.1f} ms ({len(quiet.latencies)} req), "
        f"under attack {attacked.p99() * 1000:.1f} ms ({len(attacked.latencies)} req)"
    )
    print(
        f"hostile requests: {sent} ({sent / (ATTACK_S + 1):.0f}/s), statuses {dict(by_status)}, "
        f"transport errors {report['errors']}"
    )
    print(
        f"/metrics {metrics_before} -> {len(exposition)} bytes; "
        f"RSS {rss_before // 1024} -> {rss_after // 1024} MiB"
    )

    # The attack happened, every kind of it, and was refused in the API's words.
    assert sent > 300, report
    kinds = {key.rsplit(" ", 1)[0] for key in statuses}
    assert len(kinds) >= 18, kinds
    assert set(by_status) <= REFUSALS, statuses
    assert {400, 401, 404, 413, 431} <= set(by_status), statuses
    assert sum(report["errors"].values()) <= sent * 0.02, report["errors"]

    # The well-behaved tenant: every request answered, with its own answer, and in time.
    assert not quiet.failures and not attacked.failures, (quiet.failures + attacked.failures)[:5]
    assert len(quiet.latencies) >= QUIET_S * RATE - 1
    assert len(attacked.latencies) >= (ATTACK_S - 1) * RATE - 1
    assert attacked.p99() < 5 * quiet.p99() + 0.2, (quiet.p99(), attacked.p99())

    # Nothing the attacker sent became state: /metrics and memory stay bounded.
    assert len(exposition) < 200 * 1024
    assert "good" in exposition and 'model="m-' not in exposition
    assert rss_after - rss_before < 50 * 1024, (rss_before, rss_after)


async def well_behaved(gw: Gateway, seconds: float) -> Phase:
    """Well-formed chat requests on a fixed schedule (`RATE` a second, each sent on time
    whether or not the ones before were answered), each checked for its own answer."""
    phase = Phase()
    headers = {"authorization": f"Bearer {GOOD_KEY}"}
    async with httpx.AsyncClient(base_url=gw.base_url, headers=headers, timeout=30) as client:

        async def one(index: int) -> None:
            text = f"good {index} {uuid.uuid4().hex}"
            body = {"model": "echo", "messages": [{"role": "user", "content": text}]}
            started = time.perf_counter()
            try:
                answer = await client.post("/chat/completions", json=body)
            except httpx.HTTPError as exc:
                phase.failures.append(f"{index}: {type(exc).__name__} {exc}")
                return
            phase.latencies.append(time.perf_counter() - started)
            if answer.status_code != 200:
                phase.failures.append(f"{index}: {answer.status_code} {answer.text[:200]}")
            elif answer.json()["choices"][0]["message"]["content"] != f"echo: {text}":
                phase.failures.append(f"{index}: wrong answer {answer.text[:200]}")

        loop = asyncio.get_running_loop()
        start = loop.time()
        tasks = []
        for index in range(int(seconds * RATE)):
            await asyncio.sleep(max(0.0, start + index / RATE - loop.time()))
            tasks.append(asyncio.create_task(one(index)))
        await asyncio.gather(*tasks)
    return phase


def scrape(gw: Gateway) -> str:
    answer = httpx.get(f"{gw.url}/metrics", headers=OPERATOR)
    assert answer.status_code == 200
    return answer.text


def rss_kib(gw: Gateway) -> int:
    assert gw.server.process is not None
    status = Path(f"/proc/{gw.server.process.pid}/status").read_text()
    line = next(line for line in status.splitlines() if line.startswith("VmRSS:"))
    return int(line.split()[1])
