"""Errors of the batch API, in the gateway's tree (gateway/errors.py turns them into
OpenAI's error JSON, like every other):

    GatewayError
    ├── BadRequest                  400
    │   ├── InvalidBatchFile        400  a line of an uploaded file is wrong: the message
    │   │                                names the line, `param` the field in it
    │   └── FileInUse               400  an unfinished batch reads the file
    │   └── FileLimitExceeded       400  the tenant has as many files as it may keep
    ├── StorageLimitExceeded        413  the tenant's files would hold more than it may
    ├── TooManyUploads              429  the tenant's uploads at once (Retry-After)
    ├── FileNotFound                404  no such file, or another tenant's (or expired)
    ├── BatchNotFound               404  no such batch, or another tenant's
    └── BatchNotCancellable         409  the batch is over

and, where the stores' own errors enter (gateway/batches/routes.py):

    BatchStoreError  -> StateUnavailable (503, Retry-After)
    BlobStoreError   -> StateUnavailable (503, Retry-After)
"""

from __future__ import annotations

from gateway.errors import BadRequest, GatewayError


class InvalidBatchFile(BadRequest):
    code = "invalid_batch_file"

    def __init__(
        self,
        message: str,
        *,
        line: int | None = None,  # 1-based; None: the whole file
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message, param=param, code=code)
        self.line = line


class FileInUse(BadRequest):
    code = "file_in_use"


class FileLimitExceeded(BadRequest):
    code = "file_limit_exceeded"


class StorageLimitExceeded(GatewayError):
    status = 413
    type = "invalid_request_error"
    code = "storage_limit_exceeded"


class TooManyUploads(GatewayError):
    status = 429
    type = "rate_limit_error"
    code = "too_many_uploads"


class FileNotFound(GatewayError):
    status = 404
    type = "invalid_request_error"
    code = "file_not_found"


class BatchNotFound(GatewayError):
    status = 404
    type = "invalid_request_error"
    code = "batch_not_found"


class BatchNotCancellable(GatewayError):
    status = 409
    type = "invalid_request_error"
    code = "batch_not_cancellable"


class BatchStoreError(Exception):
    """The store of files' records and jobs cannot be reached or answered nonsense."""


class BlobStoreError(Exception):
    """The bytes of a file cannot be written or read (disk, S3)."""


class BlobMissing(BlobStoreError):
    """The file's bytes are not there (deleted, or never written)."""
