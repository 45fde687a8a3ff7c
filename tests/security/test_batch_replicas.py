"""Batch data survives several replicas (#37, item 5): gateway replicas that share job
records in Redis must share the files' bytes too. A configuration that would keep them on
each replica's own disk is refused at start; with S3 (moto's server on loopback), or a
folder declared shared, a job uploaded through one replica is claimed and run by another
and its output read through a third. Real processes, real Redis, no mocks."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import boto3
import openai
import pytest
import yaml

from bench.processes import ROOT, free_port
from tests.batches.test_batches_e2e import ALPHA_KEY, batch_config, chat_line, jsonl, rows, wait_for
from tests.conftest import GatewayFactory
from tests.warmpool.conftest import s3_client_args, s3_endpoint

__all__ = ["s3_endpoint"]  # the fixture (moto's S3 server), shared with the other S3 tests


@pytest.fixture
def bucket(s3_endpoint: str) -> str:
    name = "replicas-" + uuid.uuid4().hex[:12]
    client = boto3.client("s3", **s3_client_args(s3_endpoint))
    client.create_bucket(Bucket=name)
    client.close()
    return name


def replica_config(
    upstream: str, work: Path, redis_url: str, prefix: str, files: dict[str, Any]
) -> dict[str, Any]:
    config = batch_config(upstream, work, files=files)
    config["state"] = {"url": redis_url, "prefix": prefix, "path": str(work / "state.json")}
    return config


def s3_files(endpoint: str, bucket: str) -> dict[str, Any]:
    credentials = {
        "endpoint_url": endpoint,
        "access_key_id": "testing",
        "secret_access_key": "test-secret",
    }
    return {"store": "s3", "bucket": bucket, "prefix": "batch/", "s3": credentials}


def refused(config: dict[str, Any], work: Path, command: str) -> subprocess.CompletedProcess[str]:
    """Runs `gateway COMMAND` on `config`, which must exit at once (not serve)."""
    path = work / f"refused-{uuid.uuid4().hex[:8]}.yaml"
    path.write_text(yaml.safe_dump(config))
    args = [sys.executable, "-m", "gateway.cli", command, "--config", str(path)]
    if command == "serve":
        args += ["--port", str(free_port())]
    try:
        answer = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail(f"`gateway {command}` started with batch files on each replica's own disk")
    assert answer.returncode != 0, answer.stdout
    assert "batches.files" in answer.stderr and "shared" in answer.stderr, answer.stderr
    return answer


def run_across_replicas(factory: GatewayFactory, config: dict[str, Any]) -> tuple[str, str]:
    """Uploads through a first replica, which then goes away (a rolling update); a second
    one takes the job and runs it; a third, started afterwards, serves the output. Returns
    the input's and the output's file ids."""
    first = factory(config)
    with openai.OpenAI(base_url=first.base_url, api_key=ALPHA_KEY, max_retries=0) as client:
        lines = [chat_line(f"r{i}", f"replica {i}") for i in range(3)]
        upload = client.files.create(file=("replicas.jsonl", jsonl(lines)), purpose="batch")
    first.stop()

    second = factory(config)
    with openai.OpenAI(base_url=second.base_url, api_key=ALPHA_KEY, max_retries=0) as client:
        batch = client.batches.create(
            input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        done = wait_for(client, batch.id, "completed", "failed")
        assert done.status == "completed", done.errors
        assert done.request_counts is not None and done.request_counts.completed == 3
        assert done.output_file_id is not None
    second.stop()

    third = factory(config)
    with openai.OpenAI(base_url=third.base_url, api_key=ALPHA_KEY, max_retries=0) as client:
        output = rows(client.files.content(done.output_file_id).content)
    assert [row["custom_id"] for row in output] == ["r0", "r1", "r2"]
    answers = [row["response"]["body"]["choices"][0]["message"]["content"] for row in output]
    assert answers == [f"echo: replica {i}" for i in range(3)]
    return upload.id, done.output_file_id


def test_replicas_sharing_redis_run_a_job_through_s3_and_refuse_their_own_disks(
    gateway_factory: GatewayFactory,
    fake_upstream: str,
    tmp_path: Path,
    redis_url: str,
    redis_prefix: str,
    s3_endpoint: str,
    bucket: str,
) -> None:
    # Each replica's own folder with the job records in Redis: refused at start, and by
    # `gateway check`, with what to do instead.
    own_disk = {"store": "local", "path": str(tmp_path / "this-pod-only")}
    local = replica_config(fake_upstream, tmp_path, redis_url, redis_prefix, own_disk)
    refused(local, tmp_path, "serve")
    refused(local, tmp_path, "check")
    local["batches"].pop("files")  # the default folder (beside the state file) alike
    refused(local, tmp_path, "serve")

    files = s3_files(s3_endpoint, bucket)
    config = replica_config(fake_upstream, tmp_path, redis_url, redis_prefix, files)
    input_id, output_id = run_across_replicas(gateway_factory, config)
    s3 = boto3.client("s3", **s3_client_args(s3_endpoint))
    keys = {item["Key"] for item in s3.list_objects_v2(Bucket=bucket)["Contents"]}
    s3.close()
    assert {f"batch/{input_id}", f"batch/{output_id}"} <= keys
    assert not (tmp_path / "files").exists()  # nothing on a replica's own disk


def test_replicas_may_share_a_folder_they_all_mount_when_it_is_declared(
    gateway_factory: GatewayFactory,
    fake_upstream: str,
    tmp_path: Path,
    redis_url: str,
    redis_prefix: str,
) -> None:
    folder = tmp_path / "shared-volume"
    files = {"store": "local", "path": str(folder), "shared": True}
    config = replica_config(fake_upstream, tmp_path, redis_url, redis_prefix, files)
    input_id, output_id = run_across_replicas(gateway_factory, config)
    assert {input_id, output_id} <= {path.name for path in folder.iterdir()}
