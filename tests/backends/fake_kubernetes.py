"""A FAITHFUL FAKE of the Kubernetes API endpoints the kubernetes provider calls. Not a cluster.

It answers on a loopback port, as the Kubernetes API reference documents these endpoints:

    GET   /apis/apps/v1/namespaces/{ns}/deployments/{name}/scale      -> autoscaling/v1 Scale
    PUT   the same                                                     <- a Scale; a stale
          metadata.resourceVersion is a 409 Conflict, a name other than the URL's a 400
    PATCH the same, by Content-Type:
          application/merge-patch+json            RFC 7386
          application/strategic-merge-patch+json  a Scale has no lists: as a merge patch
          application/json-patch+json             RFC 6902: add, replace, remove, test
          application/apply-patch+yaml            needs ?fieldManager= (422 without); merged
                                                  like a merge patch, no managedFields kept
          anything else                           415 Unsupported Media Type
          ?dryRun=All validates and answers without storing.
    GET   /apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices?labelSelector=...
          -> EndpointSliceList (equality selectors: k=v, k==v, k!=v, k, !k)
    GET/PATCH /api/v1/namespaces/{ns}/pods/{name}   (a PATCH keeps metadata.labels and
          metadata.annotations; controller.kubernetes.io/pod-deletion-cost must be an int32)

Every request needs `Authorization: Bearer <token>` (a 401 Status without it). Errors are
metav1.Status objects served as `application/json` with the API's codes and reasons. JSON
follows the Go encoding: autoscaling/v1 `spec.replicas` is omitempty (zero replicas read
`"spec": {}`), an EndpointSlice without endpoints has `"endpoints": null`, and list items
carry no kind or apiVersion.

Controllers are simulated lazily, at each request, from the clock:
- Deployment/ReplicaSet: more replicas create pods that turn ready `ready_delay_s` later;
  fewer replicas mark surplus pods terminating, ranked as the ReplicaSet controller ranks
  them (not ready first, then lower pod-deletion-cost, then ready for less time, then newer);
  terminating pods disappear `terminating_s` later.
- EndpointSlice controller: one slice per Service, one endpoint per pod, with the ready /
  serving / terminating conditions the controller sets.
- `crash_container(pod)`: the container exits and kubelet restarts it in place: the pod
  keeps its name and is not ready until it has started again.

Not implemented: watch, list pagination (limit/continue), any other resource or verb,
managedFields, admission, RBAC.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

import yaml
from aiohttp import web

Json = dict[str, Any]
MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY = "application/apply-patch+yaml"
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"


class ApiStatus(Exception):
    """A metav1.Status failure, raised by a handler and served as the API serves it."""

    def __init__(self, code: int, reason: str, message: str, details: Json | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def response(self) -> web.Response:
        body: Json = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        return _json(body, self.code)


@dataclass
class FakePod:
    name: str
    uid: str
    ip: str
    created: float
    ready_at: float
    labels: dict[str, str]
    annotations: dict[str, str] = field(default_factory=dict)
    terminating_since: float | None = None
    restarts: int = 0

    def ready(self, now: float) -> bool:
        return self.terminating_since is None and now >= self.ready_at

    def deletion_cost(self) -> int:
        return int(self.annotations.get(DELETION_COST, "0"))


@dataclass
class FakeDeployment:
    namespace: str
    name: str
    service: str
    port: int
    uid: str
    replicas: int = 0
    resource_version: int = 1
    pods: list[FakePod] = field(default_factory=list)


@dataclass(frozen=True)
class Call:
    method: str
    path: str
    query: dict[str, str]
    content_type: str
    body: Any
    status: int


class FakeKubernetes:
    def __init__(
        self,
        token: str,
        *,
        ready_delay_s: float = 0.3,
        terminating_s: float = 0.3,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.token = token
        self.ready_delay_s = ready_delay_s
        self.terminating_s = terminating_s
        self.calls: list[Call] = []
        self._clock = clock
        self._deployments: dict[tuple[str, str], FakeDeployment] = {}
        self._numbers = itertools.count(1)
        self._revision = itertools.count(100)  # like etcd's: one counter for every object
        self._runner: web.AppRunner | None = None
        self.url = ""  # set by start()

    # --- test controls -------------------------------------------------------------------

    def add_deployment(
        self, namespace: str, name: str, service: str, port: int = 8000, replicas: int = 0
    ) -> FakeDeployment:
        deployment = FakeDeployment(namespace, name, service, port, self._uid(), replicas)
        self._deployments[(namespace, name)] = deployment
        self._reconcile()
        return deployment

    def pods(self, namespace: str, name: str) -> list[FakePod]:
        self._reconcile()
        return list(self._deployment(namespace, name).pods)

    def crash_container(self, pod_name: str, restart_s: float) -> None:
        pod = self._pod(pod_name)
        pod.restarts += 1
        pod.ready_at = self._clock() + restart_s

    def scale_writes(self) -> list[int | None]:
        """spec.replicas of each accepted write to a scale subresource, in order."""
        return [
            _replicas(call.body)
            for call in self.calls
            if call.path.endswith("/scale") and call.method in ("PUT", "PATCH")
            if call.status == 200
        ]

    async def start(self) -> str:
        app = web.Application(middlewares=[self._record, self._authenticate])
        app.router.add_route(
            "*", "/apis/apps/v1/namespaces/{ns}/deployments/{name}/scale", self._scale
        )
        app.router.add_route(
            "*", "/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices", self._slices
        )
        app.router.add_route("*", "/api/v1/namespaces/{ns}/pods/{name}", self._pod_route)
        app.router.add_route("*", "/{tail:.*}", self._not_found)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"
        return self.url

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    # --- HTTP ---------------------------------------------------------------------------

    @web.middleware
    async def _record(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        raw = await request.read()
        try:
            response = await handler(request)
        except ApiStatus as status:
            response = status.response()
        content_type = request.headers.get("Content-Type", "")
        body: Any = None
        if raw:
            try:
                body = yaml.safe_load(raw) if content_type == APPLY else json.loads(raw)
            except ValueError:
                body = raw
        query = dict(request.query)
        call = Call(request.method, request.path, query, content_type, body, response.status)
        self.calls.append(call)
        return response

    @web.middleware
    async def _authenticate(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            raise ApiStatus(401, "Unauthorized", "Unauthorized")
        self._reconcile()
        return await handler(request)

    async def _scale(self, request: web.Request) -> web.Response:
        deployment = self._deployment(request.match_info["ns"], request.match_info["name"])
        if request.method == "GET":
            return _json(self._scale_json(deployment))
        if request.method == "PUT":
            desired = _decode_json(await request.read())
            _check_name(desired, deployment.name)
        elif request.method == "PATCH":
            desired = _apply_patch(self._scale_json(deployment), request, await request.read())
        else:
            raise _method_not_allowed(request)
        replicas = self._validated_replicas(deployment, desired)
        if request.query.get("dryRun") != "All":
            deployment.replicas = replicas
            deployment.resource_version = next(self._revision)
            self._reconcile()
        answer = self._scale_json(deployment)
        answer["spec"] = {"replicas": replicas} if replicas else {}
        return _json(answer)

    async def _slices(self, request: web.Request) -> web.Response:
        if request.method != "GET":
            raise _method_not_allowed(request)
        if request.query.get("watch") in ("true", "1"):
            raise ApiStatus(400, "BadRequest", "watch is not implemented by this fake")
        matches = _selector(request.query.get("labelSelector", ""))
        namespace = request.match_info["ns"]
        items = [
            self._slice_json(deployment)
            for deployment in self._deployments.values()
            if deployment.namespace == namespace
        ]
        selected = [item for item in items if matches(item["metadata"]["labels"])]
        return _json(
            {
                "kind": "EndpointSliceList",
                "apiVersion": "discovery.k8s.io/v1",
                "metadata": {"resourceVersion": str(next(self._revision))},
                "items": selected,
            }
        )

    async def _pod_route(self, request: web.Request) -> web.Response:
        namespace, name = request.match_info["ns"], request.match_info["name"]
        deployment, pod = self._find_pod(namespace, name)
        if request.method == "GET":
            return _json(self._pod_json(deployment, pod))
        if request.method != "PATCH":
            raise _method_not_allowed(request)
        patched = _apply_patch(self._pod_json(deployment, pod), request, await request.read())
        metadata = patched.get("metadata") or {}
        annotations = dict(metadata.get("annotations") or {})
        cost = annotations.get(DELETION_COST)
        if cost is not None and not _is_int32(cost):
            raise ApiStatus(
                422,
                "Invalid",
                f'Pod "{name}" is invalid: metadata.annotations[{DELETION_COST}]: '
                f'Invalid value: "{cost}": must be a 32bit integer',
            )
        if request.query.get("dryRun") != "All":
            pod.annotations = annotations
            pod.labels = dict(metadata.get("labels") or {})
        return _json(self._pod_json(deployment, pod))

    async def _not_found(self, request: web.Request) -> web.Response:
        raise ApiStatus(404, "NotFound", "the server could not find the requested resource")

    # --- objects as the API encodes them -------------------------------------------------

    def _scale_json(self, deployment: FakeDeployment) -> Json:
        running = [pod for pod in deployment.pods if pod.terminating_since is None]
        return {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {
                "name": deployment.name,
                "namespace": deployment.namespace,
                "uid": deployment.uid,
                "resourceVersion": str(deployment.resource_version),
                "creationTimestamp": "2025-01-01T00:00:00Z",
            },
            # ScaleSpec.replicas is `json:"replicas,omitempty"`: zero is left out.
            "spec": {"replicas": deployment.replicas} if deployment.replicas else {},
            "status": {"replicas": len(running), "selector": f"app={deployment.name}"},
        }

    def _slice_json(self, deployment: FakeDeployment) -> Json:
        now = self._clock()
        endpoints = [
            {
                "addresses": [pod.ip],
                "conditions": {
                    "ready": pod.ready(now),
                    "serving": now >= pod.ready_at,
                    "terminating": pod.terminating_since is not None,
                },
                "targetRef": {
                    "kind": "Pod",
                    "namespace": deployment.namespace,
                    "name": pod.name,
                    "uid": pod.uid,
                },
                "nodeName": "fake-node-1",
            }
            for pod in deployment.pods
        ]
        return {
            "metadata": {
                "name": f"{deployment.service}-x7k2p",
                "generateName": f"{deployment.service}-",
                "namespace": deployment.namespace,
                "labels": {
                    "kubernetes.io/service-name": deployment.service,
                    "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
                },
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "Service",
                        "name": deployment.service,
                        "uid": "svc",
                    }
                ],
                "resourceVersion": str(deployment.resource_version),
            },
            "addressType": "IPv4",
            "endpoints": endpoints or None,  # a nil slice in Go: `null` in JSON
            "ports": [{"name": "http", "protocol": "TCP", "port": deployment.port}],
        }

    def _pod_json(self, deployment: FakeDeployment, pod: FakePod) -> Json:
        metadata: Json = {
            "name": pod.name,
            "namespace": deployment.namespace,
            "uid": pod.uid,
            "labels": pod.labels,
            "creationTimestamp": _timestamp(pod.created),
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": f"{deployment.name}-5d8f7c9b4",
                    "uid": "rs",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        }
        if pod.annotations:
            metadata["annotations"] = pod.annotations
        ready = "True" if pod.ready(self._clock()) else "False"
        return {
            "kind": "Pod",
            "apiVersion": "v1",
            "metadata": metadata,
            "spec": {
                "containers": [{"name": "model-server", "image": "example.invalid/model:fake"}],
                "nodeName": "fake-node-1",
            },
            "status": {
                "phase": "Running",
                "podIP": pod.ip,
                "conditions": [{"type": "Ready", "status": ready}],
            },
        }

    # --- the simulated controllers -------------------------------------------------------

    def _reconcile(self) -> None:
        now = self._clock()
        for deployment in self._deployments.values():
            deployment.pods = [
                pod
                for pod in deployment.pods
                if pod.terminating_since is None or now < pod.terminating_since + self.terminating_s
            ]
            running = [pod for pod in deployment.pods if pod.terminating_since is None]
            for _ in range(deployment.replicas - len(running)):
                deployment.pods.append(self._new_pod(deployment, now))
            surplus = len(running) - deployment.replicas
            for pod in sorted(running, key=lambda pod: _deletion_rank(pod, now))[: max(0, surplus)]:
                pod.terminating_since = now

    def _new_pod(self, deployment: FakeDeployment, now: float) -> FakePod:
        number = next(self._numbers)
        return FakePod(
            name=f"{deployment.name}-5d8f7c9b4-{number:05x}",
            uid=self._uid(),
            ip=f"10.244.0.{9 + number}",
            created=now,
            ready_at=now + self.ready_delay_s,
            labels={"app": deployment.name, "pod-template-hash": "5d8f7c9b4"},
        )

    def _validated_replicas(self, deployment: FakeDeployment, scale: Json) -> int:
        if scale.get("kind", "Scale") != "Scale":
            raise ApiStatus(400, "BadRequest", f"expected kind Scale, not {scale.get('kind')!r}")
        version = (scale.get("metadata") or {}).get("resourceVersion")
        if version is not None and version != str(deployment.resource_version):
            raise ApiStatus(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on deployments.apps "{deployment.name}": the '
                "object has been modified; please apply your changes to the latest version "
                "and try again",
                {"name": deployment.name, "group": "apps", "kind": "deployments"},
            )
        replicas = (scale.get("spec") or {}).get("replicas", 0)
        if not isinstance(replicas, int) or isinstance(replicas, bool):
            raise ApiStatus(400, "BadRequest", "spec.replicas: must be an integer")
        if replicas < 0:
            raise ApiStatus(
                422,
                "Invalid",
                f'Scale.autoscaling "{deployment.name}" is invalid: spec.replicas: '
                f"Invalid value: {replicas}: must be greater than or equal to 0",
            )
        return replicas

    def _deployment(self, namespace: str, name: str) -> FakeDeployment:
        deployment = self._deployments.get((namespace, name))
        if deployment is None:
            raise ApiStatus(
                404,
                "NotFound",
                f'deployments.apps "{name}" not found',
                {"name": name, "group": "apps", "kind": "deployments"},
            )
        return deployment

    def _find_pod(self, namespace: str, name: str) -> tuple[FakeDeployment, FakePod]:
        for deployment in self._deployments.values():
            for pod in deployment.pods:
                if deployment.namespace == namespace and pod.name == name:
                    return deployment, pod
        raise ApiStatus(404, "NotFound", f'pods "{name}" not found', {"name": name, "kind": "pods"})

    def _pod(self, name: str) -> FakePod:
        for deployment in self._deployments.values():
            for pod in deployment.pods:
                if pod.name == name:
                    return pod
        raise KeyError(name)

    def _uid(self) -> str:
        return f"00000000-0000-4000-8000-{next(self._numbers):012d}"


def _deletion_rank(pod: FakePod, now: float) -> tuple[bool, int, float, float]:
    """ReplicaSet's order for scale-down (controller.ActivePodsWithRanks): first goes first."""
    ready = pod.ready(now)
    return (ready, pod.deletion_cost(), -pod.ready_at if ready else 0.0, -pod.created)


