"""Errors of the replica providers (a branch of `backends.errors.BackendError`).

ProviderError
├── ReplicaNotFound       stop_replica named a replica this provider does not run
├── ProviderClosed        ensure() after close()
└── OrchestratorRequestFailed  the orchestrator refused or did not answer (Kubernetes API)

A replica that fails to launch, crashes or never gets ready is not an exception: the
provider reports it as a "crashed" event and restarts it with backoff.
"""

from backends.errors import BackendError


class ProviderError(BackendError):
    pass


class ReplicaNotFound(ProviderError):
    pass


class ProviderClosed(ProviderError):
    pass


class OrchestratorRequestFailed(ProviderError):
    pass
