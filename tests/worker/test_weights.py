"""The fast weight loader against safetensors' own, and models assembled around its tensors."""

from __future__ import annotations

import json
import mmap
import os
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from backends.worker.assembly import CheckpointMismatch, assemble_causal_lm
from backends.worker.weights import (
    METHODS,
    Method,
    _missing_chunks,
    load_files,
    load_state_dict_fast,
    weight_files,
)


def _reference(folder: Path) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    for path in weight_files(folder):
        state.update(load_file(path))
    return state


def _assert_bitwise_equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for name, tensor in want.items():
        assert (got[name].dtype, got[name].shape) == (tensor.dtype, tensor.shape), name
        assert torch.equal(got[name].view(torch.uint8), tensor.view(torch.uint8)), name


@pytest.mark.parametrize("method", METHODS)
def test_sharded_model_loads_bitwise_like_safetensors(
    synthetic_model_dir: Path, method: Method
) -> None:
    assert len(weight_files(synthetic_model_dir)) > 1
    state, stats = load_state_dict_fast(synthetic_model_dir, method=method)
    _assert_bitwise_equal(state, _reference(synthetic_model_dir))
    assert stats.method == method and stats.files == len(weight_files(synthetic_model_dir))
    assert stats.bytes == sum(t.numel() * t.element_size() for t in state.values())
    assert stats.tensors == len(state) and stats.gbps > 0


@pytest.mark.parametrize("method", METHODS)
def test_single_file_model_loads_bitwise_like_safetensors(
    tiny_model_dir: Path, method: Method
) -> None:
    state, _ = load_state_dict_fast(tiny_model_dir, method=method, chunk_bytes=1 << 16)
    _assert_bitwise_equal(state, _reference(tiny_model_dir))


@pytest.mark.parametrize("method", METHODS)
def test_unaligned_tensors_and_small_chunks(tmp_path: Path, method: Method) -> None:
    # Three int8 bytes first leave the float32 tensor after them at an odd offset.
    path = _write_raw_safetensors(
        tmp_path / "odd.safetensors",
        {
            "a": ("I8", [3], bytes([1, 2, 255])),
            "b": ("F32", [2], struct.pack("<2f", 1.5, -2.0)),
            "c": ("BF16", [0], b""),
        },
    )
    state, stats = load_files([path], method=method, chunk_bytes=4)
    _assert_bitwise_equal(state, load_file(path))
    assert state["b"].tolist() == [1.5, -2.0] and stats.bytes == 11


def test_files_not_in_the_page_cache_are_read_through_it_first(tmp_path: Path) -> None:
    path = tmp_path / "cold.safetensors"
    data = torch.arange(3 * 2**20, dtype=torch.int32)
    from safetensors.torch import save_file

    save_file({"x": data}, path)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # only clean pages can be dropped
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        with mmap.mmap(fd, 0, access=mmap.ACCESS_COPY) as mapping:
            assert list(_missing_chunks(mapping, 2**20))  # mincore sees the drop
            state, _ = load_files([path], method="mmap", chunk_bytes=2**20)
            assert not list(_missing_chunks(mapping, 2**20))  # all read in
    finally:
        os.close(fd)
    assert torch.equal(state["x"], data)


def test_a_truncated_file_is_refused(tiny_model_dir: Path, tmp_path: Path) -> None:
    data = (tiny_model_dir / "model.safetensors").read_bytes()
    cut = tmp_path / "model.safetensors"
    cut.write_bytes(data[: len(data) - 100])
    with pytest.raises(ValueError, match="truncated"):
        load_state_dict_fast(tmp_path)


def test_a_folder_without_safetensors_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_state_dict_fast(tmp_path)


def test_assembled_model_computes_what_from_pretrained_computes(tiny_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    state, _ = load_state_dict_fast(tiny_model_dir)
    model = assemble_causal_lm(tiny_model_dir, state, "cpu")
    reference = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype="auto")
    assert not any(t.is_meta for t in [*model.parameters(), *model.buffers()])
    # The parameters are the loaded tensors themselves: nothing was copied.
    assert (
        model.get_input_embeddings().weight.data_ptr()
        == state["model.embed_tokens.weight"].data_ptr()
    )
    ids = torch.tensor([[101, 2023, 2003, 1037, 3231]])
    with torch.inference_mode():
        assert torch.equal(model(input_ids=ids).logits, reference.eval()(input_ids=ids).logits)


def test_a_checkpoint_with_other_names_is_a_mismatch(tiny_model_dir: Path) -> None:
    state, _ = load_state_dict_fast(tiny_model_dir)
    state["renamed.weight"] = state.pop("lm_head.weight")
    with pytest.raises(CheckpointMismatch, match="lm_head"):
        assemble_causal_lm(tiny_model_dir, state, "cpu")


def _write_raw_safetensors(path: Path, tensors: dict[str, tuple[str, list[int], bytes]]) -> Path:
    header: dict[str, object] = {}
    data = b""
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {
            "dtype": dtype,
            "shape": shape,
            "data_offsets": [len(data), len(data) + len(raw)],
        }
        data += raw
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + data)
    return path
