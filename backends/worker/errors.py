"""Errors the worker answers with; each knows its HTTP status and OpenAI error type.

    WorkerError                     500 server_error
    ├── InvalidRequest              400 invalid_request_error
    │   ├── ContextLengthExceeded   400 invalid_request_error, code context_length_exceeded
    │   └── BodyTooLarge            413 invalid_request_error
    ├── ModelNotFound               404 invalid_request_error, code model_not_found
    └── ModelsLoading               503 server_error, code models_loading, Retry-After

The server turns them into OpenAI's error JSON in one exception handler. `ModelsLoading` is
temporary (the worker is starting), so it carries `Retry-After`; the others are not.
"""

from __future__ import annotations


class WorkerError(Exception):
    status_code = 500
    error_type = "server_error"
    code: str | None = None
    retry_after_s: int | None = None  # set on temporary conditions only

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    def payload(self) -> dict[str, object]:
        return error_payload(self.message, self.error_type, self.param, self.code)

    def headers(self) -> dict[str, str]:
        return {} if self.retry_after_s is None else {"Retry-After": str(self.retry_after_s)}


class InvalidRequest(WorkerError):
    status_code = 400
    error_type = "invalid_request_error"


class ContextLengthExceeded(InvalidRequest):
    code = "context_length_exceeded"


class BodyTooLarge(InvalidRequest):
    status_code = 413

    def __init__(self, limit: int) -> None:
        super().__init__(f"The request body is larger than {limit} bytes.")


class ModelNotFound(WorkerError):
    status_code = 404
    error_type = "invalid_request_error"
    code = "model_not_found"

    def __init__(self, model: str, task: str | None = None) -> None:
        served = "" if task is None else f" or does not serve {task}"
        super().__init__(f"The model '{model}' does not exist{served}", "model")


class ModelsLoading(WorkerError):
    status_code = 503
    code = "models_loading"
    retry_after_s = 1

    def __init__(self, phase: str) -> None:
        super().__init__(f"The worker is still starting ({phase}); retry shortly.")


def error_payload(
    message: str, error_type: str, param: str | None = None, code: str | None = None
) -> dict[str, object]:
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}
