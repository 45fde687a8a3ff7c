"""How each downloaded file is checked before it may be used.

In order of preference:

- `sha256`: the prefix holds a `manifest.json`, `{"files": {"name": {"size": N, "sha256": HEX}}}`,
  that lists the file. Every file the manifest lists must exist with that size, or staging
  fails before downloading anything. Objects the manifest does not list fall through to:
- `etag-md5`: the object's ETag is a plain MD5 (32 hex digits), which S3 gives single-part
  uploads without SSE-KMS/SSE-C encryption. Turn it off (`verify_etag=False`) for stores
  whose ETags are not content MD5s (SSE-KMS, some S3-compatible servers), or their files
  would fail verification.
- `size`: multipart ETags (`<hex>-<parts>`) are an MD5 of the parts' MD5s, which depends on
  the part size used at upload; unknown here, so only the size is checked. Upload a manifest
  to get a real checksum for such files.

The size is always checked. A file that fails is deleted and downloaded once more.

The digest is computed over the part file's own bytes, read back in order as each stretch
of chunks from the start is on disk (`warmpool.partfile`), so that hashing overlaps the
download instead of following it; what is hashed is what the file holds, as before.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

import orjson

from warmpool.errors import IntegrityError, InvalidWeightLayout
from warmpool.source import RemoteObject

MANIFEST = "manifest.json"
RESERVED_NAMES = frozenset({".complete"})
_MD5 = re.compile(r"^[0-9a-f]{32}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class ManifestEntry:
    size: int
    sha256: str


@dataclass(frozen=True)
class FileSpec:
    """One file to stage, and what it must match."""

    remote: RemoteObject
    verified_by: str  # "sha256", "etag-md5" or "size"
    sha256: str | None = None

    @property
    def name(self) -> str:
        return self.remote.name

    @property
    def size(self) -> int:
        return self.remote.size


def parse_manifest(raw: bytes) -> dict[str, ManifestEntry]:
    try:
        files = orjson.loads(raw)["files"]
        entries = {
            str(name): ManifestEntry(int(e["size"]), str(e["sha256"]).lower())
            for name, e in files.items()
        }
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise IntegrityError(f"{MANIFEST} is not valid: {type(exc).__name__}: {exc}") from exc
    bad = [name for name, e in entries.items() if not _SHA256.match(e.sha256) or e.size < 0]
    if bad:
        raise IntegrityError(f"{MANIFEST} has a bad size or sha256 for {sorted(bad)[:5]}")
    return entries


def plan_files(
    objects: Iterable[RemoteObject],
    manifest: dict[str, ManifestEntry] | None,
    verify_etag: bool = True,
) -> list[FileSpec]:
    objects = list(objects)
    check_names([o.name for o in objects])
    listed = {o.name for o in objects}
    missing = sorted(set(manifest or {}) - listed)
    if missing:
        raise IntegrityError(f"{MANIFEST} lists files that are not in the bucket: {missing[:5]}")
    return [_spec(o, (manifest or {}).get(o.name), verify_etag) for o in objects]


def _spec(obj: RemoteObject, entry: ManifestEntry | None, verify_etag: bool) -> FileSpec:
    if entry is not None:
        if entry.size != obj.size:
            raise IntegrityError(
                f"{obj.name}: {MANIFEST} says {entry.size} bytes, the object has {obj.size}"
            )
        return FileSpec(obj, "sha256", entry.sha256)
    if verify_etag and _MD5.match(obj.etag):
        return FileSpec(obj, "etag-md5")
    return FileSpec(obj, "size")


def check_names(names: list[str]) -> None:
    """Each name must be a relative path that stays inside the model folder."""
    paths = set()
    for name in names:
        path = PurePosixPath(name)
        parts = name.split("/")
        if any(p in ("", ".", "..") for p in parts) or "\\" in name or "\0" in name:
            raise InvalidWeightLayout(f"object name {name!r} cannot be a local file name")
        if name in RESERVED_NAMES:
            raise InvalidWeightLayout(f"object name {name!r} is reserved by the stager")
        paths.add(path)
    # S3 allows both "a" and "a/b"; a folder cannot be both a file and a directory.
    clashes = sorted(str(p) for p in paths if any(parent in paths for parent in p.parents))
    if clashes:
        raise InvalidWeightLayout(f"object names nest inside other objects: {clashes[:5]}")


def new_digest(spec: FileSpec) -> Any:
    """A hashlib object for the file's checksum, or None when only the size is checked."""
    if spec.verified_by == "sha256":
        return hashlib.sha256()
    if spec.verified_by == "etag-md5":
        return _md5()
    return None


def check_digest(spec: FileSpec, size: int, digest: Any) -> str | None:
    """Why a file of `size` bytes whose checksum is `digest` does not match `spec`, or None."""
    if size != spec.size:
        return f"{spec.name}: {size} bytes on disk, expected {spec.size}"
    if digest is None:
        return None
    expected = spec.sha256 if spec.verified_by == "sha256" else spec.remote.etag
    actual = digest.hexdigest()
    if actual != expected:
        return f"{spec.name}: {spec.verified_by} is {actual}, expected {expected}"
    return None


def _md5() -> Any:
    return hashlib.md5(usedforsecurity=False)
