"""The embedding model as an ONNX graph, exported here from the installed weights.

ONNX Runtime runs the packaged MiniLM's float32 pass about twice as fast as cache/bert.py
on a CPU without bf16 units (cache/onnx_encoder.py). Nothing is downloaded: the graph is
cache/bert.py's float32 forward pass (the same arithmetic as BertModel, mean pooling
included) traced by `torch.onnx.export` from the model folder's own weights. Its outputs
are the token vectors the verifier reads and the mean-pooled sentence vector:

    input_ids, attention_mask (int64, batch x tokens)
      -> token_embeddings (float32, batch x tokens x hidden),
         sentence_embedding (float32, batch x hidden; not normalised)

`ensure_int8` derives from that graph an int8 one (`bert-<digest>-int8v1.onnx`, ~23 MB):
ONNX Runtime's dynamic quantisation of the weight matrix products, per output channel,
signed int8 weights; activations are quantised per pass. It runs a lone prompt in about
half the float32 time on this AVX2 CPU; its vectors are not float32's to 1e-7 but within a
cosine of about 0.995 (on prompt-pairs-dev.jsonl: mean 0.995, least 0.990; token vectors
about 0.99), and bench/cache_quality.py gives the same hits on both dev files. Per tensor
(one scale for a whole matrix) it was 0.97 (least 0.93): that is why per channel.

The files are not part of the repository. `ensure_onnx` finds it or makes it: in
`gateway-onnx/` inside the model folder (`make install` exports the packaged model there:
`python -m cache.onnx_export`), or, where that folder is read-only, in the directory the
caller names (the gateway: `<cache.path>/onnx`). The name carries a digest of the weights
and of this exporter's version, so a changed model is never served by a stale graph. An
export is written to a temporary file, checked against the torch pass, then renamed: a
reader never sees half a file, and two processes exporting at once both end with a whole
one.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import logging
import os
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

_log = logging.getLogger(__name__)

EXPORT_VERSION = 1  # bump when the graph changes: older files are then ignored
QUANT_VERSION = 1  # bump when the quantisation changes
INPUTS = ("input_ids", "attention_mask")
OUTPUTS = ("token_embeddings", "sentence_embedding")
SUBDIR = "gateway-onnx"
_WEIGHT_FILES = ("config.json", "model.safetensors", "pytorch_model.bin")
_CHECK_TEXTS = ["Convert 5 km to miles", "How do I reverse a list in Python, in place?", ""]
_MIN_COSINE = 0.99999  # the exported graph against the torch pass, sentence and tokens
_MIN_INT8_COSINE = 0.98  # the int8 graph's sentence vectors against float32's


class OnnxExportError(RuntimeError):
    """The model could not be exported, or the export does not compute what torch does."""


def graph_name(model_dir: Path) -> str:
    """The file name for `model_dir`'s weights: bert-<digest>.onnx."""
    digest = hashlib.sha256(f"export-v{EXPORT_VERSION}".encode())
    for name in _WEIGHT_FILES:
        path = model_dir / name
        if path.is_file():
            digest.update(name.encode())
            with path.open("rb") as handle:
                digest.update(hashlib.file_digest(handle, "sha256").digest())
    return f"bert-{digest.hexdigest()[:16]}.onnx"


def ensure_onnx(
    model: SentenceTransformer, model_dir: Path, fallback_dir: Path | None = None
) -> Path:
    """The ONNX graph of `model` (loaded from `model_dir`), exported on first use."""
    places = _graph_places(model_dir, fallback_dir)
    return _found_or_made(graph_name(model_dir), places, lambda target: export(model, target))


def find_onnx(model_dir: Path, fallback_dir: Path | None = None) -> Path | None:
    """`model_dir`'s graph where `ensure_onnx` would find it, if it was exported already."""
    return _found(graph_name(model_dir), _graph_places(model_dir, fallback_dir))


def _graph_places(model_dir: Path, fallback_dir: Path | None) -> list[Path]:
    return [model_dir / SUBDIR] + ([fallback_dir] if fallback_dir is not None else [])


def int8_name(graph: Path) -> str:
    """The int8 graph's file name for a float32 graph: the same digest, marked."""
    return f"{graph.stem}-int8v{QUANT_VERSION}.onnx"


