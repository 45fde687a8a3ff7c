"""A job's end: its output and error files written from the recorded results, then the
job's final state, then the results forgotten.

    output file   one line per line that answered 2xx, in input order (OpenAI's output format)
    error file    one per line that answered otherwise, and one per line the job ended
                  without running (`batch_expired`, `batch_cancelled`; `response: null`)

Each step can run again: a crash before the final state leaves the job `finalizing` (or
still running, for a cancelled or expired one), and the next run writes the same files
under the same ids (reserved when the job was created) before anything says they exist.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from gateway.batches.blobs import BlobStore
from gateway.batches.execution import Ending
from gateway.batches.lines import InputLine
from gateway.batches.models import (
    BatchJob,
    Counts,
    FileRecord,
    LineError,
    LineResult,
    Usage,
    output_line,
    unrun_line,
)
from gateway.batches.store import BatchStore

_UNRUN = {
    "expired": (
        "batch_expired",
        "This request could not be executed before the completion window expired.",
    ),
    "cancelled": (
        "batch_cancelled",
        "This request was not executed because the batch was cancelled.",
    ),
}


class Finisher:
    def __init__(self, store: BatchStore, blobs: BlobStore, clock: Callable[[], float]) -> None:
        self._store = store
        self._blobs = blobs
        self._clock = clock

    async def finish(self, job: BatchJob, lines: list[InputLine], ending: Ending) -> BatchJob:
        assert ending != "lost"  # another replica holds the job: it finishes it
        now = int(self._clock())
        if ending == "completed" and job.status != "finalizing":
            job = job.model_copy(update={"status": "finalizing", "finalizing_at": now})
            await self._store.put_job(job)
        results = {r.index: r for r in await self._store.results(job.id)}
        output, errors = _split(lines, results, ending)
        succeeded = [r for r in results.values() if r.succeeded]
        usage = Usage()
        for result in succeeded:
            usage = usage.add(result.body)
        update: dict[str, Any] = {
            "status": ending,
            f"{ending}_at": now,
            "output_file_id": await self._write(job, job.output_file_id, "output", output),
            "error_file_id": await self._write(job, job.error_file_id, "error", errors),
            "counts": Counts(
                total=len(lines),
                completed=len(succeeded),
                failed=len(results) - len(succeeded),
            ),
            "usage": usage,
        }
        done = job.model_copy(update=update)
        await self._store.put_job(done)
        await self._store.forget_results(job.id)
        return done

    async def fail(self, job: BatchJob, errors: list[LineError]) -> BatchJob:
        """The job cannot run at all (its file does not fit it): `failed`, with `errors`."""
        update = {"status": "failed", "failed_at": int(self._clock()), "errors": errors}
        failed = job.model_copy(update=update)
        await self._store.put_job(failed)
        return failed

    async def _write(
        self, job: BatchJob, file_id: str | None, kind: str, rows: list[dict[str, Any]]
    ) -> str | None:
        if file_id is None or not rows:
            return None
        data = b"".join(orjson.dumps(row) + b"\n" for row in rows)
        await self._blobs.put(file_id, data)
        now = self._clock()
        record = FileRecord(
            id=file_id,
            tenant=job.tenant,
            filename=f"{job.id}_{kind}.jsonl",
            bytes=len(data),
            created_at=int(now),
            created=now,
            purpose="batch_output",
            lines=len(rows),
        )
        await self._store.put_file(record)
        return file_id


def _split(
    lines: list[InputLine], results: dict[int, LineResult], ending: Ending
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    output: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    code, message = _UNRUN.get(ending, ("batch_not_run", "This request was not executed."))
    for line in lines:
        result = results.get(line.index)
        if result is None:
            errors.append(unrun_line(line.custom_id, code, message))
        else:
            (output if result.succeeded else errors).append(output_line(result))
    return output, errors
