"""The gateway in front of the real vLLM (CPU build): answers, streams and usage, the
engine's own errors, priority reaching its scheduler, per-tenant prefix-cache salts, and the
metrics parser on its live exposition. Every fact about the engine is read from the engine
(its answers, its /metrics), not from the gateway's view of it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from bench.processes import Gateway
from gateway.traffic.engine_metrics import parse
from tests.engine.conftest import (
    BATCH_KEY,
    INTERACTIVE_KEY,
    MAX_NUM_SEQS,
    MODEL,
    OPERATOR_KEY,
    OTHER_KEY,
    Engine,
)

# The engine's start (35-50 s) counts against the timeout of the first test that asks for it.
pytestmark = [pytest.mark.timeout(600), pytest.mark.serial]

# Long enough to fill several 128-token blocks of vLLM's prefix cache (a shared prefix
# hits only in whole blocks), short enough for its 1,024-token context: about 620 tokens
# of the engine's byte-level tokenizer.
LONG_PREFIX = " ".join(
    f"section {i} of the shared operating manual says nothing" for i in range(12)
)


_CLIENTS: dict[tuple[str, str], openai.OpenAI] = {}


def client(gateway: Gateway, key: str = INTERACTIVE_KEY) -> openai.OpenAI:
    """One client per gateway and key, closed when the module's tests are done."""
    made = _CLIENTS.get((gateway.url, key))
    if made is None:
        made = openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0, timeout=120)
        _CLIENTS[(gateway.url, key)] = made
    return made


@pytest.fixture(autouse=True, scope="module")
def _close_clients() -> Iterator[None]:
    yield
    for made in _CLIENTS.values():
        made.close()
    _CLIENTS.clear()


def engine_counter(engine: Engine, name: str) -> float:
    text = httpx.get(f"{engine.url}/metrics", timeout=10).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_chat_and_completions_answer_with_the_engines_usage(vllm_gateway: Gateway) -> None:
    chat = client(vllm_gateway).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=8
    )
    assert chat.choices[0].message.content
    assert chat.usage is not None and chat.usage.completion_tokens == 8
    assert chat.system_fingerprint is not None and "vllm" in chat.system_fingerprint
    text = client(vllm_gateway).completions.create(model=MODEL, prompt="one two", max_tokens=5)
    assert text.usage is not None and text.usage.completion_tokens == 5


