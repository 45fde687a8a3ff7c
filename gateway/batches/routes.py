"""The HTTP side of the Files and Batch APIs: authenticate the tenant, read the request
(a multipart upload, a JSON body, a page's query), call the operation, answer OpenAI's
JSON; errors in OpenAI's shape (the gateway's error tree, gateway/errors.py), with the
stores' errors translated where they enter. Every answer writes one access-log line.

    POST   /v1/files                     upload a batch input file (multipart: file, purpose)
    GET    /v1/files                     the tenant's files (purpose, limit, after, order)
    GET    /v1/files/{file_id}           one file's record
    GET    /v1/files/{file_id}/content   its bytes (inputs, outputs, errors)
    DELETE /v1/files/{file_id}
    POST   /v1/batches                   create a job
    GET    /v1/batches                   the tenant's jobs, newest first (limit, after)
    GET    /v1/batches/{batch_id}
    POST   /v1/batches/{batch_id}/cancel

These routes go through Starlette's router, never the hot path of the online requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import orjson
from starlette.datastructures import FormData, UploadFile
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Message

from gateway.accesslog import AccessLog
from gateway.batches.errors import BatchStoreError, BlobStoreError, TooManyUploads
from gateway.batches.files import Files
from gateway.batches.jobs import Jobs
from gateway.batches.models import file_object
from gateway.errors import (
    BadRequest,
    BodyTooLarge,
    GatewayError,
    RequestTimeout,
    StateUnavailable,
    as_error,
    request_id,
)
from gateway.tenancy.auth import Authenticator
from gateway.tenancy.tenants import Catalog

Handler = Callable[["BatchApi", Request, str], Awaitable[Response]]
ENVELOPE = 64 * 1024  # a multipart body's own bytes around the file: headers, boundaries
MAX_JSON = 1024 * 1024  # a batch's creation body
MIN_EXPIRY_S, MAX_EXPIRY_S = 3600, 30 * 86400  # OpenAI's bounds on `expires_after`


class BatchApi:
    def __init__(
        self,
        auth: Authenticator,
        catalog: Catalog,
        files: Files,
        jobs: Jobs,
        access: AccessLog,
        max_file_bytes: int,
        body_timeout_s: float,
    ) -> None:
        self._auth = auth
        self._catalog = catalog
        self.files = files
        self.jobs = jobs
        self._access = access
        self._max_file = max_file_bytes
        self._timeout_s = body_timeout_s
        self._uploads: Counter[str] = Counter()  # uploads in progress here, by tenant

    async def handle(self, request: Request, handler: Handler) -> Response:
        rid, started, tenant = request_id(request.headers), time.perf_counter(), None
        try:
            principal = await self._auth.authenticate(request.headers.get("authorization"))
            found = self._catalog.tenant(principal.tenant)
            tenant = found.name
            # Files and jobs are the owner's, not the name's (`Tenant.owner`).
            response = await handler(self, request, found.owner)
        except Exception as exc:
            error = _as_error(exc, rid)
            self._log(request, rid, tenant, started, error.status, error.code or error.type)
            return error.to_response(rid)
        response.headers["x-request-id"] = rid
        self._log(request, rid, tenant, started, response.status_code, None)
        return response

    # --- files ----------------------------------------------------------------------

    async def create_file(self, request: Request, tenant: str) -> Response:
        with self._one_upload(tenant):
            form = await self._form(request)
            try:
                purpose, expires_after_s = form.get("purpose"), _expires_after(form)
                if purpose != "batch":
                    raise BadRequest(
                        f"purpose must be 'batch' (the gateway keeps files for batches "
                        f"only); got {purpose!r}.",
                        param="purpose",
                    )
                upload = form.get("file")
                if not isinstance(upload, UploadFile):
                    raise BadRequest("The upload has no file part named 'file'.", param="file")
                if (upload.size or 0) > self._max_file:
                    raise BodyTooLarge(f"The file exceeds {self._max_file} bytes.", param="file")
                name = upload.filename or "batch.jsonl"
                record = await self.files.upload(tenant, name, upload.file, expires_after_s)
            finally:
                await form.close()
        return _json(file_object(record))

    async def list_files(self, request: Request, tenant: str) -> Response:
        query = request.query_params
        files = await self.files.listing(tenant, query.get("purpose"))
        if query.get("order", "desc") == "asc":
            files.reverse()
        limit = _limit(query.get("limit"), 10_000, 10_000)
        shown = _window([f.id for f in files], limit, query.get("after"))
        return _json(_listing([file_object(f) for f in files[shown]], shown.stop < len(files)))

    async def get_file(self, request: Request, tenant: str) -> Response:
        return _json(file_object(await self.files.own(tenant, _param(request, "file_id"))))

    async def file_content(self, request: Request, tenant: str) -> Response:
        data = await self.files.content(tenant, _param(request, "file_id"))
        return Response(data, media_type="application/octet-stream")

    async def delete_file(self, request: Request, tenant: str) -> Response:
        file_id = _param(request, "file_id")
        await self.files.delete(tenant, file_id)
        return _json({"id": file_id, "object": "file", "deleted": True})

    # --- batches --------------------------------------------------------------------

    async def create_batch(self, request: Request, tenant: str) -> Response:
        raw = await _read(request, MAX_JSON, self._timeout_s)
        return _json(await self.jobs.create(tenant, raw))

    async def list_batches(self, request: Request, tenant: str) -> Response:
        query = request.query_params
        jobs = await self.jobs.listing(tenant)
        limit = _limit(query.get("limit"), 20, 100)
        shown = _window([job.id for job in jobs], limit, query.get("after"))
        data = [await self.jobs.view(job) for job in jobs[shown]]
        return _json(_listing(data, shown.stop < len(jobs)))

    async def get_batch(self, request: Request, tenant: str) -> Response:
        return _json(await self.jobs.get(tenant, _param(request, "batch_id")))

    async def cancel_batch(self, request: Request, tenant: str) -> Response:
        return _json(await self.jobs.cancel(tenant, _param(request, "batch_id")))

    # --- helpers --------------------------------------------------------------------

    @contextlib.contextmanager
    def _one_upload(self, tenant: str) -> Iterator[None]:
        """One of the tenant's uploads at once here (at most `max_concurrent_uploads`):
        each may hold a file of up to `max_file_bytes` while it is read and checked."""
        most = self.files.settings.max_concurrent_uploads
        if self._uploads[tenant] >= most:
            raise TooManyUploads(
                f"You have {most} uploads in progress, the most at once; try again when "
                "one is done.",
                retry_after=1,
            )
        self._uploads[tenant] += 1
        try:
            yield
        finally:
            self._uploads[tenant] -= 1
            if not self._uploads[tenant]:
                del self._uploads[tenant]

    async def _form(self, request: Request) -> FormData:
        """The upload's form, the body read within the size limit and `upload_timeout_s`
        in all (a trickle cannot hold it open), the file spooled to disk past 1 MiB."""
        limit = self._max_file + ENVELOPE
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise BodyTooLarge(f"The file exceeds {self._max_file} bytes.", param="file")
        if not request.headers.get("content-type", "").startswith("multipart/form-data"):
            raise BadRequest("Upload the file as multipart/form-data.", param="file")
        bounded = Request(request.scope, _bounded(request, limit, self._timeout_s))
        deadline_s = self.files.settings.upload_timeout_s
        try:
            async with asyncio.timeout(deadline_s):
                return await bounded.form(max_files=1, max_fields=8)
        except TimeoutError as exc:
            raise RequestTimeout(
                f"The upload took longer than {deadline_s:g} s.", headers={"connection": "close"}
            ) from exc
        except (HTTPException, MultiPartException) as exc:
            detail = exc.detail if isinstance(exc, HTTPException) else exc.message
            raise BadRequest(f"The multipart body cannot be read: {detail}", param="file") from exc

    def _log(
        self,
        request: Request,
        rid: str,
        tenant: str | None,
        started: float,
        status: int,
        error: str | None,
    ) -> None:
        seconds = time.perf_counter() - started
        path = request.url.path
        self._access.write(rid, request.method, path, tenant, None, status, seconds, error)


ROUTES: list[tuple[str, str, Handler]] = [
    ("/v1/files", "POST", BatchApi.create_file),
    ("/v1/files", "GET", BatchApi.list_files),
    ("/v1/files/{file_id}", "GET", BatchApi.get_file),
    ("/v1/files/{file_id}", "DELETE", BatchApi.delete_file),
    ("/v1/files/{file_id}/content", "GET", BatchApi.file_content),
    ("/v1/batches", "POST", BatchApi.create_batch),
    ("/v1/batches", "GET", BatchApi.list_batches),
    ("/v1/batches/{batch_id}", "GET", BatchApi.get_batch),
    ("/v1/batches/{batch_id}/cancel", "POST", BatchApi.cancel_batch),
]


def batch_routes(api: Callable[[], BatchApi]) -> list[Route]:
    """Starlette routes; `api` gives the BatchApi the lifespan built."""
    by_path: dict[str, dict[str, Handler]] = {}
    for path, method, handler in ROUTES:
        by_path.setdefault(path, {})[method] = handler

    def endpoint(handlers: dict[str, Handler]) -> Callable[[Request], Awaitable[Response]]:
        async def serve(request: Request) -> Response:
            return await api().handle(request, handlers[request.method])

        return serve

    return [Route(path, endpoint(h), methods=list(h)) for path, h in by_path.items()]


def _as_error(exc: Exception, rid: str) -> GatewayError:
    """The stores' errors enter here: translated, then answered as any."""
    if isinstance(exc, BatchStoreError | BlobStoreError):
        return StateUnavailable("The batch store is unreachable; try again shortly.", retry_after=1)
    return as_error(exc, rid)


