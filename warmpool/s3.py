"""`WeightSource` over any S3-compatible endpoint, with aiobotocore.

    async with S3WeightSource(
        endpoint_url=..., region="us-east-1",
        access_key_id=SecretStr(...), secret_access_key=SecretStr(...),
    ) as src:
        objects = await src.list_objects(parse_s3_uri("s3://weights/llama/"))

botocore's own retries are switched off: the stager retries per chunk with backoff, and two
retry layers would multiply (5 x 5 GETs for one bad range). Response checksum validation is
off too, because the stager verifies whole files itself (sha256 or MD5) after download.

Credentials are held as `SecretValue`s (pydantic's `SecretStr` fits) and unwrapped only when
the client is built; with none given, botocore's default chain (environment, instance role,
web identity) applies. They never appear in reprs, exceptions or logs from this module.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AsyncExitStack, contextmanager
from types import TracebackType
from typing import Any, Literal, Protocol

import aiohttp
import botocore.exceptions as boto_errors
from aiobotocore.config import AioConfig
from aiobotocore.session import AioSession, get_session

from warmpool.errors import (
    SourceAccessDenied,
    SourceChanged,
    SourceError,
    SourceNotFound,
    SourceUnavailable,
)
from warmpool.source import RemoteObject, S3Location, WeightSourceFactory

_TRANSIENT: tuple[type[BaseException], ...] = (
    boto_errors.HTTPClientError,  # closed connections, read timeouts, broken bodies
    boto_errors.ConnectionError,  # refused, connect timeouts
    boto_errors.IncompleteReadError,  # body shorter than its Content-Length
    aiohttp.ClientError,
    TimeoutError,
)
_TRANSIENT_CODES = frozenset(
    {"SlowDown", "RequestTimeout", "InternalError", "ServiceUnavailable", "Throttling"}
)
_DENIED_CODES = frozenset({"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"})


class SecretValue(Protocol):
    def get_secret_value(self) -> str: ...


class S3WeightSource:
    def __init__(
        self,
        *,
        endpoint_url: str | None,
        region: str,
        access_key_id: SecretValue | None = None,
        secret_access_key: SecretValue | None = None,
        session_token: SecretValue | None = None,
        max_pool_connections: int = 16,
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 30.0,
        addressing_style: Literal["auto", "path", "virtual"] = "auto",
        session: AioSession | None = None,
    ) -> None:
        if (access_key_id is None) != (secret_access_key is None):
            raise ValueError("give both access_key_id and secret_access_key, or neither")
        self.endpoint_url = endpoint_url
        self.region = region
        self._access_key_id = access_key_id
        self._secret_access_key = secret_access_key
        self._session_token = session_token
        self._config = AioConfig(
            max_pool_connections=max_pool_connections,
            connect_timeout=connect_timeout_s,
            read_timeout=read_timeout_s,
            retries={"total_max_attempts": 1},
            response_checksum_validation="when_required",
            s3={"addressing_style": addressing_style},
        )
        self._session = session
        self._stack: AsyncExitStack | None = None
        self._client: Any = None

    @classmethod
    def factory(cls, **kwargs: Any) -> WeightSourceFactory:
        """Sources with these constructor arguments, sharing one botocore session.

        A fresh session loads botocore's service model again (about 150 ms a staging here);
        a shared one also shares its credential cache.
        """
        session = kwargs.pop("session", None) or get_session()
        return lambda: cls(session=session, **kwargs)

    def __repr__(self) -> str:
        credentials = "explicit" if self._access_key_id is not None else "default chain"
        return (
            f"S3WeightSource(endpoint_url={self.endpoint_url!r}, region={self.region!r}, "
            f"credentials={credentials})"
        )

    async def __aenter__(self) -> S3WeightSource:
        stack = AsyncExitStack()
        with _translated(f"opening an S3 client for {self.endpoint_url or 'AWS'}"):
            self._client = await stack.enter_async_context(
                (self._session or get_session()).create_client("s3", **self._client_args())
            )
        self._stack = stack
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        stack, self._stack, self._client = self._stack, None, None
        if stack is not None:
            await stack.aclose()

    def _client_args(self) -> dict[str, Any]:
        args: dict[str, Any] = {
            "region_name": self.region,
            "endpoint_url": self.endpoint_url,
            "config": self._config,
        }
        if self._access_key_id is not None and self._secret_access_key is not None:
            args["aws_access_key_id"] = self._access_key_id.get_secret_value()
            args["aws_secret_access_key"] = self._secret_access_key.get_secret_value()
        if self._session_token is not None:
            args["aws_session_token"] = self._session_token.get_secret_value()
        return args

    async def list_objects(self, location: S3Location) -> list[RemoteObject]:
        client = self._require_client()
        found: list[RemoteObject] = []
        with _translated(f"listing {location}"):
            pages = client.get_paginator("list_objects_v2").paginate(
                Bucket=location.bucket, Prefix=location.prefix
            )
            async for page in pages:
                found.extend(_objects(location, page.get("Contents", [])))
        return found

    async def read_range(self, obj: RemoteObject, start: int, stop: int) -> bytes:
        buffer = bytearray(stop - start)  # small reads (the manifest): one copy is nothing
        await self.read_into(obj, start, memoryview(buffer))
        return bytes(buffer)

    async def read_into(self, obj: RemoteObject, start: int, buffer: memoryview) -> None:
        client = self._require_client()
        stop = start + len(buffer)
        what = f"reading bytes {start}-{stop - 1} of s3://{obj.bucket}/{obj.key}"
        with _translated(what):
            # If-Match: ranges of two versions of an object must never be stitched together.
            response = await client.get_object(
                Bucket=obj.bucket,
                Key=obj.key,
                Range=f"bytes={start}-{stop - 1}",
                IfMatch=f'"{obj.etag}"',
            )
            async with response["Body"] as body:
                filled = await _fill(body, buffer)
        if filled != len(buffer):
            raise SourceUnavailable(f"{what}: got {filled} bytes, expected {len(buffer)}")

    def _require_client(self) -> Any:
        if self._client is None:
            raise RuntimeError("use S3WeightSource as an async context manager")
        return self._client


async def _fill(body: Any, buffer: memoryview) -> int:
    """Read the body into `buffer` as it arrives: unlike `read()`, no list of pieces joined
    into a new object per chunk (a fresh 32 MiB allocation and its page faults each time)."""
    filled = 0
    while filled < len(buffer):
        read: int = await body.readinto(buffer[filled:])
        if read == 0:
            break
        filled += read
    return filled


def _objects(location: S3Location, contents: list[dict[str, Any]]) -> list[RemoteObject]:
    return [
        RemoteObject(
            bucket=location.bucket,
            key=item["Key"],
            name=item["Key"][len(location.prefix) :],
            size=int(item["Size"]),
            etag=str(item.get("ETag", "")).strip('"'),
        )
        for item in contents
        if not item["Key"].endswith("/")
    ]


@contextmanager
def _translated(what: str) -> Iterator[None]:
    try:
        yield
    except boto_errors.ClientError as exc:
        raise _client_error(exc, what) from exc
    except _TRANSIENT as exc:
        raise SourceUnavailable(f"{what}: {type(exc).__name__}") from exc
    except (boto_errors.NoCredentialsError, boto_errors.PartialCredentialsError) as exc:
        raise SourceAccessDenied(f"{what}: no S3 credentials found") from exc
    except (boto_errors.BotoCoreError, ValueError) as exc:
        raise SourceError(f"{what}: {type(exc).__name__}") from exc


def _client_error(exc: boto_errors.ClientError, what: str) -> SourceError:
    code = str(exc.response.get("Error", {}).get("Code", ""))
    status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
    detail = f"{what}: HTTP {status} {code}".rstrip()
    if status >= 500 or status == 429 or code in _TRANSIENT_CODES:
        return SourceUnavailable(detail)
    if status == 404 or code in ("NoSuchKey", "NoSuchBucket"):
        return SourceNotFound(detail)
    if status in (401, 403) or code in _DENIED_CODES:
        return SourceAccessDenied(detail)
    if status == 412 or code == "PreconditionFailed":
        return SourceChanged(detail + " (the object changed while it was being staged)")
    return SourceError(detail)
