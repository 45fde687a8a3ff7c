"""Batch jobs through a real gateway process, driven by the official `openai` client: files,
batches, their output and error files, a tenant's isolation, cancel and expiry."""

from __future__ import annotations

import io
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest
from openai.types import Batch

from bench.processes import OPERATOR, Gateway, start_gateway
from tests.conftest import GatewayFactory, fake_backend, hash_of

ALPHA_KEY = "sk-test-batch-alpha-0123456789"
BETA_KEY = "sk-test-batch-beta-0123456789"
TENANTS = [
    {"name": "alpha", "keys": [{"sha256": hash_of(ALPHA_KEY)}]},
    {"name": "beta", "models": ["echo"], "keys": [{"sha256": hash_of(BETA_KEY)}]},
]


def batch_config(upstream: str, work: Path, **batches: Any) -> dict[str, Any]:
    """A gateway whose runner looks often and retries fast, with a short window for tests."""
    return {
        "state": {"url": "memory", "path": str(work / "state.json")},
        "backends": [fake_backend(upstream)],
        "cache": {"enabled": False},
        "tenants": TENANTS,
        "batches": {
            "poll_s": 0.2,
            "retry_base_s": 0.05,
            "retry_cap_s": 0.2,
            "completion_windows": ["24h", "2s"],
            **batches,
        },
    }


def chat_line(custom_id: str, text: str, model: str = "echo", **extra: Any) -> dict[str, Any]:
    body = {"model": model, "messages": [{"role": "user", "content": text}], **extra}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def jsonl(lines: list[dict[str, Any]]) -> io.BytesIO:
    return io.BytesIO(b"".join(orjson.dumps(line) + b"\n" for line in lines))


def rows(data: bytes) -> list[dict[str, Any]]:
    return [orjson.loads(row) for row in data.splitlines()]


def wait_for(client: openai.OpenAI, batch_id: str, *statuses: str, timeout_s: float = 20) -> Batch:
    deadline = time.monotonic() + timeout_s
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in statuses or time.monotonic() > deadline:
            assert batch.status in statuses, batch
            return batch
        time.sleep(0.1)


def upstream_counts(upstream: str, tag: str) -> dict[str, int]:
    stats = httpx.get(upstream.removesuffix("/v1") + "/_stats", timeout=5).json()
    return {k.removeprefix("user:"): v for k, v in stats.items() if k.startswith(f"user:{tag}")}


@pytest.fixture(scope="module")
def gateway(fake_upstream: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    work = tmp_path_factory.mktemp("batches")
    config = batch_config(fake_upstream, work, concurrency=2, max_file_bytes=64 * 1024)
    gw = start_gateway(config, work)
    yield gw
    gw.stop()


@pytest.fixture
def alpha(gateway: Gateway) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gateway.base_url, api_key=ALPHA_KEY, max_retries=0) as client:
        yield client


@pytest.fixture
def beta(gateway: Gateway) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gateway.base_url, api_key=BETA_KEY, max_retries=0) as client:
        yield client


