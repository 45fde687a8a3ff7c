"""Incremental decoding with a toy word-piece decoder, as BERT-style tokenizers behave."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from backends.worker.detokenizer import IncrementalDecoder

PIECES = ["hello", "wor", "##ld", ",", "stop", "##s", "here", "\ufffd"]


def decode(ids: Sequence[int]) -> str:
    text = " ".join(PIECES[i] for i in ids).replace(" ##", "")
    return text.replace(" ,", ",")  # a clean-up that rewrites the previous text


def run(ids: Sequence[int], stop: Sequence[str] = ()) -> tuple[list[str], bool]:
    decoder = IncrementalDecoder(decode, stop)
    pieces = []
    for token in ids:
        pieces.append(decoder.push(token))
        if decoder.stopped:
            break
    pieces.append(decoder.flush())
    return pieces, decoder.stopped


def test_pieces_add_up_to_the_whole_text() -> None:
    pieces, stopped = run([0, 1, 2, 3, 6])
    assert "".join(pieces) == decode([0, 1, 2, 3, 6]) == "hello world, here"
    assert not stopped


def test_half_characters_are_held_until_the_end() -> None:
    pieces, _ = run([0, 7])
    assert pieces == ["hello", " ", "\ufffd"]


@pytest.mark.parametrize(
    ("ids", "stop", "expected", "stopped"),
    [
        ([0, 4, 6], ["stop"], "hello ", True),
        ([0, 1, 2], ["world"], "hello ", True),  # a stop made of two tokens
        ([0, 4, 5, 6], ["stops here"], "hello ", True),
        ([0, 4, 5], ["stop here"], "hello stops", False),  # held back, then released
    ],
)
def test_stop_strings_end_the_text_before_them(
    ids: list[int], stop: list[str], expected: str, stopped: bool
) -> None:
    pieces, was_stopped = run(ids, stop)
    assert ("".join(pieces), was_stopped) == (expected, stopped)


def test_a_possible_stop_is_not_released_early() -> None:
    decoder = IncrementalDecoder(decode, ["stops here"])
    assert decoder.push(0) == "hello"
    assert decoder.push(4) == " "
    assert decoder.push(5) == ""
    assert decoder.push(6) == ""
    assert decoder.stopped
