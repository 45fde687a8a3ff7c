"""Sampling draws tokens as often as their probability says, each answer from its own seed."""

from __future__ import annotations

import math

import pytest
import torch

from backends.worker.sampling import SamplingParams, make_generator, sample_tokens

CPU = torch.device("cpu")
ROWS = 20_000


def frequencies(logits: list[float], params: SamplingParams) -> list[float]:
    rows = torch.tensor([logits]).expand(ROWS, -1)
    generators = [make_generator(seed=9, device=CPU, answer=row) for row in range(ROWS)]
    tokens = sample_tokens(rows, params, generators)
    return [tokens.count(token) / ROWS for token in range(len(logits))]


def test_tokens_come_as_often_as_their_probability() -> None:
    logits = [0.0, 1.0, 2.0, -math.inf, 0.5]
    expected = torch.softmax(torch.tensor(logits), dim=-1).tolist()
    seen = frequencies(logits, SamplingParams(max_tokens=1))
    assert seen[3] == 0
    assert seen == pytest.approx(expected, abs=0.015)


def test_temperature_and_top_p() -> None:
    logits = [math.log(0.5), math.log(0.3), math.log(0.2)]
    # top_p 0.6: 0.5 alone is short of it, so 0.3 stays too; 0.2 is cut.
    seen = frequencies(logits, SamplingParams(max_tokens=1, top_p=0.6))
    assert seen == pytest.approx([0.5 / 0.8, 0.3 / 0.8, 0.0], abs=0.015)
    sharper = frequencies(logits, SamplingParams(max_tokens=1, temperature=0.5))
    weights = [0.5**2, 0.3**2, 0.2**2]
    assert sharper == pytest.approx([w / sum(weights) for w in weights], abs=0.015)
    greedy = frequencies(logits, SamplingParams(max_tokens=1, temperature=0))
    assert greedy == [1.0, 0.0, 0.0]


def test_each_answer_repeats_with_its_seed_whatever_the_others() -> None:
    logits = torch.randn(1, 1000, generator=torch.Generator().manual_seed(0)).expand(4, -1)
    params = SamplingParams(max_tokens=1)

    def draw(answers: list[int], seed: int = 1) -> list[int]:
        generators = [make_generator(seed, CPU, answer) for answer in answers]
        rows = logits[: len(answers)]
        return [token for _ in range(5) for token in sample_tokens(rows, params, generators)]

    together = draw([0, 1, 2, 3])
    assert draw([2]) == together[2::4]
    assert draw([0, 1, 2, 3]) == together
    assert draw([0, 1, 2, 3], seed=2) != together
    assert len(set(together[0::4]) | set(together[1::4])) > 5  # rows do not draw alike
