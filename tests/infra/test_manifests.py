"""Static checks of infra/k8s: YAML, kustomize references, and the properties that matter
for safety (probes, non-root, GPU, least-privilege RBAC, no secrets in the repository).

No cluster and no kustomize binary: the checks read the files with PyYAML.
"""

from __future__ import annotations

import base64
import fnmatch
import re
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from gateway.batches.blobs import refuse_unshared_blobs
from gateway.config_file import parse_settings
from gateway.settings import Settings
from tests.infra.manifests import (
    BASE,
    INFRA,
    K8S,
    OVERLAYS,
    ROOT,
    Doc,
    Kustomization,
    all_containers,
    base_documents,
    find,
    generator_paths,
    kustomization_dirs,
    literal_values,
    load_docs,
    of_kind,
    pod_spec,
    yaml_files,
)

WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob")
GATEWAY_IMAGES = {"inference-gateway", "inference-gateway-cuda"}


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


# ---- YAML and kustomize structure ------------------------------------------------------


@pytest.mark.parametrize("path", yaml_files(), ids=_rel)
def test_every_yaml_file_parses_without_duplicate_keys(path: Path) -> None:
    assert "\t" not in path.read_text(), "tabs in YAML"
    load_docs(path)


def test_there_is_a_base_and_dev_and_prod_overlays() -> None:
    assert (BASE / "kustomization.yaml").is_file()
    assert {p.name for p in OVERLAYS} >= {"dev", "prod"}


@pytest.mark.parametrize("directory", kustomization_dirs(), ids=_rel)
def test_kustomization_references_exist(directory: Path) -> None:
    kustomization = Kustomization(directory)
    for what, name in kustomization.references():
        assert "://" not in name and not name.startswith("github.com"), (
            f"{_rel(directory)}: remote {what} {name!r}: vendor it so builds are reproducible"
        )
        path = directory / name
        assert path.exists(), f"{_rel(directory)}: {what} {name!r} does not exist"
        if what in ("resources", "components") and path.is_dir():
            Kustomization(path.resolve())  # has a kustomization file
        if what == "components":
            assert Kustomization(path.resolve()).spec["kind"] == "Component"


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_overlay_builds_on_the_base_and_every_patch_has_a_target(overlay: Path) -> None:
    kustomization = Kustomization(overlay)
    reached = kustomization.reaches()
    assert BASE.resolve() in reached, f"{overlay.name} does not include the base"
    docs = kustomization.documents()
    names = {(doc["kind"], doc["metadata"]["name"]) for doc in docs}
    # kustomize ignores a patch whose target matches nothing: a renamed object would leave
    # its patch silently unapplied.
    for directory in reached:
        for patch, kind, name in Kustomization(directory).patch_targets():
            assert (kind, name) in names, f"{_rel(directory)}: {patch} targets no {kind} {name}"


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_overlay_sets_a_namespace_and_every_gateway_image(overlay: Path) -> None:
    kustomization = Kustomization(overlay)
    assert kustomization.spec.get("namespace") == "inference-gateway"
    # An overlay on another overlay (prod-vllm on prod) keeps the image mappings below it.
    images = {
        entry["name"]: entry
        for directory in kustomization.reaches()
        for entry in Kustomization(directory).spec.get("images", [])
    }
    assert set(images) >= GATEWAY_IMAGES, f"{overlay.name} must map both gateway images"
    for name in GATEWAY_IMAGES:
        assert images[name].get("newTag") != "latest" and (
            "newTag" in images[name] or "digest" in images[name]
        ), f"{overlay.name}: pin {name} to a tag or digest"


def test_base_workload_images_are_only_the_two_gateway_images() -> None:
    for workload in of_kind(base_documents(), *WORKLOAD_KINDS):
        for container in all_containers(pod_spec(workload)):
            assert container["image"] in GATEWAY_IMAGES, container["image"]


