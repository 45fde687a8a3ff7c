"""Where staged weights live on disk, and the blocking file operations that move them.

    cache_dir/
      <safe-name>/                    a published model: its files, then `.complete`
        .complete                     written last (JSON: model, uri, files); is_staged needs
                                      it; its mtime is the last use (LRU order survives restarts)
      .partial/<safe-name>/           one staging in progress, or interrupted (kept to resume)
        state.json                    the model's name and the files already verified
        parts/<file>.part             bytes as they arrive (sparse, chunks written in place)
        parts/<file>.part.json        which chunks of that file are on disk (fsync'd)
        files/<file>                  verified files; this folder is renamed to <safe-name>/
      .trash/                         folders being deleted (renamed here first, so a
                                      half-deleted model is never seen under its name)

Only one stager may own a cache folder. Everything here blocks: call it through the pool.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

MARKER = ".complete"
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,79}-[0-9a-f]{12}")


def safe_name(model: str) -> str:
    """A folder name for a model: readable, and distinct for "org/m" and "org_m"."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "_", model).strip("._-")[:80] or "model"
    return f"{cleaned}-{hashlib.sha256(model.encode()).hexdigest()[:12]}"


def is_safe_name(name: str) -> bool:
    """Could `safe_name` have made this folder name? Only those folders are ever deleted."""
    return _SAFE_NAME.fullmatch(name) is not None


@dataclass(frozen=True)
class CacheLayout:
    root: Path

    @property
    def partial_root(self) -> Path:
        return self.root / ".partial"

    @property
    def trash(self) -> Path:
        return self.root / ".trash"

    def published(self, model: str) -> Path:
        return self.root / safe_name(model)

    def marker(self, model: str) -> Path:
        return self.published(model) / MARKER

    def partial(self, model: str) -> Path:
        return self.partial_root / safe_name(model)

    def state(self, model: str) -> Path:
        return self.partial(model) / "state.json"

    def part(self, model: str, name: str) -> Path:
        return self.partial(model) / "parts" / (name + ".part")

    def sidecar(self, model: str, name: str) -> Path:
        return self.partial(model) / "parts" / (name + ".part.json")

    def ready(self, model: str, name: str) -> Path:
        return self.partial(model) / "files" / name

    def create(self) -> None:
        for folder in (self.root, self.partial_root, self.trash):
            folder.mkdir(parents=True, exist_ok=True)
        for leftover in self.trash.iterdir():  # deletions a crash interrupted
            shutil.rmtree(leftover, ignore_errors=True)


def write_json_atomic(path: Path, data: Any) -> None:
    """Readers see the old content or the new one, never a torn write, also after power loss."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, orjson.dumps(data))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def read_json(path: Path) -> Any:
    """The parsed content, or None when the file is missing or not JSON (a crash mid-write)."""
    try:
        return orjson.loads(path.read_bytes())
    except (FileNotFoundError, orjson.JSONDecodeError):
        return None


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def discard(path: Path, trash: Path) -> None:
    """Remove a folder: renamed away first (atomic), then deleted."""
    target = trash / f"{path.name}.{uuid.uuid4().hex[:8]}"
    try:
        os.replace(path, target)
    except FileNotFoundError:
        return
    shutil.rmtree(target, ignore_errors=True)


def publish(layout: CacheLayout, model: str, marker: dict[str, Any]) -> Path:
    """Rename the verified files' folder into place, then write `.complete` last."""
    files, final = layout.partial(model) / "files", layout.published(model)
    files.mkdir(parents=True, exist_ok=True)  # a model of zero files is still a model
    for folder, _, _ in os.walk(files):
        fsync_dir(Path(folder))  # the renames of verified files must outlive a crash
    discard(final, layout.trash)  # a folder without marker: an earlier crash mid-publish
    os.replace(files, final)
    fsync_dir(layout.root)
    write_json_atomic(final / MARKER, marker)
    fsync_dir(final)
    discard(layout.partial(model), layout.trash)
    return final


def allocated_bytes(path: Path) -> int:
    """Disk blocks in use under `path` (part files are sparse: only written chunks count)."""
    total = 0
    for folder, _, names in os.walk(path):
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                total += os.stat(os.path.join(folder, name)).st_blocks * 512
    return total
