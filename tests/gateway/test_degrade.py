"""Degradation under overload (gateway/degrade.py): the decision and the body, alone; and
its policies as the settings check them at start-up."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from pydantic import ValidationError

from gateway.degrade import Degradation, decide, rewritten
from gateway.settings import Degrade, Settings

CAP = Degrade(when_wait_over=0.5, max_tokens=128)
ROUTE = Degrade(when_wait_over=0.5, model="small", classes=["interactive", "batch"])
BOTH = Degrade(when_wait_over=0.25, max_tokens=64, model="small")


@pytest.mark.parametrize(
    ("policy", "priority", "wait_s", "left_s", "asked", "expected"),
    [
        (CAP, "batch", 4.0, 10.0, 512, None),  # within the fraction: as asked
        (CAP, "batch", 5.0, 10.0, 512, None),  # at it: as asked
        (CAP, "batch", 6.0, 10.0, 512, Degradation(128, None)),
        (CAP, "batch", 6.0, 10.0, None, Degradation(128, None)),  # no cap set: capped
        (CAP, "batch", 6.0, 10.0, 100, None),  # asked for less already
        (CAP, "batch", 6.0, 10.0, 0, None),  # no output (embeddings): nothing to cap
        (CAP, "interactive", 60.0, 10.0, 512, None),  # batch only, by default
        (CAP, "batch", 6.0, 0.0, 512, None),  # no time left: shed, not degraded
        (ROUTE, "interactive", 6.0, 10.0, None, Degradation(None, "small")),
        (ROUTE, "batch", 6.0, 10.0, 0, Degradation(None, "small")),
        (BOTH, "batch", 3.0, 10.0, 512, Degradation(64, "small")),
        (BOTH, "batch", 3.0, 10.0, 32, Degradation(None, "small")),
    ],
)
def test_decide(
    policy: Degrade,
    priority: str,
    wait_s: float,
    left_s: float,
    asked: int | None,
    expected: Degradation | None,
) -> None:
    assert decide(policy, priority, wait_s, left_s, asked) == expected


def test_the_header_names_each_action() -> None:
    assert Degradation(128, None).header == "max_tokens=128"
    assert Degradation(None, "small").header == "model=small"
    assert Degradation(64, "small").header == "max_tokens=64, model=small"


def test_rewritten_caps_the_fields_present_and_keeps_the_rest() -> None:
    raw = orjson.dumps({"model": "big", "max_completion_tokens": 900, "max_tokens": 50, "x": 1})
    body = orjson.loads(rewritten(raw, Degradation(128, "small")))
    assert body == {"model": "small", "max_completion_tokens": 128, "max_tokens": 50, "x": 1}


def test_rewritten_sets_a_cap_where_none_was_set() -> None:
    raw = orjson.dumps({"model": "big", "messages": []})
    assert orjson.loads(rewritten(raw, Degradation(16, None)))["max_tokens"] == 16


def settings(**extra: Any) -> Settings:
    backends = [
        {"name": "b", "base_url": "http://127.0.0.1:1/v1", "models": ["big"]},
        {"name": "s", "base_url": "http://127.0.0.1:2/v1", "models": ["small"]},
    ]
    return Settings.model_validate({"backends": backends, **extra})


def test_valid_policies_per_model_and_per_tenant() -> None:
    tenant = {
        "name": "t",
        "models": ["big", "small"],
        "degrade": {"when_wait_over": 1.0, "model": "small"},
    }
    loaded = settings(degrade={"big": {"when_wait_over": 0.3, "max_tokens": 1}}, tenants=[tenant])
    assert loaded.degrade["big"].classes == ["batch"]
    assert loaded.tenants[0].degrade == Degrade(when_wait_over=1.0, model="small")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"degrade": {"big": {"when_wait_over": 0.5}}}, "needs max_tokens, model"),
        ({"degrade": {"big": {"when_wait_over": 0, "max_tokens": 8}}}, "greater than 0"),
        ({"degrade": {"big": {"when_wait_over": 1.5, "max_tokens": 8}}}, "less than or equal"),
        ({"degrade": {"big": {"when_wait_over": 0.5, "max_tokens": 0}}}, "greater than or equal"),
        ({"degrade": {"nope": {"when_wait_over": 0.5, "max_tokens": 8}}}, "'nope' is not a model"),
        ({"degrade": {"big": {"when_wait_over": 0.5, "model": "nope"}}}, "'nope' is not a model"),
        ({"degrade": {"big": {"when_wait_over": 0.5, "model": "big"}}}, "the model itself"),
        (
            {
                "tenants": [
                    {
                        "name": "t",
                        "models": ["big"],
                        "degrade": {"when_wait_over": 0.5, "model": "small"},
                    }
                ]
            },
            "may not use 'small'",
        ),
    ],
)
def test_wrong_policies_fail_at_start_up(extra: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        settings(**extra)


def test_a_max_tokens_no_store_can_hold_is_refused() -> None:
    """Found by the admin API's schema fuzzing: 10**30 passed validation, then failed to
    be written (orjson takes 64-bit integers), a 500 instead of a 400."""
    assert Degrade(when_wait_over=0.5, max_tokens=2**53).max_tokens == 2**53
    with pytest.raises(ValidationError, match="less than or equal"):
        Degrade(when_wait_over=0.5, max_tokens=10**30)