def test_a_stream_is_charged_the_engines_count_and_the_client_sees_no_usage_it_did_not_ask(
    vllm_gateway: Gateway,
) -> None:
    """The gateway asks every stream for usage; a client that did not ask does not get the
    usage chunk, and the tokens recorded for its tenant are the engine's own count (a CJK
    prompt: characters/4 would be a fraction of it)."""
    messages: Any = [
        {"role": "user", "content": "東京の天気は今日どうですか。明日は雨が降りますか。"}
    ]
    whole = client(vllm_gateway, OTHER_KEY).chat.completions.create(
        model=MODEL, messages=messages, max_tokens=6
    )
    assert whole.usage is not None
    before = _tokens(vllm_gateway, "other")
    chunks = list(
        client(vllm_gateway, OTHER_KEY).chat.completions.create(
            model=MODEL, messages=messages, max_tokens=6, stream=True
        )
    )
    assert chunks and all(chunk.choices for chunk in chunks)  # no usage-only chunk
    assert all(chunk.usage is None for chunk in chunks)
    after = _tokens(vllm_gateway, "other")
    assert after["prompt"] - before["prompt"] == whole.usage.prompt_tokens
    assert after["completion"] - before["completion"] == 6
    asked = list(
        client(vllm_gateway, OTHER_KEY).chat.completions.create(
            model=MODEL,
            messages=messages,
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert asked[-1].choices == [] and asked[-1].usage is not None
    assert asked[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def _tokens(gateway: Gateway, tenant: str) -> dict[str, float]:
    headers = {"authorization": f"Bearer {OPERATOR_KEY}"}
    text = httpx.get(f"{gateway.url}/metrics", headers=headers, timeout=10).text
    found = {"prompt": 0.0, "completion": 0.0}
    for line in text.splitlines():
        if line.startswith("gateway_tokens_total{") and f'tenant="{tenant}"' in line:
            kind = "prompt" if 'kind="prompt"' in line else "completion"
            found[kind] += float(line.rsplit(" ", 1)[1])
    return found


def test_the_engines_own_errors_come_back_openai_shaped(vllm_gateway: Gateway) -> None:
    with pytest.raises(openai.BadRequestError) as too_long:
        client(vllm_gateway).completions.create(model=MODEL, prompt="word " * 1500, max_tokens=4)
    assert too_long.value.status_code == 400
    error = _error(too_long.value)
    assert "maximum context length" in error["message"]
    assert isinstance(error["type"], str)
    with pytest.raises(openai.NotFoundError) as unknown:
        client(vllm_gateway).completions.create(model="no-such-model", prompt="x", max_tokens=1)
    assert unknown.value.status_code == 404
    assert _error(unknown.value)["message"]


def _error(exc: openai.APIStatusError) -> dict[str, Any]:
    body = exc.response.json()
    assert set(body) == {"error"}
    error: dict[str, Any] = body["error"]
    assert {"message", "type", "code"} <= set(error)
    return error


# Long enough that the engine stays full for seconds (four rounds of 4, ~1.5 s each here),
# even when its /metrics answers late (a sample in 2 s was seen, while it streamed outputs).
BATCH_TOKENS = 512
ROUNDS = 4
# Rounds where nothing waited are tried again; a round takes about 10 s, and the first
# that queues ends the test. With the engine on both cores, three were not always enough
# (2026-12-07: most seen (0, 0), (0, 0), (4, 3)); on a CPU of its own
# (`tests/engine/shared.py`'s `engine_cpus`) vLLM queued in the first round 12 times of 12.
ATTEMPTS = 5


async def test_an_interactive_request_overtakes_batch_requests_queued_in_the_engine(
    vllm_gateway: Gateway, vllm_engine: Engine
) -> None:
    """The gateway sends batch and interactive requests alike (its limit is above the
    engine's batch): the engine's own scheduler, told each request's class as `priority`,
    runs the interactive one before batch requests that were queued before it.

    The interactive request is sent once vLLM reports batch requests waiting. Should its
    API server take requests in no faster than it finishes them, nothing waits: then that
    round is let finish and another tried (the claim is about requests that do wait; a
    round where none did cannot test it). The order the answers arrive in is the order the
    engine ran them only where its API server gets CPU enough to answer as it goes: with
    the engine on both cores, 12 of 16 answers once came back at the same instant, 3-5 s
    late, and the interactive one among them overtook none (`engine_cpus`)."""
    seen: list[tuple[float, float]] = []
    # A new connection per request: a round takes about 10 s, so a connection kept from the
    # last one has idled for seconds, and one reused as the gateway closed it read a broken
    # connection (httpx.ReadError, CI of 2026-12-07, when the gateway closed idle ones at
    # uvicorn's 5 s; now `limits.keep_alive_s`, 75 s). The claim is about the engine's
    # order, not about connection reuse.
    fresh = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=vllm_gateway.base_url, timeout=120, limits=fresh) as http:
        for _ in range(ATTEMPTS):
            later = await _overtaken(http, vllm_engine, seen)
            if later is not None:
                # By priority it takes the next free slot, ahead of every batch request then
                # waiting (4 or more: a whole round); first-come-first-served, it runs after
                # them all and overtakes none (measured: 0). Not "all 12 - 4": vLLM's gauges
                # are read late, and the request may reach it a round after they said 8.
                assert later >= MAX_NUM_SEQS - 1, later
                return
    pytest.fail(f"vLLM never queued the batch requests; most (running, waiting) seen: {seen}")


async def _overtaken(
    http: httpx.AsyncClient, engine: Engine, seen: list[tuple[float, float]]
) -> int | None:
    """How many batch requests end after the interactive one; None if none waited."""
    # Prompts all different: each its own request and its own prefix, whatever is on.
    batch = [
        _timed(http, BATCH_KEY, BATCH_TOKENS, f"count {n}") for n in range(ROUNDS * MAX_NUM_SEQS)
    ]
    tasks = [asyncio.create_task(call) for call in batch]
    queued = await _until_engine_queues(engine, tasks, seen)
    interactive = await _timed(http, INTERACTIVE_KEY, 4, "count") if queued else None
    finished = await asyncio.gather(*tasks)
    if interactive is None:
        return None
    return sum(1 for ended in finished if ended > interactive)


async def _timed(http: httpx.AsyncClient, key: str, tokens: int, prompt: str) -> float:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": tokens, "ignore_eos": True}
    headers = {"authorization": f"Bearer {key}"}
    response = await http.post("completions", json=body, headers=headers)
    assert response.status_code == 200, response.text
    return time.monotonic()


async def _until_engine_queues(
    engine: Engine, sent: list[asyncio.Task[float]], seen: list[tuple[float, float]]
) -> bool:
    """Whether vLLM itself reports requests waiting (read from its /metrics) before the
    requests sent are all answered."""
    most = (0.0, 0.0)
    # A new connection per poll: vLLM's server closes an idle kept-alive one, and a poll
    # that raced that close read "Server disconnected without sending a response".
    fresh = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=5, limits=fresh) as http:
        while not all(task.done() for task in sent):
            sample = parse("vllm", (await http.get(f"{engine.url}/metrics")).text)
            if (sample.waiting or 0) >= MAX_NUM_SEQS:
                # Its gauges are a snapshot between steps: 3 running and 9 waiting was seen.
                assert 0 < (sample.running or 0) <= MAX_NUM_SEQS
                return True
            most = max(most, (sample.running or 0.0, sample.waiting or 0.0))
            await asyncio.sleep(0.02)
    seen.append(most)
    return False


def test_each_tenant_gets_its_own_prefix_cache_salt(
    vllm_gateway: Gateway, vllm_engine: Engine
) -> None:
    """The same long prompt hits vLLM's prefix cache the second time one tenant sends it
    and misses when another tenant sends it (vLLM's prefix-cache counters), even when the
    client sets a `cache_salt` of its own."""

    def send(key: str, salt: str | None = None) -> float:
        hits = engine_counter(vllm_engine, "vllm:prefix_cache_hits_total")
        extra = {"cache_salt": salt} if salt is not None else {}
        client(vllm_gateway, key).completions.create(
            model=MODEL, prompt=LONG_PREFIX, max_tokens=1, extra_body=extra
        )
        return engine_counter(vllm_engine, "vllm:prefix_cache_hits_total") - hits

    send(INTERACTIVE_KEY)
    assert send(INTERACTIVE_KEY) >= 256  # two whole blocks at least, from the same tenant
    assert send(OTHER_KEY, salt="anything") == 0  # another tenant: another salt
    assert send(OTHER_KEY) >= 256  # which is its own, and hits for it


def test_the_parser_reads_the_live_exposition(vllm_engine: Engine) -> None:
    sample = parse("vllm", httpx.get(f"{vllm_engine.url}/metrics", timeout=10).text)
    assert sample.kv_capacity_tokens is not None and sample.kv_capacity_tokens > 0
    assert sample.running is not None and sample.waiting is not None
    assert sample.waiting_for_capacity is not None
    assert sample.prompt_tokens is not None and sample.generation_tokens is not None
    assert sample.queue_time_count is not None and sample.queue_time_at_finish
