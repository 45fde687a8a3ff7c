"""A transformers causal LM built around tensors that are already loaded.

The model is constructed with its parameters on the meta device (no memory, no random
initialisation), then every parameter is replaced by the loaded tensor itself
(`load_state_dict(assign=True)`): nothing is copied or cast. Buffers are built for real,
because the ones a checkpoint lacks (rotary frequencies) are computed in `__init__`.

This works for checkpoints whose names match the module's parameters, as `save_pretrained`
writes them for decoder-only LMs. Anything else (renamed legacy keys, fused experts,
quantised weights) raises `CheckpointMismatch`, and the caller loads through transformers.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel


class CheckpointMismatch(Exception):
    """The checkpoint's tensors do not map one to one onto the model's parameters."""


def assemble_causal_lm(
    folder: Path, state: dict[str, torch.Tensor], device: str
) -> PreTrainedModel:
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    config = AutoConfig.from_pretrained(folder, local_files_only=True)
    dtype = getattr(config, "dtype", None) or _first_float_dtype(state)
    with parameters_on_meta():
        model: PreTrainedModel = AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
            config, dtype=dtype
        )
    result = model.load_state_dict(state, strict=False, assign=True)
    model.tie_weights()
    left_empty = [name for name, parameter in model.named_parameters() if parameter.is_meta]
    if result.unexpected_keys or left_empty:
        raise CheckpointMismatch(
            f"unexpected {sorted(result.unexpected_keys)[:5]}, missing {left_empty[:5]}"
        )
    if (folder / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(folder, local_files_only=True)
    model.requires_grad_(False)
    # Parameters are on `device` already; this moves the buffers built on the CPU.
    # (transformers types `to` through a decorator that mypy reads wrongly.)
    model.to(device).eval()  # type: ignore[arg-type]
    return model


@contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Modules built inside get parameters on the meta device; buffers stay real.

    As accelerate's `init_empty_weights(include_buffers=False)`, by patching
    `Module.register_parameter` for the duration: models must be built in one thread at a
    time (the worker builds them all in its one compute thread).
    """
    original = torch.nn.Module.register_parameter

    def register(module: torch.nn.Module, name: str, param: torch.nn.Parameter | None) -> None:
        original(module, name, param)
        if param is not None and not param.is_meta:
            empty = param.to("meta")
            module._parameters[name] = type(param)(empty, requires_grad=param.requires_grad)

    torch.nn.Module.register_parameter = register  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = original  # type: ignore[method-assign]


def _first_float_dtype(state: dict[str, torch.Tensor]) -> torch.dtype | None:
    return next((t.dtype for t in state.values() if t.is_floating_point()), None)
