"""A transformers causal LM that writes answers one token at a time with a KV cache.

All methods block; the server runs them in its single compute thread, so only one forward
pass uses the model at a time while answers in flight take turns token by token.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from backends.worker.config import GenerationLimits, ModelSpec
from backends.worker.errors import ContextLengthExceeded, InvalidRequest
from backends.worker.sampling import SamplingParams, make_generator, sample_tokens

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


class ChatModel:
    def __init__(
        self,
        name: str,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        context_length: int,
    ) -> None:
        self.name = name
        self.context_length = context_length
        self._model = model
        self._tokenizer = tokenizer
        self._end_ids = _end_token_ids(model, tokenizer)
        embeddings = model.get_input_embeddings()
        self._vocab_size = (
            embeddings.num_embeddings
            if isinstance(embeddings, torch.nn.Embedding)
            else len(tokenizer)
        )

    @classmethod
    def load(cls, spec: ModelSpec, device: str, max_context: int) -> ChatModel:
        """Load through transformers' `from_pretrained` (any format it reads)."""
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(spec.path, local_files_only=True, dtype="auto")
        # transformers types `to` through a decorator that mypy reads wrongly.
        model.to(device).eval()  # type: ignore[arg-type]
        return cls._around(spec, model, max_context)

    @classmethod
    def assemble(
        cls, spec: ModelSpec, state: dict[str, torch.Tensor], device: str, max_context: int
    ) -> ChatModel:
        """Build the model around weights already loaded (see `assembly`)."""
        from backends.worker.assembly import assemble_causal_lm

        return cls._around(spec, assemble_causal_lm(spec.path, state, device), max_context)

    @classmethod
    def _around(cls, spec: ModelSpec, model: PreTrainedModel, max_context: int) -> ChatModel:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(spec.path, local_files_only=True)
        positions = getattr(model.config, "max_position_embeddings", None) or max_context
        return cls(spec.name, model, tokenizer, min(max_context, positions))

    @property
    def bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self._model.parameters())

    def probe(self) -> int:
        """Write one token greedily: a real forward pass through the serving path."""
        prompt = self.text_prompt("Hello")
        return self.start(prompt, SamplingParams(max_tokens=1, temperature=0)).step()[0]

    def chat_prompt(self, messages: Sequence[dict[str, str]]) -> list[int]:
        if self._tokenizer.chat_template is None:
            raise InvalidRequest(f"model '{self.name}' has no chat template", "model")
        text = self._tokenizer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=True
        )
        return self._encode(str(text))

    def text_prompt(self, prompt: str) -> list[int]:
        ids = self._encode(prompt)
        if ids:
            return ids
        # The model needs at least one token to continue from.
        bos = self._tokenizer.bos_token_id
        if bos is None:
            raise InvalidRequest("The prompt is empty.", "prompt")
        return [int(bos)]

    def check_token_ids(self, ids: Sequence[int]) -> list[int]:
        vocab = self._vocab_size
        if not ids or not all(0 <= token < vocab for token in ids):
            raise InvalidRequest(f"token ids must be in [0, {vocab}) and not empty", "prompt")
        return list(ids)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tokenizer.decode(list(ids), skip_special_tokens=True))

    def is_end(self, token_id: int) -> bool:
        return token_id in self._end_ids

    def token_budget(
        self, prompt_length: int, requested: int | None, limits: GenerationLimits
    ) -> int:
        room = self.context_length - prompt_length
        if room < 1:
            raise ContextLengthExceeded(
                f"The prompt has {prompt_length} tokens; model '{self.name}' takes at most "
                f"{self.context_length - 1}, leaving room for an answer."
            )
        wanted = limits.default_max_tokens if requested is None else requested
        return min(wanted, limits.max_tokens, room)

    def start(self, prompt_ids: Sequence[int], params: SamplingParams, n: int = 1) -> Generation:
        return Generation(self._model, prompt_ids, params, n)

    def _encode(self, text: str) -> list[int]:
        # Chat templates write their own special tokens, so the tokenizer adds none.
        encoded = self._tokenizer(text, add_special_tokens=False)
        return [int(token) for token in encoded["input_ids"]]


class Generation:
    """`n` answers to one prompt being written together, one row of a batch each.

    The prompt goes through the model once; its KV cache is then copied to `n` rows, and
    every later step is one forward pass for all the answers still being written. Each
    answer samples with its own generator (see `make_generator`).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        n: int = 1,
    ) -> None:
        self._model = model
        self._params = params
        self._generators = [make_generator(params.seed, model.device, j) for j in range(n)]
        self._next_input = torch.tensor([list(prompt_ids)], device=model.device)
        self._cache: Any = None

    def step(self) -> list[int]:
        """Run one forward pass (the prompt on the first call); one new token per row."""
        rows = len(self._generators)
        with torch.inference_mode():
            output = self._model(
                input_ids=self._next_input, past_key_values=self._cache, use_cache=True
            )
            self._cache = output.past_key_values
            logits = output.logits[:, -1]
            if logits.shape[0] != rows:  # the prompt's one row: the answers branch off here
                logits = logits.expand(rows, -1)
                self._cache.batch_repeat_interleave(rows)
            tokens = sample_tokens(logits, self._params, self._generators)
        self._next_input = torch.tensor([[token] for token in tokens], device=self._model.device)
        return tokens

    def keep(self, rows: Sequence[int]) -> None:
        """Go on with these rows only (positions in the current batch), in this order."""
        if list(rows) == list(range(len(self._generators))):
            return
        index = torch.tensor(list(rows), dtype=torch.long, device=self._next_input.device)
        self._cache.batch_select_indices(index)
        self._next_input = self._next_input[index]
        self._generators = [self._generators[row] for row in rows]


def _end_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    ids: set[int] = set()
    for source in (model.generation_config, model.config, tokenizer):
        value = getattr(source, "eos_token_id", None)
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list):
            ids.update(int(token) for token in value)
    return frozenset(ids)
