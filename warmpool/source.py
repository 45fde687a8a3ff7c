"""Where weights come from: an `s3://bucket/prefix/` location and the `WeightSource` seam.

A source lists the objects under a prefix (with sizes and ETags) and reads byte ranges of
one object, as new bytes or into a caller's buffer. `warmpool.s3.S3WeightSource` implements
it with aiobotocore; tests may put any other object behind it. Sources raise only
`warmpool.errors.SourceError` and its subclasses.
"""

from __future__ import annotations

import re
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Protocol

from warmpool.errors import InvalidWeightURI

# Lenient on purpose (dots, underscores, upper case): S3-compatible stores differ from AWS.
_BUCKET = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{1,61}[A-Za-z0-9]$")


@dataclass(frozen=True)
class S3Location:
    bucket: str
    prefix: str  # empty (the whole bucket) or ending in "/"

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"


@dataclass(frozen=True)
class RemoteObject:
    bucket: str
    key: str
    name: str  # the key relative to the prefix: the file's path in the local folder
    size: int
    etag: str  # without the surrounding quotes


def parse_s3_uri(uri: str) -> S3Location:
    """`s3://bucket/some/prefix` → S3Location("bucket", "some/prefix/").

    Split by hand rather than with urllib: `?` and `#` are legal in S3 keys.
    """
    scheme, sep, rest = uri.partition("://")
    if not sep or scheme.lower() != "s3":
        raise InvalidWeightURI(f"weights URI must start with s3://, got {uri!r}")
    bucket, _, prefix = rest.partition("/")
    if not _BUCKET.match(bucket):
        raise InvalidWeightURI(f"invalid bucket name {bucket!r} in {uri!r}")
    prefix = prefix.strip("/")
    if any(part in ("", ".", "..") for part in prefix.split("/")) and prefix:
        raise InvalidWeightURI(f"invalid prefix {prefix!r} in {uri!r}")
    return S3Location(bucket, prefix + "/" if prefix else "")


class WeightSource(Protocol):
    async def list_objects(self, location: S3Location) -> list[RemoteObject]:
        """Every object under the prefix, "folder" markers (keys ending in /) left out."""
        ...

    async def read_range(self, obj: RemoteObject, start: int, stop: int) -> bytes:
        """Bytes [start, stop) of the object, exactly stop - start of them.

        Fails with SourceChanged if the object's ETag is no longer `obj.etag`.
        """
        ...

    async def read_into(self, obj: RemoteObject, start: int, buffer: memoryview) -> None:
        """Fill `buffer` with the bytes from `start` on: a chunk with no allocation of its own.

        Fails as `read_range` does; on failure the buffer holds anything.
        """
        ...


class WeightSourceFactory(Protocol):
    """Opens a source for one staging; the context closes its connections."""

    def __call__(self) -> AbstractAsyncContextManager[WeightSource]: ...