def test_no_cluster_roles_and_no_hard_coded_namespaces() -> None:
    # Overlays place everything in their namespace; RBAC stays inside it.
    docs = [doc for overlay in OVERLAYS for doc in Kustomization(overlay).documents()]
    assert not of_kind(docs, "ClusterRole", "ClusterRoleBinding")
    assert not [doc for doc in docs if "namespace" in doc.get("metadata", {})]


# ---- the gateway ----------------------------------------------------------------------------


def _gateway() -> Doc:
    return find(base_documents(), "Deployment", "gateway")


def _container(workload: Doc, name: str) -> Doc:
    (container,) = [c for c in pod_spec(workload)["containers"] if c["name"] == name]
    return container


def _pod_labels(workload: Doc) -> dict[str, str]:
    labels: dict[str, str] = workload["spec"]["template"]["metadata"]["labels"]
    return labels


def _probe_port(container: Doc, probe: str) -> int:
    port = container[probe]["httpGet"]["port"]
    if isinstance(port, int):
        return port
    (named,) = [p["containerPort"] for p in container["ports"] if p["name"] == port]
    return int(named)


def test_gateway_runs_several_replicas_and_probes_readyz_and_healthz() -> None:
    gateway = _gateway()
    assert gateway["spec"]["replicas"] >= 2
    container = _container(gateway, "gateway")
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["startupProbe"]["httpGet"]["path"] == "/healthz"
    config = _config(BASE / "gateway.yaml")
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert _probe_port(container, probe) == config.listen.port
    assert container["args"] == ["serve", "--config", "/etc/gateway/gateway.yaml"]


def test_gateway_has_requests_and_limits() -> None:
    resources = _container(_gateway(), "gateway")["resources"]
    assert {"cpu", "memory"} <= set(resources["requests"])
    assert "memory" in resources["limits"]


def test_gateway_is_non_root_with_a_read_only_root_filesystem() -> None:
    gateway = _gateway()
    spec = pod_spec(gateway)
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    context = _container(gateway, "gateway")["securityContext"]
    assert context["runAsNonRoot"] is True
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"]["drop"] == ["ALL"]


def test_gateway_reads_its_config_and_secrets_from_the_cluster() -> None:
    gateway = _gateway()
    spec = pod_spec(gateway)
    volumes = {v["name"]: v for v in spec["volumes"]}
    container = _container(gateway, "gateway")
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert volumes[mounts["/etc/gateway"]["name"]]["configMap"]["name"] == "gateway-config"
    env = {e["name"]: e for e in container["env"]}
    assert env["REDIS_URL"]["valueFrom"]["secretKeyRef"]["name"] == "gateway-secrets"
    assert spec["serviceAccountName"] == "gateway"
    assert spec["enableServiceLinks"] is False


def test_gateway_has_a_disruption_budget_and_an_autoscaler() -> None:
    docs = base_documents()
    pdb = find(docs, "PodDisruptionBudget", "gateway")
    labels = _pod_labels(_gateway())
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    hpa = find(docs, "HorizontalPodAutoscaler", "gateway")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "gateway",
    }
    assert hpa["spec"]["minReplicas"] >= 2


def test_services_select_their_pods() -> None:
    docs = base_documents()
    workloads = of_kind(docs, *WORKLOAD_KINDS)
    for service in of_kind(docs, "Service"):
        selector = service["spec"]["selector"].items()
        assert any(selector <= _pod_labels(w).items() for w in workloads), service


# ---- the model worker and weight staging ------------------------------------------------


def _worker() -> Doc:
    return find(base_documents(), "Deployment", "model-worker")


def test_worker_starts_at_zero_replicas_with_one_gpu() -> None:
    worker = _worker()
    assert worker["spec"]["replicas"] == 0
    container = _container(worker, "worker")
    assert int(container["resources"]["limits"]["nvidia.com/gpu"]) == 1
    assert int(container["resources"]["requests"].get("nvidia.com/gpu", 1)) == 1
    spec = pod_spec(worker)
    assert any(t["key"] == "nvidia.com/gpu" for t in spec["tolerations"])
    assert spec["nodeSelector"]


