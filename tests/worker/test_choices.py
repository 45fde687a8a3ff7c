"""Several answers per request (`n`) and several prompts per completion, as OpenAI serves them.

Driven by the official openai client against a real worker; streamed answers are checked
against whole ones, and each choice against the same prompt asked on its own.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import httpx
import openai
from openai.types import Completion, CompletionChoice
from openai.types.chat import ChatCompletionChunk

from tests.worker.conftest import CHAT_MODEL
from tests.worker.test_worker import MESSAGES

PROMPTS = ["Once upon a time", "The capital of France"]


def test_chat_answers_n_times_and_each_answer_repeats_with_its_seed(
    client: openai.OpenAI,
) -> None:
    def ask(n: int) -> openai.types.chat.ChatCompletion:
        return client.chat.completions.create(
            model=CHAT_MODEL, messages=MESSAGES, max_tokens=10, temperature=1.0, seed=11, n=n
        )

    alone, three = ask(1), ask(3)
    texts = [choice.message.content for choice in three.choices]
    assert [choice.index for choice in three.choices] == [0, 1, 2]
    assert all(
        choice.message.role == "assistant" and choice.message.content for choice in three.choices
    )
    assert len(set(texts)) > 1, "the answers are sampled each on its own"
    assert texts[0] == alone.choices[0].message.content
    assert [choice.message.content for choice in ask(3).choices] == texts
    assert three.usage is not None and alone.usage is not None
    # The prompt is counted once; every answer's tokens are counted.
    assert three.usage.prompt_tokens == alone.usage.prompt_tokens
    if all(choice.finish_reason == "length" for choice in three.choices):
        assert three.usage.completion_tokens == 3 * 10
    else:
        assert 3 <= three.usage.completion_tokens < 3 * 10
    assert three.usage.total_tokens == three.usage.prompt_tokens + three.usage.completion_tokens


def test_streamed_chat_choices_equal_the_whole_answer(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(
        model=CHAT_MODEL, messages=MESSAGES, max_tokens=10, seed=5, n=3
    )
    chunks: list[ChatCompletionChunk] = list(
        client.chat.completions.create(
            model=CHAT_MODEL,
            messages=MESSAGES,
            max_tokens=10,
            seed=5,
            n=3,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    *answer_chunks, usage_chunk = chunks
    assert all(len(chunk.choices) == 1 for chunk in answer_chunks)
    assert [chunk.choices[0].delta.role for chunk in answer_chunks[:3]] == ["assistant"] * 3
    assert [chunk.choices[0].index for chunk in answer_chunks[:3]] == [0, 1, 2]
    texts: dict[int, str] = defaultdict(str)
    for chunk in answer_chunks:
        texts[chunk.choices[0].index] += chunk.choices[0].delta.content or ""
    assert [texts[index] for index in range(3)] == [c.message.content for c in whole.choices]
    assert _finishes((c.choices[0].index, c.choices[0].finish_reason) for c in answer_chunks) == {
        c.index: c.finish_reason for c in whole.choices
    }
    assert usage_chunk.choices == [] and usage_chunk.usage == whole.usage


def test_a_stopped_answer_leaves_the_others_as_they_were(client: openai.OpenAI) -> None:
    """Answers that end early leave the batch; the others must go on with their own tokens."""

    def ask(stop: str | None, stream: bool) -> Iterable[CompletionChoice]:
        answer = client.completions.create(
            model=CHAT_MODEL,
            prompt=PROMPTS[0],
            max_tokens=12,
            seed=3,
            n=4,
            stop=stop,
            stream=stream,
        )
        if isinstance(answer, Completion):
            return answer.choices
        return (chunk.choices[0] for chunk in answer)

    free = [choice.text for choice in ask(None, stream=False)]
    stop = next(word for word in free[1].split()[2:] if word not in free[0])
    expected = [
        (text[: text.index(stop)], "stop") if stop in text else (text, "length") for text in free
    ]
    assert expected[1][1] == "stop" and expected[0] == (free[0], "length")

    assert [(c.text, c.finish_reason) for c in ask(stop, stream=False)] == expected
    pieces = list(ask(stop, stream=True))
    texts: dict[int, str] = defaultdict(str)
    for piece in pieces:
        texts[piece.index] += piece.text
    assert [texts[index] for index in range(4)] == [text for text, _ in expected]
    finishes = _finishes((piece.index, piece.finish_reason) for piece in pieces)
    assert finishes == {index: finish for index, (_, finish) in enumerate(expected)}


def test_several_prompts_with_n_answers_each(client: openai.OpenAI) -> None:
    alone = [
        client.completions.create(model=CHAT_MODEL, prompt=p, max_tokens=8, temperature=0)
        for p in PROMPTS
    ]
    whole = client.completions.create(
        model=CHAT_MODEL, prompt=PROMPTS, n=2, max_tokens=8, temperature=0
    )
    # Prompt i's answer j is choice i * n + j.
    assert [c.index for c in whole.choices] == [0, 1, 2, 3]
    assert [c.text for c in whole.choices] == [a.choices[0].text for a in alone for _ in range(2)]
    assert [c.finish_reason for c in whole.choices] == [
        a.choices[0].finish_reason for a in alone for _ in range(2)
    ]
    assert whole.usage is not None
    assert whole.usage.prompt_tokens == sum(_usage(a).prompt_tokens for a in alone)
    assert whole.usage.completion_tokens == 2 * sum(_usage(a).completion_tokens for a in alone)

    chunks = list(
        client.completions.create(
            model=CHAT_MODEL,
            prompt=PROMPTS,
            n=2,
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    *answer_chunks, usage_chunk = chunks
    assert all(len(chunk.choices) == 1 for chunk in answer_chunks)
    texts: dict[int, str] = defaultdict(str)
    for chunk in answer_chunks:
        texts[chunk.choices[0].index] += chunk.choices[0].text
    assert [texts[index] for index in range(4)] == [c.text for c in whole.choices]
    finishes = _finishes((c.choices[0].index, c.choices[0].finish_reason) for c in answer_chunks)
    assert finishes == {c.index: c.finish_reason for c in whole.choices}
    assert usage_chunk.choices == [] and usage_chunk.usage == whole.usage


def test_prompts_as_token_ids(client: openai.OpenAI) -> None:
    prompts = [[1000, 1001, 1002], [2000, 2001]]
    alone = [
        client.completions.create(model=CHAT_MODEL, prompt=p, max_tokens=6, temperature=0)
        .choices[0]
        .text
        for p in prompts
    ]
    both = client.completions.create(model=CHAT_MODEL, prompt=prompts, max_tokens=6, temperature=0)
    assert [c.text for c in both.choices] == alone
    assert _usage(both).prompt_tokens == 5


def test_n_up_to_openai_bound(client: openai.OpenAI) -> None:
    answer = client.completions.create(model=CHAT_MODEL, prompt="a", max_tokens=2, n=128)
    assert [c.index for c in answer.choices] == list(range(128))
    assert _usage(answer).completion_tokens <= 2 * 128


def test_one_prompt_too_long_fails_the_whole_stream_before_it_starts(worker: str) -> None:
    body = {
        "model": CHAT_MODEL,
        "prompt": [[1000, 1001], list(range(1000, 3100))],
        "n": 2,
        "stream": True,
    }
    response = httpx.post(worker + "/completions", json=body)
    assert response.status_code == 400
    assert response.headers["content-type"] == "application/json"
    assert response.json()["error"]["code"] == "context_length_exceeded"


def _finishes(pairs: Iterable[tuple[int, str | None]]) -> dict[int, str | None]:
    """Each choice's finish reason, checking that it comes once, on the choice's last chunk."""
    finishes: dict[int, str | None] = {}
    for index, finish in pairs:
        assert index not in finishes, f"choice {index} has a chunk after its finish"
        if finish is not None:
            finishes[index] = finish
    return finishes


def _usage(answer: Completion) -> openai.types.CompletionUsage:
    assert answer.usage is not None
    return answer.usage
