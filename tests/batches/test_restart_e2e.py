"""A batch job outlives its gateway: stopped mid-job (the state store on a file), the next
gateway resumes where the recorded results end, and no line reaches the upstream twice."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import openai
import pytest

from bench.processes import Gateway
from tests.batches.test_batches_e2e import (
    ALPHA_KEY,
    batch_config,
    chat_line,
    jsonl,
    rows,
    upstream_counts,
    wait_for,
)
from tests.conftest import GatewayFactory

LINES = 12


@pytest.fixture
def client_of() -> Iterator[Callable[[Gateway], openai.OpenAI]]:
    """Clients of tenant alpha, closed after the test."""
    clients: list[openai.OpenAI] = []

    def make(gateway: Gateway) -> openai.OpenAI:
        clients.append(openai.OpenAI(base_url=gateway.base_url, api_key=ALPHA_KEY, max_retries=0))
        return clients[-1]

    yield make
    for client in clients:
        client.close()


def _slow_job(client: openai.OpenAI, tag: str) -> str:
    lines = [
        chat_line(f"{tag}-{i}", f"line {i}", model="slow", x_delay=0.25, user=f"{tag}-{i}")
        for i in range(LINES)
    ]
    upload = client.files.create(file=("restart.jsonl", jsonl(lines)), purpose="batch")
    batch = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    return batch.id


def _until_some_done(client: openai.OpenAI, batch_id: str, at_least: int) -> int:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        counts = client.batches.retrieve(batch_id).request_counts
        assert counts is not None
        if counts.completed >= at_least:
            return counts.completed
        time.sleep(0.05)
    raise AssertionError("the job made no progress")


def test_a_restarted_gateway_resumes_the_job_and_runs_no_line_twice(
    gateway_factory: GatewayFactory,
    fake_upstream: str,
    tmp_path: Path,
    client_of: Callable[[Gateway], openai.OpenAI],
) -> None:
    tag = uuid.uuid4().hex[:8]
    config = batch_config(fake_upstream, tmp_path, concurrency=2)
    first = gateway_factory(config)
    batch_id = _slow_job(client_of(first), tag)
    _until_some_done(client_of(first), batch_id, 3)
    assert first.stop() == 0  # lines in flight finish and are recorded before it exits
    before = upstream_counts(fake_upstream, tag)
    assert 3 <= len(before) < LINES

    second = gateway_factory(config)
    client = client_of(second)
    done = wait_for(client, batch_id, "completed")
    assert done.request_counts is not None and done.request_counts.completed == LINES
    sent = upstream_counts(fake_upstream, tag)
    assert sent == {f"{tag}-{i}": 1 for i in range(LINES)}  # every line once, none twice
    assert done.output_file_id is not None
    output = rows(client.files.content(done.output_file_id).content)
    assert [row["custom_id"] for row in output] == [f"{tag}-{i}" for i in range(LINES)]


@pytest.mark.timeout(120)
def test_after_a_crash_only_lines_in_flight_go_again(
    gateway_factory: GatewayFactory,
    fake_upstream: str,
    tmp_path: Path,
    client_of: Callable[[Gateway], openai.OpenAI],
) -> None:
    """SIGKILL: no drain. Lines whose results were recorded never go again; the ones in
    flight at the crash (at most the job's concurrency) may (README "Batch jobs")."""
    tag = uuid.uuid4().hex[:8]
    config = batch_config(fake_upstream, tmp_path, concurrency=2)
    first = gateway_factory(config)
    batch_id = _slow_job(client_of(first), tag)
    _until_some_done(client_of(first), batch_id, 3)
    first.server.kill()
    second = gateway_factory(config)
    done = wait_for(client_of(second), batch_id, "completed")
    assert done.request_counts is not None and done.request_counts.completed == LINES
    sent = upstream_counts(fake_upstream, tag)
    assert set(sent) == {f"{tag}-{i}" for i in range(LINES)}
    twice = [line for line, count in sent.items() if count > 1]
    assert len(twice) <= 2 and all(count <= 2 for count in sent.values())
