"""Fallback models as configured (README "Model fallbacks"), merged and checked once, at
start-up: per model, the models tried in its place, in order, from the top-level
`fallbacks` and from each backend's own `fallbacks` (keyed by that backend's models).

Checked: the model and each of its fallbacks are served; a fallback shares no backend
with its model (the same backend is as unavailable or overloaded as the model itself; a
model may have several, by prompt size: gateway/prompt_size.py); no
fallback is listed twice for one model, nor a model's fallbacks in two places; and no
cycle (a model among its own fallbacks, however far down): a request is only ever sent to
its model's own list, but a cycle says the configuration means something else.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

Chains = dict[str, tuple[str, ...]]


def merge_chains(
    backend_of: Mapping[str, Collection[str]],
    top: Mapping[str, Sequence[str]],
    per_backend: Mapping[str, Mapping[str, Sequence[str]]],
) -> Chains:
    """The fallbacks of each model that has some; ValueError naming what is wrong."""
    declared: list[tuple[str, str | None, Mapping[str, Sequence[str]]]] = [("fallbacks", None, top)]
    for name, lists in per_backend.items():
        declared.append((f"backends[{name}].fallbacks", name, lists))
    chains: Chains = {}
    for where, owner, lists in declared:
        for model, fallbacks in lists.items():
            if model in chains:
                raise ValueError(f"{where}: the fallbacks of {model!r} are declared twice")
            if owner is not None and owner not in backend_of.get(model, ()):
                raise ValueError(f"{where}: {model!r} is not one of this backend's models")
            _check(where, model, fallbacks, backend_of)
            chains[model] = tuple(fallbacks)
    _acyclic(chains)
    return chains


def _check(
    where: str, model: str, fallbacks: Sequence[str], backend_of: Mapping[str, Collection[str]]
) -> None:
    if model not in backend_of:
        raise ValueError(f"{where}: {model!r} is not a model any backend serves")
    if len(set(fallbacks)) != len(fallbacks):
        raise ValueError(f"{where}.{model}: a fallback is listed twice")
    for fallback in fallbacks:
        if fallback not in backend_of:
            raise ValueError(f"{where}.{model}: {fallback!r} is not a model any backend serves")
        shared = [name for name in backend_of[model] if name in backend_of[fallback]]
        if shared:
            raise ValueError(
                f"{where}.{model}: {fallback!r} is served by the same backend "
                f"({shared[0]!r}); a fallback must be served by another"
            )


def _acyclic(chains: Chains) -> None:
    done: set[str] = set()

    def visit(model: str, path: list[str]) -> None:
        if model in path:
            cycle = " -> ".join([*path[path.index(model) :], model])
            raise ValueError(f"fallbacks: a cycle ({cycle})")
        if model in done:
            return
        for fallback in chains.get(model, ()):
            visit(fallback, [*path, model])
        done.add(model)

    for model in chains:
        visit(model, [])
