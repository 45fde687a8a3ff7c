"""Each replica's learned concurrency limit: how many requests to send it at once so that
the engine is just saturated and the queue forms in the gateway, where fairness, priority
classes and shedding act on it.

A model engine (vLLM, SGLang, TGI) accepts everything and queues what it cannot run in its
own first-come-first-served queue, blind to tenants and deadlines. Its capacity moves with
prompt and output lengths, KV-cache pressure, model and GPU, so nobody can write it in a
config. Two signals; the gateway builds each replica with one (gateway/compose/pools.py): engine
metrics where the backend declares its engine, else latency.

- **Engine metrics** (`EngineLimiter`), when the backend declares its `engine`: requests
  waiting inside the engine, or KV usage at `kv_high`, mean the gateway sent more than
  the engine runs. The limit then becomes the gateway's own share of what the engine runs:
  `in_flight * running / (running + waiting)` (one gateway: what the engine runs; several
  gateway replicas sharing an engine: each its share, so their sum does not overshoot).
  While the engine runs everything it is sent and the limit binds, the limit grows: fast
  (x1.5 per tick) until the first sign of saturation, then by sqrt(limit) a tick, so it
  keeps probing for room the engine gained (a faster step, a bigger KV budget).
- **Latency** (`gateway.traffic.gradient.GradientLimiter`), for an engine without metrics
  (`engine: none`): time to first token of streams and latency per output token of whole
  answers against their long-window baselines (Netflix Gradient2, Envoy adaptive
  concurrency), counted in engine steps (the streams' time per output token) once there
  are streams, so that a step growing with the batch is not taken for a queue. Its
  baseline measurements pin the limit at half of it, never below half the `initial` limit
  (`min_pin`), for a few seconds at start and then rarely.

One signal per replica, never both (`ReplicaCapacity` refuses a latency limiter for an
engine with metrics). Both used to apply, the lower limit winning, on the argument that
an engine shows a queue only at `max_num_seqs` or a full KV cache while prefill steps
double time to first token long before (bench/capacity.py, the fake engine: the engine
limit alone grew to 183 where 17 kept TTFT within 2x). In front of the real vLLM the
latency limiter held the limit at a third of what the engine ran, and SLO goodput at load 1
fell to a seventh of the engine-only limit's (bench/slo_goodput.py, three seeds: 2.8
against 22.9 requests/s; docs/slo-goodput.md). The limit is a whole number of requests, at
least `min_limit`, at most the backend's `max_concurrency` (now a ceiling).

LLM requests are not equal units. Where the engine reports its KV capacity in tokens
(vLLM's `cache_config_info`), slow start ends at the number of requests of the recent mean
expected size (prompt + `max_tokens`) that fit in it: past that point growth is careful
(sqrt(limit) a tick), since each step up may be the one that fills the cache. Not a cap: answers
often end well before `max_tokens`, and the engine's waiting and KV usage say when it is
really full.

`mode: fixed` keeps the old behaviour: the limit is `max_concurrency`, nothing learned.
Everything here is pure (no clock, no I/O); `gateway.traffic.pool` drives it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from gateway.traffic.engine_metrics import Engine, EngineSample
from gateway.traffic.gradient import GradientLimiter, GradientSnapshot, LatencyKind

CapacityMode = Literal["adaptive", "fixed"]

SLOW_START_GROWTH = 1.5  # per tick, until the engine first shows saturation
# Afterwards sqrt(limit) a tick, the queue-size headroom of Gradient2 and Envoy: 17 to 34 in
# 4 ticks (1 s at 0.25 s). A probe past the engine's room leaves about sqrt(limit) requests
# waiting inside it for two ticks before the cut; 5% a tick (tried first) made a gateway
# that had seen one saturation take most of a phase to follow the load back up
# (bench/capacity.py: load-1 throughput 0.57 of the bare engine's).

# Is the engine queueing because it is full? A request that arrived between two steps, or
# that the step's token budget (chunked prefill) left for the next one, shows as waiting
# for a step or two even with room to spare, so `waiting > 0` alone is no proof: under half
# load it cut the limit below the demand. Where the engine counts the time requests waited
# (vLLM's request_queue_time_seconds, TGI's request_queue_duration), the requests that left
# its queue during the tick must have waited more than QUEUED_STEPS engine steps on average
# (the step time from generated tokens over requests running; QUEUE_WAIT_FLOOR_S when that
# is unknown); otherwise waiting must be seen on QUEUED_TICKS ticks in a row.
QUEUED_STEPS = 4
QUEUE_WAIT_FLOOR_S = 0.2
QUEUED_TICKS = 2


@dataclass(frozen=True, slots=True)
class CapacityConfig:
    mode: CapacityMode = "adaptive"
    ceiling: int = 256  # the backend's max_concurrency
    initial: int = 8
    min_limit: int = 1
    engine: Engine = "none"
    kv_high: float = 0.95  # KV usage at which the engine is full (it starts preempting)

    def __post_init__(self) -> None:
        if not 1 <= self.min_limit <= self.ceiling:
            raise ValueError("need 1 <= min_limit <= ceiling")
        if not 0 < self.kv_high <= 1:
            raise ValueError("kv_high must be in (0, 1]")


class EngineLimiter:
    """The limit from what the engine reports it runs and queues."""

    def __init__(self, initial: float, min_limit: float, max_limit: float, kv_high: float) -> None:
        self.limit = initial
        self._min = min_limit
        self._max = max_limit
        self._kv_high = kv_high
        self._queued_ticks = 0
        self._last: tuple[float, EngineSample] | None = None
        self.saturated_once = False
        self.step_s: float | None = None  # the engine's decode step, last measured

    def update(
        self, sample: EngineSample, in_flight: int, expected_tokens: float, now: float
    ) -> float | None:
        """The new limit, or None when the sample says nothing of running or waiting."""
        if sample.running is None and sample.waiting is None:
            return None
        running = sample.running or 0.0
        waiting = _waiting(sample)
        kv_full = sample.kv_usage is not None and sample.kv_usage >= self._kv_high
        queueing = self._queueing(sample, now) or (waiting > 0 and kv_full)
        if queueing:
            self.saturated_once = True
            # Hold when the engine emptied since (nothing to share), or when this gateway
            # sends it nothing: the queue is another gateway's, or what an aborted burst
            # left, and a share of 0 would be a limit of 1 to slow-start from when its own
            # traffic comes (bench/capacity.py: a gateway idle while another drove the
            # engine into its queue met its next load at 3 in flight and refused batch
            # requests for ten seconds).
            if running + waiting > 0 and in_flight > 0:
                share = in_flight * running / (running + waiting)
                self.limit = self._clamp(min(self.limit, share))
        elif kv_full:
            self.saturated_once = True  # full, not yet queueing: hold
        elif waiting > 0:
            pass  # waiting, not (yet) queueing: hold, and see on the next tick
        elif in_flight >= math.floor(self.limit):
            self.limit = self._clamp(self.limit + max(1.0, self._growth(sample, expected_tokens)))
        return self.limit

    def _queueing(self, sample: EngineSample, now: float) -> bool:
        """Whether the engine holds requests in its queue for want of room (see
        QUEUED_STEPS): from its queue-time counters when it has them, else from waiting
        seen on QUEUED_TICKS ticks in a row."""
        waiting = _waiting(sample)
        self._queued_ticks = self._queued_ticks + 1 if waiting > 0 else 0
        last, self._last = self._last, (now, sample)
        step_s = None if last is None else _step_time(last[1], sample, now - last[0])
        if step_s is not None:
            self.step_s = step_s
        if last is None or sample.queue_time_sum is None or sample.queue_time_count is None:
            return self._queued_ticks >= QUEUED_TICKS
        before = last[1]
        if before.queue_time_sum is None or before.queue_time_count is None:
            return self._queued_ticks >= QUEUED_TICKS
        left = sample.queue_time_count - before.queue_time_count
        if left < 0:  # the engine restarted: its counters began again
            return False
        if left == 0:  # nothing left the queue for a whole tick while requests waited
            return self._queued_ticks >= QUEUED_TICKS
        mean_wait_s = (sample.queue_time_sum - before.queue_time_sum) / left
        threshold = QUEUED_STEPS * step_s if step_s is not None else QUEUE_WAIT_FLOOR_S
        if sample.queue_time_at_finish and waiting == 0:
            # vLLM records a wait when the request finishes: this one waited a whole
            # service time ago, and nothing waits now (its queue has drained).
            return False
        return mean_wait_s > threshold

    def _growth(self, sample: EngineSample, expected_tokens: float) -> float:
        """Slow start (x1.5 a tick) until the engine first saturates or the limit reaches
        what surely fits in its KV cache; sqrt(limit) a tick after."""
        probe = math.sqrt(self.limit)
        if self.saturated_once:
            return probe
        kv_tokens = sample.kv_capacity_tokens
        if (
            kv_tokens is not None
            and expected_tokens > 0
            and self.limit >= kv_tokens / expected_tokens
        ):
            return probe
        return self.limit * (SLOW_START_GROWTH - 1)

    def _clamp(self, limit: float) -> float:
        return min(self._max, max(self._min, limit))


def _waiting(sample: EngineSample) -> float:
    """Requests the engine holds for want of room: vLLM's `capacity` reason where it
    says why they wait (a `deferred` request waits for something else), else all."""
    if sample.waiting_for_capacity is not None:
        return sample.waiting_for_capacity
    return sample.waiting or 0.0


def _step_time(before: EngineSample, after: EngineSample, seconds: float) -> float | None:
    """The engine's mean decode step over `seconds`: each step makes one token per running
    request, so steps = tokens generated / requests running."""
    if before.generation_tokens is None or after.generation_tokens is None or seconds <= 0:
        return None
    tokens = after.generation_tokens - before.generation_tokens
    running = ((before.running or 0.0) + (after.running or 0.0)) / 2
    if tokens <= 0 or running <= 0:
        return None
    return seconds * running / tokens


@dataclass(frozen=True, slots=True)
class CapacitySnapshot:
    """One replica's learned capacity, for metrics, /readyz and the admin API."""

    mode: CapacityMode
    limit: int
    source: str  # "fixed", "engine", "latency", or "initial" before either has a say
    engine_limit: float | None
    latency_limit: float | None
    running: float | None
    waiting: float | None
    kv_usage: float | None
    kv_capacity_tokens: int | None
    latency: GradientSnapshot | None


