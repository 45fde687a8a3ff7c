"""The state store: what gateway replicas share. Here, API keys (stored hashed).

`FileStateStore` is the embedded default: state in memory, persisted to one JSON file
(written atomically) and re-read when another process (the CLI) changed it.
`RedisStateStore` (gateway/state_redis.py) shares it between replicas.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

import orjson


@dataclass(frozen=True)
class KeyRecord:
    key_id: str
    tenant: str
    created_at: float

    def to_json(self) -> bytes:
        return orjson.dumps(asdict(self))

    @staticmethod
    def from_json(data: bytes | str) -> KeyRecord:
        fields = orjson.loads(data)
        return KeyRecord(str(fields["key_id"]), str(fields["tenant"]), float(fields["created_at"]))


class StateStoreError(Exception):
    """The state store cannot be reached or answered nonsense."""


class StateStore(Protocol):
    async def get_key(self, key_hash: str) -> KeyRecord | None: ...
    async def put_key(self, key_hash: str, record: KeyRecord) -> None: ...
    async def list_keys(self) -> list[KeyRecord]: ...
    async def revoke_key(self, key_id: str) -> bool: ...
    async def ping(self) -> None: ...
    async def close(self) -> None: ...


class FileStateStore:
    """Keys in a dict, persisted to `path`; other processes' changes show within `recheck_s`."""

    def __init__(self, path: Path, recheck_s: float = 0.25) -> None:
        self._path = path
        self._recheck_s = recheck_s
        self._keys: dict[str, KeyRecord] = {}
        self._mtime_ns = -1
        self._checked_at = 0.0
        path.parent.mkdir(parents=True, exist_ok=True)
        self._reload()

    async def get_key(self, key_hash: str) -> KeyRecord | None:
        now = time.monotonic()
        if now - self._checked_at >= self._recheck_s:
            self._checked_at = now
            self._reload()
        return self._keys.get(key_hash)

    async def put_key(self, key_hash: str, record: KeyRecord) -> None:
        await asyncio.to_thread(self._update, lambda keys: keys.__setitem__(key_hash, record))

    async def list_keys(self) -> list[KeyRecord]:
        self._reload()
        return sorted(self._keys.values(), key=lambda r: r.created_at)

    async def revoke_key(self, key_id: str) -> bool:
        def drop(keys: dict[str, KeyRecord]) -> None:
            for key_hash, record in list(keys.items()):
                if record.key_id == key_id:
                    del keys[key_hash]

        before = len(self._keys)
        await asyncio.to_thread(self._update, drop)
        return len(self._keys) < before

    async def ping(self) -> None:
        if not self._path.parent.is_dir():
            raise StateStoreError(f"state folder {self._path.parent} is missing")

    async def close(self) -> None:
        return None

    def _reload(self) -> None:
        try:
            mtime_ns = self._path.stat().st_mtime_ns
        except FileNotFoundError:
            self._keys, self._mtime_ns = {}, -1
            return
        if mtime_ns != self._mtime_ns:
            self._keys, self._mtime_ns = self._read(), mtime_ns

    def _read(self) -> dict[str, KeyRecord]:
        try:
            data = orjson.loads(self._path.read_bytes())
        except (OSError, orjson.JSONDecodeError) as exc:
            raise StateStoreError(f"cannot read state file {self._path}: {exc}") from exc
        return {h: KeyRecord.from_json(orjson.dumps(r)) for h, r in data.get("keys", {}).items()}

    def _update(self, change: Callable[[dict[str, KeyRecord]], None]) -> None:
        with self._locked():
            self._mtime_ns = -1
            self._reload()
            change(self._keys)
            self._write()
            self._mtime_ns = -1
            self._reload()

    def _write(self) -> None:
        body = {"keys": {h: asdict(r) for h, r in self._keys.items()}}
        tmp = self._path.with_suffix(f".tmp.{os.getpid()}")
        tmp.write_bytes(orjson.dumps(body, option=orjson.OPT_INDENT_2))
        os.chmod(tmp, 0o600)
        os.replace(tmp, self._path)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        with open(self._path.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
