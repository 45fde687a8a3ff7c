"""Degradation under overload, opt-in (README "Degradation under overload").

    degrade: {big: {when_wait_over: 0.3, max_tokens: 128, model: small}}   # per model
    tenants: [{name: bulk, degrade: {...}}]                                # or per tenant

Before a request joins its model's queue, its expected wait there is compared with the
time left before its deadline: past `when_wait_over` of it, the policy (the tenant's, else
the model's) applies to requests of its `classes` (batch by default): the output is capped
at `max_tokens`, and/or the request goes to `model`, a cheaper one, instead. Shedding stays
the last step: a degraded request joins a queue as any other and is refused as any other
when even that queue cannot meet its deadline.

`decide` is the decision, pure; `rewritten` the body sent upstream (nothing else changes).
A degraded answer says what it gave up (`x-degraded: max_tokens=128, model=small`), is
counted (`gateway_degraded_total`), is not stored in the cache (the key is the request as
asked) and is not shared with identical requests in flight.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from gateway.settings import Degrade

# The body fields that cap the output: OpenAI's current one and the older one.
_CAPS = ("max_completion_tokens", "max_tokens")


@dataclass(frozen=True, slots=True)
class Degradation:
    """What a request gives up: its output beyond `max_tokens`, its model for `model`."""

    max_tokens: int | None
    model: str | None

    @property
    def header(self) -> str:
        """The `x-degraded` value: the actions, as `name=value`."""
        return ", ".join(f"{name}={value}" for name, value in self.actions())

    def actions(self) -> list[tuple[str, str]]:
        found = [("max_tokens", self.max_tokens), ("model", self.model)]
        return [(name, str(value)) for name, value in found if value is not None]


def decide(
    policy: Degrade, priority: str, wait_s: float, left_s: float, asked_tokens: int | None
) -> Degradation | None:
    """The degradation of a request of class `priority` expected to wait `wait_s` with
    `left_s` left before its deadline; None: served as asked. `asked_tokens`: its output
    cap per choice (None: none set, the upstream's default, so the cap applies; 0: it
    produces no output, an embedding, so there is nothing to cap)."""
    if priority not in policy.classes or left_s <= 0:
        return None  # no time left: the queue sheds it, degraded or not
    if wait_s <= policy.when_wait_over * left_s:
        return None
    cap = policy.max_tokens
    if cap is not None and asked_tokens is not None and asked_tokens <= cap:
        cap = None  # it asked for no more than the cap already
    if cap is None and policy.model is None:
        return None
    return Degradation(cap, policy.model)


def rewritten(raw: bytes, degradation: Degradation) -> bytes:
    """The request's body with its model and output cap degraded, the rest unchanged."""
    body = orjson.loads(raw)
    if degradation.model is not None:
        body["model"] = degradation.model
    cap = degradation.max_tokens
    if cap is not None:
        present = [field for field in _CAPS if isinstance(body.get(field), int)]
        for field in present or ["max_tokens"]:
            body[field] = min(cap, body.get(field, cap))
    return orjson.dumps(body)