def test_worker_reads_weights_from_a_node_local_volume() -> None:
    worker = _worker()
    volumes = {v["name"]: v for v in pod_spec(worker)["volumes"]}
    (mount,) = [
        m
        for m in _container(worker, "worker")["volumeMounts"]
        if "hostPath" in volumes[m["name"]] or "persistentVolumeClaim" in volumes[m["name"]]
    ]
    assert mount["readOnly"] is True
    args = _container(worker, "worker")["args"]
    model_path = args[args.index("--chat-model") + 1].split("=", 1)[1]
    assert model_path.startswith(mount["mountPath"] + "/")
    # It starts once the stager has published that folder (warmpool's `.complete` marker).
    (wait,) = [c for c in pod_spec(worker)["initContainers"] if c["name"] == "wait-for-weights"]
    assert wait["command"][-1] == model_path
    assert '"$0/.complete"' in wait["command"][2]


def test_weights_are_staged_on_gpu_nodes_ahead_of_time() -> None:
    docs = base_documents()
    stager = find(docs, "DaemonSet", "weights-stager")
    worker = _worker()
    stager_spec, worker_spec = pod_spec(stager), pod_spec(worker)
    assert stager_spec["nodeSelector"] == worker_spec["nodeSelector"]
    assert stager_spec["tolerations"] == worker_spec["tolerations"]

    def host_path(spec: Doc) -> str:
        (path,) = [v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v]
        return str(path)

    assert host_path(stager_spec) == host_path(worker_spec)
    stages = [c for c in all_containers(stager_spec) if c.get("args", [])[:1] == ["stage"]]
    assert stages, "no `gateway stage MODEL` step in the stager"
    served = _container(worker, "worker")["args"]
    model = served[served.index("--chat-model") + 1].split("=", 1)[0]
    assert model in {c["args"][1] for c in stages}


def test_only_gpu_containers_see_gpus() -> None:
    # On GPU nodes the NVIDIA runtime exposes every GPU to a container whose image says
    # NVIDIA_VISIBLE_DEVICES=all (the CUDA base does) unless the device plugin assigned it
    # some: containers that request none must say `void`.
    for workload in of_kind(base_documents(), *WORKLOAD_KINDS):
        spec = pod_spec(workload)
        if not any(t["key"] == "nvidia.com/gpu" for t in spec.get("tolerations", [])):
            continue
        for container in all_containers(spec):
            if "nvidia.com/gpu" in container["resources"].get("limits", {}):
                continue
            env = {e["name"]: e.get("value") for e in container.get("env", [])}
            assert env.get("NVIDIA_VISIBLE_DEVICES") == "void", container["name"]


def test_every_container_is_locked_down_and_sized() -> None:
    for workload in of_kind(base_documents(), *WORKLOAD_KINDS):
        spec = pod_spec(workload)
        assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        for container in all_containers(spec):
            where = f"{workload['metadata']['name']}/{container['name']}"
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False, where
            assert context["readOnlyRootFilesystem"] is True, where
            assert context["capabilities"]["drop"] == ["ALL"], where
            if context.get("runAsUser") == 0:
                # Only a one-shot init step may be root, and only to chown.
                assert container in spec["initContainers"], where
                assert set(context["capabilities"].get("add", [])) <= {"CHOWN"}, where
            else:
                assert context.get("runAsNonRoot", spec["securityContext"]["runAsNonRoot"]), where
            resources = container["resources"]
            assert {"cpu", "memory"} <= set(resources["requests"]), where
            assert "memory" in resources["limits"], where