def ensure_int8(model: SentenceTransformer, graph: Path, fallback_dir: Path | None = None) -> Path:
    """The int8 graph derived from the float32 `graph`, quantised on first use."""
    places = _int8_places(graph, fallback_dir)
    return _found_or_made(int8_name(graph), places, lambda target: quantize(model, graph, target))


def find_int8(graph: Path, fallback_dir: Path | None = None) -> Path | None:
    """The int8 graph where `ensure_int8` would find it, if it was quantised already."""
    return _found(int8_name(graph), _int8_places(graph, fallback_dir))


def _int8_places(graph: Path, fallback_dir: Path | None) -> list[Path]:
    return [graph.parent] + ([fallback_dir] if fallback_dir is not None else [])


def _found(name: str, places: list[Path]) -> Path | None:
    """`name` in the first of `places` that has it."""
    return next((place / name for place in places if (place / name).is_file()), None)


def _found_or_made(name: str, places: list[Path], make: Callable[[Path], Path]) -> Path:
    """`name` in the first of `places` that has it; else made in the first writable one."""
    found = _found(name, places)
    if found is not None:
        return found
    failures = []
    for place in places:
        try:
            return make(place / name)
        except OSError as exc:  # a read-only model folder: try the next place
            failures.append(f"{place}: {exc}")
    raise OnnxExportError(f"cannot write {name}: " + "; ".join(failures))


def quantize(model: SentenceTransformer, graph: Path, target: Path) -> Path:
    """Writes `graph` with int8 weights to `target` atomically, after checking it."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    started = time.perf_counter()
    with _temporary(target) as temporary, _quantiser_quiet():
        quantize_dynamic(
            graph,
            temporary,
            weight_type=QuantType.QInt8,
            op_types_to_quantize=["MatMul"],
            per_channel=True,
        )
        check_int8(model_vectors(model), graph_vectors(model, temporary))
        os.replace(temporary, target)
    seconds = time.perf_counter() - started
    _log.warning("embedder: quantised the ONNX graph to int8 in %.1f s: %s", seconds, target)
    return target


@contextlib.contextmanager
def _quantiser_quiet() -> Iterator[None]:
    """ONNX Runtime's quantiser logs its per-node notes (and advice on pre-processing that
    does not apply to dynamic quantisation) through the root logger, and prints: noise
    at a start-up, not errors (the result is checked before it is kept)."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(None):
            yield
    finally:
        root.setLevel(level)


@contextlib.contextmanager
def _temporary(target: Path) -> Iterator[Path]:
    """A temporary file beside `target` (readable by others), removed unless renamed."""
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(handle)
    try:
        os.chmod(name, 0o644)  # mkstemp's 0600 would hide it from other users
        yield Path(name)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name)


def export(model: SentenceTransformer, target: Path) -> Path:
    """Exports `model`'s transformer to `target` atomically, after checking the graph."""
    import torch

    from cache.bert import BertForward

    forward = BertForward.of(getattr(model[0], "auto_model", None), torch.float32)
    if forward is None:
        raise OnnxExportError("only a BERT encoder that cache/bert.py reproduces is exported")
    started = time.perf_counter()
    with _temporary(target) as temporary:
        _trace(forward, model, temporary)
        _check(model, temporary)
        os.replace(temporary, target)
    seconds = time.perf_counter() - started
    _log.warning("embedder: exported the model to ONNX in %.1f s: %s", seconds, target)
    return target


def _inputs(model: SentenceTransformer, texts: list[str]) -> dict[str, Any]:
    tokens = model.tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
    return {name: tokens[name] for name in INPUTS}


