"""The torch encoder: `SentenceEncoder`, a sentence-transformers model run in this process.

For the packaged MiniLM the pass is cache/bert.py (the same arithmetic without the
libraries' per-call overhead, in bf16 where the CPU has it: `native_bf16`); any other model
runs through sentence-transformers. cache/embedder.py's `load_embedder` chooses between
this encoder and ONNX Runtime's (cache/onnx_encoder.py).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cache.bert import BertForward
from cache.embedder import Embedded, Precision, split_rows

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer


class SentenceEncoder:
    """A sentence-transformers model. Blocking: call it from one worker thread at a time."""

    def __init__(
        self, model: SentenceTransformer, precision: Precision = "float32", *, fast: bool = True
    ) -> None:
        self._model = model
        self.forward_passes = 0  # counted so that tests and metrics can see batching
        # The packaged MiniLM's pass without the libraries' per-call overhead (about a third
        # of a lone lookup's forward pass here); None: sentence-transformers' own path,
        # always in float32 (a model cache/bert.py does not reproduce, or fast=False).
        self._fast = fast_forward(model, precision) if fast else None

    @property
    def model(self) -> SentenceTransformer:
        """The sentence-transformers model (to build another encoder on the same weights)."""
        return self._model

    @property
    def backend(self) -> str:
        return "torch"

    @property
    def fast(self) -> bool:
        """Whether encode() runs cache/bert.py's forward pass."""
        return self._fast is not None

    @property
    def precision(self) -> str:
        """The dtype of the forward pass's arithmetic: "float32" or "bfloat16"."""
        return "float32" if self._fast is None else self._fast.precision

    @property
    def dimension(self) -> int:
        return int(self._model.get_embedding_dimension() or 0)

    @property
    def max_tokens(self) -> int:
        length = self._model.max_seq_length
        return int(length) if length is not None else 512

    def tokenizer_vocab(self) -> dict[str, int]:
        """Word piece -> id, for tools that need to name the ids in the features."""
        return dict(self._model.tokenizer.get_vocab())

    def encode(self, texts: Sequence[str]) -> list[Embedded]:
        """One forward pass over `texts` (pass a bounded batch)."""
        import torch

        if not texts:
            return []
        with torch.inference_mode():
            outputs = self._forward(list(texts))
        self.forward_passes += 1
        return self._split(outputs)

    def _forward(self, texts: list[str]) -> dict[str, Any]:
        if self._fast is None:
            # preprocess() leaves the tensors on the CPU; encode() would move them, and
            # the model's forward does not (on CUDA it stopped on the first lookup).
            device = self._model.device
            features = {
                name: value.to(device) if hasattr(value, "to") else value
                for name, value in self._model.preprocess(texts).items()
            }
            return dict(self._model(features))
        # What sentence-transformers' Transformer, Pooling (mean) and Normalize modules do.
        inputs = self._model.tokenizer(
            texts,
            padding=True,
            truncation="longest_first",
            max_length=self.max_tokens,
            return_tensors="pt",
        )
        ids, mask = inputs["input_ids"], inputs["attention_mask"]
        tokens = self._fast(ids, mask)
        weights = mask.unsqueeze(-1).to(tokens.dtype)
        mean = (tokens * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
        return {
            "sentence_embedding": mean,
            "token_embeddings": tokens,
            "input_ids": ids,
            "attention_mask": mask,
        }

    def _split(self, outputs: dict[str, Any]) -> list[Embedded]:
        return split_rows(
            outputs["sentence_embedding"].float().cpu().numpy(),
            outputs["token_embeddings"].float().cpu().numpy(),
            outputs["input_ids"].cpu().numpy(),
            outputs["attention_mask"].sum(dim=1).cpu().numpy(),
            self.max_tokens,
        )


def fast_forward(model: SentenceTransformer, precision: Precision) -> BertForward | None:
    """BertForward when `model` is [Transformer(BertModel), Pooling(mean), Normalize?] on the
    CPU with a plain text tokenizer, the shape of all-MiniLM-L6-v2; None otherwise."""
    modules: list[Any] = list(model)
    names = [type(m).__name__ for m in modules]
    if names not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
        return None
    transformer, pooling = modules[0], modules[1]
    if getattr(pooling, "pooling_mode", None) != "mean" or getattr(
        transformer, "do_lower_case", False
    ):
        return None
    config = transformer.get_config_dict() if hasattr(transformer, "get_config_dict") else {}
    if config.get("transformer_task", "feature-extraction") != "feature-extraction":
        return None
    import torch

    bf16 = precision == "bfloat16" or (precision == "auto" and native_bf16())
    dtype = torch.bfloat16 if bf16 else torch.float32
    return BertForward.of(getattr(transformer, "auto_model", None), dtype)


def native_bf16() -> bool:
    """Whether this CPU multiplies bf16 matrices natively (AMX or AVX-512 BF16); without
    that, torch emulates bf16 and a pass is slower than in float32."""
    import torch

    cpu = getattr(torch, "cpu", None)
    checks = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")  # private, so guarded
    return any(bool(getattr(cpu, name, lambda: False)()) for name in checks)


def load_sentence_model(path: Path, device: str) -> SentenceTransformer:
    """The sentence-transformers model in folder `path`, on `device`, in eval mode."""
    # Before the import: huggingface_hub reads this once, and a cache never downloads.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    if not path.is_dir():
        raise FileNotFoundError(f"embedding model folder not found: {path}")
    model = SentenceTransformer(str(path), device=device, local_files_only=True)
    model.eval()
    return model
