"""Entry serialisation, shared by the stores.

An entry becomes four byte fields: `meta` (orjson: the scalar fields), `vector` (raw
float32), `features` and `response` (as given). Redis stores them as hash fields; the local
snapshot file frames them with lengths:

    b"GWCACHE1" | u32 dim | records... | b"END." | u32 count | u32 crc32(everything before)

    record = u32 len | meta (with "hits" and "last_hit") | u32 len | vector | u32 len |
             features | u32 len | response

The file is written to a temporary name, fsynced and renamed over the old one, so a reader
sees the old file or the new one; the trailing CRC rejects anything else.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import orjson

from cache.entry import CacheEntry

_MAGIC = b"GWCACHE1"
_END = b"END."
_U32 = struct.Struct("<I")
_FIELDS = ("meta", "vector", "features", "response")
_BUFFER = 1 << 20  # bytes a snapshot writes or reads at once (the GIL is released meanwhile)


@dataclass(frozen=True)
class StoredEntry:
    entry: CacheEntry
    last_hit: float  # 0 if never hit
    hits: int


class CorruptSnapshot(ValueError):
    """The snapshot file is truncated, corrupt, or for another vector dimension."""


def entry_fields(entry: CacheEntry, **extra: object) -> dict[str, bytes]:
    meta = {
        "entry_id": entry.entry_id,
        "namespace": entry.namespace,
        "prompt": entry.prompt,
        "exact_key": entry.exact_key,
        "normalized_key": entry.normalized_key,
        "model": entry.model,
        "tenant": entry.tenant,
        "created_at": entry.created_at,
        "ttl_s": entry.ttl_s,
        **extra,
    }
    return {
        "meta": orjson.dumps(meta),
        "vector": np.ascontiguousarray(entry.vector, dtype=np.float32).tobytes(),
        "features": entry.features,
        "response": entry.response,
    }


def entry_from_fields(fields: Mapping[bytes, bytes] | Mapping[str, bytes]) -> CacheEntry:
    """Inverse of `entry_fields`; keys may be str or bytes (as Redis returns them)."""
    by_name = {k.decode() if isinstance(k, bytes) else k: v for k, v in fields.items()}
    meta = orjson.loads(by_name["meta"])
    return CacheEntry(
        entry_id=str(meta["entry_id"]),
        namespace=str(meta["namespace"]),
        prompt=str(meta["prompt"]),
        exact_key=str(meta["exact_key"]),
        normalized_key=str(meta["normalized_key"]),
        vector=np.frombuffer(by_name["vector"], dtype=np.float32),
        features=bytes(by_name["features"]),
        response=bytes(by_name["response"]),
        model=str(meta["model"]),
        tenant=str(meta["tenant"]),
        created_at=float(meta["created_at"]),
        ttl_s=float(meta["ttl_s"]),
    )


def write_snapshot(path: Path, dim: int, stored: Iterable[StoredEntry]) -> None:
    """Atomically replace `path` with a snapshot of `stored`, framed and written one entry
    at a time. The whole file was once built in memory first: at 100k entries with the
    verifier's features (1.1 GB) the write took ~10 s and 2.8 GB more memory, and the
    joining held the GIL, and so the event loop, for up to 3 s (bench/snapshot_write.py)."""
    with _replacing(path) as out:
        head = _MAGIC + _U32.pack(dim)
        crc = zlib.crc32(head)
        out.write(head)
        count = 0
        for item in stored:
            fields = entry_fields(item.entry, hits=item.hits, last_hit=item.last_hit)
            record = b"".join(
                part for name in _FIELDS for part in (_U32.pack(len(fields[name])), fields[name])
            )
            crc = zlib.crc32(record, crc)
            out.write(record)
            count += 1
        tail = _END + _U32.pack(count)
        out.write(tail + _U32.pack(zlib.crc32(tail, crc)))


# The error-bounded mode's evidence, per namespace: {namespace: [evidence JSON, expires_at]}
# in one small orjson file beside the snapshot (a few KB per namespace that uses it).
Evidence = dict[str, tuple[bytes, float]]


def write_evidence(path: Path, evidence: Evidence) -> None:
    """Atomically replace `path` with `evidence`."""
    rows = {ns: [data.decode(), expires_at] for ns, (data, expires_at) in evidence.items()}
    _replace(path, orjson.dumps(rows))


def read_evidence(path: Path) -> Evidence:
    """The evidence written to `path`; {} if there is none. Raises CorruptSnapshot."""
    try:
        rows = orjson.loads(path.read_bytes())
        return {ns: (data.encode(), float(expires_at)) for ns, (data, expires_at) in rows.items()}
    except FileNotFoundError:
        return {}
    except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError) as exc:
        raise CorruptSnapshot(f"{path}: corrupt evidence: {exc}") from exc


def _replace(path: Path, data: bytes) -> None:
    with _replacing(path) as out:
        out.write(data)


def _owner_only(path: str, flags: int) -> int:
    return os.open(path, flags, 0o600)


@contextmanager
def _replacing(path: Path) -> Iterator[BinaryIO]:
    """A file to write that replaces `path` once complete: written to a temporary name,
    fsynced and renamed, so a reader sees the old file or the new one; on an error the
    temporary file is removed and `path` left as it was."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)  # a leftover would keep its mode
    try:
        # Cached prompts and answers of every tenant: the gateway's user's alone.
        with open(tmp, "wb", buffering=_BUFFER, opener=_owner_only) as out:
            yield out
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_snapshot(path: Path, dim: int) -> list[StoredEntry]:
    """The entries of a snapshot; [] if there is none. Raises CorruptSnapshot.

    Read twice as a stream, to check it and then to parse it: only the entries are held.
    Read whole and sliced, a 1.1 GB file (100k entries) took two copies of itself beside
    the entries while it loaded (bench/snapshot_write.py)."""
    try:
        with open(path, "rb", buffering=_BUFFER) as file:
            count, end = _checked(file, dim, path)
            stored = list(_records(file, end, path))
    except FileNotFoundError:
        return []
    if len(stored) != count:
        raise CorruptSnapshot(f"{path}: record count mismatch")
    return stored


