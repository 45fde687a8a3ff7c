"""KubernetesProvider with the real lightkube client against the FAITHFUL FAKE Kubernetes API
in `fake_kubernetes.py` (no cluster runs here; the fake implements the documented endpoints)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import pytest
from lightkube import ApiError
from lightkube.models.core_v1 import ObjectReference
from lightkube.models.discovery_v1 import (
    Endpoint,
    EndpointConditions,
    EndpointPort,
    EndpointSlice,
)
from lightkube.resources.apps_v1 import Deployment
from lightkube.types import PatchType

from backends.providers.errors import OrchestratorRequestFailed, ReplicaNotFound
from backends.providers.kubernetes import (
    EndpointDiscovery,
    KubernetesProvider,
    ScaleTarget,
    api_client,
    endpoints_of,
)
from backends.providers.replicas import Replica
from tests.backends.fake_kubernetes import DELETION_COST, MERGE, FakeKubernetes
from tests.backends.support import phases, record, running, wait_until

TOKEN = "fake-cluster-token-3f9a"
NAMESPACE, DEPLOYMENT, SERVICE = "models", "qwen", "qwen-svc"


@pytest.fixture
async def fake() -> AsyncIterator[FakeKubernetes]:
    fake = FakeKubernetes(TOKEN, ready_delay_s=0.3, terminating_s=0.2)
    fake.add_deployment(NAMESPACE, DEPLOYMENT, SERVICE, port=8000)
    await fake.start()
    yield fake
    await fake.close()


def provider_for(
    fake: FakeKubernetes, token: str = TOKEN, target: str = DEPLOYMENT
) -> KubernetesProvider:
    client = api_client(fake.url, token, NAMESPACE)
    discovery = EndpointDiscovery(SERVICE, poll_interval_s=0.05)
    return KubernetesProvider(client, NAMESPACE, ScaleTarget(target), discovery, name="k8s")


async def fails_to_start(provider: KubernetesProvider, message: str) -> None:
    async with anyio.create_task_group() as task_group:
        with pytest.raises(OrchestratorRequestFailed) as failure:
            await provider.start(task_group)
        await provider.close()
    assert message in str(failure.value)


def scale_patches(fake: FakeKubernetes) -> list[str]:
    return [c.content_type for c in fake.calls if c.method == "PATCH" and "/scale" in c.path]


async def test_scale_from_zero_and_back_to_zero_on_fake_kubernetes(fake: FakeKubernetes) -> None:
    provider = provider_for(fake)
    events = record(provider)
    async with running(provider):
        assert (provider.ready(), provider.starting()) == ([], 0)
        await provider.ensure(1)
        assert fake.scale_writes() == [1]
        assert (provider.ready(), provider.starting()) == ([], 1)  # the pod is not ready yet
        await wait_until(provider.ready, "the pod's endpoint to be ready")
        [pod] = fake.pods(NAMESPACE, DEPLOYMENT)
        assert provider.ready() == [Replica(pod.name, f"http://{pod.ip}:8000/v1")]
        await provider.ensure(1)
        assert fake.scale_writes() == [1]
        await provider.ensure(0)
        await wait_until(lambda: not fake.pods(NAMESPACE, DEPLOYMENT), "the pod to be gone")
        await wait_until(lambda: "stopped" in phases(events), "the stop to be seen")
    assert fake.scale_writes() == [1, 0]
    assert scale_patches(fake) == [MERGE, MERGE]
    assert phases(events) == ["scaled", "ready", "scaled", "stopped"]
    assert [e.detail for e in events if e.phase == "scaled"] == ["0->1", "1->0"]


async def test_stop_replica_marks_that_pod_cheapest_then_scales_down_on_fake_kubernetes(
    fake: FakeKubernetes,
) -> None:
    provider = provider_for(fake)
    events = record(provider)
    async with running(provider):
        await provider.ensure(2)
        await wait_until(lambda: len(provider.ready()) == 2, "two ready pods")
        older, newer = fake.pods(NAMESPACE, DEPLOYMENT)  # by default the newer one would go
        await provider.stop_replica(older.name)
        assert [replica.id for replica in provider.ready()] == [newer.name]
        assert older.annotations == {DELETION_COST: str(-(2**31))}
        assert older.terminating_since is not None and newer.terminating_since is None
        await wait_until(lambda: "stopped" in phases(events), "the pod to leave")
        with pytest.raises(ReplicaNotFound):
            await provider.stop_replica(older.name)
    assert fake.scale_writes() == [2, 1]
    [pod_patch] = [call for call in fake.calls if "/pods/" in call.path]
    assert (pod_patch.method, pod_patch.content_type) == ("PATCH", MERGE)
    stopped = [e.replica_id for e in events if e.phase == "stopped"]
    assert stopped == [older.name]
    assert [r.id for r in provider.ready()] == [newer.name]


async def test_container_crash_is_reported_then_ready_again_on_fake_kubernetes(
    fake: FakeKubernetes,
) -> None:
    provider = provider_for(fake)
    events = record(provider)
    async with running(provider):
        await provider.ensure(1)
        await wait_until(provider.ready, "the pod's endpoint to be ready")
        [pod] = fake.pods(NAMESPACE, DEPLOYMENT)
        fake.crash_container(pod.name, restart_s=0.3)
        await wait_until(lambda: phases(events).count("ready") == 2, "the restarted container")
    assert phases(events) == ["scaled", "ready", "crashed", "ready"]
    assert {e.replica_id for e in events if e.phase != "scaled"} == {pod.name}


async def test_fake_kubernetes_answers_401_without_the_bearer_token(
    fake: FakeKubernetes,
) -> None:
    url = f"{fake.url}/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{DEPLOYMENT}/scale"
    async with httpx.AsyncClient() as client:
        answer = await client.get(url)
    assert (answer.status_code, answer.headers["content-type"]) == (401, "application/json")
    assert answer.json()["reason"] == "Unauthorized"
    await fails_to_start(provider_for(fake, token="wrong"), "401 Unauthorized")


async def test_missing_deployment_is_a_clear_error_on_fake_kubernetes(
    fake: FakeKubernetes,
) -> None:
    await fails_to_start(
        provider_for(fake, target="nope"), '404 NotFound: deployments.apps "nope" not found'
    )


async def test_fake_kubernetes_scale_subresource_takes_what_lightkube_sends(
    fake: FakeKubernetes,
) -> None:
    client = api_client(fake.url, TOKEN, NAMESPACE)
    try:
        scale = await client.get(Deployment.Scale, DEPLOYMENT, namespace=NAMESPACE)
        assert scale.spec is not None
        assert scale.spec.replicas is None  # omitempty: zero is absent, as the API encodes it
        scale.spec.replicas = 2
        await client.replace(scale, DEPLOYMENT, namespace=NAMESPACE)
        with pytest.raises(ApiError) as conflict:  # the same resourceVersion again: stale
            await client.replace(scale, DEPLOYMENT, namespace=NAMESPACE)
        assert conflict.value.status.code == 409
        patches: list[tuple[dict[str, Any] | list[Any], PatchType]] = [
            ({"spec": {"replicas": 3}}, PatchType.STRATEGIC),
            ([{"op": "replace", "path": "/spec/replicas", "value": 1}], PatchType.JSON),
            (
                {"apiVersion": "autoscaling/v1", "kind": "Scale", "spec": {"replicas": 4}},
                PatchType.APPLY,
            ),
        ]
        for patch, patch_type in patches:
            await client.patch(
                Deployment.Scale,
                DEPLOYMENT,
                patch,
                namespace=NAMESPACE,
                patch_type=patch_type,
                field_manager="gateway",
            )
        with pytest.raises(ApiError) as invalid:
            await client.patch(
                Deployment.Scale, DEPLOYMENT, {"spec": {"replicas": -1}}, namespace=NAMESPACE
            )
        assert (invalid.value.status.code, invalid.value.status.reason) == (422, "Invalid")
        final = await client.get(Deployment.Scale, DEPLOYMENT, namespace=NAMESPACE)
        assert final.spec is not None and final.spec.replicas == 4
    finally:
        await client.close()
    assert fake.scale_writes() == [2, 3, 1, 4]
    assert scale_patches(fake) == [
        "application/strategic-merge-patch+json",
        "application/json-patch+json",
        "application/apply-patch+yaml",
        "application/strategic-merge-patch+json",
    ]


def test_endpoints_of_reads_conditions_as_the_api_documents() -> None:
    def endpoint(address: str, pod: str | None, **conditions: bool) -> Endpoint:
        reference = ObjectReference(kind="Pod", name=pod) if pod else None
        return Endpoint([address], conditions=EndpointConditions(**conditions), targetRef=reference)

    endpoint_slice = EndpointSlice(
        addressType="IPv6",
        endpoints=[
            endpoint("fd00::1", "nil-means-ready"),
            endpoint("fd00::2", "loading", ready=False, serving=False),
            endpoint("fd00::3", "leaving", ready=False, serving=True, terminating=True),
            endpoint("fd00::4", None, ready=True),
        ],
        ports=[EndpointPort(name="metrics", port=9090), EndpointPort(name="http", port=8000)],
    )
    discovery = EndpointDiscovery("svc", port_name="http")
    ready, running_ids = endpoints_of([endpoint_slice], discovery)
    assert ready == {
        "nil-means-ready": Replica("nil-means-ready", "http://[fd00::1]:8000/v1"),
        "fd00::4": Replica("fd00::4", "http://[fd00::4]:8000/v1"),
    }
    assert running_ids == {"nil-means-ready", "loading", "fd00::4"}
    assert endpoints_of([EndpointSlice(addressType="IPv4")], discovery) == ({}, set())
