"""moto's S3 as a real HTTP server, a bucket of synthetic weights, and a fault proxy."""

from __future__ import annotations

import hashlib
import random
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import orjson
import pytest
from pydantic import SecretStr

from bench.processes import ServerProcess, free_port
from tests.warmpool.fault_proxy import FaultProxy
from warmpool.retry import TransferRetryPolicy
from warmpool.s3 import S3WeightSource
from warmpool.source import WeightSourceFactory
from warmpool.staging import WeightStager

BUCKET = "weights"
KiB, MiB = 1024, 1024 * 1024
FAST_RETRY = TransferRetryPolicy(
    max_attempts=5, base_delay_s=0.01, max_delay_s=0.05, attempt_timeout_s=5
)
SECRET = "wJalrXUtnFEMI-do-not-leak-9c41f7e2"


@dataclass(frozen=True)
class Model:
    prefix: str
    files: dict[str, bytes]  # name -> content, as the stager must reproduce it

    @property
    def uri(self) -> str:
        return f"s3://{BUCKET}/{self.prefix}/"

    @property
    def total(self) -> int:
        return sum(len(b) for b in self.files.values())


@dataclass(frozen=True)
class Weights:
    endpoint: str
    models: dict[str, Model]


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of moto's S3 server, a real HTTP endpoint on a free loopback port."""
    port = free_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    server = ServerProcess(command, f"http://127.0.0.1:{port}/moto-api/", log).start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture(scope="session")
def weights(s3_endpoint: str) -> Weights:
    rng = random.Random(7)
    blob = rng.randbytes
    models = {
        # Every file in the manifest: sha256 checks, one of them a multipart upload.
        "alpha": _with_manifest(
            {
                "model.safetensors": blob(3 * MiB + 123),
                "big.bin": blob(12 * MiB),
                "config.json": b'{"hidden_size": 64}',
                "tokenizer/vocab.txt": blob(200 * KiB),
            }
        ),
        # No manifest: ETag MD5 for single-part objects, size only for the multipart one.
        "beta": {"a.bin": blob(2 * MiB + 5), "multi.bin": blob(11 * MiB), "empty.txt": b""},
        "tiny": {"w.bin": blob(100 * KiB)},
        **{f"small-{i}": {"w.bin": blob(256 * KiB)} for i in range(1, 5)},
        "huge": {"w.bin": blob(600 * KiB)},
    }
    good = blob(1 * MiB)
    corrupt = bytearray(good)
    corrupt[12345] ^= 0xFF
    models["corrupt"] = {**_with_manifest({"w.bin": good}), "w.bin": bytes(corrupt)}
    models["wrongsize"] = {**_with_manifest({"w.bin": good}), "w.bin": good[:-1]}
    client = boto3.client("s3", **s3_client_args(s3_endpoint))
    client.create_bucket(Bucket=BUCKET)
    for prefix, files in models.items():
        for name, content in files.items():
            _upload(client, f"{prefix}/{name}", content)
    client.close()  # else its pooled socket may warn (an error here) whenever it is collected
    return Weights(s3_endpoint, {p: Model(p, f) for p, f in models.items()})


def s3_client_args(endpoint: str, secret: str = "test-secret") -> dict[str, Any]:
    return {
        "endpoint_url": endpoint,
        "region_name": "us-east-1",
        "aws_access_key_id": "testing",
        "aws_secret_access_key": secret,
    }


def _with_manifest(files: dict[str, bytes]) -> dict[str, bytes]:
    manifest = {
        name: {"size": len(b), "sha256": hashlib.sha256(b).hexdigest()} for name, b in files.items()
    }
    return {**files, "manifest.json": orjson.dumps({"files": manifest})}


def _upload(client: Any, key: str, content: bytes) -> None:
    if len(content) <= 8 * MiB:
        client.put_object(Bucket=BUCKET, Key=key, Body=content)
        return
    part = 5 * MiB  # S3's smallest part: the ETag becomes "<md5 of md5s>-<parts>"
    upload = client.create_multipart_upload(Bucket=BUCKET, Key=key)["UploadId"]
    parts = []
    for number, start in enumerate(range(0, len(content), part), start=1):
        body = content[start : start + part]
        etag = client.upload_part(
            Bucket=BUCKET, Key=key, UploadId=upload, PartNumber=number, Body=body
        )["ETag"]
        parts.append({"PartNumber": number, "ETag": etag})
    client.complete_multipart_upload(
        Bucket=BUCKET, Key=key, UploadId=upload, MultipartUpload={"Parts": parts}
    )


def source_factory(endpoint: str, secret: str = "test-secret", **kw: Any) -> WeightSourceFactory:
    return S3WeightSource.factory(
        endpoint_url=endpoint,
        region="us-east-1",
        access_key_id=SecretStr("testing"),
        secret_access_key=SecretStr(secret),
        **{"read_timeout_s": 2.0, **kw},
    )


StagerFactory = Callable[..., WeightStager]


@pytest.fixture
async def make_stager(tmp_path: Path) -> AsyncIterator[StagerFactory]:
    """Stagers on `tmp_path / "cache"` (so a second one sees what the first left), closed after."""
    made: list[WeightStager] = []

    def make(endpoint: str, **kw: Any) -> WeightStager:
        options: dict[str, Any] = {
            "disk_budget_bytes": 1 << 30,
            "chunk_bytes": 1 * MiB,
            "parallelism": 4,
            "retry": FAST_RETRY,
            **kw,
        }
        source_kw = options.pop("source", {})
        stager = WeightStager(tmp_path / "cache", source_factory(endpoint, **source_kw), **options)
        made.append(stager)
        return stager

    yield make
    for stager in made:
        await stager.aclose()


@pytest.fixture
async def proxy(weights: Weights) -> AsyncIterator[FaultProxy]:
    proxy = await FaultProxy(weights.endpoint).start()
    yield proxy
    await proxy.stop()
