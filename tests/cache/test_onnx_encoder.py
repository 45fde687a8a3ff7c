"""The embedder on ONNX Runtime: the graph is exported here from the packaged model, once,
atomically, and gives the torch pass's vectors and token features."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cache.embedder import default_model_path, load_embedder
from cache.features import TokenFeatures
from cache.onnx_encoder import OnnxEncoder, read_bert_folder
from cache.onnx_export import (
    SUBDIR,
    OnnxExportError,
    check_int8,
    ensure_int8,
    ensure_onnx,
    export,
    graph_name,
    graph_vectors,
    int8_name,
    model_vectors,
)
from cache.torch_encoder import SentenceEncoder

TEXTS = [
    "How do I reverse a list in Python?",
    "Convert 5 km to miles",
    "Summarize this memo in two sentences: 'The office moves to the fourth floor next week.'",
    "Is 91 prime?",
    "word " * 400,  # truncated
    "",
]


def test_onnx_gives_the_torch_float32_vectors_and_features(
    encoder: SentenceEncoder, onnx_encoder: OnnxEncoder
) -> None:
    torch_pass = SentenceEncoder(encoder.model, "float32")
    assert (onnx_encoder.backend, onnx_encoder.precision) == ("onnx", "float32")
    assert (onnx_encoder.dimension, onnx_encoder.max_tokens) == (384, torch_pass.max_tokens)
    for got, want in zip(onnx_encoder.encode(TEXTS), torch_pass.encode(TEXTS), strict=True):
        assert float(got.vector @ want.vector) >= 0.99999
        assert abs(float(np.linalg.norm(got.vector)) - 1.0) < 1e-5
        mine, theirs = (
            TokenFeatures.from_bytes(got.features),
            TokenFeatures.from_bytes(want.features),
        )
        np.testing.assert_array_equal(mine.ids, theirs.ids)  # the same word pieces
        assert mine.truncated == theirs.truncated
        x, y = mine.embeddings.astype(np.float32), theirs.embeddings.astype(np.float32)
        cosines = (x * y).sum(1) / (np.linalg.norm(x, axis=1) * np.linalg.norm(y, axis=1))
        assert cosines.min() >= 0.99999
    # Alone or padded in a batch: the same vector.
    alone = onnx_encoder.encode([TEXTS[3]])[0]
    assert float(alone.vector @ onnx_encoder.encode(TEXTS)[3].vector) >= 0.99999
    assert onnx_encoder.tokenizer_vocab() == encoder.tokenizer_vocab()


def test_the_graph_is_found_next_to_the_model_once_exported(onnx_encoder: OnnxEncoder) -> None:
    model_dir = default_model_path()
    assert onnx_encoder.path == model_dir / SUBDIR / graph_name(model_dir)
    assert graph_name(model_dir).startswith("bert-") and graph_name(model_dir) == graph_name(
        model_dir
    )


def test_an_export_is_checked_and_written_whole(encoder: SentenceEncoder, tmp_path: Path) -> None:
    target = tmp_path / "graphs" / "bert.onnx"
    assert export(encoder.model, target) == target
    assert [p.name for p in target.parent.iterdir()] == ["bert.onnx"]  # no temporary left
    assert target.stat().st_mode & 0o444 == 0o444  # readable by the gateway's user
    exported = OnnxEncoder.of(encoder.model, target)
    (vector,) = exported.encode(["Convert 5 km to miles"])
    assert float(vector.vector @ encoder.encode(["Convert 5 km to miles"])[0].vector) > 0.9999


def test_a_fallback_directory_is_used_only_when_the_graph_is_not_next_to_the_model(
    encoder: SentenceEncoder, onnx_encoder: OnnxEncoder, tmp_path: Path
) -> None:
    assert ensure_onnx(encoder.model, default_model_path(), tmp_path) == onnx_encoder.path
    assert list(tmp_path.iterdir()) == []


def test_auto_picks_onnx_int8_on_the_cpu() -> None:
    chosen = load_embedder(device="cpu")
    assert (chosen.backend, chosen.precision) == ("onnx", "int8")
    assert load_embedder(device="cpu", precision="float32").precision == "float32"
    assert load_embedder(device="cpu", backend="torch").backend == "torch"


def test_the_int8_graph_gives_vectors_near_float32_and_the_same_word_pieces(
    onnx_encoder: OnnxEncoder,
) -> None:
    int8 = load_embedder(device="cpu", backend="onnx-int8")
    assert isinstance(int8, OnnxEncoder) and int8.precision == "int8"
    assert int8.path.name == int8_name(onnx_encoder.path)
    assert int8.path.stat().st_size < onnx_encoder.path.stat().st_size * 0.8
    for got, want in zip(int8.encode(TEXTS[:4]), onnx_encoder.encode(TEXTS[:4]), strict=True):
        assert 0.98 <= float(got.vector @ want.vector) < 0.99999  # close, not the same
        mine, theirs = (
            TokenFeatures.from_bytes(got.features),
            TokenFeatures.from_bytes(want.features),
        )
        np.testing.assert_array_equal(mine.ids, theirs.ids)


def test_a_prompt_s_vector_does_not_depend_on_what_it_is_embedded_with(
    onnx_encoder: OnnxEncoder,
) -> None:
    # int8 activations are scaled by their range over a pass: batch-mates would move it.
    int8 = load_embedder(device="cpu", backend="onnx-int8")
    long = "Summarize this: " + "the quick brown fox jumps over the lazy dog " * 20
    for encoder in (int8, onnx_encoder):
        alone = encoder.encode([TEXTS[0]])[0]
        for mates in ([long], ["hi", long], TEXTS[1:4]):
            batched = encoder.encode([TEXTS[0], *mates])[0]
            if encoder is int8:
                np.testing.assert_array_equal(batched.vector, alone.vector)
                assert batched.features == alone.features
            else:  # float32: padding is masked, rounding aside nothing else moves it
                assert float(batched.vector @ alone.vector) > 0.99999


def test_an_int8_graph_that_computes_other_vectors_is_refused(
    encoder: SentenceEncoder, onnx_encoder: OnnxEncoder, tmp_path: Path
) -> None:
    quantized = ensure_int8(encoder.model, onnx_encoder.path, tmp_path)
    check_int8(model_vectors(encoder.model), graph_vectors(encoder.model, quantized))  # passes
    broken = scrambled(quantized, tmp_path / "broken.onnx")
    with pytest.raises(OnnxExportError, match="int8 graph differs"):
        check_int8(model_vectors(encoder.model), graph_vectors(encoder.model, broken))


def scrambled(graph_path: Path, target: Path) -> Path:
    """`graph_path` with every int8 weight matrix's values shuffled, saved to `target`."""
    import onnx

    graph = onnx.load(str(graph_path))
    for tensor in graph.graph.initializer:
        if tensor.data_type == onnx.TensorProto.INT8:
            values = onnx.numpy_helper.to_array(tensor)
            shuffled = np.random.default_rng(0).permutation(values.ravel()).reshape(values.shape)
            tensor.CopyFrom(onnx.numpy_helper.from_array(shuffled, tensor.name))
    onnx.save(graph, str(target))
    return target


