"""Choosing the next token of each answer being written from the model's logits.

torch is imported where it is used, so that the server can build `SamplingParams` (and open
its socket) before torch has been imported.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()


# Spreads the answers' seeds apart (the 64-bit golden ratio, as in splitmix64).
_SEED_STRIDE = 0x9E3779B97F4A7C15


def make_generator(seed: int | None, device: torch.device, answer: int = 0) -> torch.Generator:
    """The random state of one answer. Each answer to a prompt has its own, so a seed makes
    each answer repeat whatever the others do (answer 0 of any `n` is the answer for n = 1).
    """
    import torch

    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed((seed + answer * _SEED_STRIDE) % 2**64)
    return generator


def sample_tokens(
    logits: torch.Tensor, params: SamplingParams, generators: Sequence[torch.Generator]
) -> list[int]:
    """Pick a token for each row of logits (one answer each), with that answer's generator.

    Each row takes one uniform draw from its generator and finds it in the row's cumulative
    distribution (inverse transform): one draw per token, where `torch.multinomial` makes one
    per vocabulary entry, and the search runs on all rows at once.
    """
    import torch

    if params.temperature == 0:
        return [int(token) for token in logits.argmax(dim=-1).tolist()]
    probs = torch.softmax(logits.float() / params.temperature, dim=-1)
    order = None
    if params.top_p < 1:
        probs, order = probs.sort(dim=-1, descending=True)
        # Keep the most likely tokens until their mass reaches top_p; the first always stays.
        outside = probs.cumsum(dim=-1) - probs >= params.top_p
        probs = probs.masked_fill(outside, 0)
    cdf = probs.double().cumsum(dim=-1)
    draws = torch.cat(
        [torch.rand(1, generator=g, device=g.device, dtype=torch.float64) for g in generators]
    )
    # `right=True`: the first entry whose cumulative mass exceeds the draw, never one of mass 0.
    targets = (draws.to(cdf.device) * cdf[:, -1]).unsqueeze(-1)
    chosen = torch.searchsorted(cdf, targets, right=True).squeeze(-1)
    chosen = chosen.clamp_(max=cdf.shape[-1] - 1)
    if order is not None:
        chosen = order.gather(-1, chosen.unsqueeze(-1)).squeeze(-1)
    return [int(token) for token in chosen.tolist()]
