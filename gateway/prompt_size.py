"""Long prompts to their own pool (README "Long prompts"): per model, the backend that takes
a request, by the estimated size of its prompt.

    backends:
      - {name: chat, models: [llama], ...}                             # the other prompts
      - {name: chat-long, models: [llama], prompt_tokens_above: 8000}  # prompts above 8000

A model has one backend without `prompt_tokens_above`, and may have more that take its
prompts above their thresholds (distinct per model); a request goes to the backend with
the highest threshold its prompt is above (`prompt_tokens()` of gateway/openai_schema.py,
the whole request's estimate), else to the one without. So long prefill work waits in its
own queue, not in front of short interactive requests, and short prompts never take a
long-context replica. Nothing overflows between them: a long prompt may not fit the other
backend's context, so when its backend cannot take it, it is refused or held as any
request for that backend is (its model's fallbacks are routed by the same rule).

Checked at start-up (ValueError naming the backends and the model): a model listed twice
by one backend, by two backends without a threshold, by two with the same threshold, or
only by backends with one (no backend for its other prompts).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gateway.backend_settings import Backend


@dataclass(frozen=True, slots=True)
class SizeRoutes:
    """The backends of one model, by the size of a request's prompt."""

    backend: str  # the prompts at or below the lowest threshold (all, without thresholds)
    above: tuple[tuple[int, str], ...] = ()  # (threshold, backend), ascending thresholds

    def backend_for(self, prompt_tokens: int) -> str:
        """The backend of a prompt estimated at `prompt_tokens`: that of the highest
        threshold it is above (a prompt of exactly a threshold stays below it)."""
        chosen = self.backend
        for threshold, backend in self.above:
            if prompt_tokens <= threshold:
                break
            chosen = backend
        return chosen

    @property
    def by_size(self) -> bool:
        return bool(self.above)

    @property
    def backends(self) -> tuple[str, ...]:
        return (self.backend, *(backend for _, backend in self.above))


def model_routes(backends: Sequence[Backend]) -> dict[str, SizeRoutes]:
    """Per model served, its backends by prompt size, in the order the models are listed."""
    plain: dict[str, str] = {}
    sized: dict[str, dict[int, str]] = {}
    for backend in backends:
        _listed_once(backend)
        for model in backend.models:
            if backend.prompt_tokens_above is None:
                _place(plain, model, backend.name)
            else:
                _place_above(sized.setdefault(model, {}), model, backend)
    for model, thresholds in sized.items():
        if model not in plain:
            above = min(thresholds)
            name = thresholds[above]
            raise ValueError(
                f"backends[{name}].prompt_tokens_above: no backend serves {model!r} for "
                f"prompts of {above} tokens or fewer (list {model!r} in a backend without "
                "prompt_tokens_above)"
            )
    return {
        model: SizeRoutes(name, tuple(sorted(sized.get(model, {}).items())))
        for model, name in plain.items()
    }


def _listed_once(backend: Backend) -> None:
    seen: set[str] = set()
    for model in backend.models:
        if model in seen:
            raise ValueError(f"backends[{backend.name}].models: {model!r} is listed twice")
        seen.add(model)


def _place(plain: dict[str, str], model: str, name: str) -> None:
    other = plain.setdefault(model, name)
    if other != name:
        raise ValueError(
            f"model {model!r} is served by backends {other!r} and {name!r}: a model has one "
            "backend, and more only for its long prompts (prompt_tokens_above)"
        )


def _place_above(thresholds: dict[int, str], model: str, backend: Backend) -> None:
    above = backend.prompt_tokens_above
    assert above is not None
    other = thresholds.setdefault(above, backend.name)
    if other != backend.name:
        raise ValueError(
            f"backends {other!r} and {backend.name!r} both take {model!r} prompts above "
            f"{above} tokens: a model's thresholds must differ"
        )
