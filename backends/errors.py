"""Errors of the backend layer, translated from the HTTP client where they enter.

BackendError
├── UpstreamConnectError    connection refused or reset before an answer began
├── UpstreamTimeoutError    no answer (or no next chunk) within the configured time
└── UpstreamProtocolError   the answer broke off or was not valid HTTP
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


class LaunchError(Exception):
    pass