def test_a_batch_runs_to_its_output_and_error_files(alpha: openai.OpenAI) -> None:
    lines = [chat_line(f"ok-{i}", f"hello {i}") for i in range(4)]
    lines.insert(2, chat_line("broken", "fails upstream", model="error-500"))
    upload = alpha.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
    assert (upload.purpose, upload.filename, upload.status) == ("batch", "in.jsonl", "processed")
    assert alpha.files.retrieve(upload.id).bytes == upload.bytes
    created = alpha.batches.create(
        input_file_id=upload.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"run": "nightly"},
    )
    assert created.status == "validating" and created.metadata == {"run": "nightly"}
    assert created.expires_at == created.created_at + 86400

    done = wait_for(alpha, created.id, "completed")
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed) == (5, 4)
    assert done.request_counts.failed == 1
    assert done.in_progress_at and done.finalizing_at and done.completed_at
    assert done.model == "echo" or done.model is None
    assert done.output_file_id and done.error_file_id
    output = rows(alpha.files.content(done.output_file_id).content)
    assert [row["custom_id"] for row in output] == ["ok-0", "ok-1", "ok-2", "ok-3"]
    first = output[0]
    assert first["id"].startswith("batch_req_") and first["error"] is None
    assert first["response"]["status_code"] == 200
    assert first["response"]["request_id"]
    assert first["response"]["body"]["choices"][0]["message"]["content"] == "echo: hello 0"
    errors = rows(alpha.files.content(done.error_file_id).content)
    assert [row["custom_id"] for row in errors] == ["broken"]
    assert errors[0]["response"]["status_code"] == 502
    assert errors[0]["response"]["body"]["error"]["type"] == "upstream_error"
    output_file = alpha.files.retrieve(done.output_file_id)
    assert output_file.purpose == "batch_output"
    assert done.usage is not None and done.usage.output_tokens > 0

    listed = alpha.batches.list(limit=100)
    assert created.id in [b.id for b in listed.data]
    assert upload.id in [f.id for f in alpha.files.list(purpose="batch")]


def test_embeddings_batch(alpha: openai.OpenAI) -> None:
    lines = [
        {"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings", "body": body}
        for i, body in enumerate(
            [{"model": "echo", "input": "one"}, {"model": "echo", "input": ["two", "three"]}]
        )
    ]
    upload = alpha.files.create(file=("emb.jsonl", jsonl(lines)), purpose="batch")
    batch = alpha.batches.create(
        input_file_id=upload.id, endpoint="/v1/embeddings", completion_window="24h"
    )
    done = wait_for(alpha, batch.id, "completed")
    assert done.output_file_id is not None and done.error_file_id is None
    output = rows(alpha.files.content(done.output_file_id).content)
    assert [len(row["response"]["body"]["data"]) for row in output] == [1, 2]


def test_a_wrong_line_is_refused_naming_it(alpha: openai.OpenAI) -> None:
    lines = [chat_line("a", "fine"), chat_line("b", "fine")]
    lines.append({"custom_id": "c", "method": "POST", "url": "/v1/chat/completions", "body": {}})
    with pytest.raises(openai.BadRequestError) as refused:
        alpha.files.create(file=("bad.jsonl", jsonl(lines)), purpose="batch")
    error = refused.value.body
    assert isinstance(error, dict)
    assert error["message"].startswith("Line 3: ") and error["param"] == "body.model"

    twice = [chat_line("same", "x"), chat_line("same", "y")]
    with pytest.raises(openai.BadRequestError, match="Line 2: custom_id 'same' is used twice"):
        alpha.files.create(file=("dup.jsonl", jsonl(twice)), purpose="batch")
    garbage = io.BytesIO(orjson.dumps(chat_line("a", "x")) + b"\n{not json\n")
    with pytest.raises(openai.BadRequestError, match="Line 2: the line is not valid JSON"):
        alpha.files.create(file=("garbage.jsonl", garbage), purpose="batch")


def test_a_file_over_the_size_limit_is_refused(alpha: openai.OpenAI) -> None:
    lines = [chat_line(f"big-{i}", "x" * 1000) for i in range(70)]  # about 75 KiB
    with pytest.raises(openai.APIStatusError) as refused:
        alpha.files.create(file=("big.jsonl", jsonl(lines)), purpose="batch")
    assert refused.value.status_code == 413
    with pytest.raises(openai.BadRequestError, match="purpose must be 'batch'"):
        alpha.files.create(file=("tune.jsonl", jsonl(lines[:1])), purpose="fine-tune")


def test_a_model_the_tenant_may_not_use_is_refused_naming_its_line(beta: openai.OpenAI) -> None:
    lines = [chat_line("a", "fine"), chat_line("b", "not for beta", model="slow")]
    with pytest.raises(openai.BadRequestError) as refused:
        beta.files.create(file=("models.jsonl", jsonl(lines)), purpose="batch")
    error = refused.value.body
    assert isinstance(error, dict)
    assert error["message"].startswith("Line 2: ") and error["code"] == "model_not_allowed"


