"""Recording streams into whole answers and replaying them: faithful both ways (reasoning,
refusals, logprobs, tool calls, finish reasons), in several chunks, ended by the `[DONE]`
event only, with events of several `data:` lines."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from cache.sse import StreamRecorder, event_data, replay

HEAD = {"id": "c1", "created": 5, "model": "m", "system_fingerprint": "fp_1"}
USAGE = {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}


def chat(*choices: dict[str, Any]) -> dict[str, Any]:
    return {**HEAD, "object": "chat.completion", "choices": list(choices), "usage": USAGE}


def message(**fields: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": None, **fields}


def token(text: str) -> dict[str, Any]:
    return {"token": text, "logprob": -0.5, "bytes": list(text.encode()), "top_logprobs": []}


def weather_call(city: str) -> dict[str, Any]:
    arguments = orjson.dumps({"city": city}).decode()
    return {
        "id": f"call_{city}",
        "type": "function",
        "function": {"name": "w", "arguments": arguments},
    }


LONG = "Recursion is when a function calls itself on a smaller piece of the problem until done."
ANSWERS = {
    "plain": chat({"index": 0, "message": message(content=LONG), "finish_reason": "stop"}),
    "reasoning and logprobs": chat(
        {
            "index": 0,
            "message": message(content="Hi there", reasoning_content="Greet back.", refusal=None),
            "logprobs": {"content": [token("Hi"), token(" there")], "refusal": None},
            "finish_reason": "stop",
        }
    ),
    "logprobs that do not spell the text": chat(
        {
            "index": 0,
            "message": message(content="Hi there"),
            "logprobs": {"content": [token("\\xe2"), token("?")], "refusal": None},
            "finish_reason": "length",
        }
    ),
    "refusal": chat(
        {"index": 0, "message": message(refusal="I can't help with that."), "finish_reason": "stop"}
    ),
    "tool calls": chat(
        {
            "index": 0,
            "message": message(tool_calls=[weather_call("Paris"), weather_call("Oslo")]),
            "logprobs": None,
            "finish_reason": "tool_calls",
        }
    ),
    "several choices": chat(
        {"index": 0, "message": message(content="one two"), "finish_reason": "stop"},
        {"index": 1, "message": message(content="three"), "finish_reason": "length"},
    ),
}


def recorded(kind: str, stream: bytes, step: int = 0) -> dict[str, Any] | None:
    recorder = StreamRecorder(kind)
    for i in range(0, len(stream), step or len(stream)):
        recorder.feed(stream[i : i + (step or len(stream))])
    result = recorder.result()
    return None if result is None else dict(orjson.loads(result))


def chunks_of(events: list[bytes]) -> list[dict[str, Any]]:
    return [orjson.loads(event_data(e.strip()) or b"") for e in events[:-1]]


@pytest.mark.parametrize("name", list(ANSWERS))
def test_recording_a_replay_gives_the_answer_back(name: str) -> None:
    answer = ANSWERS[name]
    events = replay("chat", answer, include_usage=True)
    assert events[-1] == b"data: [DONE]\n\n"
    assert recorded("chat", b"".join(events), step=11) == answer


def test_a_replay_comes_in_several_chunks_and_logprobs_ride_with_their_token() -> None:
    plain = chunks_of(replay("chat", ANSWERS["plain"], include_usage=False))
    texts = [c["choices"][0]["delta"].get("content") for c in plain]
    assert len([t for t in texts if t]) >= 4 and "".join(t or "" for t in texts) == LONG
    assert plain[0]["choices"][0]["delta"]["role"] == "assistant"
    assert [c["choices"][0]["finish_reason"] for c in plain][-1] == "stop"

    rich = chunks_of(replay("chat", ANSWERS["reasoning and logprobs"], include_usage=False))
    deltas = [c["choices"][0]["delta"] for c in rich]
    assert deltas[0] == {
        "role": "assistant",
        "refusal": None,
        "reasoning_content": "Greet back.",
    }
    assert [d.get("content") for d in deltas[1:3]] == ["Hi", " there"]
    assert [c["choices"][0]["logprobs"]["content"][0]["token"] for c in rich[1:3]] == [
        "Hi",
        " there",
    ]


def test_logprobs_that_do_not_spell_the_text_come_whole_with_the_finish() -> None:
    answer = ANSWERS["logprobs that do not spell the text"]
    chunks = chunks_of(replay("chat", answer, include_usage=False))
    assert [("logprobs" in c["choices"][0]) for c in chunks] == [False] * (len(chunks) - 1) + [True]


def test_tool_calls_streamed_in_pieces_are_merged_by_index() -> None:
    def delta(piece: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**HEAD, "choices": [{"index": 0, "delta": piece, "finish_reason": finish}]}

    first = {
        "index": 0,
        "id": "call_1",
        "type": "function",
        "function": {"name": "w", "arguments": ""},
    }
    pieces = [
        delta({"role": "assistant", "content": None, "tool_calls": [first]}),
        delta({"tool_calls": [{"index": 0, "function": {"arguments": '{"city":'}}]}),
        delta(
            {
                "tool_calls": [
                    {"index": 0, "type": "function", "function": {"arguments": ' "Rome"}'}}
                ]
            }
        ),
        delta({}, "tool_calls"),
    ]
    stream = b"".join(b"data: " + orjson.dumps(p) + b"\n\n" for p in pieces) + b"data: [DONE]\n\n"
    whole = recorded("chat", stream, step=5)
    assert whole is not None
    call = whole["choices"][0]["message"]["tool_calls"][0]
    assert call == {
        "id": "call_1",
        "type": "function",
        "function": {"name": "w", "arguments": '{"city": "Rome"}'},
    }
    assert whole["choices"][0]["finish_reason"] == "tool_calls"


def test_completions_keep_per_token_logprobs() -> None:
    logprobs = {
        "tokens": ["a", " b", " c"],
        "token_logprobs": [-1.0, -2.0, -0.5],
        "top_logprobs": [{"a": -1.0}, {" b": -2.0}, {" c": -0.5}],
        "text_offset": [0, 1, 3],
    }
    choice = {"index": 0, "text": "a b c", "logprobs": logprobs, "finish_reason": "length"}
    answer = {**HEAD, "object": "text_completion", "choices": [choice]}
    events = replay("completions", answer, include_usage=False)
    assert len(events) == 5  # a token each, the finish, [DONE]
    assert recorded("completions", b"".join(events), step=3) == answer


def test_only_the_done_event_ends_a_stream() -> None:
    says_done = {**HEAD, "choices": [{"index": 0, "delta": {"content": "write data: [DONE]"}}]}
    finish = {**HEAD, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    body = (
        b"data: " + orjson.dumps(says_done) + b"\n\n" + b"data: " + orjson.dumps(finish) + b"\n\n"
    )
    assert recorded("chat", body) is None  # no [DONE] event: cut off
    whole = recorded("chat", body + b": a comment\n\ndata:[DONE]\n\n")
    assert whole is not None and whole["choices"][0]["message"]["content"] == "write data: [DONE]"


def test_events_of_several_data_lines_and_crlf_are_read() -> None:
    chunk = orjson.dumps(
        {**HEAD, "choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": "stop"}]}
    )
    cut = chunk.index(b',"choices"') + 1
    split = b"data: " + chunk[:cut] + b"\r\ndata: " + chunk[cut:] + b"\r\n\r\n"
    assert event_data(split.strip()) == chunk[:cut] + b"\n" + chunk[cut:]
    whole = recorded("chat", split + b"data: [DONE]\r\n\r\n", step=4)
    assert whole is not None and whole["choices"][0]["message"]["content"] == "ok"


@pytest.mark.parametrize(
    "stream",
    [
        # no finish reason
        b'data: {"choices": [{"index": 0, "delta": {"content": "a"}}]}\n\ndata: [DONE]\n\n',
        b'data: {"error": {"message": "boom"}}\n\ndata: [DONE]\n\n',
        b"data: {not json\n\ndata: [DONE]\n\n",
        b"data: [DONE]\n\n",  # no choices at all
    ],
)
def test_incomplete_or_failed_streams_record_nothing(stream: bytes) -> None:
    assert recorded("chat", stream) is None
