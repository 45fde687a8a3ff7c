"""The worker over real HTTP, driven by the official openai client."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from backends.worker.tiny_model import is_complete, write_tiny_chat_model
from tests.worker.conftest import CHAT_MODEL, EMBEDDING_MODEL

MESSAGES: list[openai.types.chat.ChatCompletionMessageParam] = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name three colours."},
]


def test_tiny_model_is_written_once(tiny_model_dir: Path) -> None:
    assert is_complete(tiny_model_dir)
    weights = tiny_model_dir / "model.safetensors"
    before = weights.stat().st_mtime_ns
    assert write_tiny_chat_model(tiny_model_dir) == tiny_model_dir
    assert weights.stat().st_mtime_ns == before
    assert [p.name for p in tiny_model_dir.parent.iterdir()] == [tiny_model_dir.name]
    assert oct(tiny_model_dir.stat().st_mode & 0o777) == oct(0o755)


def test_health_and_model_list(worker: str, client: openai.OpenAI) -> None:
    health = httpx.get(worker.removesuffix("/v1") + "/health")
    assert (health.status_code, health.json()) == (200, {"status": "ok"})
    assert sorted(model.id for model in client.models.list()) == [EMBEDDING_MODEL, CHAT_MODEL]
    assert client.models.retrieve(CHAT_MODEL).id == CHAT_MODEL


def test_embeddings_are_unit_vectors_of_384(client: openai.OpenAI) -> None:
    texts = ["The cat sat on the mat.", "Stock markets fell sharply today."]
    # The client asks for base64 unless told otherwise; both encodings must agree.
    as_base64 = client.embeddings.create(model=EMBEDDING_MODEL, input=texts)
    as_floats = client.embeddings.create(
        model=EMBEDDING_MODEL, input=texts, encoding_format="float"
    )
    vectors = np.array([item.embedding for item in as_base64.data])
    assert vectors.shape == (2, 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(vectors, [item.embedding for item in as_floats.data], atol=1e-6)
    assert [item.index for item in as_base64.data] == [0, 1]
    assert as_base64.usage.prompt_tokens == as_base64.usage.total_tokens > len(texts)


def test_paraphrases_are_closer_than_an_unrelated_sentence(client: openai.OpenAI) -> None:
    texts = [
        "How do I reset my password?",
        "What are the steps to change a forgotten password?",
        "The weather in Lisbon is sunny this weekend.",
    ]
    answer = client.embeddings.create(model=EMBEDDING_MODEL, input=texts)
    question, paraphrase, unrelated = (np.array(item.embedding) for item in answer.data)
    assert question @ paraphrase > question @ unrelated + 0.2


def test_chat_completion_answers_with_usage(client: openai.OpenAI) -> None:
    answer = client.chat.completions.create(
        model=CHAT_MODEL, messages=MESSAGES, max_tokens=8, temperature=0
    )
    choice = answer.choices[0]
    assert answer.object == "chat.completion" and answer.model == CHAT_MODEL
    assert choice.message.role == "assistant" and choice.message.content
    assert answer.usage is not None
    assert 1 <= answer.usage.completion_tokens <= 8
    assert answer.usage.prompt_tokens > 0
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + answer.usage.completion_tokens
    assert choice.finish_reason == ("length" if answer.usage.completion_tokens == 8 else "stop")


def test_streamed_chat_equals_the_whole_greedy_answer(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(
        model=CHAT_MODEL, messages=MESSAGES, max_completion_tokens=12, temperature=0
    )
    chunks = list(
        client.chat.completions.create(
            model=CHAT_MODEL,
            messages=MESSAGES,
            max_completion_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert {chunk.id for chunk in chunks} == {chunks[0].id}
    assert all(chunk.object == "chat.completion.chunk" for chunk in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    content_chunks = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(content_chunks) > 1, "the answer should arrive token by token"
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == whole.choices[0].finish_reason
    assert not any(finishes[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage


def test_stream_without_usage_option_reports_none(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model=CHAT_MODEL, messages=MESSAGES, max_tokens=3, temperature=0, stream=True
        )
    )
    assert all(chunk.usage is None and chunk.choices for chunk in chunks)


def test_completions_whole_and_streamed_agree(client: openai.OpenAI) -> None:
    prompt = "Once upon a time"
    whole = client.completions.create(model=CHAT_MODEL, prompt=prompt, max_tokens=10, temperature=0)
    assert whole.object == "text_completion" and whole.choices[0].text
    assert whole.usage is not None and whole.usage.completion_tokens <= 10
    chunks = list(
        client.completions.create(
            model=CHAT_MODEL, prompt=prompt, max_tokens=10, temperature=0, stream=True
        )
    )
    assert all(chunk.object == "text_completion" for chunk in chunks)
    assert "".join(chunk.choices[0].text for chunk in chunks) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason


def test_stop_string_ends_the_answer_before_it(client: openai.OpenAI) -> None:
    prompt = "Once upon a time"
    full = client.completions.create(model=CHAT_MODEL, prompt=prompt, max_tokens=12, temperature=0)
    text = full.choices[0].text
    stop = text.split()[3]
    expected = text[: text.index(stop)]
    for stream in (False, True):
        if stream:
            chunks = client.completions.create(
                model=CHAT_MODEL,
                prompt=prompt,
                max_tokens=12,
                temperature=0,
                stop=stop,
                stream=True,
            )
            pieces = [chunk.choices[0] for chunk in chunks]
            got, finish = "".join(p.text for p in pieces), pieces[-1].finish_reason
        else:
            answer = client.completions.create(
                model=CHAT_MODEL, prompt=prompt, max_tokens=12, temperature=0, stop=[stop]
            )
            got, finish = answer.choices[0].text, answer.choices[0].finish_reason
        assert (got, finish) == (expected, "stop")


def test_seeded_sampling_repeats(client: openai.OpenAI) -> None:
    def sample(seed: int) -> str | None:
        answer = client.chat.completions.create(
            model=CHAT_MODEL,
            messages=MESSAGES,
            max_tokens=10,
            temperature=1.0,
            top_p=0.9,
            seed=seed,
        )
        return answer.choices[0].message.content

    assert sample(7) == sample(7)
    assert len({sample(seed) for seed in range(4)}) > 1


def test_max_tokens_is_capped_by_the_worker_limit(client: openai.OpenAI) -> None:
    answer = client.completions.create(model=CHAT_MODEL, prompt="a", max_tokens=10_000)
    assert answer.usage is not None and answer.usage.completion_tokens <= 64


def test_unknown_model_is_404_in_openai_shape(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="no-such-model", messages=MESSAGES)
    _assert_error_shape(caught.value.response, "model")
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model=CHAT_MODEL, input="chat models do not embed")
    with pytest.raises(openai.NotFoundError) as caught:
        client.models.retrieve("no-such-model")
    _assert_error_shape(caught.value.response, "model")


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/chat/completions", {"model": CHAT_MODEL}, "messages"),
        ("/chat/completions", {"model": CHAT_MODEL, "messages": MESSAGES, "n": 0}, "n"),
        ("/chat/completions", {"model": CHAT_MODEL, "messages": MESSAGES, "n": 129}, "n"),
        ("/chat/completions", {"model": CHAT_MODEL, "messages": MESSAGES, "top_p": 0}, "top_p"),
        ("/completions", {"model": CHAT_MODEL, "prompt": []}, "prompt"),
        ("/completions", {"model": CHAT_MODEL, "prompt": ["one", 2]}, "prompt"),
        ("/completions", {"model": CHAT_MODEL, "prompt": [[1, 2], "three"]}, "prompt"),
        ("/completions", {"model": CHAT_MODEL, "prompt": [True]}, "prompt"),
        ("/completions", {"model": CHAT_MODEL, "prompt": [[]]}, "prompt"),
        ("/embeddings", {"model": EMBEDDING_MODEL, "input": [[1, 2, 3]]}, "input"),
        ("/embeddings", {"model": EMBEDDING_MODEL, "input": []}, "input"),
    ],
)
def test_invalid_requests_are_400_in_openai_shape(
    worker: str, path: str, body: dict[str, object], param: str
) -> None:
    response = httpx.post(worker + path, json=body)
    assert response.status_code == 400
    _assert_error_shape(response, param)


def test_body_that_is_not_json_is_400(worker: str) -> None:
    response = httpx.post(worker + "/chat/completions", content=b"{not json")
    assert response.status_code == 400
    _assert_error_shape(response, None)


def test_oversized_body_is_413(worker: str) -> None:
    body = {"model": EMBEDDING_MODEL, "input": "word " * 2_000_000}
    response = httpx.post(worker + "/embeddings", json=body)
    assert response.status_code == 413
    _assert_error_shape(response, None)


def test_prompt_longer_than_the_context_is_400(worker: str) -> None:
    body = {"model": CHAT_MODEL, "prompt": list(range(1000, 3100)), "max_tokens": 1}
    response = httpx.post(worker + "/completions", json=body)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "context_length_exceeded"


def _assert_error_shape(response: httpx.Response, param: str | None) -> None:
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"] and error["type"] == "invalid_request_error"
    assert error["param"] == param


async def test_concurrent_answers_do_not_mix(worker: str, client: openai.OpenAI) -> None:
    prompts = ["Once upon a time", "The capital of France", "In a galaxy far away"]
    alone = [
        client.completions.create(model=CHAT_MODEL, prompt=p, max_tokens=12, temperature=0)
        for p in prompts
    ]
    async with openai.AsyncOpenAI(base_url=worker, api_key="unused", max_retries=0) as aclient:
        together = await asyncio.gather(
            *(
                aclient.completions.create(model=CHAT_MODEL, prompt=p, max_tokens=12, temperature=0)
                for p in prompts
            )
        )
    assert [a.choices[0].text for a in together] == [a.choices[0].text for a in alone]