def _apply_patch(current: Json, request: web.Request, raw: bytes) -> Json:
    content_type = request.headers.get("Content-Type", "").split(";")[0].strip()
    if content_type in (MERGE, STRATEGIC):
        return cast(Json, _merge(current, _decode_json(raw)))
    if content_type == JSON_PATCH:
        return _json_patch(current, _decode_json(raw))
    if content_type == APPLY:
        if not request.query.get("fieldManager"):
            raise ApiStatus(
                422,
                "Invalid",
                'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: '
                "is required for apply patch",
            )
        applied = yaml.safe_load(raw)
        if (
            not isinstance(applied, dict)
            or not applied.get("apiVersion")
            or not applied.get("kind")
        ):
            raise ApiStatus(400, "BadRequest", "apply patch needs apiVersion and kind")
        return cast(Json, _merge(current, applied))
    raise ApiStatus(
        415,
        "UnsupportedMediaType",
        f"the body of the request was in an unknown format - accepted media types include: "
        f"{JSON_PATCH}, {MERGE}, {APPLY}, {STRATEGIC}",
    )


def _merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge(result.get(key), value)
    return result


def _json_patch(document: Json, operations: Any) -> Json:
    """RFC 6902 JSON patch: add, replace, remove and test."""
    if not isinstance(operations, list):
        raise ApiStatus(400, "BadRequest", "a JSON patch is a list of operations")
    result: Json = json.loads(json.dumps(document))
    for operation in operations:
        op, path = operation.get("op"), operation.get("path", "")
        keys = [k.replace("~1", "/").replace("~0", "~") for k in path.split("/")[1:]]
        if not keys:
            raise ApiStatus(422, "Invalid", f"unsupported JSON patch path {path!r}")
        parent = result
        for key in keys[:-1]:
            if not isinstance(parent, dict) or key not in parent:
                raise ApiStatus(422, "Invalid", f"doc is missing path: {path!r}")
            parent = parent[key]
        last = keys[-1]
        if op == "add" or (op == "replace" and last in parent):
            parent[last] = operation["value"]
        elif op == "remove" and last in parent:
            del parent[last]
        elif op == "test" and parent.get(last) == operation.get("value"):
            pass
        else:
            raise ApiStatus(422, "Invalid", f"JSON patch operation {op!r} on {path!r} failed")
    return result


