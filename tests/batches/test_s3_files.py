"""Batch files' bytes in S3 (moto's S3 server on loopback): the store itself, then a gateway
whose inputs and outputs live in the bucket."""

from __future__ import annotations

import uuid
from pathlib import Path

import boto3
import openai
import pytest
from pydantic import SecretStr

from gateway.batches.blobs_s3 import S3BlobStore
from gateway.batches.errors import BlobMissing
from gateway.settings import BatchFiles, S3Settings
from tests.batches.test_batches_e2e import ALPHA_KEY, batch_config, chat_line, jsonl, rows, wait_for
from tests.conftest import GatewayFactory
from tests.warmpool.conftest import s3_client_args, s3_endpoint

__all__ = ["s3_endpoint"]  # the fixture, shared with the weight-staging tests


@pytest.fixture
def bucket(s3_endpoint: str) -> str:
    name = "batch-" + uuid.uuid4().hex[:12]
    client = boto3.client("s3", **s3_client_args(s3_endpoint))
    client.create_bucket(Bucket=name)
    client.close()
    return name


def settings_for(endpoint: str, bucket: str) -> BatchFiles:
    credentials = S3Settings(
        endpoint_url=endpoint,
        access_key_id=SecretStr("testing"),
        secret_access_key=SecretStr("test-secret"),
    )
    return BatchFiles(store="s3", bucket=bucket, prefix="files/", s3=credentials)


async def test_the_s3_store_keeps_replaces_and_deletes_bytes(s3_endpoint: str, bucket: str) -> None:
    store = await S3BlobStore.open(settings_for(s3_endpoint, bucket))
    try:
        await store.put("file-a", b"one\n")
        await store.put("file-a", b"two\n")  # a job finishing again rewrites its files whole
        assert await store.get("file-a") == b"two\n"
        await store.delete("file-a")
        with pytest.raises(BlobMissing):
            await store.get("file-a")
    finally:
        await store.close()
    s3 = boto3.client("s3", **s3_client_args(s3_endpoint))
    assert s3.list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0
    s3.close()


def test_a_gateway_keeps_batch_files_in_the_bucket(
    gateway_factory: GatewayFactory,
    fake_upstream: str,
    tmp_path: Path,
    s3_endpoint: str,
    bucket: str,
) -> None:
    files = settings_for(s3_endpoint, bucket).model_dump(mode="json")
    files["s3"]["secret_access_key"] = "test-secret"  # dumped as a mask; the YAML needs it
    files["s3"]["access_key_id"] = "testing"
    gateway = gateway_factory(batch_config(fake_upstream, tmp_path, files=files))
    with openai.OpenAI(base_url=gateway.base_url, api_key=ALPHA_KEY, max_retries=0) as client:
        upload = client.files.create(
            file=("s3.jsonl", jsonl([chat_line("a", "x")])), purpose="batch"
        )
        batch = client.batches.create(
            input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        done = wait_for(client, batch.id, "completed")
        assert done.output_file_id is not None
        output = rows(client.files.content(done.output_file_id).content)
    assert output[0]["response"]["body"]["choices"][0]["message"]["content"] == "echo: x"
    s3 = boto3.client("s3", **s3_client_args(s3_endpoint))
    keys = {item["Key"] for item in s3.list_objects_v2(Bucket=bucket)["Contents"]}
    s3.close()
    assert keys == {f"files/{upload.id}", f"files/{done.output_file_id}"}
    assert not (tmp_path / "files").exists()  # nothing on the local disk
