"""What the batch API keeps: files' records, jobs, and each line's recorded result; and the
OpenAI objects they are shown as (`File`, `Batch`, the output and error files' lines).

A job's status moves as OpenAI's do:

    validating -> in_progress -> finalizing -> completed
         |             |-> expired              (its completion window passed)
         |             `-> cancelled            (shown as `cancelling` until lines in flight end)
         `-> failed                             (the file no longer fits the batch)

The store writes a job whole; a cancellation is kept apart from it (`request_cancel`), so
that the API asking for one never races the runner moving the job on.
"""

from __future__ import annotations

import secrets
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict

Status = Literal[
    "validating",
    "failed",
    "in_progress",
    "finalizing",
    "completed",
    "expired",
    "cancelling",
    "cancelled",
]
STATUSES: tuple[str, ...] = get_args(Status)
TERMINAL: frozenset[str] = frozenset({"failed", "completed", "expired", "cancelled"})
CANCELLABLE: frozenset[str] = frozenset({"validating", "in_progress"})
Purpose = Literal["batch", "batch_output"]
Endpoint = Literal["/v1/chat/completions", "/v1/completions", "/v1/embeddings"]


def new_id(prefix: str) -> str:
    """`file-…`, `batch_…`, `batch_req_…`: OpenAI's shapes, 96 random bits."""
    return prefix + secrets.token_hex(12)


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class _Created(_Record):
    created_at: int  # whole seconds, as OpenAI shows it
    created: float = 0.0  # the same, precisely: orders things made within one second

    def order(self) -> tuple[int, float]:
        return self.created_at, self.created


class FileRecord(_Created):
    id: str
    tenant: str
    filename: str
    bytes: int
    purpose: Purpose
    lines: int = 0  # requests in it (an input file) or results (an output file)
    model: str | None = None  # an input file's, if all its lines name one
    expires_at: int | None = None  # None: `batches.file_ttl_s` after it was created


class LineError(_Record):
    """One entry of a failed batch's `errors` (OpenAI's `BatchError`)."""

    code: str
    message: str
    param: str | None = None
    line: int | None = None


class Counts(_Record):
    total: int
    completed: int = 0
    failed: int = 0


class Usage(_Record):
    input_tokens: int = 0
    output_tokens: int = 0

    def add(self, body: Any) -> Usage:
        usage = body.get("usage") if isinstance(body, dict) else None
        if not isinstance(usage, dict):
            return self
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        return Usage(
            input_tokens=self.input_tokens + (prompt if isinstance(prompt, int) else 0),
            output_tokens=self.output_tokens + (completion if isinstance(completion, int) else 0),
        )


class BatchJob(_Created):
    id: str
    tenant: str
    input_file_id: str
    endpoint: Endpoint
    completion_window: str
    expires_at: int
    total: int
    metadata: dict[str, str] | None = None
    model: str | None = None  # the model every line names, if they all name one
    status: Status = "validating"
    in_progress_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelled_at: int | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    errors: list[LineError] = []
    counts: Counts | None = None  # final, once the job is over (live ones: the store's)
    usage: Usage | None = None

    @property
    def over(self) -> bool:
        return self.status in TERMINAL


class LineResult(_Record):
    """A line's answer, recorded once: a line with one is never sent again."""

    index: int  # 0-based, in the input file
    id: str  # batch_req_…
    custom_id: str
    status_code: int
    request_id: str
    body: Any  # the answer's JSON (an error's too)

    @property
    def succeeded(self) -> bool:
        return 200 <= self.status_code < 300


def file_object(record: FileRecord) -> dict[str, Any]:
    return {
        "id": record.id,
        "object": "file",
        "bytes": record.bytes,
        "created_at": record.created_at,
        "filename": record.filename,
        "purpose": record.purpose,
        "status": "processed",
        "expires_at": record.expires_at,
        "status_details": None,
    }


def batch_object(job: BatchJob, live: Counts | None, cancel_at: int | None) -> dict[str, Any]:
    """OpenAI's `Batch`; `live` counts while it runs, `cancel_at` if a cancel was asked."""
    status = "cancelling" if cancel_at is not None and job.status in CANCELLABLE else job.status
    counts = job.counts or live or Counts(total=job.total)
    hidden = {"tenant", "total", "created", "counts", "usage", "errors"}
    fields = job.model_dump(exclude={*hidden, "output_file_id", "error_file_id"})
    return {
        **fields,
        "object": "batch",
        "status": status,
        "cancelling_at": cancel_at if status in ("cancelling", "cancelled") else None,
        "request_counts": counts.model_dump(),
        "errors": _errors(job.errors),
        # Shown once written: a job that is still running has no files yet.
        "output_file_id": job.output_file_id if job.over else None,
        "error_file_id": job.error_file_id if job.over else None,
        "usage": _usage(job.usage),
    }


def output_line(result: LineResult) -> dict[str, Any]:
    response = {
        "status_code": result.status_code,
        "request_id": result.request_id,
        "body": result.body,
    }
    return {"id": result.id, "custom_id": result.custom_id, "response": response, "error": None}


def unrun_line(custom_id: str, code: str, message: str) -> dict[str, Any]:
    """A line the job ended without running (expired, cancelled): the error file says so."""
    error = {"code": code, "message": message}
    return {"id": new_id("batch_req_"), "custom_id": custom_id, "response": None, "error": error}


def _errors(errors: list[LineError]) -> dict[str, Any] | None:
    if not errors:
        return None
    return {"object": "list", "data": [e.model_dump() for e in errors]}


def _usage(usage: Usage | None) -> dict[str, Any] | None:
    if usage is None:
        return None
    return {
        "input_tokens": usage.input_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": usage.output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.input_tokens + usage.output_tokens,
    }
