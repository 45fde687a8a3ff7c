"""The synthetic model: the size asked for, laid out as save_pretrained lays it out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from backends.worker.synthetic_model import (
    LlamaShape,
    choose_shape,
    is_complete,
    read_spec,
    write_synthetic_model,
)
from backends.worker.weights import weight_files
from tests.worker.conftest import SYNTHETIC_GB, SYNTHETIC_SHARD_GB

VOCAB = 30522


@pytest.mark.parametrize("size_gb", [0.01, 0.06, 0.25, 1.0, 4.0])
def test_shapes_have_the_parameters_asked_for(size_gb: float) -> None:
    parameters = int(size_gb * 1e9) // 2
    shape = choose_shape(parameters, VOCAB)
    assert abs(shape.parameters - parameters) / parameters < 0.01
    assert 2 <= shape.num_hidden_layers <= 32
    assert shape.num_attention_heads % shape.num_key_value_heads == 0


def test_a_size_below_the_smallest_model_is_refused() -> None:
    with pytest.raises(ValueError, match="smallest"):
        choose_shape(1000, VOCAB)


def test_weights_have_the_requested_size_in_shards(synthetic_model_dir: Path) -> None:
    files = weight_files(synthetic_model_dir)
    sizes = [path.stat().st_size for path in files]
    assert len(files) == 3 and all(size <= SYNTHETIC_SHARD_GB * 1e9 * 1.01 for size in sizes)
    assert abs(sum(sizes) - SYNTHETIC_GB * 1e9) / (SYNTHETIC_GB * 1e9) < 0.10
    index = json.loads((synthetic_model_dir / "model.safetensors.index.json").read_text())
    assert {synthetic_model_dir / name for name in index["weight_map"].values()} == set(files)
    assert index["metadata"]["total_size"] <= sum(sizes)


def test_the_model_loads_with_transformers_and_runs(synthetic_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(synthetic_model_dir, dtype="auto").eval()
    tokenizer = AutoTokenizer.from_pretrained(synthetic_model_dir)
    config = json.loads((synthetic_model_dir / "config.json").read_text())
    assert model.dtype == torch.bfloat16 and config["model_type"] == "llama"
    ids = tokenizer("Once upon a time", return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        logits = model(input_ids=ids).logits
    assert logits.shape == (1, ids.shape[1], len(tokenizer))
    assert bool(torch.isfinite(logits).all())


def test_written_once_and_never_over_another_size(synthetic_model_dir: Path) -> None:
    assert is_complete(synthetic_model_dir)
    first = weight_files(synthetic_model_dir)[0]
    before = first.stat().st_mtime_ns
    again = write_synthetic_model(synthetic_model_dir, SYNTHETIC_GB, shard_gb=SYNTHETIC_SHARD_GB)
    assert again == synthetic_model_dir and first.stat().st_mtime_ns == before
    assert [p.name for p in synthetic_model_dir.parent.iterdir()] == [synthetic_model_dir.name]
    assert read_spec(synthetic_model_dir).size_gb == SYNTHETIC_GB
    with pytest.raises(FileExistsError):
        write_synthetic_model(synthetic_model_dir, 2 * SYNTHETIC_GB)


def test_shape_arithmetic_matches_the_real_model() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = LlamaShape(vocab_size=1000, hidden_size=256, intermediate_size=300, num_hidden_layers=3)
    assert shape.num_key_value_heads < shape.num_attention_heads
    config = LlamaConfig(
        vocab_size=shape.vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        tie_word_embeddings=False,
    )
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    assert sum(p.numel() for p in model.parameters()) == shape.parameters
