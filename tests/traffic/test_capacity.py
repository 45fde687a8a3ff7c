"""The learned per-replica limit (gateway/traffic/capacity.py): the engine-metrics rule, its
combination with the latency limiter, and replica choice by headroom."""

from __future__ import annotations

import pytest

from gateway.traffic.capacity import (
    QUEUED_TICKS,
    CapacityConfig,
    EngineLimiter,
    ReplicaCapacity,
    fixed_capacity,
)
from gateway.traffic.engine_metrics import EngineSample
from gateway.traffic.gradient import GradientLimiter


def engine(initial: float = 8, ceiling: float = 256) -> EngineLimiter:
    return EngineLimiter(initial, 1, ceiling, kv_high=0.95)


def test_the_limit_grows_fast_while_the_engine_runs_everything_it_is_sent() -> None:
    limiter = engine()
    limits = []
    for _ in range(6):
        limit = limiter.update(
            EngineSample(running=limiter.limit, waiting=0), int(limiter.limit), 0, 0.0
        )
        assert limit is not None
        limits.append(limit)
    assert limits == sorted(limits) and limits[-1] > 60  # x1.5 a tick from 8


def test_an_idle_replica_does_not_grow_its_limit() -> None:
    limiter = engine()
    for _ in range(20):
        limiter.update(EngineSample(running=2, waiting=0, kv_usage=0.1), 2, 0, 0.0)
    assert limiter.limit == 8


def test_a_queue_inside_the_engine_brings_the_limit_to_what_it_runs() -> None:
    limiter = engine(initial=100)
    # one tick of waiting is a request that arrived between two steps: no change
    assert limiter.update(EngineSample(running=40, waiting=60), 100, 0, 0.0) == 100
    assert limiter.update(EngineSample(running=40, waiting=60), 100, 0, 0.0) == pytest.approx(40)
    # then it probes upward by sqrt(limit) a tick, not at the slow-start pace
    assert limiter.update(EngineSample(running=40, waiting=0), 40, 0, 0.0) == pytest.approx(
        40 + 40**0.5
    )


def test_several_gateways_sharing_an_engine_each_take_their_share() -> None:
    """Waiting counts every gateway's requests: each shrinks to its own share of what the
    engine runs, so the sum of their limits is what it runs, not a multiple of it."""
    limiters = [engine(initial=60), engine(initial=60)]
    sample = EngineSample(running=60, waiting=60)  # 120 sent by two gateways, 60 each
    for _ in range(QUEUED_TICKS):
        limits = [lim.update(sample, 60, 0, 0.0) for lim in limiters]
    assert sum(limit or 0 for limit in limits) == pytest.approx(60)


def test_a_gateway_that_sends_nothing_keeps_its_limit_while_another_fills_the_engine() -> None:
    """The engine queues another gateway's requests (or an aborted burst's): this one, with
    nothing in flight, has no share to take; cut to it, it would meet its own traffic at a
    limit of 1. It still learns that the engine saturates (careful growth from then on)."""
    limiter = engine(initial=20)
    sample = EngineSample(running=60, waiting=60)
    for _ in range(QUEUED_TICKS + 2):
        assert limiter.update(sample, 0, 0, 0.0) == 20
    assert limiter.saturated_once
    cut = limiter.update(sample, 10, 0, 0.0)  # its own requests among them: its share
    assert cut == pytest.approx(5)


def test_a_full_kv_cache_holds_the_limit_and_with_a_queue_cuts_it_at_once() -> None:
    limiter = engine(initial=50)
    assert limiter.update(EngineSample(running=50, waiting=0, kv_usage=0.97), 50, 0, 0.0) == 50
    cut = limiter.update(EngineSample(running=30, waiting=20, kv_usage=0.99), 50, 0, 0.0)
    assert cut == pytest.approx(30)


def queue(
    now: float, waited_s: float, left: int, generated: float, **gauges: float
) -> EngineSample:
    """A vLLM sample with its queue-time counters: `waited_s` seconds in all by the `left`
    requests that left the queue so far, `generated` tokens so far."""
    return EngineSample(
        queue_time_sum=waited_s, queue_time_count=left, generation_tokens=generated, **gauges
    )


def test_waiting_a_step_or_two_for_the_prefill_budget_is_not_saturation() -> None:
    """20 running, a 20 ms step (20 tokens per step: 250 tokens in 0.25 s); requests wait
    a step or two (30 ms, under 4 steps): the limit holds, however long waiting shows."""
    limiter = engine(initial=30)
    limiter.update(queue(0.0, 0.0, 0, 0.0, running=20, waiting=3), 30, 0, 0.0)
    for tick in range(1, 6):
        sample = queue(
            0.25 * tick, 0.03 * 10 * tick, 10 * tick, 250.0 * tick, running=20, waiting=3
        )
        assert limiter.update(sample, 30, 0, 0.25 * tick) == 30


def test_waiting_many_steps_is_saturation_at_the_first_tick() -> None:
    """The same engine, requests now leave its queue after 200 ms (10 steps): cut at once to
    the gateway's share of what it runs."""
    limiter = engine(initial=30)
    limiter.update(queue(0.0, 0.0, 0, 0.0, running=20, waiting=10), 30, 0, 0.0)
    cut = limiter.update(queue(0.25, 0.2 * 10, 10, 250.0, running=20, waiting=10), 30, 0, 0.25)
    assert cut == pytest.approx(30 * 20 / 30)


