"""The error-bounded mode end to end: real MiniLM, the pair verifier, the gateway as a real
server over loopback, the echo upstream (its answer names the prompt it answered, so a
served hit shows the *cached* prompt). Rewordings the shipped cache serves are explored
first; the fresh answers are compared with the cached one and become the namespace's
evidence, persisted beside the entries (read here after the gateway stopped)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from bench.processes import OPERATOR, Gateway, start_fake_upstream
from cache.bounded import SIGNAL_MODEL
from cache.error_bound import Evidence, serve_probability
from tests.cache.test_cache_e2e import KEY_A, KEY_B, ask, cache_config, content, stored
from tests.conftest import GatewayFactory, hash_of

ADMIN_KEY = "sk-test-admin-bound-0123456789"
ORIGINAL = "How do I reset my password?"
# Each passes the shipped guards against ORIGINAL (the shipped cache serves the first).
REWORDINGS = [
    "How can I reset my password?",
    "How could I reset my password?",
    "How would I reset my password?",
    "How do I reset my own password?",
    "How do I reset my account password?",
    "How can I reset the password?",
]


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server, base_url = start_fake_upstream(tmp_path_factory.mktemp("up"))
    yield base_url
    server.stop()


def start(factory: GatewayFactory, upstream: str, work: Path, delta: float | None) -> Gateway:
    state = {"url": "memory", "path": str(work / "state.json")}
    config = cache_config(upstream, state, path=str(work / "cache"))
    if delta is not None:
        config["tenants"][0]["cache_error_bound"] = {"delta": delta}
    config["admin"] = {"keys": [{"sha256": hash_of(ADMIN_KEY)}]}
    return factory(config, timeout_s=120)


def upstream_calls(upstream: str) -> int:
    return int(httpx.get(upstream.removesuffix("/v1") + "/_stats").json()["requests"])


def counted(gw: Gateway, metric: str, **labels: str) -> float:
    text = httpx.get(gw.url + "/metrics", headers=OPERATOR).text
    named = ",".join(f'{k}="{v}"' for k, v in sorted({**labels, "tenant": "a"}.items()))
    found = re.search(rf"{metric}{{{named}}} (\S+)", text)
    return float(found.group(1)) if found else 0.0


def explores(gw: Gateway, outcome: str) -> float:
    return counted(gw, "gateway_cache_explores_total", outcome=outcome)


def judged(gw: Gateway, outcome: str, count: int) -> None:
    """Waits until `count` explores were compared with that outcome (in the background)."""
    deadline = time.monotonic() + 10
    while explores(gw, outcome) < count:
        assert time.monotonic() < deadline, f"{count} explores not {outcome}"
        time.sleep(0.05)


def evidence_of(work: Path) -> Evidence:
    import orjson

    rows = orjson.loads((work / "cache" / "entries.bin.evidence").read_bytes())
    [(data, _)] = rows.values()  # one namespace learned
    return Evidence.from_bytes(data.encode())


def test_agreeing_explores_earn_hits_and_a_bad_hit_report_is_a_wrong_label(
    gateway_factory: GatewayFactory, upstream: str, tmp_path: Path
) -> None:
    """Tenant `a` opts in through the admin API at delta 0.2; sampled answers (no
    temperature given) are compared by their embeddings, and the echo's answers to two
    rewordings of one question are close. Tenant `b`, not opted in, is served as ever."""
    gw = start(gateway_factory, upstream, tmp_path, None)
    admin = httpx.Client(base_url=gw.url, headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    client = openai.OpenAI(base_url=gw.base_url, api_key=KEY_A, max_retries=0)
    with admin, client:
        learn_and_serve(gw, admin, client, upstream)
    agreed = explores(gw, "agreed")
    assert gw.stop() == 0
    evidence = evidence_of(tmp_path)
    wrong = sum(w for _, _, w in evidence.bins)
    assert (wrong, evidence.observations) == (1, agreed + 1)


def learn_and_serve(gw: Gateway, admin: httpx.Client, client: openai.OpenAI, upstream: str) -> None:
    refused = admin.patch(
        "/admin/tenants/a", json={"cache_error_bound": {"delta": 0.01, "scope": "entry"}}
    )
    assert refused.status_code == 400 and "not supported yet" in refused.text
    opted = admin.patch("/admin/tenants/a", json={"cache_error_bound": {"delta": 0.2}})
    assert opted.json()["cache_error_bound"] == {"delta": 0.2, "scope": "namespace"}

    stored(gw, ORIGINAL, key=KEY_B)
    shipped = ask(gw, REWORDINGS[0], key=KEY_B)  # no bound: the shipped decision serves it
    assert (shipped.headers["x-cache"], shipped.headers["x-cache-tier"]) == ("hit", "semantic")

    stored(gw, ORIGINAL)
    for n in range(1, SIGNAL_MODEL.min_observations + 1):  # no evidence yet: always explored
        before = upstream_calls(upstream)
        answer = ask(gw, REWORDINGS[0])
        assert answer.headers["x-cache-miss-reason"] == "explore"
        assert (
            content(answer) == f"echo: {REWORDINGS[0]}" and upstream_calls(upstream) == before + 1
        )
        judged(gw, "agreed", n)
    assert explores(gw, "explored") == SIGNAL_MODEL.min_observations

    for _ in range(40):  # served with a chance of about 0.55 now
        raw = client.chat.completions.with_raw_response.create(
            model="echo",
            messages=[
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": REWORDINGS[0]},
            ],
        )
        if raw.headers["x-cache"] == "hit":
            break
    assert raw.headers["x-cache-tier"] == "semantic"
    assert raw.parse().choices[0].message.content == f"echo: {ORIGINAL}"

    report = httpx.post(
        gw.base_url + "/cache/feedback",
        json={"id": raw.headers["x-cache-key"]},
        headers={"Authorization": f"Bearer {KEY_A}"},
    )
    assert report.status_code == 200, report.text
    assert counted(gw, "gateway_cache_bad_hit_labels_total", labelled="yes") == 1
    judged(gw, "agreed", int(explores(gw, "explored")))  # every explore labelled


def test_disagreeing_explores_keep_the_entry_from_being_served(
    gateway_factory: GatewayFactory, upstream: str, tmp_path: Path
) -> None:
    """With temperature 0 answers compare as text: the echo answers each rewording in its
    own words, so every explore disagrees. The fresh answer is stored as an entry of its
    own; the cached one is served about delta of the time once wrong is all the namespace
    has seen."""
    delta = 0.05
    gw = start(gateway_factory, upstream, tmp_path, delta)
    stored(gw, ORIGINAL, temperature=0)
    for n, rewording in enumerate(REWORDINGS, start=1):
        answer = ask(gw, rewording, temperature=0)
        assert answer.headers["x-cache-miss-reason"] == "explore", rewording
        assert content(answer) == f"echo: {rewording}"
        judged(gw, "disagreed", n)
    own = ask(gw, REWORDINGS[0], temperature=0)  # the differing answer was stored
    assert (own.headers["x-cache-tier"], content(own)) == ("exact", f"echo: {REWORDINGS[0]}")
    assert explores(gw, "agreed") == 0
    assert gw.stop() == 0
    evidence = evidence_of(tmp_path)
    assert sum(c for _, c, _ in evidence.bins) == 0
    assert sum(w for _, _, w in evidence.bins) == len(REWORDINGS)
    chance = serve_probability(evidence, 0.999, delta, SIGNAL_MODEL)
    # Wrong is all it has seen: served about delta of the time (0.058 after these six
    # labels, falling toward delta as more come in; six agreeing labels give 0.14).
    assert chance < 1.2 * delta
