"""`BlobStore` in an S3 bucket (any S3-compatible endpoint), with aiobotocore: one object
per file, `{prefix}{file id}`. A put replaces the object whole, so a job that finalizes
again after a crash rewrites its files without ever exposing half of one.

Credentials come from the settings (`SecretStr`, unwrapped only to build the client) or
botocore's default chain; they never appear in errors or logs from here. botocore's own
retries stay on (its standard mode): these are single small requests, not a transfer
that retries per chunk as weight staging does (warmpool/s3.py).
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any

import botocore.exceptions as boto_errors
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session

from gateway.batches.errors import BlobMissing, BlobStoreError
from gateway.settings import BatchFiles


class S3BlobStore:
    def __init__(self, client: Any, bucket: str, prefix: str, stack: AsyncExitStack) -> None:
        self._client = client
        self._bucket = bucket
        self._prefix = prefix
        self._stack = stack

    @classmethod
    async def open(cls, settings: BatchFiles) -> S3BlobStore:
        assert settings.bucket is not None  # the settings refuse s3 without a bucket
        s3 = settings.s3
        args: dict[str, Any] = {
            "region_name": s3.region,
            "endpoint_url": s3.endpoint_url,
            "config": AioConfig(retries={"mode": "standard"}, connect_timeout=5, read_timeout=60),
        }
        if s3.access_key_id is not None and s3.secret_access_key is not None:
            args["aws_access_key_id"] = s3.access_key_id.get_secret_value()
            args["aws_secret_access_key"] = s3.secret_access_key.get_secret_value()
        stack = AsyncExitStack()
        try:
            client = await stack.enter_async_context(get_session().create_client("s3", **args))
        except (boto_errors.BotoCoreError, ValueError) as exc:
            raise BlobStoreError(f"opening S3: {type(exc).__name__}") from exc
        return cls(client, settings.bucket, settings.prefix, stack)

    async def put(self, file_id: str, data: bytes) -> None:
        try:
            await self._client.put_object(Bucket=self._bucket, Key=self._key(file_id), Body=data)
        except (boto_errors.BotoCoreError, boto_errors.ClientError) as exc:
            raise _translated(exc, f"writing {file_id}") from exc

    async def get(self, file_id: str) -> bytes:
        try:
            answer = await self._client.get_object(Bucket=self._bucket, Key=self._key(file_id))
            async with answer["Body"] as body:
                data: bytes = await body.read()
        except (boto_errors.BotoCoreError, boto_errors.ClientError) as exc:
            raise _translated(exc, f"reading {file_id}") from exc
        return data

    async def delete(self, file_id: str) -> None:
        try:
            await self._client.delete_object(Bucket=self._bucket, Key=self._key(file_id))
        except (boto_errors.BotoCoreError, boto_errors.ClientError) as exc:
            raise _translated(exc, f"deleting {file_id}") from exc

    async def close(self) -> None:
        await self._stack.aclose()

    def _key(self, file_id: str) -> str:
        return self._prefix + file_id


def _translated(exc: Exception, what: str) -> BlobStoreError:
    if isinstance(exc, boto_errors.ClientError):
        code = str(exc.response.get("Error", {}).get("Code", ""))
        if code in ("NoSuchKey", "404"):
            return BlobMissing(f"S3: {what}: not found")
        return BlobStoreError(f"S3: {what}: {code or 'error'}")
    return BlobStoreError(f"S3: {what}: {type(exc).__name__}")
