"""The semantic cache's settings (`cache` in the configuration; README "Semantic cache").
Part of the one settings tree (`gateway.settings`, which re-exports every name here)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr

from gateway.settings_types import Strict


class EmbedderEndpoint(Strict):
    """The deployment's own embedder for the cache: an OpenAI-compatible embeddings endpoint
    (cache/remote_embedder.py), its similarity threshold from `gateway cache calibrate`."""

    base_url: str  # e.g. http://tei:8080/v1 (POST {base_url}/embeddings)
    model: str
    api_key: SecretStr | None = None
    timeout_s: float = Field(default=2.0, gt=0)


class CacheSettings(Strict):
    """The semantic cache. See README "Semantic cache" for the tiers and their defaults."""

    enabled: bool = True
    model_path: str | None = None  # a sentence-transformers folder; None: the packaged MiniLM
    device: str | None = None  # None: cuda when available, else cpu
    # What runs the embedding model: onnx-int8 or onnx (ONNX Runtime, int8 or float32
    # weights, CPU only), torch, or auto: onnx-int8 on the CPU, torch on CUDA (README
    # "Semantic cache").
    embedder: Literal["auto", "onnx", "onnx-int8", "torch"] = "auto"
    path: Path = Path(".gateway/cache")  # where the `memory` state store persists entries
    ttl_s: float = Field(default=7 * 86400, gt=0)
    max_entries_per_namespace: int = Field(default=10_000, ge=1)
    lookup_budget_ms: float = Field(default=50.0, gt=0)
    batch_window_ms: float = Field(default=2.0, ge=0)
    max_batch: int = Field(default=32, ge=1)
    max_temperature: float = Field(default=1.0, ge=0)
    cacheable_tools: list[str] = Field(default_factory=list)
    semantic: bool = True  # tier 3 (verified embedding similarity); tiers 1-2 always on
    # None: the packaged MiniLM (`embedder`, `model_path`); else this endpoint, whose
    # semantic tier needs a calibration (`gateway cache calibrate`) before it serves a hit.
    embedder_endpoint: EmbedderEndpoint | None = None

    def calibration_path(self) -> Path:
        return self.path / "calibration.json"