def test_components_point_at_base_objects() -> None:
    docs = base_documents()
    components = K8S / "components"
    (scaled,) = Kustomization(components / "keda-worker-autoscaling").documents()
    target = find(docs, "Deployment", scaled["spec"]["scaleTargetRef"]["name"])
    assert target["spec"]["replicas"] == 0, "KEDA scales a worker, never the gateway"
    assert scaled["spec"]["minReplicaCount"] == 0
    # It scales on the replicas the gateways' learned capacity says the demand needs.
    (desired,) = [
        t for t in scaled["spec"]["triggers"] if "desired_replicas" in t["metadata"]["query"]
    ]
    assert desired["metadata"]["query"].startswith("max(gateway_backend_desired_replicas{")
    assert desired["metadata"]["threshold"] == "1"
    monitor = find(
        Kustomization(components / "monitoring").documents(), "ServiceMonitor", "gateway"
    )
    service = find(docs, "Service", "gateway")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= (
        service["metadata"]["labels"].items()
    )
    ports = {p["name"] for p in service["spec"]["ports"]}
    assert all(e["port"] in ports and e["path"] == "/metrics" for e in monitor["spec"]["endpoints"])
    # /metrics is closed without an operator key: the scrape sends the one the gateway reads.
    env = find(docs, "Deployment", "gateway")["spec"]["template"]["spec"]["containers"][0]["env"]
    (operator,) = [
        e["valueFrom"]["secretKeyRef"] for e in env if e["name"] == "GATEWAY_OPERATOR_KEY"
    ]
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["authorization"]["type"] == "Bearer"
        sent = endpoint["authorization"]["credentials"]
        assert (sent["name"], sent["key"]) == (operator["name"], operator["key"])


# ---- RBAC ------------------------------------------------------------------------------


def test_gateway_may_scale_only_its_worker_deployments() -> None:
    docs = base_documents()
    (role,) = of_kind(docs, "Role")
    workers = {
        d["metadata"]["name"]
        for d in of_kind(docs, "Deployment")
        if d["spec"]["replicas"] == 0 and d["metadata"]["name"] != "gateway"
    }
    scale_rules = [r for r in role["rules"] if "deployments/scale" in r["resources"]]
    assert scale_rules
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"], rule
        assert not {"secrets", "deployments", "pods/exec"} & set(rule["resources"]), rule
        if "deployments/scale" in rule["resources"]:
            assert rule["resources"] == ["deployments/scale"]
            assert rule["apiGroups"] == ["apps"]
            assert set(rule["verbs"]) <= {"get", "patch", "update"}
            assert rule.get("resourceNames"), "deployments/scale without resourceNames"
            assert set(rule["resourceNames"]) <= workers
        else:
            assert set(rule["resources"]) <= {"endpoints", "endpointslices"}, rule
            assert set(rule["verbs"]) <= {"get", "list", "watch"}, rule
    (binding,) = of_kind(docs, "RoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gateway"}]


def test_only_the_gateway_pod_gets_an_api_token() -> None:
    docs = base_documents()
    for account in of_kind(docs, "ServiceAccount"):
        assert account["automountServiceAccountToken"] is False
    for workload in of_kind(docs, *WORKLOAD_KINDS):
        token = pod_spec(workload).get("automountServiceAccountToken", False)
        assert token == (workload["metadata"]["name"] == "gateway"), workload["metadata"]["name"]


# ---- configuration ----------------------------------------------------------------------

_ENVIRON = {"REDIS_URL": "redis://redis:6379/0", "GATEWAY_DEMO_KEY": "sk-gw-test"}


def _config(path: Path) -> Settings:
    return parse_settings(path.read_text(), str(path), _ENVIRON)


def _config_files() -> list[Path]:
    files = []
    for directory in kustomization_dirs():
        for entry in Kustomization(directory).spec.get("configMapGenerator", []):
            if entry["name"] == "gateway-config":
                files.extend(directory / name for name in generator_paths(entry))
    return files


