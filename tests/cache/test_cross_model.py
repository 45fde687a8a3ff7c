"""The gateway's cross-attention pair model (cache/cross.py, numpy) computes the logits of the
torch model that trains it (scripts/cross_model.py), from the float16 file training saves."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
if str(SCRIPTS) not in sys.path:
    sys.path.insert(0, str(SCRIPTS))

from cross_model import Cross, round_to_half, save, torch_batch  # noqa: E402

from cache.cross import PairModel, Side  # noqa: E402
from cache.embedder import default_model_path  # noqa: E402


def _side(rng: np.random.Generator, n: int, vocabulary: int = 40) -> Side:
    ids = np.concatenate([[101], rng.integers(1000, 1000 + vocabulary, n - 2), [102]])
    return ids.astype(np.uint16), rng.normal(size=(n, 384)).astype(np.float16)


def test_the_numpy_port_gives_the_torch_logits_from_the_saved_weights(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Cross(2, default_model_path() / "model.safetensors").eval()
    with torch.no_grad():  # trained-looking parameters: the fresh ones start at zero
        for param in (model.segment, model.shared, model.head.weight):
            param.normal_(0, 0.5)
    round_to_half(model)
    path = tmp_path / "cross.safetensors"
    save(model, 0.97, {"seed": 0}, path)
    ported = PairModel.load(path)
    assert ported.threshold == 0.97

    rng = np.random.default_rng(1)
    # Different lengths, so rows are padded; a shared vocabulary, so pieces are shared.
    pairs = [(_side(rng, a), _side(rng, b)) for a, b in ((3, 9), (12, 5), (7, 7), (20, 2))]
    with torch.inference_mode():
        want = model(torch_batch(pairs)).double().numpy()
    got = ported.logits(pairs)
    assert np.abs(want).max() > 0.5  # the check below is not between two zeros
    np.testing.assert_allclose(got, want, atol=2e-3)
    alone = [ported.logits([pair])[0] for pair in pairs]
    np.testing.assert_allclose(alone, got, atol=1e-4)  # padding changes nothing


def test_the_shipped_weights_are_small_and_say_how_they_were_trained() -> None:
    from cache.cross import DEFAULT_WEIGHTS

    assert DEFAULT_WEIGHTS.stat().st_size < 25 * 2**20  # the bound on shipped weights
    shipped = PairModel.load()
    assert 0.5 < shipped.threshold < 1.0
    assert shipped.info["command"].startswith("python scripts/train_cross.py")
    assert shipped.info["args"]["input_layer"] == "6"  # the stored last-layer vectors
