"""Identical concurrent requests make one upstream call (gateway/coalesce.py), end to end:
the gateway as a real server with its cache on (exact tiers only: these are about the
requests in flight, not about similarity), the fake upstream counting calls by the body's
`user` (which is no part of a cache key, so it tags otherwise identical requests), and the
official `openai` client reading the answers."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import openai
import pytest

from bench.processes import OPERATOR, Gateway, start_fake_upstream, start_gateway
from tests.conftest import fake_backend, hash_of

KEY_A, KEY_B = "sk-test-coalesce-a-0123456789", "sk-test-coalesce-b-0123456789"
MANY = 50


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server, base_url = start_fake_upstream(tmp_path_factory.mktemp("up"))
    yield base_url
    server.stop()


@pytest.fixture(scope="module")
def gateway(upstream: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    work = tmp_path_factory.mktemp("coalesce-gw")
    config = {
        "state": {"url": "memory", "path": str(work / "state.json")},
        "cache": {
            "enabled": True,
            "semantic": False,
            "lookup_budget_ms": 3000,
            "path": str(work / "cache"),
        },
        "backends": [fake_backend(upstream)],
        "tenants": [
            {"name": "a", "keys": [{"sha256": hash_of(KEY_A)}]},
            {"name": "b", "keys": [{"sha256": hash_of(KEY_B)}]},
        ],
    }
    gw = start_gateway(config, work, timeout_s=120)
    yield gw
    gw.stop()


@pytest.fixture
async def client(gateway: Gateway) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(
        base_url=gateway.base_url, api_key=KEY_A, max_retries=0, timeout=30
    ) as client:
        yield client


def calls(upstream: str, user: str) -> int:
    stats = httpx.get(upstream.removesuffix("/v1") + "/_stats").json()
    return int(stats.get(f"user:{user}", 0))


def body(prompt: str, user: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": "slow",
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0,
        "user": user,
        **extra,
    }


def unique(words: int = 3) -> str:
    return " ".join(["coalesce", *(uuid.uuid4().hex[:6] for _ in range(words))])


async def ask(client: openai.AsyncOpenAI, request: dict[str, Any]) -> tuple[str, str]:
    """(x-cache, the answer's content) of a whole answer."""
    extra = {k: v for k, v in request.items() if k.startswith("x_")}
    raw = await client.chat.completions.with_raw_response.create(
        model=request["model"],
        messages=request["messages"],
        temperature=request["temperature"],
        user=request["user"],
        extra_body=extra,
    )
    answer = raw.parse()
    assert answer.usage is not None
    if raw.headers["x-cache"] == "coalesced":  # a follower is charged like a hit
        assert answer.usage.total_tokens == 0
    return raw.headers["x-cache"], answer.choices[0].message.content or ""


async def ask_streamed(
    client: openai.AsyncOpenAI, request: dict[str, Any], include_usage: bool = False
) -> tuple[str, str, int | None]:
    """(x-cache, the streamed content, the usage chunk's total if one came)."""
    extra = {k: v for k, v in request.items() if k.startswith("x_")}
    raw = await client.chat.completions.with_raw_response.create(
        model=request["model"],
        messages=request["messages"],
        temperature=request["temperature"],
        user=request["user"],
        stream=True,
        stream_options={"include_usage": True} if include_usage else None,
        extra_body=extra,
    )
    text, total = "", None
    async for chunk in raw.parse():
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
        if chunk.usage is not None:
            total = chunk.usage.total_tokens
    return raw.headers["x-cache"], text, total


def coalesced_total(gateway: Gateway, tenant: str) -> float:
    text = httpx.get(gateway.url + "/metrics", headers=OPERATOR).text
    match = re.search(rf'^gateway_cache_coalesced_total\{{tenant="{tenant}"\}} (\S+)$', text, re.M)
    return float(match.group(1)) if match else 0.0


async def test_identical_requests_make_one_upstream_call(
    gateway: Gateway, upstream: str, client: openai.AsyncOpenAI
) -> None:
    prompt, user = unique(), "whole-" + uuid.uuid4().hex[:8]
    before = coalesced_total(gateway, "a")
    request = body(prompt, user, x_delay=1.5)
    answers = await asyncio.gather(*(ask(client, request) for _ in range(MANY)))
    assert calls(upstream, user) == 1
    assert {text for _, text in answers} == {f"echo: {prompt}"}
    outcomes = [cache for cache, _ in answers]
    assert outcomes.count("miss") == 1
    assert outcomes.count("coalesced") == MANY - 1
    assert coalesced_total(gateway, "a") - before == MANY - 1


async def test_identical_streams_fan_out_from_one_upstream_call(
    upstream: str, client: openai.AsyncOpenAI
) -> None:
    """Half come before the first chunk, half while the stream is under way (they get what
    was relayed so far, then the rest as it comes); some ask for usage (theirs is zero)."""
    prompt, user = unique(words=8), "stream-" + uuid.uuid4().hex[:8]
    # The stream lasts about 2.5 s, so the second half (0.9 s on) comes while it runs even
    # on a slow machine, where 25 requests at once take a while to reach the coalescer.
    request = body(prompt, user, x_delay=0.5, x_chunk_delay=0.2)

    async def later(delay_s: float, include_usage: bool) -> tuple[str, str, int | None]:
        await asyncio.sleep(delay_s)
        return await ask_streamed(client, request, include_usage)

    answers = await asyncio.gather(
        *(later(0.0 if i < MANY // 2 else 0.9, include_usage=i % 2 == 1) for i in range(MANY))
    )
    assert calls(upstream, user) == 1
    assert {text for _, text, _ in answers} == {f"echo: {prompt}"}
    assert sorted(cache for cache, _, _ in answers) == ["coalesced"] * (MANY - 1) + ["miss"]
    followers_usage = {total for cache, _, total in answers if cache == "coalesced"}
    assert followers_usage == {0, None}  # zero when asked for, else no usage chunk


async def test_a_failing_leader_releases_its_followers(
    upstream: str, client: openai.AsyncOpenAI
) -> None:
    """The leader's upstream answers 500 (its `user` says so): it gets 502, and each
    follower then goes upstream on its own, and gets its answer."""
    prompt, user = unique(), "released-" + uuid.uuid4().hex[:8]
    before = calls(upstream, "fail-500")
    # The upstream takes 2 s, so that the followers (sent 0.4 s on) join the leader's
    # flight even on a slow machine: with 1 s, CI once saw them come after it had failed,
    # and then they rightly coalesced with each other. (`x_delay` is part of the key.)
    leader = asyncio.create_task(ask(client, body(prompt, "fail-500", x_delay=2.0)))
    await asyncio.sleep(0.4)
    followers = [ask(client, body(prompt, user, x_delay=2.0)) for _ in range(10)]
    answers = await asyncio.gather(*followers)
    with pytest.raises(openai.APIStatusError) as failed:
        await leader
    assert failed.value.status_code == 502
    assert calls(upstream, "fail-500") - before == 1
    assert calls(upstream, user) == 10
    assert answers == [("miss", f"echo: {prompt}")] * 10


async def test_the_leader_leaving_mid_stream_does_not_cut_its_followers(
    gateway: Gateway, upstream: str, client: openai.AsyncOpenAI
) -> None:
    """From the first follower on the upstream is read for the flight, not for the leader:
    its client closing the connection leaves the upstream call and the followers be."""
    prompt, user = unique(words=10), "left-" + uuid.uuid4().hex[:8]
    request = body(prompt, user, x_delay=0.3, x_chunk_delay=0.2, stream=True)
    headers = {"Authorization": f"Bearer {KEY_A}"}
    followers: list[asyncio.Task[tuple[str, str, int | None]]] = []
    async with (
        httpx.AsyncClient(timeout=30) as http,
        http.stream(
            "POST", gateway.base_url + "/chat/completions", json=request, headers=headers
        ) as leader,
    ):
        assert leader.headers["x-cache"] == "miss"
        async for _ in leader.aiter_bytes():  # the first chunk: then the followers come
            followers = [asyncio.create_task(ask_streamed(client, request)) for _ in range(5)]
            await asyncio.sleep(0.6)
            break  # and the leader's client goes
    answers = await asyncio.gather(*followers)
    assert answers == [("coalesced", f"echo: {prompt}", None)] * 5
    assert calls(upstream, user) == 1


async def test_a_follower_is_cut_at_its_own_deadline_and_the_leader_goes_on(
    gateway: Gateway, upstream: str, client: openai.AsyncOpenAI
) -> None:
    """A follower whose `x-request-timeout` (the whole answer's deadline) comes while the
    shared stream still flows ends then with `deadline_exceeded`; the leader, and the one
    upstream call, go on to the end."""
    prompt, user = unique(words=10), "cut-" + uuid.uuid4().hex[:8]
    request = body(prompt, user, x_delay=0.2, x_chunk_delay=0.2, stream=True)
    leader = asyncio.create_task(ask_streamed(client, request))
    await asyncio.sleep(0.5)  # the leader's first chunk has come: the follower follows
    headers = {"Authorization": f"Bearer {KEY_A}", "x-request-timeout": "1.2"}
    async with (
        httpx.AsyncClient(timeout=30) as http,
        http.stream(
            "POST", gateway.base_url + "/chat/completions", json=request, headers=headers
        ) as follower,
    ):
        assert follower.headers["x-cache"] == "coalesced"
        events = [line async for line in follower.aiter_lines() if line.startswith("data: ")]
    assert '"deadline_exceeded"' in events[-1], events[-1]
    assert not any("[DONE]" in event for event in events)
    assert await leader == ("miss", f"echo: {prompt}", None)
    assert calls(upstream, user) == 1


async def test_followers_of_a_leader_whose_client_left_go_on_their_own(
    gateway: Gateway, upstream: str, client: openai.AsyncOpenAI
) -> None:
    """A whole answer's leader that leaves before the answer cancels its upstream call:
    the followers are released, and each is answered by its own call."""
    prompt, user = unique(), "gone-" + uuid.uuid4().hex[:8]
    headers = {"Authorization": f"Bearer {KEY_A}"}
    async with httpx.AsyncClient(timeout=0.6) as http:
        leader = asyncio.create_task(
            http.post(
                gateway.base_url + "/chat/completions",
                json=body(prompt, user, x_delay=1.5),
                headers=headers,
            )
        )
        await asyncio.sleep(0.2)
        followers = [ask(client, body(prompt, user, x_delay=1.5)) for _ in range(3)]
        answers = await asyncio.gather(*followers)
        with pytest.raises(httpx.ReadTimeout):
            await leader
    assert answers == [("miss", f"echo: {prompt}")] * 3
    assert calls(upstream, user) == 4


async def test_tenants_of_different_cache_scopes_do_not_coalesce(
    gateway: Gateway, upstream: str, client: openai.AsyncOpenAI
) -> None:
    prompt, user = unique(), "scopes-" + uuid.uuid4().hex[:8]
    request = body(prompt, user, x_delay=1.0)
    async with openai.AsyncOpenAI(
        base_url=gateway.base_url, api_key=KEY_B, max_retries=0, timeout=30
    ) as other:
        answers = await asyncio.gather(ask(client, request), ask(other, request))
    assert answers == [("miss", f"echo: {prompt}")] * 2
    assert calls(upstream, user) == 2


async def test_a_request_looks_up_before_following_a_leader_that_did_not(
    gateway: Gateway, upstream: str, client: openai.AsyncOpenAI
) -> None:
    """A leader that did not look up (here `Cache-Control: no-cache`; under load, one whose
    lookup failed open) says nothing of what the cache holds: an identical request that
    comes meanwhile looks up first, and is a hit, instead of waiting on the model."""
    prompt, user = unique(), "looks-up-" + uuid.uuid4().hex[:8]
    request = body(prompt, user, x_delay=1.5)
    assert await ask(client, request) == ("miss", f"echo: {prompt}")
    for _ in range(50):  # stored in the background
        if (await ask(client, request))[0] == "hit":
            break
        await asyncio.sleep(0.05)
    headers = {"Authorization": f"Bearer {KEY_A}", "Cache-Control": "no-cache"}
    async with httpx.AsyncClient(timeout=30) as raw:
        url = gateway.base_url + "/chat/completions"
        fresh = asyncio.create_task(raw.post(url, json=request, headers=headers))
        await asyncio.sleep(0.5)  # the no-cache request is with the model
        started = asyncio.get_running_loop().time()
        outcome, text = await ask(client, request)
        took_s = asyncio.get_running_loop().time() - started
        answer = await fresh
    assert (outcome, text) == ("hit", f"echo: {prompt}") and took_s < 0.8
    assert answer.status_code == 200 and answer.headers["x-cache"] != "hit"
    assert calls(upstream, user) == 2  # the first request and the no-cache one