class ReplicaCapacity:
    """One replica's limit: from its engine's metrics where it declares its engine, else
    from the latencies it answers with (`gradient`), else (`mode: fixed`) its ceiling."""

    def __init__(self, config: CapacityConfig, gradient: GradientLimiter | None = None) -> None:
        self.config = config
        fixed = config.mode == "fixed"
        if gradient is not None and (fixed or config.engine != "none"):
            raise ValueError("a latency limiter is for an adaptive replica without metrics")
        self.limit = (
            config.ceiling if fixed else max(config.min_limit, min(config.initial, config.ceiling))
        )
        self._gradient = gradient
        self._engine: EngineLimiter | None = None
        if not fixed and config.engine != "none":
            self._engine = EngineLimiter(
                self.limit, config.min_limit, config.ceiling, config.kv_high
            )
        self._latency_step_s: float | None = None  # `step_s`
        self.sample: EngineSample | None = None
        self._engine_limit: float | None = None
        self._expected_tokens = 0.0  # mean prompt + max_tokens of recent requests

    @property
    def adaptive(self) -> bool:
        return self.config.mode == "adaptive"

    @property
    def ceiling(self) -> int:
        """The most requests it may ever have in flight: max_concurrency (with a fixed
        limit, the limit itself)."""
        return self.config.ceiling

    def observe(self, kind: LatencyKind, seconds: float, now: float) -> None:
        """A latency sample from an answer this replica gave."""
        if self._gradient is not None:
            self._gradient.observe(kind, seconds, now)

    def observe_step(self, seconds: float) -> None:
        """A finished stream's time per output token after the first: the engine's step."""
        if self._gradient is not None:
            self._gradient.observe_step(seconds)

    def sent(self, expected_tokens: int) -> None:
        """A request of this many expected KV tokens (prompt + max_tokens) went out."""
        self._expected_tokens += 0.05 * (expected_tokens - self._expected_tokens)

    def update(self, now: float, in_flight: int, sample: EngineSample | None) -> int:
        """One control tick: the new limit from the latest engine sample (None: none
        read, or the engine has no metrics) and the latency samples since the last."""
        if not self.adaptive:
            return self.limit
        self.sample = sample
        limit: float | None = None
        if self._engine is not None:  # no metrics this tick (None): the limit holds
            self._engine_limit = None
            if sample is not None:
                tokens = self._expected_tokens
                self._engine_limit = self._engine.update(sample, in_flight, tokens, now)
            limit = self._engine_limit
        elif self._gradient is not None:
            limit = self._gradient.update(now, in_flight)
            self._remember_step(self._gradient)
        if limit is not None:
            self.limit = max(self.config.min_limit, min(self.config.ceiling, math.floor(limit)))
        return self.limit

    def _remember_step(self, gradient: GradientLimiter) -> None:
        """The streams' step time where there is one, else the latency per output token,
        the last one known: a latency measurement clears the recent samples, and with no
        step time pacing was off just when the limit came back from the measurement's pin,
        and dozens of batch prompts went at once (bench/capacity.py --quick,
        adaptive-latency, after the step-time change: interactive requests refused)."""
        if gradient.step_s is not None:
            self._latency_step_s = gradient.step_s
            return
        kind = gradient.snapshot().kinds.get("per_token")
        if kind is not None and kind.recent is not None:
            self._latency_step_s = kind.recent

    @property
    def step_s(self) -> float | None:
        """The engine's decode step time, for pacing (gateway.traffic.pacing): from its
        metrics where they are read, else the streams' time per output token, else the
        recent median latency per output token of whole answers (a step per token, plus a
        little prefill and queueing); None with a fixed limit."""
        if not self.adaptive:
            return None
        if self._engine is not None and self._engine.step_s is not None:
            return self._engine.step_s
        return self._latency_step_s

    def headroom(self, in_flight: int) -> float:
        """How much more this replica can take: its limit less what is on it and what its
        engine queues, less a share for KV pressure (replica choice takes the most)."""
        room = float(self.limit - in_flight)
        sample = self.sample
        if sample is not None:
            room -= sample.waiting or 0.0
            if sample.kv_usage is not None:
                room -= self.limit * max(0.0, sample.kv_usage - 0.5)
        return room

    def snapshot(self) -> CapacitySnapshot:
        sample = self.sample
        gradient = self._gradient
        return CapacitySnapshot(
            mode=self.config.mode,
            limit=self.limit,
            source=self._source(),
            engine_limit=self._engine_limit,
            latency_limit=gradient.limit if gradient is not None else None,
            running=sample.running if sample else None,
            waiting=sample.waiting if sample else None,
            kv_usage=sample.kv_usage if sample else None,
            kv_capacity_tokens=sample.kv_capacity_tokens if sample else None,
            latency=gradient.snapshot() if gradient is not None else None,
        )

    def _source(self) -> str:
        if not self.adaptive:
            return "fixed"
        if self._engine_limit is not None:
            return "engine"
        return "latency" if self._gradient is not None else "initial"


def fixed_capacity(limit: int) -> ReplicaCapacity:
    """A replica sent exactly `limit` requests at once (`mode: fixed`)."""
    return ReplicaCapacity(CapacityConfig("fixed", ceiling=limit))
