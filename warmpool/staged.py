"""What staging produces: the local folder, what each file was checked against, and timings.

The same record, as JSON, is the `.complete` marker of a published model folder.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Throughput:
    bytes: int
    seconds: float

    @property
    def mb_per_s(self) -> float:
        """Decimal megabytes (10**6 bytes) per second; 0 when nothing was timed."""
        return self.bytes / self.seconds / 1e6 if self.seconds > 0 else 0.0

    def __str__(self) -> str:
        return f"{self.bytes / 1e6:.1f} MB in {self.seconds:.2f} s ({self.mb_per_s:.1f} MB/s)"


@dataclass(frozen=True)
class StagedFile:
    name: str  # relative path inside the model folder
    size: int
    etag: str
    sha256: str | None  # from the manifest, when there is one
    verified_by: str  # "sha256", "etag-md5" or "size" (see warmpool.verify)


@dataclass(frozen=True)
class StagedModel:
    model: str
    uri: str
    path: Path
    files: tuple[StagedFile, ...]
    from_cache: bool  # already staged: nothing was fetched
    resumed_bytes: int = 0  # bytes kept from an interrupted staging
    download: Throughput | None = None  # bytes fetched by this call, verification included
    readahead: Throughput | None = None

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def marker(self, staged_at: float) -> dict[str, Any]:
        return {
            "model": self.model,
            "uri": self.uri,
            "staged_at": staged_at,
            "files": [vars(f) for f in self.files],
        }

    @classmethod
    def from_marker(cls, data: Any, path: Path) -> StagedModel:
        """Raises TypeError, KeyError or ValueError when `data` is not a marker."""
        files = tuple(StagedFile(**f) for f in data["files"])
        return cls(str(data["model"]), str(data["uri"]), path, files, from_cache=True)