MORE_TEXTS = [
    *TEXTS,
    "Café crème, naïve façade: ÀÉÎÕÜ",  # accents, which the tokenizer strips
    "把这段话翻译成英文。我们明天见。",  # CJK, one piece a character
    "def f(x):\n\treturn x ** 2  # tabs, newlines, symbols {}[]<>",
    "unaffable antidisestablishmentarianism",  # word pieces
    "token " * 300,  # past the model's 256
]


def test_the_folder_reader_builds_the_encoder_the_loaded_model_does(
    encoder: SentenceEncoder, onnx_encoder: OnnxEncoder
) -> None:
    """`read_bert_folder` reads the tokenizer and sizes from the model's files; `of` takes
    them from sentence-transformers: the same word pieces, vectors, sizes and vocabulary."""
    folder = read_bert_folder(default_model_path())
    assert folder is not None
    read = OnnxEncoder.from_folder(folder, onnx_encoder.path)
    built = OnnxEncoder.of(encoder.model, onnx_encoder.path)
    assert (read.max_tokens, read.dimension) == (built.max_tokens, built.dimension) == (256, 384)
    assert read.tokenizer_vocab() == built.tokenizer_vocab()
    for text in MORE_TEXTS:  # alone: each its own padding
        (mine,), (theirs,) = read.encode([text]), built.encode([text])
        assert mine.features == theirs.features and np.array_equal(mine.vector, theirs.vector)
    for mine, theirs in zip(read.encode(MORE_TEXTS), built.encode(MORE_TEXTS), strict=True):
        assert mine.features == theirs.features and np.array_equal(mine.vector, theirs.vector)