def _trace(forward: Any, model: SentenceTransformer, path: Path) -> None:
    import torch

    class Graph(torch.nn.Module):
        def forward(
            self, input_ids: torch.Tensor, attention_mask: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor]:
            tokens = forward(input_ids, attention_mask, always_mask=True)
            weights = attention_mask.unsqueeze(-1).to(tokens.dtype)
            mean = (tokens * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
            return tokens, mean

    batch, length = torch.export.Dim("batch", max=4096), torch.export.Dim("tokens", max=512)
    example = _inputs(model, _CHECK_TEXTS[:2])
    # The exporter reports its progress and its own deprecations: noise, not errors (the
    # graph is checked against the torch pass before it is kept).
    with warnings.catch_warnings(), contextlib.redirect_stdout(None):
        warnings.simplefilter("ignore")
        torch.onnx.export(
            Graph(),
            (example["input_ids"], example["attention_mask"]),
            str(path),
            dynamo=True,
            input_names=list(INPUTS),
            output_names=list(OUTPUTS),
            dynamic_shapes={name: {0: batch, 1: length} for name in INPUTS},
            external_data=False,
            verbose=False,
        )


def _check(model: SentenceTransformer, path: Path) -> None:
    """The graph gives the torch pass's vectors (cosine >= _MIN_COSINE), padding included."""
    import onnxruntime
    import torch

    from cache.bert import BertForward

    forward = BertForward.of(model[0].auto_model, torch.float32)
    assert forward is not None
    inputs = _inputs(model, _CHECK_TEXTS)
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    tokens, _ = session.run(list(OUTPUTS), {k: v.numpy() for k, v in inputs.items()})
    with torch.inference_mode():
        want = forward(inputs["input_ids"], inputs["attention_mask"]).numpy()
    mask = inputs["attention_mask"].numpy().astype(bool)
    got, expected = tokens[mask], want[mask]
    cosines = (got * expected).sum(-1) / (
        np.linalg.norm(got, axis=-1) * np.linalg.norm(expected, axis=-1)
    )
    if float(cosines.min()) < _MIN_COSINE:
        raise OnnxExportError(f"the exported graph differs from torch (cosine {cosines.min()})")


SentenceVectors = Callable[[list[str]], npt.NDArray[np.float32]]  # texts -> vectors


def check_int8(float32: SentenceVectors, vectors: SentenceVectors) -> None:
    """Raises OnnxExportError unless the int8 graph's sentence vectors (`vectors`, computed
    on this CPU) are near the float32 ones (`float32`: the torch pass, or the exported
    graph, which computes it to a cosine of _MIN_COSINE) to a cosine of _MIN_INT8_COSINE.
    Checked at each load, not only at export: the integer kernels differ from one CPU to
    another (VNNI or not), and a graph may have been quantised on another machine."""
    texts = _CHECK_TEXTS[:2]
    got = vectors(texts)
    want = float32(texts)
    got = got / np.linalg.norm(got, axis=1, keepdims=True)
    want = want / np.linalg.norm(want, axis=1, keepdims=True)
    cosine = float((got * want).sum(1).min())
    if cosine < _MIN_INT8_COSINE:
        raise OnnxExportError(f"the int8 graph differs from float32 here (cosine {cosine:.4f})")


def model_vectors(model: SentenceTransformer) -> SentenceVectors:
    """The torch pass's sentence vectors, for `check_int8`."""

    def vectors(texts: list[str]) -> npt.NDArray[np.float32]:
        return np.asarray(model.encode(texts, convert_to_numpy=True), dtype=np.float32)

    return vectors


def graph_vectors(model: SentenceTransformer, graph: Path) -> SentenceVectors:
    """The sentence vectors of `graph`, for `check_int8` (a session of its own)."""
    import onnxruntime

    session = onnxruntime.InferenceSession(str(graph), providers=["CPUExecutionProvider"])

    def vectors(texts: list[str]) -> npt.NDArray[np.float32]:
        inputs = {k: v.numpy() for k, v in _inputs(model, texts).items()}
        _, sentence = session.run(list(OUTPUTS), inputs)
        return np.asarray(sentence, dtype=np.float32)

    return vectors


def main(argv: list[str] | None = None) -> None:
    """Exports a model folder (default: the packaged MiniLM) next to its weights: the float32
    graph, then the int8 one derived from it."""
    from cache.embedder import default_model_path
    from cache.torch_encoder import load_sentence_model

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--model", help="a sentence-transformers folder")
    parser.add_argument(
        "--fallback-dir", type=Path, help="where to write if the folder is read-only"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    model_dir = Path(args.model) if args.model else default_model_path()
    model = load_sentence_model(model_dir, "cpu")
    path = ensure_onnx(model, model_dir, args.fallback_dir)
    print(path)
    print(ensure_int8(model, path, args.fallback_dir))


if __name__ == "__main__":
    main()
