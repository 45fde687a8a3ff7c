"""Replicas as pods of a Kubernetes workload, scaled through its scale subresource.

- `ensure(n)` writes `spec.replicas` with a JSON merge patch on
  `/apis/{group}/{version}/namespaces/{ns}/{plural}/{name}/scale` (lightkube
  `AsyncClient.patch(Deployment.Scale, ..., patch_type=PatchType.MERGE)`). A merge patch,
  not lightkube's default strategic merge patch: custom resources (KServe, Argo Rollouts,
  anything whose CRD declares a scale subresource) reject strategic merge patches.
- `ready()` comes from the EndpointSlices labelled `kubernetes.io/service-name=<service>`,
  polled every `poll_interval_s`. An endpoint is ready when `conditions.ready` is not false
  (the API documents nil as true) and it is not terminating. Kubernetes sets it from the
  pod's readinessProbe, so point that probe at the model server's `/health` (503 while the
  model loads). Replica ids are pod names (`targetRef`), or the address without one.
- `stop_replica(pod)` sets the pod's `controller.kubernetes.io/pod-deletion-cost`
  annotation to the minimum and then scales down by one, so that the ReplicaSet controller
  deletes that pod. This is best effort, as documented: the controller still deletes
  not-ready pods before ready ones whatever their cost, and cost does not span ReplicaSets
  in a rollout. Kubernetes drains the pod itself (the endpoint turns terminating, then
  SIGTERM and terminationGracePeriodSeconds); the replica leaves `ready()` at once.
- `close()` stops polling and leaves the workload as it is: other gateway replicas may
  share it, and scaling to zero is the cold-start manager's decision.

Without a cluster to talk to, tests run it against `tests/backends/fake_kubernetes.py`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import httpx2
from anyio.abc import TaskGroup
from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube.config.models import Cluster, User
from lightkube.core.client import LabelSelector
from lightkube.generic_resource import create_namespaced_resource
from lightkube.models.discovery_v1 import EndpointSlice as EndpointSliceModel
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.core_v1 import Pod
from lightkube.resources.discovery_v1 import EndpointSlice
from lightkube.types import PatchType

from backends.providers.errors import OrchestratorRequestFailed, ProviderClosed, ReplicaNotFound
from backends.providers.replicas import Phase, Replica, ReplicaEvent, ReplicaListener, notify

logger = logging.getLogger(__name__)

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
LOWEST_COST = str(-(2**31))  # the annotation is an int32


@dataclass(frozen=True)
class ScaleTarget:
    """The workload to scale; any resource with a scale subresource (default: Deployment)."""

    name: str
    group: str = "apps"
    version: str = "v1"
    kind: str = "Deployment"
    plural: str = "deployments"


@dataclass(frozen=True)
class EndpointDiscovery:
    service: str  # the Service whose EndpointSlices list the replicas
    port: int | None = None  # None: the slice's port named `port_name`, or its first
    port_name: str | None = None
    scheme: str = "http"
    path: str = "/v1"
    poll_interval_s: float = 0.5


def api_client(
    server: str,
    token: str,
    namespace: str,
    *,
    ca_file: str | None = None,
    insecure: bool = False,
    timeout_s: float = 10.0,
) -> AsyncClient:
    """A lightkube client for an explicit API server and bearer token (no kubeconfig).

    `KubeConfig.from_server` alone is not enough: it has no user, and lightkube's client
    then fails on `assert config.user`. `trust_env=False` keeps proxy variables out.
    """
    cluster = Cluster(server=server, certificate_auth=ca_file, insecure=insecure)
    config = KubeConfig.from_one(cluster=cluster, user=User(token=token), namespace=namespace)
    timeout = httpx2.Timeout(timeout_s)
    return AsyncClient(config, namespace=namespace, timeout=timeout, trust_env=False)


class KubernetesProvider:
    def __init__(
        self,
        client: AsyncClient,
        namespace: str,
        target: ScaleTarget,
        discovery: EndpointDiscovery,
        *,
        name: str = "kubernetes",
        close_client: bool = True,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.name = name
        self.on_change: list[ReplicaListener] = []
        self._client = client
        self._namespace = namespace
        self._target = target
        self._scale = _scale_resource(target)
        self._discovery = discovery
        self._close_client = close_client
        self._clock = clock
        self._desired = 0
        self._endpoints: dict[str, Replica] = {}  # ready, as last polled
        self._stopping: set[str] = set()
        self._polling = anyio.CancelScope()
        self._closed = False

    async def start(self, task_group: TaskGroup) -> None:
        await self._poll()  # fails fast on a wrong server, token, namespace or target
        task_group.start_soon(self._poll_forever)

    async def ensure(self, count: int) -> None:
        if self._closed:
            raise ProviderClosed(f"{self.name} is closed")
        if count < 0:
            raise ValueError(f"replica count must be >= 0, not {count}")
        if count != self._desired:
            await self._set_replicas(count)

    def ready(self) -> list[Replica]:
        return [r for r in self._endpoints.values() if r.id not in self._stopping]

    def starting(self) -> int:
        return max(0, self._desired - len(self.ready()))

    async def stop_replica(self, replica_id: str) -> None:
        if replica_id not in self._endpoints:
            raise ReplicaNotFound(f"{self.name} has no ready replica {replica_id!r}")
        self._stopping.add(replica_id)
        try:
            patch = {"metadata": {"annotations": {DELETION_COST: LOWEST_COST}}}
            with _translated(f"mark pod {replica_id} for deletion"):
                await self._client.patch(
                    Pod, replica_id, patch, namespace=self._namespace, patch_type=PatchType.MERGE
                )
            await self._set_replicas(max(0, self._desired - 1))
        except OrchestratorRequestFailed:
            self._stopping.discard(replica_id)
            raise

    async def close(self) -> None:
        self._closed = True
        self._polling.cancel()
        if self._close_client:
            await self._client.close()

    async def _set_replicas(self, count: int) -> None:
        target = self._target
        with _translated(f"scale {target.kind} {self._namespace}/{target.name} to {count}"):
            scale = await self._client.patch(
                self._scale,
                target.name,
                {"spec": {"replicas": count}},
                namespace=self._namespace,
                patch_type=PatchType.MERGE,
            )
        before, self._desired = self._desired, _replicas_of(scale)
        self._emit("scaled", None, None, f"{before}->{self._desired}")

    async def _poll_forever(self) -> None:
        with self._polling:
            while True:
                await anyio.sleep(self._discovery.poll_interval_s)
                try:
                    await self._poll()
                except (
                    OrchestratorRequestFailed
                ) as exc:  # keep the last view; the next poll retries
                    logger.warning("%s: %s", self.name, exc)

    async def _poll(self) -> None:
        target = self._target
        with _translated(f"read the scale of {target.kind} {self._namespace}/{target.name}"):
            scale = await self._client.get(self._scale, target.name, namespace=self._namespace)
        selector: LabelSelector = {SERVICE_NAME_LABEL: self._discovery.service}
        with _translated(f"list EndpointSlices of service {self._discovery.service}"):
            slices = [
                s
                async for s in self._client.list(
                    EndpointSlice, namespace=self._namespace, labels=selector
                )
            ]
        self._desired = _replicas_of(scale)
        self._update(*endpoints_of(slices, self._discovery))

    def _update(self, ready: dict[str, Replica], running: set[str]) -> None:
        for replica_id, replica in self._endpoints.items():
            if replica_id not in ready:
                expected = replica_id in self._stopping or len(ready) >= self._desired
                phase: Phase = "stopped" if expected else "crashed"
                self._emit(phase, replica_id, replica.base_url, "" if expected else "unready")
        for replica_id, replica in ready.items():
            if replica_id not in self._endpoints:
                self._emit("ready", replica_id, replica.base_url, "")
        self._endpoints = ready
        self._stopping &= running
        if len(running) <= self._desired:  # settled: whatever still runs is meant to stay
            self._stopping.clear()

    def _emit(self, phase: Phase, replica_id: str | None, url: str | None, detail: str) -> None:
        event = ReplicaEvent(self.name, phase, replica_id, self._clock(), url, detail)
        notify(self.on_change, event)


def endpoints_of(
    slices: Iterable[EndpointSliceModel], discovery: EndpointDiscovery
) -> tuple[dict[str, Replica], set[str]]:
    """(ready replicas by id, ids of all endpoints not terminating) from EndpointSlices."""
    ready: dict[str, Replica] = {}
    running: set[str] = set()
    for endpoint_slice in slices:
        port = _port(endpoint_slice, discovery)
        for endpoint in endpoint_slice.endpoints or []:
            if not endpoint.addresses or port is None:
                continue
            address = endpoint.addresses[0]
            replica_id = endpoint.targetRef.name if endpoint.targetRef else None
            replica_id = replica_id or address
            conditions = endpoint.conditions
            if conditions is not None and conditions.terminating:
                continue
            running.add(replica_id)
            if conditions is None or conditions.ready is not False:
                ready[replica_id] = Replica(replica_id, _base_url(address, port, discovery))
    return ready, running


def _port(endpoint_slice: EndpointSliceModel, discovery: EndpointDiscovery) -> int | None:
    if discovery.port is not None:
        return discovery.port
    ports: Sequence[Any] = endpoint_slice.ports or []
    for port in ports:
        if discovery.port_name is None or port.name == discovery.port_name:
            return int(port.port) if port.port is not None else None
    return None


def _base_url(address: str, port: int, discovery: EndpointDiscovery) -> str:
    host = f"[{address}]" if ":" in address else address
    return f"{discovery.scheme}://{host}:{port}{discovery.path}"


def _replicas_of(scale: Any) -> int:
    # autoscaling/v1 ScaleSpec.replicas is `omitempty`: zero replicas arrive as `spec: {}`.
    spec = scale.spec
    return int(spec.replicas) if spec is not None and spec.replicas is not None else 0


def _scale_resource(target: ScaleTarget) -> Any:
    if (target.group, target.version, target.kind) == ("apps", "v1", "Deployment"):
        return Deployment.Scale
    resource = create_namespaced_resource(target.group, target.version, target.kind, target.plural)
    return resource.Scale


@contextmanager
def _translated(action: str) -> Iterator[None]:
    """lightkube's and httpx2's errors as OrchestratorRequestFailed, saying what was attempted."""
    try:
        yield
    except ApiError as exc:
        status = exc.status
        raise OrchestratorRequestFailed(
            f"{action}: {status.code} {status.reason}: {status.message}"
        ) from exc
    except httpx2.HTTPStatusError as exc:
        raise OrchestratorRequestFailed(f"{action}: HTTP {exc.response.status_code}") from exc
    except httpx2.HTTPError as exc:
        raise OrchestratorRequestFailed(
            f"{action}: cannot reach the Kubernetes API ({type(exc).__name__})"
        ) from exc