def test_the_default_embedder_loads_without_torch_when_its_graphs_exist() -> None:
    """A gateway's start: the exported graphs are read without importing torch,
    transformers or sentence-transformers (most of the start's time, and memory)."""
    script = (
        "import sys\n"
        "from cache.embedder import load_embedder\n"
        "e = load_embedder()\n"
        "heavy = [m for m in ('torch', 'transformers', 'sentence_transformers') "
        "if m in sys.modules]\n"
        "print(e.backend, e.precision, e.dimension, heavy)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.split("\n")[0] == "onnx int8 384 []", done.stderr


def model_copy(tmp_path: Path, graphs: dict[str, Path]) -> Path:
    """The packaged model's files linked into a folder of our own, with `graphs` (name ->
    file) as its exported graphs."""
    source, folder = default_model_path(), tmp_path / "model"
    folder.mkdir()
    for item in source.iterdir():
        if item.name != SUBDIR:
            (folder / item.name).symlink_to(item)
    (folder / SUBDIR).mkdir()
    for name, graph in graphs.items():
        (folder / SUBDIR / name).symlink_to(graph)
    return folder


def test_an_int8_graph_that_computes_other_vectors_is_not_loaded_without_torch_either(
    onnx_encoder: OnnxEncoder, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    int8 = load_embedder(device="cpu", backend="onnx-int8")
    assert isinstance(int8, OnnxEncoder)
    broken = scrambled(int8.path, tmp_path / "broken.onnx")
    name = onnx_encoder.path.name
    folder = model_copy(tmp_path, {name: onnx_encoder.path, int8_name(onnx_encoder.path): broken})
    assert graph_name(folder) == name  # the same weights: the same graph
    chosen = load_embedder(str(folder), device="cpu")  # auto: float32, with a warning
    assert isinstance(chosen, OnnxEncoder)
    assert (chosen.precision, chosen.path) == ("float32", folder / SUBDIR / name)
    assert "int8 is not usable here" in caplog.text
    with pytest.raises(OnnxExportError, match="int8 graph differs"):
        load_embedder(str(folder), device="cpu", backend="onnx-int8")  # asked by name


def test_a_folder_of_another_shape_is_not_read_by_the_folder_reader(tmp_path: Path) -> None:
    """Pooling other than the mean (or a tokenizer file missing): load it the full way."""
    folder = model_copy(tmp_path, {})
    pooling = folder / "1_Pooling"
    pooling.unlink()
    pooling.mkdir()
    config = json.loads((default_model_path() / "1_Pooling" / "config.json").read_text())
    (pooling / "config.json").write_text(json.dumps(config))
    assert read_bert_folder(folder) is not None
    config.update(pooling_mode_mean_tokens=False, pooling_mode_cls_token=True)
    (pooling / "config.json").write_text(json.dumps(config))
    assert read_bert_folder(folder) is None
    (pooling / "config.json").write_text(json.dumps({**config, "pooling_mode_cls_token": False}))
    assert read_bert_folder(folder) is None  # no pooling at all
    (folder / "tokenizer.json").unlink()
    assert read_bert_folder(folder) is None
