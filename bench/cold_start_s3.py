"""moto's S3 for bench/cold_start.py: the server, the model's upload, and the plain download
(to files, like staging) that staging is compared with.

moto keeps each object in a temporary file and reads the *whole* object for every GET, ranged
or not, before slicing the range out of it. A ranged download therefore costs moto about
(object size / chunk size) whole-object reads per object, and moto runs on the same two
cores as everything else: use shards of ~0.1 GB and chunks of tens of MiB, not 8 MiB chunks
of 5 GB shards. The plain download pays exactly the same, so the ratio stays fair; the
absolute GB/s are moto's, not S3's.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from bench.processes import ServerProcess, free_port

REGION = "us-east-1"
ACCESS_KEY = "testing"
SECRET_KEY = "cold-start-bench-secret"
MiB = 1024 * 1024


@dataclass(frozen=True)
class S3Object:
    key: str
    size: int


def start_moto(work_dir: Path) -> tuple[ServerProcess, str]:
    """moto's S3 as a real HTTP server on a free loopback port; its temp files in work_dir."""
    port = free_port()
    tmp = work_dir / "moto-tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    server = ServerProcess(
        command,
        f"http://127.0.0.1:{port}/moto-api/",
        work_dir / "moto.log",
        env={"TMPDIR": str(tmp)},
    ).start()
    return server, f"http://127.0.0.1:{port}"


def client_args(endpoint: str) -> dict[str, Any]:
    return {
        "endpoint_url": endpoint,
        "region_name": REGION,
        "aws_access_key_id": ACCESS_KEY,
        "aws_secret_access_key": SECRET_KEY,
    }


def create_bucket(endpoint: str, bucket: str) -> None:
    """The bucket; also imports the S3 clients, so that later steps do not wait for that."""
    import aiobotocore.session  # noqa: F401 - for plain_download, ahead of time
    import boto3  # type: ignore[import-untyped]

    boto3.client("s3", **client_args(endpoint)).create_bucket(Bucket=bucket)


def upload_model(
    endpoint: str, bucket: str, prefix: str, folder: Path, manifest: bool
) -> list[S3Object]:
    """Every file of `folder` under s3://bucket/prefix/ (the bucket made by `create_bucket`),
    as `aws s3 cp` would (multipart over 8 MiB), with a `manifest.json` of sha256s when
    `manifest` (else staging can only check the sizes of multipart objects). Returns what
    was uploaded."""
    import boto3
    from boto3.s3.transfer import TransferConfig  # type: ignore[import-untyped]

    client = boto3.client("s3", **client_args(endpoint))
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    config = TransferConfig(multipart_threshold=8 * MiB, multipart_chunksize=8 * MiB)
    uploaded = []
    for path in files:
        key = f"{prefix}/{path.relative_to(folder).as_posix()}"
        client.upload_file(str(path), bucket, key, Config=config)
        uploaded.append(S3Object(key, path.stat().st_size))
    if manifest:
        entries = {
            path.relative_to(folder).as_posix(): {"size": path.stat().st_size, "sha256": _sha(path)}
            for path in files
        }
        body = orjson.dumps({"files": entries})
        client.put_object(Bucket=bucket, Key=f"{prefix}/manifest.json", Body=body)
        uploaded.append(S3Object(f"{prefix}/manifest.json", len(body)))
    return uploaded


def _sha(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def plain_download(
    endpoint: str,
    bucket: str,
    objects: list[S3Object],
    chunk_bytes: int,
    parallelism: int,
    to_dir: Path | None = None,
) -> tuple[int, float]:
    """(bytes, seconds) of ranged GETs of every object, `parallelism` in flight, each body
    read whole (`read()`), as a plain downloader does. The client is made (and a connection
    opened by a warm-up GET) before the clock.

    With `to_dir`, each chunk is written in place into a file per object there (`os.pwrite`
    in a thread), so that the download ends as staging's does, with the objects on disk; the
    files are closed, not synced, when the clock stops: staging's checks, fsyncs and
    bookkeeping are not in it. Without, the bodies are dropped (no disk at all)."""
    from aiobotocore.config import AioConfig

    config = AioConfig(
        max_pool_connections=max(16, parallelism),
        retries={"total_max_attempts": 3},
        response_checksum_validation="when_required",
    )
    chunks = deque(
        (obj.key, start, min(start + chunk_bytes, obj.size))
        for obj in objects
        for start in range(0, obj.size, chunk_bytes)
    )
    fds: dict[str, int] = {}
    try:
        if to_dir is not None:
            to_dir.mkdir(parents=True, exist_ok=True)
            for number, obj in enumerate(objects):
                path = to_dir / f"{number}.part"
                fds[obj.key] = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        return asyncio.run(_fetch(endpoint, bucket, config, chunks, parallelism, fds))
    finally:
        for fd in fds.values():
            os.close(fd)


async def _fetch(
    endpoint: str,
    bucket: str,
    config: Any,
    chunks: deque[tuple[str, int, int]],
    parallelism: int,
    fds: dict[str, int],
) -> tuple[int, float]:
    from aiobotocore.session import get_session

    async with get_session().create_client("s3", config=config, **client_args(endpoint)) as s3:

        async def get(key: str, start: int, stop: int) -> int:
            response = await s3.get_object(
                Bucket=bucket, Key=key, Range=f"bytes={start}-{stop - 1}"
            )
            async with response["Body"] as body:
                data: bytes = await body.read()
            if len(data) != stop - start:
                raise RuntimeError(f"{key} {start}-{stop}: got {len(data)} bytes")
            if key in fds:
                await asyncio.to_thread(_write_at, fds[key], data, start)
            return len(data)

        async def worker() -> int:
            done = 0
            while chunks:
                done += await get(*chunks.popleft())
            return done

        # The client made and a connection opened, off the clock.
        warm_up = await s3.get_object(Bucket=bucket, Key=chunks[0][0], Range="bytes=0-0")
        async with warm_up["Body"] as body:
            await body.read()
        started = time.perf_counter()
        done = await asyncio.gather(*(worker() for _ in range(parallelism)))
        return sum(done), time.perf_counter() - started


def _write_at(fd: int, data: bytes, position: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, position)
        view, position = view[written:], position + written


def sha256_read(paths: list[Path]) -> tuple[int, float]:
    """(bytes, seconds) of hashing the files one after another, one thread, as the stager
    verifies each downloaded file against the manifest."""
    total = 0
    started = time.perf_counter()
    for path in paths:
        total += path.stat().st_size
        _sha(path)
    return total, time.perf_counter() - started
