"""A randomly initialised Llama of a chosen size, for start-up tests and weight-loading benchmarks.

The architecture is the standard `LlamaForCausalLM`, scaled so that its weights take the
requested number of bytes (decimal GB): the hidden size is the largest multiple of 64 whose
two embedding matrices stay under a third of the budget with at least four layers beside
them, the layer count fills the rest (at most 32), and the MLP width absorbs the remainder.
Weights are bfloat16 by default: half the bytes of float32, the dtype most checkpoints ship
in, and torch runs it on the CPU, so the worker can probe the model there. They are drawn
from N(0, 0.02) like `initializer_range`, norms are ones; the text it writes is nonsense.

Files are laid out as `save_pretrained` lays them out: shards of at most `shard_gb` named
`model-0000i-of-0000n.safetensors` with `model.safetensors.index.json`, or one
`model.safetensors` when the weights fit in one shard. The tokenizer is MiniLM's, as in
`tiny_model`. `synthetic.json` records the parameters the folder was written with; it is
written last, and the folder is renamed into place only when whole.

    python scripts/make_synthetic_model.py --size-gb 1.0 /tmp/models/synthetic-1gb
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from backends.worker.tiny_model import CONTEXT_LENGTH, chat_tokenizer, write_folder_atomically
from backends.worker.weights import INDEX, SINGLE_FILE

if TYPE_CHECKING:
    import torch
    from transformers import LlamaConfig, PreTrainedTokenizerBase

MARKER = "synthetic.json"
BYTES_PER_GB = 1_000_000_000
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
HEAD_DIM = 64
MIN_LAYERS = 4
MAX_LAYERS = 32
INIT_STD = 0.02


@dataclass(frozen=True)
class LlamaShape:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int

    @property
    def num_attention_heads(self) -> int:
        return self.hidden_size // HEAD_DIM

    @property
    def num_key_value_heads(self) -> int:
        # Grouped-query attention where the heads divide evenly, as in most recent models.
        heads = self.num_attention_heads
        return heads // 4 if heads % 4 == 0 else heads

    @property
    def embedding_parameters(self) -> int:
        # Input embeddings and an untied output head, plus the final norm.
        return 2 * self.vocab_size * self.hidden_size + self.hidden_size

    @property
    def attention_parameters(self) -> int:
        """Per layer: q, k, v, o projections and the two norms."""
        hidden, kv_width = self.hidden_size, self.num_key_value_heads * HEAD_DIM
        return 2 * hidden * hidden + 2 * hidden * kv_width + 2 * hidden

    @property
    def parameters(self) -> int:
        mlp = 3 * self.hidden_size * self.intermediate_size
        return self.embedding_parameters + self.num_hidden_layers * (
            self.attention_parameters + mlp
        )


@dataclass(frozen=True)
class SyntheticSpec:
    """What `synthetic.json` records; a folder written with other values is not reused."""

    size_gb: float
    dtype: str
    shard_gb: float
    seed: int


def choose_shape(parameters: int, vocab_size: int) -> LlamaShape:
    """A Llama shape with `parameters` parameters, give or take a few hundred."""
    hidden = HEAD_DIM
    for candidate in range(8192, HEAD_DIM - 1, -HEAD_DIM):
        shape = LlamaShape(vocab_size, candidate, _default_width(candidate), MIN_LAYERS)
        if shape.embedding_parameters <= parameters / 3 and shape.parameters <= parameters:
            hidden = candidate
            break
    probe = LlamaShape(vocab_size, hidden, _default_width(hidden), 1)
    per_layer = probe.parameters - probe.embedding_parameters
    rest = parameters - probe.embedding_parameters
    layers = min(MAX_LAYERS, max(2, rest // per_layer))
    width = round((rest - layers * probe.attention_parameters) / (layers * 3 * hidden))
    if width < 1:
        smallest = LlamaShape(vocab_size, HEAD_DIM, 1, 2).parameters
        raise ValueError(f"{parameters} parameters is below the smallest model ({smallest})")
    return LlamaShape(vocab_size, hidden, width, layers)


def write_synthetic_model(
    dest: Path,
    size_gb: float,
    *,
    dtype: str = "bfloat16",
    shard_gb: float = 0.5,
    seed: int = 0,
) -> Path:
    """Write the model into `dest` unless it is already there; return `dest`."""
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {sorted(DTYPE_BYTES)}, got {dtype!r}")
    spec = SyntheticSpec(size_gb, dtype, shard_gb, seed)
    dest = Path(dest)
    if is_complete(dest) and read_spec(dest) != spec:
        raise FileExistsError(f"{dest} holds a synthetic model written with {read_spec(dest)}")
    return write_folder_atomically(dest, lambda folder: _write_model(folder, spec), is_complete)


def is_complete(folder: Path) -> bool:
    """The marker is written last, so its presence means every other file is whole."""
    return (folder / MARKER).is_file()


def read_spec(folder: Path) -> SyntheticSpec:
    return SyntheticSpec(**json.loads((folder / MARKER).read_text()))


def _write_model(folder: Path, spec: SyntheticSpec) -> None:
    tokenizer = chat_tokenizer()
    parameters = int(spec.size_gb * BYTES_PER_GB) // DTYPE_BYTES[spec.dtype]
    shape = choose_shape(parameters, len(tokenizer))
    config = _config(shape, tokenizer, spec.dtype)
    config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    _write_weights(folder, config, spec)
    (folder / MARKER).write_text(json.dumps(asdict(spec)) + "\n")


def _config(shape: LlamaShape, tokenizer: PreTrainedTokenizerBase, dtype: str) -> LlamaConfig:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=shape.vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        max_position_embeddings=CONTEXT_LENGTH,
        bos_token_id=tokenizer.cls_token_id,
        eos_token_id=tokenizer.sep_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        dtype=dtype,
    )


def _write_weights(folder: Path, config: LlamaConfig, spec: SyntheticSpec) -> None:
    import torch
    from safetensors.torch import save_file

    dtype = getattr(torch, spec.dtype)
    shards = _plan_shards(_parameter_shapes(config), dtype, int(spec.shard_gb * BYTES_PER_GB))
    generator = torch.Generator().manual_seed(spec.seed)
    weight_map: dict[str, str] = {}
    for name, entries in zip(_shard_names(len(shards)), shards, strict=True):
        tensors = {key: _random(key, size, dtype, generator) for key, size in entries}
        save_file(tensors, folder / name, metadata={"format": "pt"})
        (folder / name).chmod(0o644)  # as the other files; save_file makes it private
        weight_map.update(dict.fromkeys(tensors, name))
    if len(shards) > 1:
        total = sum(_nbytes(size, dtype) for entries in shards for _, size in entries)
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (folder / INDEX).write_text(json.dumps(index, indent=2) + "\n")


def _parameter_shapes(config: LlamaConfig) -> list[tuple[str, torch.Size]]:
    """Names and shapes in the model's own order, from a model built without any memory."""
    import torch
    from transformers import LlamaForCausalLM

    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    return [(name, tensor.shape) for name, tensor in model.state_dict().items()]