def test_another_tenant_sees_nothing_of_them(alpha: openai.OpenAI, beta: openai.OpenAI) -> None:
    upload = alpha.files.create(file=("mine.jsonl", jsonl([chat_line("a", "x")])), purpose="batch")
    batch = alpha.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    for attempt in (
        lambda: beta.files.retrieve(upload.id),
        lambda: beta.files.content(upload.id),
        lambda: beta.files.delete(upload.id),
        lambda: beta.batches.retrieve(batch.id),
        lambda: beta.batches.cancel(batch.id),
        lambda: beta.batches.create(
            input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
        ),
    ):
        with pytest.raises(openai.NotFoundError):
            attempt()
    assert batch.id not in [b.id for b in beta.batches.list()]
    assert upload.id not in [f.id for f in beta.files.list()]
    done = wait_for(alpha, batch.id, "completed")
    assert done.output_file_id is not None
    with pytest.raises(openai.NotFoundError):
        beta.files.content(done.output_file_id)


def test_cancel_lets_lines_in_flight_finish_and_lists_the_rest(
    alpha: openai.OpenAI, fake_upstream: str
) -> None:
    tag = uuid.uuid4().hex[:8]
    lines = [
        chat_line(f"{tag}-{i}", "slow", model="slow", x_delay=0.4, user=f"{tag}-{i}")
        for i in range(8)
    ]
    upload = alpha.files.create(file=("slow.jsonl", jsonl(lines)), purpose="batch")
    batch = alpha.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    wait_for(alpha, batch.id, "in_progress")
    cancelling = alpha.batches.cancel(batch.id)
    assert cancelling.status == "cancelling" and cancelling.cancelling_at is not None
    done = wait_for(alpha, batch.id, "cancelled")
    assert done.cancelled_at is not None and done.request_counts is not None
    assert done.request_counts.completed < 8
    assert done.error_file_id is not None
    errors = rows(alpha.files.content(done.error_file_id).content)
    cancelled = [row for row in errors if row["error"]]
    assert cancelled and all(row["error"]["code"] == "batch_cancelled" for row in cancelled)
    assert all(row["response"] is None for row in cancelled)
    sent = upstream_counts(fake_upstream, tag)
    assert len(sent) == done.request_counts.completed  # in flight at the cancel: finished
    with pytest.raises(openai.ConflictError):
        alpha.batches.cancel(wait_for(alpha, _completed_batch(alpha), "completed").id)


def _completed_batch(client: openai.OpenAI) -> str:
    upload = client.files.create(file=("one.jsonl", jsonl([chat_line("a", "x")])), purpose="batch")
    batch = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    return batch.id


def test_a_job_past_its_window_expires_with_the_lines_not_run(alpha: openai.OpenAI) -> None:
    # 30 lines of 0.3 s, two at a time: 4.5 s of work for a window of 1 to 2 s.
    lines = [chat_line(f"x{i}", "slow", model="slow", x_delay=0.3) for i in range(30)]
    upload = alpha.files.create(file=("expiring.jsonl", jsonl(lines)), purpose="batch")
    batch = alpha.batches.create(
        input_file_id=upload.id,
        endpoint="/v1/chat/completions",
        completion_window="2s",  # type: ignore[arg-type]  # a window this gateway allows
    )
    done = wait_for(alpha, batch.id, "expired", timeout_s=15)
    assert done.expired_at is not None and done.request_counts is not None
    assert 0 < done.request_counts.completed < 30
    assert done.error_file_id is not None
    errors = rows(alpha.files.content(done.error_file_id).content)
    assert len(errors) == 30 - done.request_counts.completed
    assert {row["error"]["code"] for row in errors} == {"batch_expired"}