@pytest.mark.parametrize("path", _config_files(), ids=_rel)
def test_gateway_config_is_valid_and_points_at_services(path: Path) -> None:
    config = _config(path)  # the gateway's own validation: raises ConfigError
    assert config.listen.host == "0.0.0.0"
    assert "${REDIS_URL}" in path.read_text(), "state.url must come from the Secret"
    overlay = path.parent
    services = {
        s["metadata"]["name"]: {p["port"] for p in s["spec"]["ports"]}
        for s in of_kind(Kustomization(overlay).documents(), "Service")
    }
    for backend in config.backends:
        address = urlsplit(backend.base_url)
        assert address.hostname in services, f"{backend.name}: no Service {address.hostname}"
        assert address.port in services[address.hostname], backend.base_url


@pytest.mark.parametrize("path", _config_files(), ids=_rel)
def test_replicas_share_batch_files_or_run_no_batches(path: Path) -> None:
    # What `gateway serve` checks before it listens: with job records in Redis, batch files
    # on each pod's own disk would be lost to the replica that claims a job (#37).
    config = _config(path)
    refuse_unshared_blobs(config)
    if "prod" in path.parts[-2] or path.parent.name == "base":
        files = config.batches.files
        assert config.batches.enabled and files.store == "s3" and files.bucket
        assert files.s3.access_key_id is None, "IRSA (the gateway role), not static keys"


def test_the_gateway_role_is_its_own_and_not_the_weights_reader() -> None:
    prod = load_docs(K8S / "overlays" / "prod" / "serviceaccounts-irsa.yaml")
    roles = {doc["metadata"]["name"]: doc["metadata"]["annotations"] for doc in prod}
    assert roles["gateway"]["eks.amazonaws.com/role-arn"].endswith("-gateway")
    assert roles["model-weights"]["eks.amazonaws.com/role-arn"].endswith("-weights-reader")


def _strings(node: object) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [s for value in node.values() for s in _strings(value)]
    if isinstance(node, list):
        return [s for value in node for s in _strings(value)]
    return []


def test_every_container_reading_the_config_has_its_variables() -> None:
    # The gateway CLI loads the configuration before any command: a `${NAME}` without a
    # default that the container's environment lacks stops `serve` and `stage` alike.
    (config,) = load_docs(BASE / "gateway.yaml")
    required = set(re.findall(r"\$\{(\w+)\}", " ".join(_strings(config))))
    assert required
    readers = 0
    for workload in of_kind(base_documents(), *WORKLOAD_KINDS):
        for container in all_containers(pod_spec(workload)):
            if "/etc/gateway/gateway.yaml" not in container.get("args", []):
                continue
            readers += 1
            env = {item["name"] for item in container.get("env", [])}
            assert required <= env, f"{container['name']} lacks {required - env}"
    assert readers >= 2  # the gateway and the stager


# ---- secrets ----------------------------------------------------------------------------

_PLACEHOLDER = re.compile(r"replace[_-]?me|change[_-]?me|placeholder", re.IGNORECASE)
_SECRET_PATTERNS = {
    "AWS access key id": re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),
    "private key": re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
    "gateway API key": re.compile(r"sk-gw-[A-Za-z0-9_]{24,}"),
    "password in a URL": re.compile(r"[a-z][a-z0-9+.-]*://[^/\s:@]*:[^/\s@$<]{6,}@"),
}


def is_placeholder(value: str) -> bool:
    """An empty value, a marked placeholder, or a URL that carries no credentials."""
    if not value or _PLACEHOLDER.search(value):
        return True
    if "://" in value:
        parts = urlsplit(value)
        return parts.password is None or bool(_PLACEHOLDER.search(parts.password))
    return False


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("", True),
        ("REPLACE_ME", True),
        ("dev-admin-key-change-me", True),
        ("redis://redis:6379/0", True),
        ("rediss://:REPLACE_ME@host:6379/0", True),
        ("rediss://:s3cr3tT0kenValue@host:6379/0", False),
        ("sk-gw-9Jd8s7Hq2LmN4pQrStUvWxYz", False),
        ("hunter2", False),
    ],
)
def test_placeholder_rule(value: str, ok: bool) -> None:
    assert is_placeholder(value) is ok


