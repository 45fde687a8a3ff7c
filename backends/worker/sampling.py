"""Choosing the next token from the model's logits.

torch is imported where it is used, so that the server can build `SamplingParams` (and open
its socket) before torch has been imported.
"""

from __future__ import annotations

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


def make_generator(seed: int | None, device: torch.device) -> torch.Generator:
    import torch

    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator


def sample_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """Pick a token from one row of logits."""
    import torch

    if params.temperature == 0:
        return int(logits.argmax())
    probs = torch.softmax(logits.float() / params.temperature, dim=-1)
    if params.top_p >= 1:
        return int(torch.multinomial(probs, 1, generator=generator))
    sorted_probs, order = probs.sort(descending=True)
    # Keep the most likely tokens until their mass reaches top_p; the first always stays.
    outside = sorted_probs.cumsum(0) - sorted_probs >= params.top_p
    choice = torch.multinomial(sorted_probs.masked_fill(outside, 0), 1, generator=generator)
    return int(order[choice])
