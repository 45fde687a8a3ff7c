"""The state store: what gateway replicas share. API keys (stored hashed), and tenants
created or changed through the admin API (JSON documents by tenant name; `{"deleted": true}`
hides a tenant of the configuration).

`FileStateStore` is the embedded default: state in memory, persisted to one JSON file
(written atomically) and re-read when another process (the CLI) changed it.
`RedisStateStore` (gateway/tenancy/state_redis.py) shares it between replicas.
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
from typing import Any, Protocol

import orjson

from gateway.private_files import owner_only, private_dir, write_private


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
    async def tenants_version(self) -> str: ...
    async def list_tenants(self) -> dict[str, dict[str, Any]]: ...
    async def put_tenant(self, name: str, doc: dict[str, Any]) -> None: ...
    async def drop_tenant(self, name: str) -> bool: ...
    async def ping(self) -> None: ...
    async def close(self) -> None: ...


@dataclass
class _Contents:
    keys: dict[str, KeyRecord]
    tenants: dict[str, dict[str, Any]]


class FileStateStore:
    """State in dicts, persisted to `path`; other processes' changes show within `recheck_s`."""

    def __init__(self, path: Path, recheck_s: float = 0.25) -> None:
        self._path = path
        self._recheck_s = recheck_s
        self._state = _Contents({}, {})
        # (inode, mtime, size): each write is a new file, so a change within one mtime tick shows.
        self._stamp: tuple[int, int, int] | None = None
        self._checked_at = 0.0
        private_dir(path.parent)
        self._reload()

    async def get_key(self, key_hash: str) -> KeyRecord | None:
        self._recheck()
        return self._state.keys.get(key_hash)

    async def put_key(self, key_hash: str, record: KeyRecord) -> None:
        await asyncio.to_thread(self._update, lambda s: s.keys.__setitem__(key_hash, record))

    async def list_keys(self) -> list[KeyRecord]:
        self._reload()
        return sorted(self._state.keys.values(), key=lambda r: r.created_at)

    async def revoke_key(self, key_id: str) -> bool:
        def drop(state: _Contents) -> None:
            for key_hash, record in list(state.keys.items()):
                if record.key_id == key_id:
                    del state.keys[key_hash]

        before = len(self._state.keys)
        await asyncio.to_thread(self._update, drop)
        return len(self._state.keys) < before

    async def tenants_version(self) -> str:
        self._recheck()
        return str(self._stamp)

    async def list_tenants(self) -> dict[str, dict[str, Any]]:
        self._recheck()
        return dict(self._state.tenants)

    async def put_tenant(self, name: str, doc: dict[str, Any]) -> None:
        await asyncio.to_thread(self._update, lambda s: s.tenants.__setitem__(name, doc))

    async def drop_tenant(self, name: str) -> bool:
        dropped: list[object] = []
        await asyncio.to_thread(self._update, lambda s: dropped.append(s.tenants.pop(name, None)))
        return dropped[0] is not None

    async def ping(self) -> None:
        if not self._path.parent.is_dir():
            raise StateStoreError(f"state folder {self._path.parent} is missing")

    async def close(self) -> None:
        return None

    def _recheck(self) -> None:
        now = time.monotonic()
        if now - self._checked_at >= self._recheck_s:
            self._checked_at = now
            self._reload()

    def _reload(self) -> None:
        try:
            info = self._path.stat()
        except FileNotFoundError:
            self._state, self._stamp = _Contents({}, {}), None
            return
        stamp = (info.st_ino, info.st_mtime_ns, info.st_size)
        if stamp != self._stamp:
            self._state, self._stamp = self._read(), stamp

    def _read(self) -> _Contents:
        try:
            data = orjson.loads(self._path.read_bytes())
        except (OSError, orjson.JSONDecodeError) as exc:
            raise StateStoreError(f"cannot read state file {self._path}: {exc}") from exc
        keys = {h: KeyRecord.from_json(orjson.dumps(r)) for h, r in data.get("keys", {}).items()}
        return _Contents(keys, dict(data.get("tenants", {})))

    def _update(self, change: Callable[[_Contents], object]) -> None:
        with self._locked():
            self._stamp = None
            self._reload()
            change(self._state)
            self._write()
            self._stamp = None
            self._reload()

    def _write(self) -> None:
        keys = {h: asdict(r) for h, r in self._state.keys.items()}
        body = {"keys": keys, "tenants": self._state.tenants}
        tmp = self._path.with_suffix(f".tmp.{os.getpid()}")
        write_private(tmp, orjson.dumps(body, option=orjson.OPT_INDENT_2))
        os.replace(tmp, self._path)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        private_dir(self._path.parent)
        with open(self._path.with_suffix(".lock"), "a", opener=owner_only) as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