def _secret_values() -> list[tuple[str, str, str]]:
    """(where, key, value) for every Secret document and secretGenerator entry."""
    found = []
    for path in yaml_files():
        for doc in load_docs(path):
            if doc.get("kind") != "Secret":
                continue
            for key, value in doc.get("stringData", {}).items():
                found.append((_rel(path), key, str(value)))
            for key, value in doc.get("data", {}).items():
                found.append((_rel(path), key, base64.b64decode(value).decode()))
    for directory in kustomization_dirs():
        for entry in Kustomization(directory).spec.get("secretGenerator", []):
            for key, value in literal_values(entry):
                found.append((_rel(directory), key, value))
            for name in generator_paths(entry):
                for line in (directory / name).read_text().splitlines():
                    key, _, value = line.partition("=")
                    found.append((f"{_rel(directory)}/{name}", key, value))
    return found


def test_secrets_hold_only_placeholders() -> None:
    values = _secret_values()
    assert values, "expected the dev secretGenerator and the prod example"
    for where, key, value in values:
        assert is_placeholder(value), f"{where}: {key} looks like a real secret"


# Local Terraform state and inputs: git-ignored (infra/terraform/.gitignore), never committed.
_LOCAL_ONLY = ("*.tfstate", "*.tfstate.*", "*.tfplan", "terraform.tfvars", "*.auto.tfvars")


def _scanned_files() -> list[Path]:
    files = [
        p
        for p in INFRA.rglob("*")
        if p.is_file()
        and ".terraform" not in p.parts
        and not any(fnmatch.fnmatch(p.name, pattern) for pattern in _LOCAL_ONLY)
    ]
    return [*files, ROOT / "Dockerfile", ROOT / ".dockerignore"]


@pytest.mark.parametrize("path", _scanned_files(), ids=_rel)
def test_no_credentials_anywhere_in_infra(path: Path) -> None:
    text = path.read_text(errors="replace")
    for what, pattern in _SECRET_PATTERNS.items():
        for match in pattern.finditer(text):
            assert _PLACEHOLDER.search(match.group()), f"{what} in {_rel(path)}"


def test_prod_expects_the_secret_instead_of_generating_it() -> None:
    spec = Kustomization(K8S / "overlays" / "prod").spec
    assert "secretGenerator" not in spec
    example = load_docs(K8S / "overlays" / "prod" / "gateway-secrets.example.yaml")
    assert {"redis-url", "admin-key"} <= set(
        find(example, "Secret", "gateway-secrets")["stringData"]
    )
    assert all(name != "gateway-secrets.example.yaml" for name in spec.get("resources", []))


def test_secrets_reach_pods_by_reference_only() -> None:
    for workload in of_kind(base_documents(), *WORKLOAD_KINDS):
        for container in all_containers(pod_spec(workload)):
            for item in container.get("env", []):
                assert not re.search(r"key|token|password|secret", item["name"], re.I) or (
                    "valueFrom" in item
                ), f"{container['name']}: {item['name']} set inline"
    # IRSA, not static AWS keys, in the prod overlay.
    prod = load_docs(K8S / "overlays" / "prod" / "serviceaccounts-irsa.yaml")
    annotations = [doc["metadata"]["annotations"] for doc in prod]
    assert all("eks.amazonaws.com/role-arn" in a for a in annotations)


def test_yaml_loader_refuses_duplicate_keys(tmp_path: Path) -> None:
    path = tmp_path / "twice.yaml"
    path.write_text("kind: Service\nkind: Deployment\n")
    with pytest.raises(yaml.YAMLError, match="duplicate key"):
        load_docs(path)
