"""The pure helpers of bench/workload_shapes.py."""

from __future__ import annotations

import math
from pathlib import Path

import orjson
import pytest

from bench.capacity import MODEL, capacity_view, engine_flags
from bench.fake_engine import EngineParams, steady_capacity
from bench.loadgen import PhaseResult, Record
from bench.workload_shapes import (
    BATCH,
    DEGRADES,
    ENGINE,
    INTERACTIVE,
    MODES,
    SHAPES,
    SHARES,
    SMALL_ENGINE,
    SMALL_MODEL,
    Phase,
    bound_rps,
    budget_allowed,
    budget_burst,
    counter,
    degrade_config,
    delta,
    engine_figures,
    failed_attempts,
    gateway_counts,
    learned,
    offered,
    served_by,
    shed_by_backend,
)
from gateway.settings import Settings, TrafficSettings

BEFORE = """\
# TYPE gateway_retries counter
gateway_retries_total{backend="primary-pool",reason="connect_error"} 2.0
# TYPE gateway_upstream_errors counter
gateway_upstream_errors_total{backend="primary-pool",kind="UpstreamConnectError"} 1.0
gateway_upstream_errors_total{backend="secondary-pool",kind="timeout"} 7.0
"""
AFTER = """\
# TYPE gateway_retries counter
gateway_retries_total{backend="primary-pool",reason="connect_error"} 5.0
# TYPE gateway_upstream_errors counter
gateway_upstream_errors_total{backend="primary-pool",kind="UpstreamConnectError"} 3.0
gateway_upstream_errors_total{backend="primary-pool",kind="deadline"} 1.0
gateway_upstream_errors_total{backend="secondary-pool",kind="timeout"} 9.0
# TYPE gateway_model_fallbacks counter
gateway_model_fallbacks_total{fallback="secondary",model="primary",reason="unavailable"} 4.0
# TYPE gateway_degraded counter
gateway_degraded_total{action="max_tokens",model="m",tenant="batch"} 6.0
gateway_degraded_total{action="model",model="m",tenant="batch"} 4.0
# TYPE gateway_shed counter
gateway_shed_total{backend="gpu",class="batch",reason="deadline_unreachable"} 11.0
gateway_shed_total{backend="small",class="batch",reason="deadline_unreachable"} 5.0
gateway_shed_total{backend="small",class="batch",reason="queue_full"} 2.0
gateway_shed_total{backend="gpu",class="interactive",reason="deadline_unreachable"} 1.0
"""


def test_counter_sums_matching_samples_by_their_other_labels() -> None:
    found = counter(AFTER, "gateway_upstream_errors_total", backend="primary-pool")
    assert found == {"kind=UpstreamConnectError": 3.0, "kind=deadline": 1.0}
    fallbacks = counter(AFTER, "gateway_model_fallbacks_total", model="primary")
    assert fallbacks == {"fallback=secondary,reason=unavailable": 4.0}
    assert counter(AFTER, "gateway_retries_total", backend="absent") == {}


def test_delta_counts_series_absent_before_from_zero() -> None:
    changed = delta(BEFORE, AFTER, "gateway_upstream_errors_total", backend="primary-pool")
    assert changed == {"kind=UpstreamConnectError": 2.0, "kind=deadline": 1.0}


def test_failed_attempts_are_the_retried_and_the_given_up_ones_of_the_backend() -> None:
    assert failed_attempts(BEFORE, AFTER, "primary-pool") == 3.0 + 3.0
    assert failed_attempts(BEFORE, AFTER, "secondary-pool") == 2.0


def test_budget_burst_is_the_token_cap_and_a_full_reserve() -> None:
    traffic = TrafficSettings()
    assert budget_burst(traffic.retry_budget_ratio, traffic.retry_min_per_s) == 10 + 3
    assert budget_burst(0.0, 3.0) == 3  # nothing saved: the reserve alone
    assert budget_burst(0.2, 0.0) == 10


def test_budget_allows_one_attempt_each_plus_ratio_refill_and_burst() -> None:
    traffic = TrafficSettings()
    assert budget_allowed(100, 10.0, traffic, 13) == pytest.approx(100 * 1.2 + 3 * 10 + 13)


def test_offered_scales_the_mix_then_batch_takes_the_excess() -> None:
    assert offered(0.5) == {INTERACTIVE: SHARES[INTERACTIVE] / 2, BATCH: SHARES[BATCH] / 2}
    assert offered(5.0) == pytest.approx({INTERACTIVE: SHARES[INTERACTIVE], BATCH: 4.3})
    assert sum(offered(5.0).values()) == pytest.approx(5.0)


def test_bound_lies_between_the_shapes_own_bounds() -> None:
    params = EngineParams()
    each = [steady_capacity(params, s.prompt_tokens, s.max_tokens)[1] for s in SHAPES.values()]
    assert min(each) < bound_rps(params) < max(each)


def phase_of(
    records: list[Record], headers: list[list[str | None]], **polls: list[tuple[float, str]]
) -> Phase:
    result = PhaseResult(records=records, headers=headers, polls=polls)
    return Phase(result, (1.0, 3.0))


