"""Errors of the backend layer, translated from the HTTP client where they enter.

BackendError
├── UpstreamConnectError    connection refused or reset before an answer began
├── UpstreamTimeoutError    no answer (or no next chunk) within the configured time
├── UpstreamProtocolError   the answer broke off or was not valid HTTP
└── EngineSleepError        an engine refused to sleep or wake, or never got there
LaunchError                 a local model server did not start or become ready
"""


class BackendError(Exception):
    pass


class UpstreamConnectError(BackendError):
    pass


class UpstreamTimeoutError(BackendError):
    pass


class UpstreamProtocolError(BackendError):
    pass


class EngineSleepError(BackendError):
    """`refused`: the engine answered that it cannot (no sleep mode), not that it failed."""

    def __init__(self, message: str, *, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


class LaunchError(Exception):
    pass
