"""What feeds the error-bounded mode: answers compared (text, or embeddings given), and a
namespace's evidence labelled in a real local store."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from cache.bounded import AGREE_COSINE, Ledger, agree, answer_text
from cache.error_bound import NO_EVIDENCE
from cache.store_local import LocalCacheStore


def chat(*contents: object, **message: object) -> bytes:
    choices = [
        {"index": i, "message": {"role": "assistant", "content": c, **message}}
        for i, c in enumerate(contents)
    ]
    return orjson.dumps({"id": "x", "created": 1, "choices": choices, "usage": {"total_tokens": 3}})


def call(call_id: str, city: str) -> dict[str, object]:
    function = {"name": "get_weather", "arguments": f'{{"city": "{city}"}}'}
    return {"id": call_id, "type": "function", "function": function}


@pytest.mark.parametrize(
    ("body", "text"),
    [
        (chat("Paris."), "Paris."),
        (chat("One.", "Two."), "One.\nTwo."),
        (
            orjson.dumps({"choices": [{"text": "a completion", "finish_reason": "stop"}]}),
            "a completion",
        ),
        (chat(None, refusal="I can't help with that."), "I can't help with that."),
        (b"not json", None),
        (orjson.dumps({"error": {"message": "x"}}), None),
        (orjson.dumps({"choices": []}), None),
    ],
)
def test_what_an_answer_says(body: bytes, text: str | None) -> None:
    assert answer_text(body) == text


def test_tool_calls_compare_by_what_they_call_not_their_ids() -> None:
    first = answer_text(chat(None, tool_calls=[call("call_1", "Paris")]))
    again = answer_text(chat(None, tool_calls=[call("call_2", "Paris")]))
    other = answer_text(chat(None, tool_calls=[call("call_3", "Lyon")]))
    assert first is not None and first == again != other


def unit(*values: float) -> np.ndarray:
    vector = np.array(values, dtype=np.float32)
    return vector / np.linalg.norm(vector)


@pytest.mark.parametrize(
    ("cached", "fresh", "vectors", "agreed"),
    [
        ("Paris.", "Paris.", None, True),  # deterministic: the same text
        ("Paris.", "It is Paris.", None, False),  # deterministic: any other text differs
        ("Paris.", "Paris.", (unit(1, 0), unit(0, 1)), True),  # the same text needs no vectors
        ("Paris.", "It is Paris.", (unit(1, 0), unit(1, 0.1)), True),  # cosine 0.995
        ("Paris.", "Lyon.", (unit(1, 0), unit(1, 1)), False),  # cosine 0.71
    ],
)
def test_answers_agree(
    cached: str, fresh: str, vectors: tuple[np.ndarray, np.ndarray] | None, agreed: bool
) -> None:
    assert agree(cached, fresh, vectors) is agreed


@pytest.mark.parametrize(
    ("cosine", "agreed"), [(AGREE_COSINE - 0.01, False), (AGREE_COSINE + 0.01, True)]
)
def test_sampled_answers_agree_from_the_bar_up(cosine: float, agreed: bool) -> None:
    angle = np.arccos(cosine)
    vectors = (unit(1, 0), unit(np.cos(angle), np.sin(angle)))
    assert agree("a", "b", vectors) is agreed


async def test_labels_accumulate_per_namespace_and_served_hits_are_remembered() -> None:
    store = LocalCacheStore(None, 8)
    ledger = Ledger(store, ttl_s=60.0)
    assert await ledger.evidence("ns") == NO_EVIDENCE
    await ledger.label("ns", 0.99, True)
    state = await ledger.label("ns", 0.99, False)
    assert (await ledger.evidence("ns")) == state and state.observations == 2
    assert await ledger.evidence("other") == NO_EVIDENCE  # namespaces never share evidence
    await store.put_evidence("ns", b"damaged", 60.0)
    assert await ledger.evidence("ns") == NO_EVIDENCE  # unreadable: starts over
    ledger.served("e1", 0.97)
    assert ledger.served_signal("e1") == 0.97
    assert ledger.served_signal("e1") is None  # one report, one label
