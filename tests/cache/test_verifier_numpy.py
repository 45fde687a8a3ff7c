"""The verifier's numpy forward pass computes what the torch network it was trained as does,
on the shipped weights and with each feature switched off."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from cache.onnx_encoder import OnnxEncoder
from cache.verifier import (
    DEFAULT_WEIGHTS,
    NumpyNet,
    PairVerifier,
    Side,
    VerifierConfig,
    batch_sides,
    build_network,
    padded,
)

PAIRS = [
    ("Convert 5 km to miles", "Convert 5 miles to km"),
    ("How do I reverse a list in Python?", "How can I reverse a Python list?"),
    ("Sort the numbers ascending", "Sort the numbers descending"),
    ("Flights from Milan to Zurich", "Flights from Zurich to Milan"),
    ("hi", "Summarize this memo in two sentences: 'The office moves next week.'"),
    ("", "What is a monad?"),
]


def sides(verifier: PairVerifier, encoder: OnnxEncoder) -> tuple[list[Side], list[Side]]:
    left = [verifier.side(e.features) for e in encoder.encode([a for a, _ in PAIRS])]
    right = [verifier.side(e.features) for e in encoder.encode([b for _, b in PAIRS])]
    return left, right


def torch_logits(network: torch.nn.Module, left: list[Side], right: list[Side]) -> np.ndarray:
    with torch.inference_mode():
        return network.eval()(batch_sides(left), batch_sides(right)).double().numpy()


def test_the_shipped_weights_give_the_torch_networks_logits(
    verifier: PairVerifier, onnx_encoder: OnnxEncoder
) -> None:
    from safetensors import safe_open

    with safe_open(str(DEFAULT_WEIGHTS), framework="pt") as handle:
        config = VerifierConfig.from_json(dict(handle.metadata() or {})["config"])
    tensors = load_file(str(DEFAULT_WEIGHTS))
    tensors.pop("flag_table")
    network = build_network(config)
    network.load_state_dict(tensors)
    left, right = sides(verifier, onnx_encoder)
    want = torch_logits(network, left, right)
    got = NumpyNet(config, {k: v.numpy() for k, v in tensors.items()})(padded(left), padded(right))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert len(set(np.round(want, 2))) == len(PAIRS)  # pairs the network tells apart
    scores = [verifier.score(a, b) for a, b in zip(left, right, strict=True)]
    np.testing.assert_allclose(scores, 1 / (1 + np.exp(-want)), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("switch", ["use_exact", "use_order", "use_flags"])
def test_each_feature_switched_off_gives_the_torch_networks_logits(
    switch: str, verifier: PairVerifier, onnx_encoder: OnnxEncoder
) -> None:
    torch.manual_seed(0)
    config = dataclasses.replace(VerifierConfig(), **{switch: False})
    network = build_network(config)
    with torch.no_grad():  # away from the initial bias, so the features decide
        for parameter in network.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1)
    left, right = sides(verifier, onnx_encoder)
    want = torch_logits(network, left, right)
    weights = {k: v.detach().numpy() for k, v in network.state_dict().items()}
    np.testing.assert_allclose(
        NumpyNet(config, weights)(padded(left), padded(right)), want, rtol=1e-4, atol=1e-4
    )
