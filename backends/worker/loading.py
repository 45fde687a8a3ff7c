"""Loading the worker's models in phases, in its compute thread, while the server says 503.

Every model goes through one phase before any model starts the next (see `startup.py`), so
the phases of the start-up report are plain sequential intervals: all weights read, then
all models built, then every model probed once with a real forward pass.

Chat models read their safetensors through `weights.load_state_dict_fast` and are assembled
around those tensors; with `--weight-loader transformers`, or when a folder has no
safetensors or a layout the assembly does not know, transformers' `from_pretrained` loads
them instead (in the building phase). Embedding models load through sentence-transformers.

Nothing heavy is imported at module level: the server imports this module before it opens
its socket, and torch and transformers are imported in the `importing` phase.
"""

from __future__ import annotations

import logging
import threading
import time
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING

from backends.worker.config import ModelSpec, WorkerConfig
from backends.worker.errors import ModelsLoading
from backends.worker.startup import Phase, StartupReport

if TYPE_CHECKING:
    import torch

    from backends.worker.embedder import Embedder
    from backends.worker.generator import ChatModel
    from backends.worker.registry import ModelRegistry

logger = logging.getLogger(__name__)

# How often a test hold looks for its file (test-only: see `WorkerConfig.hold_before_probe`).
HOLD_POLL_S = 0.05


class LoadCancelled(Exception):
    """The worker was asked to stop before its models were ready."""


class ModelSlot:
    """The loaded models, once there are any; until then every use answers 503."""

    def __init__(self, report: StartupReport) -> None:
        self._report = report
        self._registry: ModelRegistry | None = None

    @property
    def ready(self) -> bool:
        return self._registry is not None

    def fill(self, registry: ModelRegistry) -> None:
        self._registry = registry

    def get(self) -> ModelRegistry:
        if self._registry is None:
            raise ModelsLoading(self._report.phase)
        return self._registry


class ModelLoader:
    """Runs the phases; blocking, for the compute thread. `stopping` cancels between steps."""

    def __init__(self, config: WorkerConfig, report: StartupReport, stopping: threading.Event):
        self._config = config
        self._report = report
        self._stopping = stopping

    def run(self) -> ModelRegistry:
        from backends.worker.registry import ModelRegistry

        self._enter("importing")  # already begun by the server; checks for a stop
        device = self._import_libraries()
        self._enter("reading_weights")
        weights = {spec.name: self._read(spec, device) for spec in self._config.chat_models}
        self._enter("building")
        embedders = {
            spec.name: self._build_embedder(spec, device) for spec in self._config.embedding_models
        }
        chat_models = {
            spec.name: self._build_chat_model(spec, weights.pop(spec.name), device)
            for spec in self._config.chat_models
        }
        self._enter("probing")
        self._hold_for_test()
        probes: list[tuple[str, ChatModel | Embedder]] = [*embedders.items(), *chat_models.items()]
        for name, model in probes:
            self._probe(name, model)
        return ModelRegistry(embedders, chat_models)

    def _enter(self, phase: Phase) -> None:
        if self._stopping.is_set():
            raise LoadCancelled(phase)
        if self._report.phase != phase:
            self._report.begin(phase)

    def _import_libraries(self) -> str:
        import torch
        import transformers  # noqa: F401

        if self._config.embedding_models:
            import sentence_transformers  # noqa: F401
        for spec in self._config.chat_models:
            _import_model_class(spec.path)
        return choose_device(self._config.device, torch.cuda.is_available())

    def _read(self, spec: ModelSpec, device: str) -> dict[str, torch.Tensor] | None:
        from backends.worker.weights import load_state_dict_fast, weight_files

        method = self._config.weight_loader
        if method == "transformers" or not weight_files(spec.path):
            return None
        self._check_stopping()
        state, stats = load_state_dict_fast(spec.path, device=device, method=method)
        self._report.record(spec.name, kind="chat", device=device, **stats.as_json())
        logger.info("%s: read %.2f GB in %.2f s", spec.name, stats.bytes / 1e9, stats.seconds)
        return state

    def _build_chat_model(
        self, spec: ModelSpec, state: dict[str, torch.Tensor] | None, device: str
    ) -> ChatModel:
        from backends.worker.assembly import CheckpointMismatch
        from backends.worker.generator import ChatModel

        self._check_stopping()
        started = time.perf_counter()
        max_context = self._config.limits.max_context
        model: ChatModel | None = None
        if state is not None:
            try:
                model = ChatModel.assemble(spec, state, device, max_context)
            except CheckpointMismatch as exc:
                logger.warning("%s: %s; loading through transformers instead", spec.name, exc)
                self._report.record(spec.name, loader="transformers", fallback_reason=str(exc))
        if model is None:
            model = ChatModel.load(spec, device, max_context)
            self._report.record(
                spec.name, kind="chat", device=device, loader="transformers", bytes=model.bytes
            )
        self._report.record(spec.name, model_built_s=_since(started))
        return model

    def _build_embedder(self, spec: ModelSpec, device: str) -> Embedder:
        from backends.worker.embedder import Embedder

        self._check_stopping()
        started = time.perf_counter()
        embedder = Embedder.load(spec, device)
        self._report.record(
            spec.name,
            kind="embedding",
            device=device,
            loader="sentence-transformers",
            bytes=embedder.bytes,
            model_built_s=_since(started),
        )
        return embedder

    def _probe(self, name: str, model: ChatModel | Embedder) -> None:
        self._check_stopping()
        started = time.perf_counter()
        model.probe()
        self._report.record(name, first_forward_s=_since(started))

    def _hold_for_test(self) -> None:
        hold = self._config.hold_before_probe
        while hold is not None and not hold.exists():
            if self._stopping.wait(HOLD_POLL_S):
                raise LoadCancelled("probing")

    def _check_stopping(self) -> None:
        if self._stopping.is_set():
            raise LoadCancelled(self._report.phase)


def choose_device(requested: str | None, cuda_available: bool) -> str:
    if requested is not None:
        return requested
    return "cuda" if cuda_available else "cpu"


def _import_model_class(folder: Path) -> None:
    """Import the modelling code of the model in `folder` (transformers imports it lazily)."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    config = AutoConfig.from_pretrained(folder, local_files_only=True)
    with suppress(KeyError):  # an unknown architecture fails, with its own message, when built
        MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]


def _since(started: float) -> float:
    return round(time.perf_counter() - started, 4)
