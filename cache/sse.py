"""Between streamed and whole answers: a stream is recorded into the whole answer it
stands for (that is what the cache stores), and a stored answer is replayed as a stream
with the same chunk schema the upstream uses (OpenAI's `chat.completion.chunk` or
`text_completion`).

    event_data(event)   the data of one SSE event: its `data:` lines joined (the SSE spec
                        allows several), or None for an event with none (a comment)
    StreamRecorder      SSE bytes in, the whole answer out: deltas accumulate as the
                        `openai` SDK accumulates them (strings concatenate, objects merge,
                        lists extend, tool calls merge by `index`), so `reasoning_content`,
                        `refusal`, tool calls, `logprobs` and every choice's
                        `finish_reason` survive; the stream ends at the `[DONE]` event only
    replay(...)         a whole answer out as SSE events: per choice, the role and the
                        fields that are not text first, then the text in pieces (one per
                        logprob token when the logprobs spell the text, else words),
                        reasoning before the answer, then tool calls, then the finish
                        reason; usage last when asked for, then `[DONE]`

`replay` and `StreamRecorder` are inverses: recording a replay gives the answer back.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

DONE = b"data: [DONE]\n\n"
_IDENTITY_KEYS = frozenset({"index", "id", "type", "role", "finish_reason", "stop_reason"})
_HEAD_KEYS = ("id", "created", "model", "system_fingerprint", "service_tier")
# The text fields of a chat message, in the order a model writes them.
_TEXT_FIELDS = ("reasoning_content", "reasoning", "content", "refusal")
_WORDS = re.compile(r"\S+\s*|\s+")
_MIN_PIECE_CHARS = 16  # a replayed text piece without logprobs: a few words, not one each


def event_data(event: bytes) -> bytes | None:
    """The data of one complete SSE event (without its blank line): its `data:` lines'
    values joined by newlines, one leading space dropped from each, as the SSE spec says."""
    values = [line[5:] for line in event.splitlines() if line.startswith(b"data:")]
    if not values:
        return None
    return b"\n".join(v[1:] if v.startswith(b" ") else v for v in values)


def split_events(data: bytes) -> tuple[list[bytes], bytes]:
    """The complete events at the start of `data` (CRLF or LF line ends), and the rest."""
    *events, rest = data.replace(b"\r\n", b"\n").split(b"\n\n")
    return events, rest


class StreamRecorder:
    """Feeds on relayed SSE bytes; `result()` is the whole answer, or None if the stream
    was not a complete, successful one (cut off before `[DONE]`, an error event, a choice
    without a finish reason, unparsable)."""

    def __init__(self, kind: str) -> None:
        self._chat = kind == "chat"
        self._buffer = b""
        self._head: dict[str, Any] = {}
        self._choices: dict[int, dict[str, Any]] = {}  # by index: the accumulated choice
        self._usage: dict[str, Any] | None = None
        self._done = False
        self._broken = False
        self._result: bytes | None = None  # `result()`, once made (making it consumes)

    def feed(self, data: bytes) -> None:
        if self._broken or self._done:
            return
        events, self._buffer = split_events(self._buffer + data)
        for event in events:
            self._event(event)

    def _event(self, event: bytes) -> None:
        payload = event_data(event)
        if payload is None or self._done or self._broken:
            return
        if payload == b"[DONE]":
            self._done = True
        elif payload:
            self._chunk(payload)

    def _chunk(self, payload: bytes) -> None:
        try:
            chunk = orjson.loads(payload)
        except orjson.JSONDecodeError:
            self._broken = True
            return
        if not isinstance(chunk, dict) or "error" in chunk:
            self._broken = True
            return
        if not self._head:
            self._head = {k: chunk.get(k) for k in _HEAD_KEYS}
        if chunk.get("usage"):
            self._usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            if isinstance(choice, dict):
                self._choice(choice)

    def _choice(self, choice: dict[str, Any]) -> None:
        index = choice.get("index", 0)
        acc = self._choices.setdefault(index if isinstance(index, int) else 0, {})
        if self._chat:
            delta = choice.get("delta")
            accumulate(acc.setdefault("message", {}), delta if isinstance(delta, dict) else {})
        accumulate(acc, {k: v for k, v in choice.items() if k not in ("delta", "index")})

    def result(self) -> bytes | None:
        if self._result is None:
            self._result = self._whole()
        return self._result

    def _whole(self) -> bytes | None:
        if self._broken or not self._done or not self._choices:
            return None
        if any(acc.get("finish_reason") is None for acc in self._choices.values()):
            return None
        body = {
            **{k: v for k, v in self._head.items() if v is not None},
            "object": "chat.completion" if self._chat else "text_completion",
            "choices": [self._whole_choice(i) for i in sorted(self._choices)],
        }
        if self._usage is not None:
            body["usage"] = self._usage
        return orjson.dumps(body)

    def _whole_choice(self, index: int) -> dict[str, Any]:
        acc = self._choices[index]
        if self._chat:
            message = {"role": "assistant", "content": None, **acc.pop("message")}
            calls = message.get("tool_calls")
            if isinstance(calls, list):  # a whole answer's tool calls go by position
                message["tool_calls"] = [_unindexed(call) for call in calls]
            return {"index": index, "message": message, **acc}
        return {"index": index, "text": "", **acc}


def accumulate(into: dict[str, Any], piece: dict[str, Any]) -> None:
    """Adds one streamed piece to what came before, as the `openai` SDK's
    `accumulate_delta` does, except that identity fields (`role`, `id`, `finish_reason`...)
    are replaced, never concatenated, and numbers are replaced, never summed."""
    for key, value in piece.items():
        old = into.get(key)
        if value is None:
            into.setdefault(key, None)
        elif old is None or key in _IDENTITY_KEYS:
            into[key] = _fresh(value)
        elif isinstance(old, str) and isinstance(value, str):
            into[key] = old + value
        elif isinstance(old, dict) and isinstance(value, dict):
            accumulate(old, value)
        elif isinstance(old, list) and isinstance(value, list):
            _extend(old, value)
        else:
            into[key] = value


def _unindexed(call: Any) -> Any:
    return {k: v for k, v in call.items() if k != "index"} if isinstance(call, dict) else call


def _fresh(value: Any) -> Any:
    """A first value, as the accumulator keeps it: indexed lists merged item by item."""
    if isinstance(value, list):
        items: list[Any] = []
        _extend(items, value)
        return items
    return value


def _extend(items: list[Any], more: list[Any]) -> None:
    """Items with an `index` (tool calls) merge into the item of that index; others append."""
    for item in more:
        index = item.get("index") if isinstance(item, dict) else None
        same = [old for old in items if isinstance(old, dict) and old.get("index") == index]
        if isinstance(index, int) and same:
            accumulate(same[0], item)
        else:
            items.append(dict(item) if isinstance(item, dict) else item)


def replay(kind: str, answer: dict[str, Any], include_usage: bool) -> list[bytes]:
    """SSE events for a stored whole answer (see the module docstring for their order)."""
    chat = kind == "chat"
    head: dict[str, Any] = {k: answer[k] for k in _HEAD_KEYS if k in answer}
    head["object"] = "chat.completion.chunk" if chat else "text_completion"
    events = []
    for choice in answer.get("choices") or []:
        pieces = _chat_pieces(choice) if chat else _text_pieces(choice)
        events += [_event({**head, "choices": [piece]}) for piece in pieces]
    if include_usage and "usage" in answer:
        events.append(_event({**head, "choices": [], "usage": answer["usage"]}))
    events.append(DONE)
    return events


def _chat_pieces(choice: dict[str, Any]) -> list[dict[str, Any]]:
    index, logprobs = choice.get("index", 0), choice.get("logprobs")
    message = dict(choice.get("message") or {})
    calls = message.pop("tool_calls", None)
    texts = {f: message.pop(f) for f in _TEXT_FIELDS if _text(message.get(f))}
    spelled = _spelled(logprobs, texts)
    deltas: list[tuple[dict[str, Any], Any]] = []
    for field, text in texts.items():
        tokens = spelled.get(field) if spelled is not None else None
        for part, entry in _pieces(text, tokens):
            deltas.append(({field: part}, _logprob_piece(logprobs, field, entry)))
    for position, call in enumerate(calls if isinstance(calls, list) else []):
        deltas.append(({"tool_calls": [{"index": position, **call}]}, None))
    # The first chunk says the role and the message's other fields (null ones too), and
    # takes the first piece along, as upstreams write it.
    first, first_logprobs = {"role": "assistant", **message}, None
    if deltas:
        (piece, first_logprobs), deltas = deltas[0], deltas[1:]
        first.update(piece)
    chunks = [_chat_chunk(index, d, lp) for d, lp in [(first, first_logprobs), *deltas]]
    last = _last_chunk(choice, {"index": index, "delta": {}}, spelled is None)
    return [*chunks, last]


def _text_pieces(choice: dict[str, Any]) -> list[dict[str, Any]]:
    index, text = choice.get("index", 0), choice.get("text") or ""
    logprobs = choice.get("logprobs")
    tokens = _completion_tokens(logprobs, text)
    chunks = []
    for position, (piece, _) in enumerate(_pieces(text, tokens)):
        chunk: dict[str, Any] = {"index": index, "text": piece}
        if tokens is not None and isinstance(logprobs, dict):
            chunk["logprobs"] = _completion_slice(logprobs, position, len(tokens))
        chunks.append({**chunk, "finish_reason": None})
    last = _last_chunk(choice, {"index": index, "text": ""}, tokens is None)
    return [*chunks, last]


def _last_chunk(choice: dict[str, Any], last: dict[str, Any], whole: bool) -> dict[str, Any]:
    """The finish chunk: the finish reason and the choice's other fields (`stop_reason`...),
    and the logprobs whole when the pieces did not carry them (`whole`)."""
    for key, value in choice.items():
        if key not in ("index", "message", "text", "logprobs", "finish_reason"):
            last[key] = value
    if "logprobs" in choice and whole:
        last["logprobs"] = choice["logprobs"]
    last["finish_reason"] = choice.get("finish_reason")
    return last


def _text(value: Any) -> bool:
    return isinstance(value, str) and value != ""


def _chat_chunk(index: Any, delta: dict[str, Any], logprobs: Any) -> dict[str, Any]:
    chunk: dict[str, Any] = {"index": index, "delta": delta}
    if logprobs is not None:
        chunk["logprobs"] = logprobs
    chunk["finish_reason"] = None
    return chunk


def _spelled(logprobs: Any, texts: dict[str, str]) -> dict[str, list[Any]] | None:
    """The token entries per chat text field (`content`, `refusal`: a logprobs key names
    the field it spells), when every non-empty list of them spells its field's text: then
    the pieces carry them. None otherwise: the finish chunk carries them whole."""
    if not isinstance(logprobs, dict):
        return None
    spelled = {}
    for field, entries in logprobs.items():
        if entries is None or entries == []:
            continue
        if not isinstance(entries, list) or _spelling(entries) != texts.get(field):
            return None
        spelled[field] = entries
    return spelled or None


def _spelling(entries: list[Any]) -> str | None:
    tokens = [e.get("token") if isinstance(e, dict) else None for e in entries]
    return "".join(t for t in tokens if isinstance(t, str)) if all(tokens) else None


def _logprob_piece(logprobs: Any, field: str, entry: Any) -> Any:
    """One token's chat logprobs: its entry under its field, the other keys empty."""
    if entry is None or not isinstance(logprobs, dict):
        return None
    empty: dict[str, Any] = {k: [] if isinstance(v, list) else None for k, v in logprobs.items()}
    return {**empty, field: [entry]}


