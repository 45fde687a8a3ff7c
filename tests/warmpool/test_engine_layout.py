"""What an engine finds in a staged folder: a Hugging Face checkpoint (sharded safetensors,
its index, config and tokenizer files, a manifest) staged from moto's S3 by the real stager
comes out as the directory `vllm serve {weights}` loads with `--load-format runai_streamer`
or `fastsafetensors`: every file unchanged under its own name, nothing else visible."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import boto3
import numpy as np
import orjson
import pytest
from safetensors import safe_open
from safetensors.numpy import save

from tests.warmpool.conftest import BUCKET, StagerFactory, Weights, s3_client_args
from warmpool.layout import CacheLayout, safe_name

MODEL = "meta-llama/Tiny-Instruct"  # a backend's name: where `{weights}` points
PREFIX = "hf/tiny-instruct"
TENSORS = {
    "model-00001-of-00002.safetensors": {
        "embed.weight": np.arange(64 * 16, dtype=np.float32).reshape(64, 16),
        "layers.0.attn.weight": np.full((16, 16), 0.5, dtype=np.float16),
    },
    "model-00002-of-00002.safetensors": {
        "layers.0.mlp.weight": np.linspace(-1, 1, 16 * 32, dtype=np.float32).reshape(16, 32),
        "lm_head.weight": np.eye(16, 64, dtype=np.float32),
    },
}


def checkpoint() -> dict[str, bytes]:
    """A checkpoint as `huggingface-cli download` leaves it, plus the stager's manifest."""
    files = {name: save(tensors) for name, tensors in TENSORS.items()}
    weight_map = {key: name for name, tensors in TENSORS.items() for key in tensors}
    files["model.safetensors.index.json"] = orjson.dumps(
        {"metadata": {"total_size": sum(len(b) for b in files.values())}, "weight_map": weight_map}
    )
    files["config.json"] = orjson.dumps({"architectures": ["LlamaForCausalLM"], "vocab_size": 64})
    files["generation_config.json"] = orjson.dumps({"max_new_tokens": 16})
    files["tokenizer.json"] = orjson.dumps({"version": "1.0", "model": {"type": "BPE"}})
    files["tokenizer_config.json"] = orjson.dumps({"model_max_length": 2048})
    files["special_tokens_map.json"] = orjson.dumps({"eos_token": "</s>"})
    manifest = {
        n: {"size": len(b), "sha256": hashlib.sha256(b).hexdigest()} for n, b in files.items()
    }
    files["manifest.json"] = orjson.dumps({"files": manifest})
    return files


@pytest.fixture(scope="module")
def uploaded(weights: Weights) -> dict[str, bytes]:
    files = checkpoint()
    client = boto3.client("s3", **s3_client_args(weights.endpoint))
    for name, content in files.items():
        client.upload_fileobj(io.BytesIO(content), BUCKET, f"{PREFIX}/{name}")
    client.close()
    return files


async def test_a_staged_checkpoint_is_what_vllm_loads(
    weights: Weights, uploaded: dict[str, bytes], make_stager: StagerFactory, tmp_path: Path
) -> None:
    stager = make_stager(weights.endpoint)
    staged = await stager.stage(MODEL, f"s3://{BUCKET}/{PREFIX}/")
    # The folder the gateway substitutes for `{weights}` (gateway/compose/pools.py).
    assert staged.path == CacheLayout(tmp_path / "cache").published(MODEL)
    assert staged.path.name == safe_name(MODEL)

    visible = {p.name for p in staged.path.iterdir() if not p.name.startswith(".")}
    assert visible == set(uploaded), "the stager adds or drops files an engine would see"
    assert {p.name for p in staged.path.iterdir()} - visible == {".complete"}
    for name, content in uploaded.items():
        assert (staged.path / name).read_bytes() == content, f"{name} changed on the way"

    # What vLLM's safetensors loaders do: glob the shards, check them against the index,
    # read each tensor by the offsets in the file's own header.
    shards = sorted(p.name for p in staged.path.glob("*.safetensors"))
    assert shards == sorted(TENSORS)
    index = orjson.loads((staged.path / "model.safetensors.index.json").read_bytes())
    assert set(index["weight_map"].values()) == set(shards)
    for shard, tensors in TENSORS.items():
        with safe_open(str(staged.path / shard), framework="numpy") as reader:
            assert set(reader.keys()) == set(tensors)
            for key, expected in tensors.items():
                np.testing.assert_array_equal(reader.get_tensor(key), expected)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        orjson.loads((staged.path / name).read_bytes())
