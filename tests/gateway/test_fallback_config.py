"""Fallback models in the configuration: merged from both places, and refused with a
message when they cannot work (gateway/fallback_config.py)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.config_file import parse_settings
from gateway.settings import ConfigError, Settings


def settings(fallbacks: dict[str, Any], **backend_fallbacks: dict[str, Any]) -> Settings:
    backends = [
        {"name": "one", "base_url": "http://127.0.0.1:9/v1", "models": ["big", "big-2"]},
        {"name": "two", "base_url": "http://127.0.0.1:9/v1", "models": ["small"]},
        {"name": "three", "base_url": "http://127.0.0.1:9/v1", "models": ["other"]},
    ]
    for backend in backends:
        if backend["name"] in backend_fallbacks:
            backend["fallbacks"] = backend_fallbacks[backend["name"]]
    config = {"backends": backends, "fallbacks": fallbacks}
    return parse_settings(orjson.dumps(config).decode(), "gw.yaml", {})


def test_fallbacks_merge_from_the_top_level_and_the_backends() -> None:
    merged = settings({"big": ["small", "other"]}, two={"small": ["other"]})
    assert merged.fallback_chains() == {"big": ("small", "other"), "small": ("other",)}
    assert settings({}).fallback_chains() == {}


@pytest.mark.parametrize(
    ("top", "per_backend", "expected"),
    [
        ({"huge": ["small"]}, {}, "'huge' is not a model any backend serves"),
        ({"big": ["tiny"]}, {}, "fallbacks.big: 'tiny' is not a model any backend serves"),
        ({"big": ["big-2"]}, {}, "'big-2' is served by the same backend ('one')"),
        ({"big": ["small", "small"]}, {}, "fallbacks.big: a fallback is listed twice"),
        ({"big": ["small"]}, {"one": {"big": ["other"]}}, "fallbacks of 'big' are declared twice"),
        ({}, {"two": {"big": ["small"]}}, "'big' is not one of this backend's models"),
        (
            {"big": ["small"], "small": ["other"], "other": ["big"]},
            {},
            "a cycle (big -> small -> other -> big)",
        ),
    ],
)
def test_fallbacks_that_cannot_work_are_refused(
    top: dict[str, Any], per_backend: dict[str, Any], expected: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        settings(top, **per_backend)
    assert expected in str(refused.value)