def _plan_shards(
    entries: Sequence[tuple[str, torch.Size]], dtype: torch.dtype, shard_bytes: int
) -> list[list[tuple[str, torch.Size]]]:
    shards: list[list[tuple[str, torch.Size]]] = [[]]
    filled = 0
    for name, size in entries:
        nbytes = _nbytes(size, dtype)
        if shards[-1] and filled + nbytes > shard_bytes:
            shards.append([])
            filled = 0
        shards[-1].append((name, size))
        filled += nbytes
    return shards


def _shard_names(count: int) -> Iterator[str]:
    if count == 1:
        yield SINGLE_FILE
        return
    for number in range(1, count + 1):
        yield f"model-{number:05d}-of-{count:05d}.safetensors"


def _random(
    name: str, size: torch.Size, dtype: torch.dtype, generator: torch.Generator
) -> torch.Tensor:
    import torch

    if name.endswith("norm.weight"):
        return torch.ones(size, dtype=dtype)
    return torch.empty(size, dtype=dtype).normal_(0.0, INIT_STD, generator=generator)


def _nbytes(size: torch.Size, dtype: torch.dtype) -> int:
    return math.prod(size) * dtype.itemsize


def _default_width(hidden: int) -> int:
    # Llama's MLP is about 8/3 of the hidden size, rounded to a multiple of 64.
    return max(HEAD_DIM, round(8 * hidden / 3 / HEAD_DIM) * HEAD_DIM)
