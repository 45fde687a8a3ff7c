"""What only a CUDA machine can check: the worker's weight loader and the cache's embedder
on the GPU, each against the CPU path that the tests here cover.

    loader    a synthetic Llama (backends/worker/synthetic_model.py) loaded onto the GPU by
              backends.worker.weights (pinned buffers, side streams) and onto the CPU; every
              tensor must be equal, bit for bit (metric loader_mismatched_tensors, 0)
    embedder  the packaged MiniLM through load_embedder() on the GPU (torch; what `auto`
              picks there) and on the CPU in float32 (the features the verifier was
              trained on), on bench/cache_latency_data.py's prompts and rewordings:
              sentence-vector cosine (least), the verifier's score difference (most),
              whether the hit/miss decisions at the verifier's threshold agree, and the
              time of a lone pass and of a 64-prompt batch on each device (p50; the GPU's
              as a ratio to the CPU's of the same run)

Prints JSON lines; exits 1 when torch sees no GPU (nothing can be measured). `--device cpu`
runs the same code with the CPU in the GPU's place: a smoke run of the script, whose
comparisons are then trivially equal.

    python bench/gpu_check.py loader --size-gb 1
    python bench/gpu_check.py embedder
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from backends.worker.synthetic_model import write_synthetic_model  # noqa: E402
from backends.worker.weights import load_files, weight_files  # noqa: E402
from bench.cache_latency_data import real_prompts  # noqa: E402
from bench.report import emitter  # noqa: E402
from cache.embedder import Encoder, load_embedder  # noqa: E402
from cache.verifier import PairVerifier  # noqa: E402

TIMED_PASSES = 50


def check_loader(size_gb: float, folder: Path, device: str) -> None:
    model = write_synthetic_model(folder / f"synthetic-{size_gb:g}gb", size_gb)
    files = weight_files(model)
    on_cpu, _ = load_files(files, device="cpu", method="chunked")
    on_gpu, stats = load_files(files, device=device)
    _synchronize(device)
    mismatched = sum(
        1
        for name, tensor in on_cpu.items()
        if name not in on_gpu
        or on_gpu[name].device.type != torch.device(device).type
        or on_gpu[name].dtype != tensor.dtype
        or not torch.equal(on_gpu[name].cpu(), tensor)
    )
    params = {"tensors": len(on_cpu), "bytes": stats.bytes, "files": stats.files}
    emit("loader_mismatched_tensors", mismatched, "tensors", **params)
    gbps = stats.bytes / stats.seconds / 1e9
    emit("loader_gbps", gbps, "GB/s", device=device, cache="pagecache", **params)


def check_embedder(device: str) -> None:
    prompts = real_prompts(32)
    stored = [prompt for prompt, _ in prompts]
    reworded = [rewording for _, rewordings in prompts for rewording in rewordings]
    owners = [i for i, (_, rewordings) in enumerate(prompts) for _ in rewordings]
    texts = stored + reworded
    gpu = load_embedder(device=device, backend="auto")
    cpu = load_embedder(device="cpu", backend="torch", precision="float32")
    emit("embedder_gpu_backend", 1, "flag", backend=gpu.backend, precision=gpu.precision)
    on_gpu, on_cpu = gpu.encode(texts), cpu.encode(texts)
    cosines = [float(np.dot(a.vector, b.vector)) for a, b in zip(on_gpu, on_cpu, strict=True)]
    emit("embedder_vector_cosine_least", min(cosines), "cosine", texts=len(texts))
    verifier = PairVerifier.load()
    pairs = [(len(stored) + i, owner) for i, owner in enumerate(owners)]
    scores = {
        name: [verifier.score(vectors[q].features, vectors[c].features) for q, c in pairs]
        for name, vectors in (("gpu", on_gpu), ("cpu", on_cpu))
    }
    gaps = [abs(g - c) for g, c in zip(scores["gpu"], scores["cpu"], strict=True)]
    threshold = verifier.threshold
    disagree = sum(
        (g >= threshold) != (c >= threshold)
        for g, c in zip(scores["gpu"], scores["cpu"], strict=True)
    )
    emit("verifier_score_gap_most", max(gaps), "score", pairs=len(pairs))
    emit("verifier_decisions_differing", disagree, "pairs", pairs=len(pairs), threshold=threshold)
    batch = (texts * 2)[:64]
    for shape, inputs in (("lone", texts[:1]), ("batch64", batch)):
        times = {name: _pass_ms(encoder, inputs) for name, encoder in (("gpu", gpu), ("cpu", cpu))}
        for name, ms in times.items():
            emit("embed_pass_ms_p50", ms, "ms", device=name, shape=shape, passes=TIMED_PASSES)
        emit("embed_pass_gpu_to_cpu", times["gpu"] / times["cpu"], "ratio", shape=shape)


def _synchronize(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _pass_ms(encoder: Encoder, texts: list[str]) -> float:
    encoder.encode(texts)  # warm: CUDA kernels load, allocator pools fill
    times = []
    for _ in range(TIMED_PASSES):
        started = time.perf_counter()
        encoder.encode(texts)  # returns numpy arrays: the GPU's work is done
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


emit = emitter("gpu_check", digits=6)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("check", choices=("loader", "embedder"))
    parser.add_argument("--quick", action="store_true", help="the loader's model at 0.25 GB")
    parser.add_argument("--size-gb", type=float, default=None, help="loader's model (default 1)")
    parser.add_argument("--dir", type=Path, default=None, help="where the loader's model goes")
    parser.add_argument("--device", default="cuda", help="cpu: a smoke run of this script")
    args = parser.parse_args(argv)
    if args.device != "cpu" and not torch.cuda.is_available():
        print("gpu_check: torch sees no CUDA device; nothing to measure", file=sys.stderr)
        return 1
    size_gb = args.size_gb or (0.25 if args.quick else 1.0)
    name = torch.cuda.get_device_name() if args.device != "cpu" else "cpu"
    emit("gpu", 1, "flag", name=name, torch=torch.__version__)
    checks: dict[str, Callable[[], None]] = {
        "embedder": lambda: check_embedder(args.device),
        "loader": lambda: _in_folder(args.dir, lambda d: check_loader(size_gb, d, args.device)),
    }
    checks[args.check]()
    return 0


def _in_folder(folder: Path | None, run: Callable[[Path], None]) -> None:
    if folder is not None:
        run(folder)
        return
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        run(Path(tmp))


if __name__ == "__main__":
    sys.exit(main())
