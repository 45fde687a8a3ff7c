"""Sampling and size parameters are checked as OpenAI checks them, through a real gateway
process and the official client: out of range is 400 with `param` and OpenAI's code."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from gateway.openai_schema import MAX_TOKENS
from gateway.tenancy.quotas import estimate_tokens
from tests.conftest import fake_backend, hash_of
from tests.support.processes import Gateway, start_gateway

KEY = "sk-test-validation-0123456789abcdef"
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def gateway(fake_upstream: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    work = tmp_path_factory.mktemp("validation")
    config = {
        "state": {"url": "memory", "path": str(work / "state.json")},
        "backends": [fake_backend(fake_upstream)],
        "cache": {"enabled": False},
        "tenants": [{"name": "alpha", "keys": [{"sha256": hash_of(KEY)}]}],
    }
    gw = start_gateway(config, work)
    yield gw
    gw.stop()


@pytest.fixture
def client(gateway: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.base_url, api_key=KEY, max_retries=0)


@pytest.mark.parametrize(
    ("field", "value", "code"),
    [
        ("max_tokens", -5, "integer_below_min_value"),
        ("max_tokens", 0, "integer_below_min_value"),
        ("max_tokens", MAX_TOKENS + 1, "integer_above_max_value"),
        ("max_completion_tokens", 2**62, "integer_above_max_value"),
        ("n", 0, "integer_below_min_value"),
        ("n", 129, "integer_above_max_value"),
        ("temperature", 2.5, "decimal_above_max_value"),
        ("temperature", -1, "decimal_below_min_value"),
        ("top_p", 1.01, "decimal_above_max_value"),
        ("presence_penalty", -2.5, "decimal_below_min_value"),
        ("frequency_penalty", 3, "decimal_above_max_value"),
        ("max_tokens", "5", None),  # OpenAI takes no strings for numbers
        ("max_tokens", 5.5, None),
        ("temperature", True, None),
    ],
)
def test_out_of_range_is_400_with_param(
    client: openai.OpenAI, field: str, value: Any, code: str | None
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="echo", messages=MESSAGES, extra_body={field: value})
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["type"] == "invalid_request_error"
    assert error["param"] == field
    assert error["code"] == code
    assert f"'{field}'" in error["message"]


def test_completions_are_checked_too(gateway: Gateway) -> None:
    answer = httpx.post(
        gateway.base_url + "/completions",
        json={"model": "echo", "prompt": "hi", "max_tokens": -5},
        headers={"authorization": f"Bearer {KEY}"},
    )
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == "max_tokens"


def test_bounds_and_nulls_pass_and_unknown_fields_go_through(client: openai.OpenAI) -> None:
    for extra in [
        {"max_tokens": 1, "n": 128, "temperature": 0, "top_p": 1, "presence_penalty": -2},
        {"max_tokens": MAX_TOKENS, "temperature": 2.0, "top_p": 0.0, "frequency_penalty": 2},
        {"max_completion_tokens": 16, "n": 1},
        {k: None for k in ("max_tokens", "max_completion_tokens", "n", "temperature", "top_p")},
        {"presence_penalty": None, "frequency_penalty": None, "x_unknown": {"kept": True}},
    ]:
        answer = client.chat.completions.create(model="echo", messages=MESSAGES, extra_body=extra)
        assert answer.choices[0].message.content == "echo: hi", extra


def test_the_openapi_document_states_the_ranges(gateway: Gateway) -> None:
    schemas = httpx.get(gateway.url + "/openapi.json").json()["components"]["schemas"]
    chat = schemas["ChatRequest"]["properties"]
    assert {"type": "integer", "minimum": 1, "maximum": MAX_TOKENS} in chat["max_tokens"]["anyOf"]
    assert {"type": "number", "minimum": 0, "maximum": 2} in chat["temperature"]["anyOf"]


def test_quota_estimates_follow_the_checked_values() -> None:
    body: dict[str, Any] = {"messages": [{"role": "user", "content": "x" * 40}]}
    assert estimate_tokens({**body, "max_tokens": MAX_TOKENS, "n": 2}) == 10 + 2 * MAX_TOKENS
    assert estimate_tokens({**body, "max_tokens": None}, 256) == 10 + 256
    assert estimate_tokens({**body, "max_completion_tokens": 7, "max_tokens": 9}) == 17
