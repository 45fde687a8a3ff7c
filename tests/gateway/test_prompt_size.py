"""Long prompts to their own pool (gateway/prompt_size.py): the routing rule, and the
configurations refused at start-up with a message naming the backends and the model."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.config_file import parse_settings
from gateway.prompt_size import SizeRoutes
from gateway.settings import ConfigError, Settings, Tenant
from gateway.tenancy.tenants import Catalog

URL = "http://127.0.0.1:9/v1"


def backend(name: str, models: list[str], above: int | None = None, **extra: Any) -> dict[str, Any]:
    sized = {} if above is None else {"prompt_tokens_above": above}
    return {"name": name, "base_url": URL, "models": models, **sized, **extra}


def settings(*backends: dict[str, Any], **top: Any) -> Settings:
    config = {"backends": list(backends), **top}
    return parse_settings(orjson.dumps(config).decode(), "gw.yaml", {})


@pytest.mark.parametrize(
    ("prompt_tokens", "backend"),
    [
        (0, "short"),
        (1000, "short"),  # exactly the threshold stays below it
        (1001, "long"),
        (8000, "long"),
        (8001, "longest"),
        (10**9, "longest"),
    ],
)
def test_a_prompt_goes_to_the_backend_of_the_highest_threshold_it_is_above(
    prompt_tokens: int, backend: str
) -> None:
    routes = SizeRoutes("short", ((1000, "long"), (8000, "longest")))
    assert routes.backend_for(prompt_tokens) == backend


def test_without_thresholds_every_prompt_goes_to_the_one_backend() -> None:
    routes = SizeRoutes("only")
    assert routes.backend_for(10**9) == "only" and not routes.by_size
    assert routes.backends == ("only",)


def test_the_configuration_becomes_each_models_routes_and_the_catalog_uses_them() -> None:
    configured = settings(
        backend("longest", ["chat"], 8000),
        backend("short", ["chat", "embed"]),
        backend("long", ["chat"], 1000),
    )
    routes = configured.model_routes()
    assert routes == {
        "chat": SizeRoutes("short", ((1000, "long"), (8000, "longest"))),
        "embed": SizeRoutes("short"),
    }
    assert configured.model_names() == ["chat", "embed"]  # each model once
    catalog = Catalog(routes, [Tenant(name="t")])
    assert catalog.route("t", "chat", 1000).backend == "short"
    long_route = catalog.route("t", "chat", 1001)
    assert long_route.backend == "long" and long_route.by_size
    assert not catalog.route("t", "embed", 10**6).by_size
    assert catalog.models_for("t") == ["chat", "embed"]


@pytest.mark.parametrize(
    ("backends", "expected"),
    [
        (
            [backend("long", ["chat"], 1000)],
            "backends[long].prompt_tokens_above: no backend serves 'chat' for prompts of "
            "1000 tokens or fewer",
        ),
        (
            [backend("short", ["other"]), backend("long", ["chat", "other"], 1000)],
            "backends[long].prompt_tokens_above: no backend serves 'chat'",
        ),
        (
            [backend("a", ["chat"]), backend("b", ["chat"])],
            "model 'chat' is served by backends 'a' and 'b'",
        ),
        (
            [backend("s", ["chat"]), backend("l1", ["chat"], 500), backend("l2", ["chat"], 500)],
            "backends 'l1' and 'l2' both take 'chat' prompts above 500 tokens",
        ),
        ([backend("s", ["chat", "chat"])], "backends[s].models: 'chat' is listed twice"),
        ([backend("s", ["chat"]), backend("l", ["chat"], 0)], "prompt_tokens_above"),
    ],
)
def test_backends_that_cannot_share_a_model_are_refused(
    backends: list[dict[str, Any]], expected: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        settings(*backends)
    assert expected in str(refused.value)


def test_a_fallback_must_share_no_backend_with_its_model() -> None:
    """A long prompt for `chat` would go to its fallback's backend for long prompts too."""
    shared = (backend("s", ["chat"]), backend("t", ["small"]), backend("l", ["chat", "small"], 99))
    with pytest.raises(ConfigError, match=r"'small' is served by the same backend \('l'\)"):
        settings(*shared, fallbacks={"chat": ["small"]})
    apart = (backend("s", ["chat"]), backend("l", ["chat"], 99, fallbacks={"chat": ["small"]}))
    chains = settings(*apart, backend("t", ["small"])).fallback_chains()
    assert chains == {"chat": ("small",)}  # declared on any backend of the model