def _expires_after(form: FormData) -> int | None:
    """`expires_after` as OpenAI's Files API takes it (multipart fields
    `expires_after[anchor]`, `created_at` only, and `expires_after[seconds]`, an hour to 30
    days): seconds, or None for the default (`batches.file_ttl_s`)."""
    anchor, seconds = form.get("expires_after[anchor]"), form.get("expires_after[seconds]")
    if anchor is None and seconds is None:
        return None
    if anchor != "created_at":
        raise BadRequest(
            "expires_after[anchor] must be 'created_at'.", param="expires_after.anchor"
        )
    if (
        not isinstance(seconds, str)
        or not seconds.isdigit()
        or not (MIN_EXPIRY_S <= int(seconds) <= MAX_EXPIRY_S)
    ):
        raise BadRequest(
            f"expires_after[seconds] must be an integer from {MIN_EXPIRY_S} to {MAX_EXPIRY_S}.",
            param="expires_after.seconds",
        )
    return int(seconds)


def _json(body: dict[str, Any]) -> Response:
    return Response(orjson.dumps(body), media_type="application/json")


def _param(request: Request, name: str) -> str:
    return str(request.path_params[name])


def _limit(text: str | None, default: int, most: int) -> int:
    if text is None:
        return default
    if not text.isdigit() or not 1 <= int(text) <= most:
        raise BadRequest(f"limit must be an integer from 1 to {most}.", param="limit")
    return int(text)


