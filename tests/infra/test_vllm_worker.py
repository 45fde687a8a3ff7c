"""The vLLM worker (components/vllm-worker, overlays/prod-vllm), read with PyYAML: vLLM
serves the folder the weights stager publishes on the node-local volume, mounted read-only,
with a load format that reads safetensors in parallel, and the gateway configuration tells
the stager where that folder is."""

from __future__ import annotations

from pathlib import Path

from gateway.config_file import parse_settings
from gateway.settings import Backend, Settings
from tests.infra.manifests import (
    K8S,
    Doc,
    Kustomization,
    all_containers,
    base_documents,
    find,
    load_docs,
    pod_spec,
)
from warmpool.layout import safe_name

COMPONENT = K8S / "components" / "vllm-worker"
OVERLAY = K8S / "overlays" / "prod-vllm"
LOAD_FORMATS = {"runai_streamer", "fastsafetensors"}


def _patch() -> Doc:
    (patch,) = load_docs(COMPONENT / "worker-vllm.yaml")
    return patch


def _vllm() -> Doc:
    (container,) = pod_spec(_patch())["containers"]
    return container


def _config() -> Settings:
    path = OVERLAY / "gateway.yaml"
    return parse_settings(path.read_text(), str(path), {"REDIS_URL": "redis://redis:6379/0"})


def _served_backend() -> Backend:
    args = _vllm()["args"]
    model = args[args.index("--served-model-name") + 1]
    (backend,) = [b for b in _config().backends if model in b.models]
    return backend


def _named(items: list[Doc], name: str) -> Doc:
    (item,) = [i for i in items if i["name"] == name]
    return item


def test_the_overlay_is_prod_with_the_vllm_component() -> None:
    spec = Kustomization(OVERLAY).spec
    assert spec["resources"] == ["../prod"]
    assert (OVERLAY / spec["components"][0]).resolve() == COMPONENT.resolve()
    vllm = _named(spec["images"], "vllm-openai")
    assert vllm["newTag"] not in ("", "latest")


def test_vllm_serves_the_staged_folder_from_the_node_local_volume_read_only() -> None:
    base = find(base_documents(), "Deployment", "model-worker")
    spec = pod_spec(base)
    volumes = {v["name"]: v for v in spec["volumes"]}
    worker = _named(spec["containers"], "worker")  # the patch keeps the base's mounts
    mounts = [m for m in worker["volumeMounts"] if "hostPath" in volumes[m["name"]]]
    (mount,) = mounts
    assert mount["readOnly"] is True
    assert not any(m["mountPath"] == mount["mountPath"] for m in _vllm().get("volumeMounts", []))

    container = _vllm()
    assert container["command"] == ["vllm", "serve"]
    folder = container["args"][0]
    assert folder == f"{mount['mountPath']}/{safe_name(_served_backend().name)}"
    # It waits for the stager's marker in that same folder.
    wait = _named(pod_spec(_patch())["initContainers"], "wait-for-weights")
    assert wait["command"][-1] == folder and '"$0/.complete"' in wait["command"][2]
    args = container["args"]
    assert args[args.index("--load-format") + 1] in LOAD_FORMATS


def test_the_stager_stages_that_backend_where_the_worker_reads() -> None:
    config, backend = _config(), _served_backend()
    assert backend.weights is not None and backend.engine == "vllm"
    stager = pod_spec(find(base_documents(), "DaemonSet", "weights-stager"))
    stages = [c for c in all_containers(stager) if c.get("args", [])[:1] == ["stage"]]
    assert any(c["args"][1] in (backend.name, *backend.models) for c in stages)
    (mount,) = [m for c in stages for m in c["volumeMounts"] if m["name"] == "weights"]
    assert Path(mount["mountPath"]) == config.staging.cache_dir


def test_the_gateway_sends_vllm_only_what_it_serves() -> None:
    # vLLM serves one model; the bundled worker also served embeddings.
    (backend,) = _config().backends
    assert backend.models == ["meta-llama/Llama-3.1-8B-Instruct"]
    assert backend.base_url == "http://model-worker:8000/v1"