def test_a_batch_over_a_file_of_another_endpoint_fails(alpha: openai.OpenAI) -> None:
    upload = alpha.files.create(file=("chat.jsonl", jsonl([chat_line("a", "x")])), purpose="batch")
    batch = alpha.batches.create(
        input_file_id=upload.id, endpoint="/v1/embeddings", completion_window="24h"
    )
    failed = wait_for(alpha, batch.id, "failed")
    assert failed.errors is not None and failed.errors.data
    error = failed.errors.data[0]
    assert (error.code, error.line, error.param) == ("mismatched_endpoint", 1, "url")
    with pytest.raises(openai.BadRequestError):
        alpha.batches.create(
            input_file_id=upload.id,
            endpoint="/v1/chat/completions",
            completion_window="1h",  # type: ignore[arg-type]  # not among the allowed
        )


def test_files_can_be_deleted_unless_a_running_batch_reads_them(alpha: openai.OpenAI) -> None:
    upload = alpha.files.create(file=("gone.jsonl", jsonl([chat_line("a", "x")])), purpose="batch")
    deleted = alpha.files.delete(upload.id)
    assert deleted.deleted and deleted.id == upload.id
    with pytest.raises(openai.NotFoundError):
        alpha.files.retrieve(upload.id)


def test_progress_shows_in_metrics_and_the_report(gateway: Gateway, alpha: openai.OpenAI) -> None:
    batch = wait_for(alpha, _completed_batch(alpha), "completed")
    deadline = time.monotonic() + 10
    while True:
        metrics = httpx.get(gateway.url + "/metrics", timeout=5, headers=OPERATOR).text
        if 'gateway_batch_jobs{status="completed"} 0.0' not in metrics:
            break
        assert time.monotonic() < deadline, "the jobs' statuses were never counted"
        time.sleep(0.1)
    assert 'gateway_batch_lines_total{outcome="completed"}' in metrics
    # Batch lines queue in the batch class, behind interactive traffic.
    assert 'gateway_queue_wait_seconds_count{backend="fake",class="batch"}' in metrics

    answer = gateway.cli("report", "batches", "--since", "1h", "--format", "json")
    assert answer.returncode == 0, answer.stderr
    report = orjson.loads(answer.stdout)
    row = next(job for job in report["jobs"] if job["id"] == batch.id)
    assert (row["tenant"], row["status"], row["progress"]) == ("alpha", "completed", 1.0)
    assert report["totals"]["by_status"]["completed"] >= 1
    table = gateway.cli("report", "batches", "--tenant", "alpha")
    assert table.returncode == 0 and "Batch jobs" in table.stdout and batch.id in table.stdout


def test_a_batch_runs_with_its_state_in_redis(
    gateway_factory: GatewayFactory,
    fake_upstream: str,
    tmp_path: Path,
    redis_url: str,
    redis_prefix: str,
) -> None:
    config = batch_config(fake_upstream, tmp_path)
    config["state"] = {"url": redis_url, "prefix": redis_prefix, "path": str(tmp_path / "s.json")}
    gateway = gateway_factory(config)
    with openai.OpenAI(base_url=gateway.base_url, api_key=ALPHA_KEY, max_retries=0) as client:
        lines = [chat_line(f"r{i}", f"redis {i}") for i in range(3)]
        upload = client.files.create(file=("redis.jsonl", jsonl(lines)), purpose="batch")
        batch = client.batches.create(
            input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        done = wait_for(client, batch.id, "completed")
        assert done.request_counts is not None and done.request_counts.completed == 3
        assert done.output_file_id is not None
        output = rows(client.files.content(done.output_file_id).content)
    assert [row["custom_id"] for row in output] == ["r0", "r1", "r2"]


def test_batches_are_listed_newest_first_page_by_page(alpha: openai.OpenAI) -> None:
    made = [_completed_batch(alpha) for _ in range(3)]
    first = alpha.batches.list(limit=2)
    assert first.has_more and len(first.data) == 2
    assert [b.id for b in first.data] == made[::-1][:2]
    every = [b.id for b in alpha.batches.list(limit=2)]  # the client follows `after`
    assert len(every) == len(set(every)) and every[:3] == made[::-1]
    files = [f.id for f in alpha.files.list(limit=2, order="asc")]
    assert len(files) == len(set(files)) >= 3