def _window(ids: list[str], limit: int, after: str | None) -> slice:
    """A cursor page: up to `limit` items after the one whose id is `after` (none after an
    id that is not there: another tenant's, or gone)."""
    start = ids.index(after) + 1 if after in ids else (len(ids) if after else 0)
    return slice(start, min(len(ids), start + limit))


def _listing(data: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    first, last = (data[0]["id"], data[-1]["id"]) if data else (None, None)
    return {
        "object": "list",
        "data": data,
        "first_id": first,
        "last_id": last,
        "has_more": has_more,
    }


async def _read(request: Request, limit: int, timeout_s: float) -> bytes:
    parts: list[bytes] = []
    receive = _bounded(request, limit, timeout_s)
    while True:
        message = await receive()
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(parts)


def _bounded(request: Request, limit: int, timeout_s: float) -> Callable[[], Awaitable[Message]]:
    """The request's messages, refused past `limit` bytes (413), or when the next one is
    `timeout_s` late (408): an upload may be large, but never unbounded or stalled."""
    size = 0

    async def receive() -> Message:
        nonlocal size
        try:
            async with asyncio.timeout(timeout_s):
                message = await request.receive()
        except TimeoutError as exc:
            raise RequestTimeout(
                f"The request body stalled for {timeout_s:g} s.", headers={"connection": "close"}
            ) from exc
        if message["type"] == "http.disconnect":
            raise BadRequest("The client closed the connection before sending the body.")
        size += len(message.get("body", b""))
        if size > limit:
            raise BodyTooLarge(f"The request body exceeds {limit} bytes.")
        return message

    return receive
