"""Configuration errors stop start-up with a message naming the key and its line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.processes import ROOT
from gateway.compose.pools import _capacity
from gateway.config_file import parse_settings
from gateway.settings import ConfigError

GOOD = """\
backends:
  - name: up
    base_url: http://127.0.0.1:9/v1
    models: [m1]
tenants:
  - name: t1
"""


def test_good_config_parses_with_defaults() -> None:
    settings = parse_settings(GOOD, "good.yaml", {})
    assert settings.state.url == "memory"
    assert settings.backends[0].timeouts.read_s == 300
    assert settings.tenants[0].models == ["*"]
    assert settings.backends[0].prefill_chunk_tokens is None  # a prompt prefills in a step


def test_controllers_switched_off_for_an_ablation_parse_as_a_set() -> None:
    text = GOOD + "traffic: {controllers_off: [pacing, prefill_gate, pacing]}\n"
    settings = parse_settings(text, "x.yaml", {})
    assert settings.traffic.controllers_off == {"pacing", "prefill_gate"}
    assert parse_settings(GOOD, "x.yaml", {}).traffic.controllers_off == frozenset()


def test_a_partial_deadline_setting_keeps_the_other_classes_defaults() -> None:
    settings = parse_settings(GOOD + "traffic: {deadline_s: {interactive: 30}}\n", "x.yaml", {})
    assert settings.traffic.deadline_s == {"interactive": 30.0, "batch": 600.0}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (GOOD.replace("base_url: http", "base_url: ftp"), "good.yaml:3: backends.0.base_url"),
        (
            GOOD.replace("models: [m1]", "models: [m1]\n    max_concurency: 3"),
            "good.yaml:5: backends.0.max_concurency: Extra inputs are not permitted",
        ),
        (
            GOOD.replace("models: [m1]", "models: [m1]\n    prefill_chunk_tokens: 0"),
            "good.yaml:5: backends.0.prefill_chunk_tokens",
        ),
        (GOOD + "    weight: -1\n", "good.yaml:7: tenants.0.weight"),
        (GOOD + "    keys: [{sha256: nothex}]\n", "good.yaml:7: tenants.0.keys.0.sha256"),
        (GOOD + "state: {url: postgres://x}\n", "good.yaml:7: state.url"),
        (GOOD + "  - name: t1\n", "duplicate name 't1' in tenants"),
        ("backends: []\n", "good.yaml:1: backends"),
        (GOOD + "traffic: {controllers_off: [gradient]}\n", "good.yaml:7: traffic.controllers_off"),
        (
            GOOD.replace(
                "models: [m1]",
                "models: [m1]\n    engine: vllm\n    concurrency: {latency_tolerance: 2}",
            ),
            "latency_tolerance applies only with engine: none",
        ),
    ],
)
def test_bad_config_names_key_and_line(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_settings(text, "good.yaml", {})
    assert expected in str(caught.value)


def test_env_references_expand_and_missing_ones_are_named() -> None:
    text = GOOD.replace("models: [m1]", "models: [m1]\n    api_key: ${UP_KEY}")
    settings = parse_settings(text, "x.yaml", {"UP_KEY": "s3cret"})
    assert settings.backends[0].api_key is not None
    assert settings.backends[0].api_key.get_secret_value() == "s3cret"
    assert "s3cret" not in repr(settings)
    with pytest.raises(ConfigError, match="UP_KEY is not set"):
        parse_settings(text, "x.yaml", {})


def test_invalid_yaml_is_reported() -> None:
    with pytest.raises(ConfigError, match="invalid YAML"):
        parse_settings("backends: [\n", "x.yaml", {})


def test_serve_with_bad_config_exits_with_message(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(GOOD.replace("name: t1", "name: t1\n    priority: urgent"))
    result = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", "--config", str(path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert result.returncode == 2
    assert f"{path}:7: tenants.0.priority" in result.stderr


def test_an_engine_with_metrics_is_limited_by_them_alone_and_one_without_by_latency() -> None:
    """In front of vLLM the latency limiter held the limit far below what the engine ran
    (docs/slo-goodput.md): an engine whose metrics are read is limited by them alone;
    latency limits only an engine without (`engine: none`)."""
    text = GOOD.replace("models: [m1]", "models: [m1]\n    engine: vllm")
    vllm = parse_settings(text, "x.yaml", {}).backends[0]
    none = parse_settings(GOOD, "x.yaml", {}).backends[0]
    assert _capacity(vllm).snapshot().latency_limit is None
    assert _capacity(none).snapshot().latency_limit is not None