def test_an_engine_that_emptied_within_the_tick_is_not_divided_by_zero() -> None:
    """Requests left its queue late, and by the scrape nothing runs or waits: no cut."""
    limiter = engine(initial=30)
    limiter.update(queue(0.0, 0.0, 0, 0.0, running=20, waiting=10), 30, 0, 0.0)
    assert limiter.update(queue(0.25, 5.0, 10, 250.0, running=0, waiting=0), 30, 0, 0.25) == 30


def test_unknown_metrics_leave_the_decision_to_latency() -> None:
    assert engine().update(EngineSample(kv_usage=0.5), 8, 0, 0.0) is None


def test_slow_start_ends_where_the_mean_request_surely_fits_in_the_kv_cache() -> None:
    """20,000 tokens of KV and requests of 500 expected tokens: 40 fit. Growth is x1.5 a
    tick below that, sqrt(limit) above."""
    limiter = engine(initial=30)
    sample = EngineSample(running=30, waiting=0, kv_capacity_tokens=20_000)
    assert limiter.update(sample, 30, 500, 0.0) == pytest.approx(45)
    assert limiter.update(sample, 45, 500, 0.0) == pytest.approx(45 + 45**0.5)


def test_limits_stay_within_min_and_ceiling() -> None:
    limiter = EngineLimiter(8, 2, 10, kv_high=0.95)
    for _ in range(10):
        limiter.update(EngineSample(running=10, waiting=0), 10, 0, 0.0)
    assert limiter.limit == 10
    for _ in range(QUEUED_TICKS):
        limiter.update(EngineSample(running=0, waiting=5), 10, 0, 0.0)
    assert limiter.limit == 2


def capacity(engine_name: str = "vllm", initial: int = 8) -> ReplicaCapacity:
    """A replica limited by its engine's metrics, or (`engine_name` "") by latency."""
    config = CapacityConfig("adaptive", 256, initial, 1, "vllm" if engine_name else "none")
    if engine_name:
        return ReplicaCapacity(config)
    return ReplicaCapacity(config, GradientLimiter(initial, min_limit=1, max_limit=256))


def test_the_step_time_from_latency_outlasts_a_measurement_that_clears_the_samples() -> None:
    """Without engine metrics the step time (for pacing) is the latency per output token;
    a latency measurement clears the recent samples, and the pace keeps the last one
    known instead of turning off (None: no pacing) when the limit comes back."""
    gradient = GradientLimiter(8, probe_samples=3, probe_max_s=1.0)
    replica = ReplicaCapacity(CapacityConfig("adaptive", 256, 8, 1, "none"), gradient)
    assert replica.step_s is None  # nothing measured yet
    now, cleared = 0.0, False
    for _ in range(40):
        now += 0.25
        for _ in range(4):
            replica.observe("per_token", 0.02, now)
        replica.update(now, 2, None)
        snapshot = gradient.snapshot()
        cleared = snapshot.phase == "probing" and snapshot.kinds["per_token"].recent is None
        if cleared:  # the measurement just ended, and cleared its samples
            break
    assert cleared
    assert replica.step_s == pytest.approx(0.02)


def test_an_engine_with_metrics_is_limited_by_them_alone() -> None:
    """One signal per replica: a latency limiter beside engine metrics is refused, and a
    tick without metrics holds the engine's limit (latency has no say)."""
    replica = capacity(initial=40)
    now = 0.0
    for _ in range(QUEUED_TICKS):
        now += 0.25
        replica.update(now, 40, EngineSample(running=20, waiting=20))
    assert replica.limit == 20
    assert replica.snapshot().source == "engine"
    replica.observe("ttft", 100.0, now)
    assert replica.update(now + 0.25, 20, None) == 20
    assert replica.snapshot().latency_limit is None
    config = CapacityConfig("adaptive", 256, 8, 1, "vllm")
    with pytest.raises(ValueError, match="without metrics"):
        ReplicaCapacity(config, GradientLimiter(8))
    with pytest.raises(ValueError, match="without metrics"):
        ReplicaCapacity(CapacityConfig("fixed", 4), GradientLimiter(8))


def test_a_fixed_replica_never_moves() -> None:
    replica = fixed_capacity(4)
    replica.observe("ttft", 100.0, 0.0)
    assert replica.update(1.0, 4, EngineSample(running=1, waiting=9)) == 4
    assert replica.snapshot().source == "fixed"


def test_headroom_counts_the_engine_queue_and_kv_pressure() -> None:
    idle, queued = capacity(initial=10), capacity(initial=10)
    idle.update(0.25, 0, EngineSample(running=2, waiting=0, kv_usage=0.2))
    queued.update(0.25, 0, EngineSample(running=2, waiting=3, kv_usage=0.2))
    assert idle.headroom(2) > queued.headroom(2)
    full = capacity(initial=10)
    full.update(0.25, 0, EngineSample(running=2, waiting=0, kv_usage=0.9))
    assert idle.headroom(2) > full.headroom(2)


def test_the_step_time_for_pacing_comes_from_the_engine_else_from_latency() -> None:
    """20 running making 250 tokens in 0.25 s: a 20 ms step. Without metrics, the recent
    median latency per output token stands for it; a fixed replica is not paced."""
    replica = capacity(initial=30)
    assert replica.step_s is None
    replica.update(0.0, 30, queue(0.0, 0.0, 0, 0.0, running=20, waiting=0))
    replica.update(0.25, 30, queue(0.25, 0.0, 0, 250.0, running=20, waiting=0))
    assert replica.step_s == pytest.approx(0.02)
    blind = capacity(engine_name="", initial=30)
    for i in range(5):
        blind.observe("per_token", 0.03, 0.1 * i)
    blind.update(0.5, 30, None)
    assert blind.step_s == pytest.approx(0.03)
    assert fixed_capacity(4).step_s is None
