"""The configurations under config/ load with the gateway's own loader; the vLLM examples
start vLLM the way docs/scale-to-zero.md "Load formats" says; `scaling.schedule` errors name
key and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.processes import ROOT
from gateway.config_file import load_settings, parse_settings
from gateway.settings import Backend, ConfigError

EXAMPLES = sorted((ROOT / "config").glob("*.yaml"))
ENV = {"GATEWAY_K8S_TOKEN": "test-token"}  # what the examples need set; the rest default
LOAD_FORMATS = {"runai_streamer", "fastsafetensors"}


def test_there_are_vllm_examples_for_both_load_formats() -> None:
    names = {path.name for path in EXAMPLES}
    assert {"vllm-runai-streamer.yaml", "vllm-fastsafetensors.yaml"} <= names
    assert "vllm-kubernetes.yaml" in names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_config_loads(path: Path) -> None:
    settings = load_settings(path, ENV)
    assert settings.backends


def _vllm_backends() -> list[tuple[str, Backend]]:
    found = []
    for path in EXAMPLES:
        for backend in load_settings(path, ENV).backends:
            if backend.kind == "process" and backend.command[:2] == ["vllm", "serve"]:
                found.append((f"{path.name}:{backend.name}", backend))
    return found


@pytest.mark.parametrize(("where", "backend"), _vllm_backends(), ids=lambda v: str(v))
def test_vllm_process_backends_load_what_the_gateway_staged_or_stream_from_s3(
    where: str, backend: Backend
) -> None:
    command = backend.command
    assert backend.engine == "vllm", where
    assert command[command.index("--load-format") + 1] in LOAD_FORMATS, where
    assert command[command.index("--served-model-name") + 1] == backend.models[0], where
    assert "{port}" in command and backend.ready_path == "/health", where
    model = command[2]
    if model == "{weights}":
        assert backend.weights is not None, f"{where}: {{weights}} needs `weights`"
    else:  # vLLM reads s3:// only through the Run:ai streamer, and stages nothing
        assert model.startswith("s3://") and backend.weights is None, where
        assert command[command.index("--load-format") + 1] == "runai_streamer", where


SCHEDULED = """\
backends:
  - name: up
    kind: process
    command: [serve]
    models: [m1]
    scaling:
      max_replicas: 2
      timezone: Europe/Berlin
      schedule:
        - {cron: "0 8 * * mon-fri", duration_s: 36000, min_replicas: 2}
"""


def test_a_schedule_parses_into_windows_in_its_zone() -> None:
    scaling = parse_settings(SCHEDULED, "s.yaml", {}).backends[0].scaling
    plan = scaling.plan()
    assert str(plan.zone) == "Europe/Berlin"
    (window,) = plan.windows
    assert (window.duration_s, window.min_replicas) == (36000, 2)
    assert window.cron.weekdays == {1, 2, 3, 4, 5} and window.cron.hours == {8}


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            ('"0 8 * * mon-fri"', '"61 8 * * mon-fri"'),
            "s.yaml:10: backends.0.scaling.schedule.0.cron: Value error, minute '61': 61 is "
            "outside 0-59",
        ),
        (
            ('"0 8 * * mon-fri"', '"0 8 * *"'),
            "backends.0.scaling.schedule.0.cron: Value error, cron '0 8 * *' has 4 fields",
        ),
        (
            ("Europe/Berlin", "Europe/Berlinn"),
            "s.yaml:8: backends.0.scaling.timezone: Value error, unknown time zone",
        ),
        (
            ("min_replicas: 2}", "min_replicas: 3}"),
            "schedule window's min_replicas must not exceed max_replicas",
        ),
        (("duration_s: 36000", "duration_s: 0"), "schedule.0.duration_s"),
        (
            ("kind: process", "kind: http\n    base_url: http://x/v1"),
            "needs a process or kubernetes",
        ),
    ],
)
def test_schedule_errors_name_key_and_line(change: tuple[str, str], expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_settings(SCHEDULED.replace(*change), "s.yaml", {})
    assert expected in str(caught.value)


def test_env_is_for_process_backends_only() -> None:
    text = SCHEDULED.replace("    command: [serve]\n", "    command: [serve]\n    env: {A: b}\n")
    assert parse_settings(text, "s.yaml", {}).backends[0].env == {"A": "b"}
    static = "backends:\n  - {name: up, base_url: 'http://x/v1', models: [m], env: {A: b}}\n"
    with pytest.raises(ConfigError, match="env is for process backends"):
        parse_settings(static, "s.yaml", {})


def test_launch_cpus_is_a_count_of_one_or_more() -> None:
    backend = "backends:\n  - {name: up, base_url: 'http://x:{port}/v1', models: [m], "
    launched = backend + "launch: {command: [serve], cpus: %s}}\n"
    launch = parse_settings(launched % "2", "l.yaml", {}).backends[0].launch
    assert launch is not None and launch.cpus == 2
    with pytest.raises(ConfigError, match=r"launch\.cpus"):
        parse_settings(launched % "0", "l.yaml", {})