def _checked(file: BinaryIO, dim: int, path: Path) -> tuple[int, int]:
    """The record count of a framed file whose CRC holds and whose vectors are `dim`
    long, and where its records end; raises CorruptSnapshot for any other."""
    size = os.fstat(file.fileno()).st_size
    corrupt = CorruptSnapshot(f"{path}: truncated or corrupt")
    if size < 24:
        raise corrupt
    head = file.read(len(_MAGIC) + 4)
    crc, left = zlib.crc32(head), size - 4 - len(head)
    while left > 0:
        chunk = file.read(min(left, _BUFFER))
        if not chunk:
            raise corrupt
        crc, left = zlib.crc32(chunk, crc), left - len(chunk)
    file.seek(size - len(_END) - 8)
    tail = file.read(len(_END) + 8)
    if head[: len(_MAGIC)] != _MAGIC or tail[: len(_END)] != _END or _U32.pack(crc) != tail[-4:]:
        raise corrupt
    if _U32.unpack_from(head, len(_MAGIC))[0] != dim:
        raise CorruptSnapshot(f"{path}: written for another vector dimension")
    return int(_U32.unpack_from(tail, len(_END))[0]), size - len(tail)


def _records(file: BinaryIO, end: int, path: Path) -> Iterator[StoredEntry]:
    """The records of a checked file, from just after its header to `end`."""
    offset = file.seek(len(_MAGIC) + 4)
    while offset < end:
        fields: dict[str, bytes] = {}
        for name in _FIELDS:
            (size,) = _U32.unpack(_exactly(file, 4, path))
            fields[name] = _exactly(file, size, path)
            offset += 4 + size
        meta = orjson.loads(fields["meta"])
        yield StoredEntry(entry_from_fields(fields), float(meta["last_hit"]), int(meta["hits"]))
    if offset != end:
        raise CorruptSnapshot(f"{path}: a record runs past the end")


def _exactly(file: BinaryIO, size: int, path: Path) -> bytes:
    data = file.read(size)
    if len(data) != size:
        raise CorruptSnapshot(f"{path}: a record runs past the end")
    return data
