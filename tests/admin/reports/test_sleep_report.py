"""The sleep tier in the cold-start report: wakes apart from starts, time asleep apart from
time at zero, GPU-hours saved only at zero; and the configuration that turns it on."""

from __future__ import annotations

import io
from datetime import UTC, datetime
from typing import Any

import pytest
from rich.console import Console

from gateway.admin.reports import ReportQuery
from gateway.admin.reports.cold_start_report import ASLEEP_NOTE, cold_start_report, phases_of
from gateway.admin.reports.html import render
from gateway.admin.reports.table import render_cold_start
from gateway.config_file import parse_settings
from gateway.settings import ConfigError, Settings

T0 = datetime(2026, 1, 31, 12, 0, tzinfo=UTC).timestamp()
SETTINGS = Settings.model_validate(
    {
        "backends": [
            {
                "name": "llm",
                "kind": "process",
                "command": ["vllm", "serve", "m", "--port", "{port}", "--enable-sleep-mode"],
                "models": ["m"],
                "engine": "vllm",
                "sleep": True,
                "scaling": {"idle_s": 60, "sleep_s": 600},
            }
        ]
    }
)


def timeline(kind: str, at: float, outcome: str, *steps: tuple[str, float]) -> dict[str, Any]:
    events = [{"event": name, "at": at + offset} for name, offset in steps]
    return {"backend": "llm", "kind": kind, "outcome": outcome, "begun_at": at, "events": events}


START = timeline(
    "start",
    T0 + 10,
    "served",
    ("request_arrived", 0),
    ("process_started", 0.5),
    ("ready", 40.5),
    ("first_byte", 41.0),
)
WAKE = timeline(
    "wake",
    T0 + 100,
    "served",
    ("request_arrived", 0),
    ("wake_begun", 0),
    ("ready", 2.0),
    ("first_byte", 2.25),
)
FAILED_WAKE = timeline("wake", T0 + 150, "failed", ("request_arrived", 0), ("wake_begun", 0))
# zero until 10, warm 10-80, asleep 80-100, warm 100-130, asleep 130-170, zero 170-200
SCALE = [
    {"ts": T0, "backend": "llm", "ready": 0},
    {"ts": T0 + 10, "backend": "llm", "ready": 1},
    {"ts": T0 + 80, "backend": "llm", "ready": 0, "asleep": 1},
    {"ts": T0 + 100, "backend": "llm", "ready": 1, "asleep": 0},
    {"ts": T0 + 130, "backend": "llm", "ready": 0, "asleep": 1},
    {"ts": T0 + 170, "backend": "llm", "ready": 0, "asleep": 0},
]


def report() -> dict[str, Any]:
    query = ReportQuery(datetime.fromtimestamp(T0, UTC), datetime.fromtimestamp(T0 + 200, UTC))
    return cold_start_report(SETTINGS, query, [START, WAKE, FAILED_WAKE], SCALE, [], now=T0 + 1e6)


def test_wakes_are_counted_and_timed_apart_from_starts() -> None:
    [row] = report()["models"]
    assert (row["cold_starts"], row["failed"]) == (1, 0)
    assert (row["wakes"], row["failed_wakes"]) == (2, 1)
    assert row["ttft_s"]["p50"] == 41.0  # starts only: the wake's 2.25 s is not in it
    assert row["wake_ttft_s"] == {"p50": 2.25, "p95": 2.25, "max": 2.25}
    assert row["phases_s"]["wake"] == 2.0 and row["phases_s"]["weight_load"] == 40.0


def test_time_asleep_is_apart_and_gpu_hours_are_saved_only_at_zero() -> None:
    made = report()
    [row] = made["models"]
    assert (row["time_at_zero_s"], row["time_asleep_s"], row["time_warm_s"]) == (40, 60, 100)
    assert row["gpu_hours_saved"] == round(40 / 3600, 4)
    assert made["notes"] == [ASLEEP_NOTE] and "host RAM" in ASLEEP_NOTE


def test_each_start_says_what_it_was_and_the_table_shows_it() -> None:
    made = report()
    assert [(s["kind"], s["outcome"]) for s in made["starts"]] == [
        ("start", "served"),
        ("wake", "served"),
        ("wake", "failed"),
    ]
    phases, ttft = phases_of(WAKE)
    assert (phases, ttft) == ({"wake": 2.0, "first_byte": 0.25}, 2.25)
    out = io.StringIO()
    render_cold_start(Console(file=out, width=250), made)
    assert "wake: served" in out.getvalue() and "host RAM" in out.getvalue()


def test_a_backend_without_sleep_has_no_note() -> None:
    query = ReportQuery(datetime.fromtimestamp(T0, UTC), datetime.fromtimestamp(T0 + 200, UTC))
    made = cold_start_report(SETTINGS, query, [START], SCALE[:2], [], now=T0 + 1e6)
    assert made["notes"] == [] and made["models"][0]["time_asleep_s"] == 0


SLEEPY = """\
backends:
  - name: llm
    kind: process
    command: [vllm, serve, m, --port, "{port}", --enable-sleep-mode]
    models: [m]
    engine: vllm
    sleep: true
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (SLEEPY.replace("engine: vllm", "engine: tgi"), "sleep needs engine: vllm"),
        (
            "backends:\n  - {name: llm, base_url: 'http://h/v1', models: [m], engine: vllm,"
            " sleep: true}\n",
            "sleep needs a process or kubernetes backend",
        ),
        (SLEEPY + "    scaling: {idle_s: 600, sleep_s: 600}\n", "sleep_s must be longer"),
    ],
)
def test_sleep_is_refused_where_it_cannot_work(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_settings(text, "gw.yaml", {})
    assert expected in str(caught.value)


def test_sleep_defaults() -> None:
    [backend] = parse_settings(SLEEPY, "gw.yaml", {}).backends
    assert backend.sleep and (backend.scaling.idle_s, backend.scaling.sleep_s) == (60, 1800)


def test_the_html_page_shows_wakes_time_asleep_and_the_note() -> None:
    page = render(None, report())
    assert ">asleep<" in page and "2 wakes" in page and "host RAM" in page
