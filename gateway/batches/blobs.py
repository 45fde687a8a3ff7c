"""The bytes of batch files (inputs, outputs, errors), by file id: `BlobStore`.

`LocalBlobStore` keeps them in a folder (the default, next to the state file);
`S3BlobStore` (blobs_s3.py) in a bucket. Records of the files (who owns them, their names)
are the batch store's (gateway/batches/store.py): a blob is only ever read through one.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TypeVar

import anyio.to_thread

from gateway.batches.errors import BlobMissing, BlobStoreError
from gateway.private_files import private_dir, write_private
from gateway.settings import ConfigError, Settings

T = TypeVar("T")


class BlobStore(Protocol):
    async def put(self, file_id: str, data: bytes) -> None: ...
    async def get(self, file_id: str) -> bytes: ...  # BlobMissing if there is none
    async def delete(self, file_id: str) -> None: ...
    async def close(self) -> None: ...


class LocalBlobStore:
    def __init__(self, root: Path) -> None:
        self._root = root

    async def put(self, file_id: str, data: bytes) -> None:
        await _io(self._write, self._path(file_id), data)

    async def get(self, file_id: str) -> bytes:
        try:
            return await anyio.to_thread.run_sync(self._path(file_id).read_bytes)
        except FileNotFoundError as exc:
            raise BlobMissing(f"no bytes for file {file_id}") from exc
        except OSError as exc:
            raise BlobStoreError(f"file store: {type(exc).__name__}: {exc}") from exc

    async def delete(self, file_id: str) -> None:
        await _io(self._path(file_id).unlink, True)

    async def close(self) -> None:
        return None

    def _path(self, file_id: str) -> Path:
        return self._root / file_id  # ids are the gateway's own (`file-` + hex)

    def _write(self, path: Path, data: bytes) -> None:
        private_dir(path.parent)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        write_private(tmp, data)
        os.replace(tmp, path)  # whole or not at all: a finalizing job may write it again


async def _io(work: Callable[..., T], *args: object) -> T:
    try:
        return await anyio.to_thread.run_sync(work, *args)
    except OSError as exc:
        raise BlobStoreError(f"file store: {type(exc).__name__}: {exc}") from exc


async def open_blobs(settings: Settings) -> BlobStore:
    files = settings.batches.files
    if files.store == "s3":
        from gateway.batches.blobs_s3 import S3BlobStore

        return await S3BlobStore.open(files)
    return LocalBlobStore(files.path or Path(settings.state.path).parent / "files")


def refuse_unshared_blobs(settings: Settings) -> None:
    """Raises ConfigError when replicas would share job records (a Redis state) but keep
    batch files on their own disks: a job claimed by another replica than the one its input
    was uploaded to would fail `file_not_found`, and outputs would answer 503 elsewhere."""
    files = settings.batches.files
    if settings.state.url == "memory" or not settings.batches.enabled:
        return
    if files.store == "s3" or files.shared:
        return
    raise ConfigError(
        "batches.files: batch files on this replica's local disk (store: local) while job "
        "records are shared in Redis (state.url): a job claimed by another replica would "
        "not find its input. Set batches.files.store: s3 with a bucket, or a folder every "
        "replica mounts as batches.files.path with batches.files.shared: true, or "
        "batches.enabled: false"
    )
