"""Batch jobs' settings (`batches` in the configuration; README "Batch jobs"). Part of the
one settings tree (`gateway.settings`, which re-exports every name here)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, StringConstraints, model_validator

from gateway.settings_types import S3Settings, Strict

_WINDOW = r"^[1-9][0-9]*[smh]$"  # a completion window: 24h, 90m, 30s


class BatchFiles(Strict):
    """Where batch files' bytes live (inputs, outputs, errors): a local folder, or S3."""

    store: Literal["local", "s3"] = "local"
    path: Path | None = None  # local: None is `files/` next to the state file
    # local: `path` is one folder every replica mounts (a shared volume). Replicas that
    # share a Redis state refuse to start with local files unless it is (blobs.py).
    shared: bool = False
    bucket: str | None = None  # s3: required
    prefix: str = "gateway-files/"  # s3: object keys are PREFIX + file id
    s3: S3Settings = S3Settings()

    @model_validator(mode="after")
    def _bucket_for_s3(self) -> BatchFiles:
        if self.store == "s3" and not self.bucket:
            raise ValueError("store: s3 needs bucket")
        if self.shared and (self.store != "local" or self.path is None):
            raise ValueError("shared: true needs store: local and path (the shared folder)")
        return self


class BatchSettings(Strict):
    """Batch jobs (`/v1/files`, `/v1/batches`), run inside the gateway (README "Batch jobs")."""

    enabled: bool = True
    max_file_bytes: int = Field(default=100 * 1024 * 1024, ge=1024)
    max_lines: int = Field(default=50_000, ge=1)
    concurrency: int = Field(default=4, ge=1)  # a job's lines in flight at once
    max_concurrency: int = Field(default=16, ge=1)  # lines in flight over all jobs
    max_jobs: int = Field(default=4, ge=1)  # jobs run at once (each holds its input in memory)
    # The windows `completion_window` may name (OpenAI knows 24h only), and their lengths.
    completion_windows: list[Annotated[str, StringConstraints(pattern=_WINDOW)]] = Field(
        default_factory=lambda: ["24h"], min_length=1
    )
    retry_base_s: float = Field(default=1.0, gt=0)  # a line refused for load (429, 503) ...
    retry_cap_s: float = Field(default=60.0, gt=0)  # ... retries after backoff up to this
    poll_s: float = Field(default=1.0, gt=0)  # how often jobs are looked for (other replicas')
    drain_s: float = Field(default=10.0, ge=0)  # at shutdown, lines in flight get this long
    lease_s: float = Field(default=30.0, gt=0)  # Redis: a replica's claim on a job
    # What one tenant's files may hold at once (inputs and the jobs' outputs, over every
    # replica), how many uploads it may send at once (per replica), how long one upload
    # may take in all (not per chunk), and how long a file is kept when its upload set no
    # `expires_after` (outputs too). README "Configuration reference", row `batches` (files'
    # limits).
    max_files_per_tenant: int = Field(default=1_000, ge=1)
    max_storage_bytes_per_tenant: int = Field(default=10 * 1024**3, ge=1024)  # 10 GiB
    max_concurrent_uploads: int = Field(default=2, ge=1)
    upload_timeout_s: float = Field(default=300.0, gt=0)
    file_ttl_s: int = Field(default=30 * 86400, ge=3600)  # OpenAI's longest: 30 days
    files: BatchFiles = BatchFiles()