def _completion_tokens(logprobs: Any, text: str) -> list[str] | None:
    tokens = logprobs.get("tokens") if isinstance(logprobs, dict) else None
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
        return None
    return tokens if "".join(tokens) == text else None


def _completion_slice(logprobs: dict[str, Any], position: int, count: int) -> dict[str, Any]:
    """Token `position`'s share of completion logprobs: one item of each per-token list;
    the other fields ride on the first piece."""
    piece: dict[str, Any] = {}
    for key, value in logprobs.items():
        if isinstance(value, list) and len(value) == count:
            piece[key] = value[position : position + 1]
        elif position == 0:
            piece[key] = value
    return piece


def _pieces(text: str, tokens: list[Any] | None) -> list[tuple[str, Any]]:
    """`text` in pieces: one per token when the logprob tokens spell it, else a few words
    each."""
    if tokens is not None:
        spelled = [t if isinstance(t, str) else t["token"] for t in tokens]
        return list(zip(spelled, tokens, strict=True))
    pieces: list[str] = []
    for word in _WORDS.findall(text):
        if pieces and len(pieces[-1]) < _MIN_PIECE_CHARS:
            pieces[-1] += word
        else:
            pieces.append(word)
    return [(piece, None) for piece in pieces]


def _event(chunk: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(chunk) + b"\n\n"