def _selector(text: str) -> Callable[[dict[str, str]], bool]:
    """Equality-based label selectors; set-based ones are not implemented (400)."""
    if "(" in text:
        raise ApiStatus(400, "BadRequest", "set-based selectors are not implemented by this fake")
    checks: list[Callable[[dict[str, str]], bool]] = []
    for requirement in filter(None, (part.strip() for part in text.split(","))):
        checks.append(_requirement(requirement))
    return lambda labels: all(check(labels) for check in checks)


def _requirement(text: str) -> Callable[[dict[str, str]], bool]:
    if "!=" in text:
        key, value = text.split("!=", 1)
        return lambda labels: labels.get(key) != value
    if "=" in text:
        key, value = text.replace("==", "=").split("=", 1)
        return lambda labels: labels.get(key) == value
    if text.startswith("!"):
        return lambda labels: text[1:] not in labels
    return lambda labels: text in labels


def _decode_json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise ApiStatus(400, "BadRequest", f"invalid JSON: {exc}") from exc


def _check_name(scale: Any, name: str) -> None:
    if not isinstance(scale, dict):
        raise ApiStatus(400, "BadRequest", "the body must be a Scale object")
    given = (scale.get("metadata") or {}).get("name")
    if given != name:
        raise ApiStatus(
            400,
            "BadRequest",
            f"the name of the object ({given}) does not match the name on the URL ({name})",
        )


def _method_not_allowed(request: web.Request) -> ApiStatus:
    return ApiStatus(
        405,
        "MethodNotAllowed",
        f"the server does not allow this method on the requested resource ({request.method})",
    )


def _replicas(body: Any) -> int | None:
    if isinstance(body, dict):
        return (body.get("spec") or {}).get("replicas")
    if isinstance(body, list):  # a JSON patch
        return next((op.get("value") for op in body if op.get("path") == "/spec/replicas"), None)
    return None


def _is_int32(value: str) -> bool:
    try:
        return -(2**31) <= int(value) < 2**31
    except ValueError:
        return False


def _timestamp(monotonic_at: float) -> str:
    wall = time.time() - (time.monotonic() - monotonic_at)
    return datetime.fromtimestamp(wall, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _json(body: Json, status: int = 200) -> web.Response:
    # Exactly `application/json`, as the API server sends: lightkube turns an error into
    # ApiError only when the Content-Type header is that string.
    return web.Response(
        status=status, body=json.dumps(body).encode(), content_type="application/json"
    )