def test_phase_windows_by_send_time_and_by_completion() -> None:
    records = [
        Record(0, 0.5, 10.0, 600.0, 200, None, False, 16),  # sent before, done in the window
        Record(1, 1.5, 900.0, 900.0, 200, None, False, 64),  # sent and done in it
        Record(1, 2.5, 900.0, 900.0, 200, None, False, 256),  # sent in it, done after
        Record(1, 2.0, 1.0, 1.0, 503, "overloaded", False, 0),
    ]
    phase = phase_of(records, [[None], ["max_tokens=64"], [None], [None]])
    assert phase.sent() == [1, 2, 3]
    assert phase.sent([0]) == []
    assert phase.done([0, 1]) == [0, 1]
    assert phase.header(1) == "max_tokens=64"
    assert phase.seconds == 2.0


def test_phase_without_kept_headers_reads_none() -> None:
    phase = phase_of([Record(0, 1.5, 1.0, 2.0, 200, None, False, 16)], [])
    assert phase.header(0) is None


def test_engine_figures_from_its_stats_at_the_window_edges() -> None:
    first = {"generation_tokens": 100, "busy_steps": 10, "busy_s": 0.2, "aborted": 1}
    last = {"generation_tokens": 1100, "busy_steps": 60, "busy_s": 1.2, "aborted": 3}
    samples = [
        (1.0, orjson.dumps({**first, "clock_s": 50.0}).decode()),
        (3.0, orjson.dumps({**last, "clock_s": 52.0}).decode()),
    ]
    figures = engine_figures(phase_of([], [], engine=samples))
    assert figures["engine_tokens_per_s"] == pytest.approx(500.0)
    assert figures["engine_step_ms_mean"] == pytest.approx(20.0)
    assert figures["engine_aborted"] == 2
    assert engine_figures(phase_of([], [])) == {}


def test_gateway_counts_of_the_batch_class_in_the_window() -> None:
    samples = [(1.0, BEFORE), (3.0, AFTER)]
    counted = gateway_counts(phase_of([], [], metrics=samples))
    assert counted == {"degraded_requests": 6.0, "shed_requests": 18.0}
    assert math.isclose(sum(counted.values()), 24.0)
    by_model = gateway_counts(phase_of([], [], metrics=samples), "model")
    assert by_model == {"degraded_requests": 4.0, "shed_requests": 18.0}


def test_shed_by_backend_sums_its_reasons() -> None:
    samples = [(1.0, BEFORE), (3.0, AFTER)]
    assert shed_by_backend(phase_of([], [], metrics=samples)) == {"gpu": 11.0, "small": 7.0}
    assert shed_by_backend(phase_of([], [])) == {}


def test_served_by_reads_the_model_action_of_the_degraded_header() -> None:
    headers: list[list[str | None]] = [
        [f"model={SMALL_MODEL}"],
        [f"max_tokens=64, model={SMALL_MODEL}"],
        ["max_tokens=64"],
        [None],
        [f"model={SMALL_MODEL}-other"],
    ]
    records = [Record(1, 1.5, 1.0, 2.0, 200, None, False, 256)] * len(headers)
    phase = phase_of(records, headers)
    assert served_by(phase, [0, 1, 2, 3, 4], SMALL_MODEL) == 2
    assert served_by(phase, [2, 3], SMALL_MODEL) == 0


def test_pool_view_and_learned_read_the_named_backend() -> None:
    readyz = orjson.dumps(
        {
            "capacity": {
                "gpu": {"limit": 40, "in_flight": 30, "queued": 2},
                "small": {"limit": 8, "in_flight": 8, "queued": 10},
            }
        }
    ).decode()
    assert capacity_view(readyz, "small") == {"limit": 8, "in_flight": 8, "queued": 10}
    assert capacity_view(readyz, "absent") is None
    assert capacity_view("not json", "gpu") is None
    phase = phase_of([], [], readyz=[(0.5, readyz), (1.5, readyz), (2.5, readyz)])
    assert learned(phase) == {
        "concurrency_limit_mean": 40.0,
        "in_flight_mean": 30.0,
        "queued_mean": 2.0,
    }
    assert learned(phase, "small")["queued_mean"] == 10.0


def test_the_small_engine_is_cheaper_and_serves_the_small_model() -> None:
    flags = engine_flags(SMALL_ENGINE)
    assert flags[flags.index("--model") + 1] == SMALL_MODEL
    assert "--port" not in flags and "--max-num-seqs" not in flags  # defaults left out
    shape = SHAPES[BATCH]
    small = steady_capacity(SMALL_ENGINE, shape.prompt_tokens, shape.max_tokens)[1]
    assert small > 2 * steady_capacity(ENGINE, shape.prompt_tokens, shape.max_tokens)[1]


def test_degrade_configs_validate_and_differ_in_batch_policy(tmp_path: Path) -> None:
    urls = {"gpu": "http://127.0.0.1:1", "small": "http://127.0.0.1:2"}
    for mode in MODES:
        settings = Settings.model_validate(degrade_config(urls, tmp_path, mode))
        batch = next(t for t in settings.tenants if t.name == BATCH)
        assert (batch.degrade is None) == (mode not in DEGRADES)
    on_model = Settings.model_validate(degrade_config(urls, tmp_path, "on_model"))
    assert set(on_model.model_names()) == {MODEL, SMALL_MODEL}
    off = Settings.model_validate(degrade_config(urls, tmp_path, "off"))
    assert off.model_names() == [MODEL]
