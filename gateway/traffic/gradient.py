"""A latency-gradient concurrency limit for one engine replica.

How many requests to send a continuous-batching engine (vLLM and the like) at once: enough
to fill its batch and no more, so that the queue forms in the gateway, where fair queueing
and priorities act, and not inside the engine. An engine that publishes no metrics shows
it only through latency, so the limit is learned from latency samples, as TCP learns a
congestion window from round-trip times. Pure: the caller passes samples, in-flight and
`now`, calls `update` every 0.25 to 0.5 s, and admits while `in_flight < limit`.

Two kinds of latency
    `"ttft"` (streams) stays nearly flat while the batch has room and jumps by a queue wait,
    a whole service time, once the engine queues: the knee signal. `"per_token"` (total
    latency over completion tokens, whole answers) rises gently below the knee too, since a
    decode step costs a + b x running, and above it only in proportion to the overload.
    Each kind keeps its own baseline and recent median. TTFT is held to `ttft_tolerance`
    (2: its jump at the knee dwarfs its rise with the batch and prompt-length noise);
    per-token latency to `per_token_tolerance` (1.25) where it is the only signal, else to
    TTFT's, as a backstop (preemption storms show there first). The worst kind decides.

In engine steps, once streams say how long a step takes
    A finished stream's time per output token (`observe_step`) is the engine's step time
    while it ran. Once there is one, both kinds are counted in steps: a sample over the
    median of the last STEP_SAMPLES steps, and a baseline learned in seconds over that
    first step time (re-measuring it pinned the limit for 3 s of a fresh gateway's start).
    A step grows with the batch, and so does a queue-free TTFT (the rest of the running
    step, then the step that computes the prompt) and a whole answer's latency per token,
    so in steps neither rises with the batch; a wait inside the engine's own queue still
    adds whole service times. In seconds, an engine whose step grows steeply with the batch
    looked queued long before it was: vLLM's CPU build runs 52-71 requests at the load it
    just carries, its step 4-10x the unloaded one, and this limiter, reading that rise as a
    queue, held it to 22 (half the requests refused; bench/slo_goodput.py,
    docs/slo-goodput.md). Without streams (whole answers
    only) there is no step time, and samples stay in seconds.

The update
    gradient = tolerance x baseline / recent, within [0.5, 1], or [0.5, 2] after 8 updates
    in a row without a cut, and from the start until the first cut (TCP's slow start: fast
    far below the knee, gentle near it; `initial` says nothing about where the knee is);
        target = limit x gradient + sqrt(limit x gradient)
        limit += smoothing x (target - limit), within [min_limit, max_limit]
    The sqrt headroom probes upwards and puts the limit a little past the knee, where the
    gradient is 1 - 1/sqrt(limit). The limit moves only while it binds (in-flight at least
    `binding_fraction` of it): an idle replica's fast answers say nothing about more load,
    and a slow one's latency nothing about a queue of ours (nor about a stale baseline).

The baseline ("measuring_min")
    Measured with the limit pinned at `probe_fraction` of itself: drain to the pin (or for
    DRAIN_MAX_S), drop the samples of requests sent before (TTFT: sent at now - seconds;
    per-token: as many as were in flight), take the median of `probe_samples`. Then halve
    the pin and measure again, until halving no longer more than halves TTFT (a latency
    linear in the batch cannot, a queue wait can) or, as the only kind, cuts per-token
    latency by 30%: that pin is below the knee, whatever the limit was. The higher pin of
    the agreeing pair gives the baselines (nearer the working batch, so less of the rise
    with the batch passes for a queue), and the limit comes back, but no higher than the
    lowest pin seen queueing: from a limit of 256 at C = 20 it lands near 20 at once. A
    series runs at start, every `probe_interval_s` (plus up to `probe_jitter` of it), when
    the traffic is of kinds without a baseline (none with one had a sample for
    MAX_SAMPLE_AGE_S), when the limit meets a cut at 2.5x the pin of its
    baselines or more (the rise with the batch may be what holds it; those baselines then
    stand for the series' second pin, so one pin suffices when they agree), and when the
    limit was cut by 30% while the latency eased by under 10%: the engine got slower, the
    latency is not our queue's, so the cuts are undone and the series pins at half the
    limit from before them.

From Netflix concurrency-limits, Gradient2Limit
    (concurrency-limits-core/src/main/java/com/netflix/concurrency/limits/limit/
    Gradient2Limit.java and README.md, https://github.com/Netflix/concurrency-limits):
    limit x gradient + queue size, smoothed by 0.2; the gradient within [0.5, 1]; no growth
    while app-limited (there: in-flight under half the limit; here 0.8, as the caller's
    count is exact). Not its baseline, a 600-sample EMA of latency pulled down when it
    exceeds twice the recent latency: under steady load the limit sits where latency is above
    that EMA, so the EMA climbs after the queue the limit allows, the gradient returns to 1
    and the limit grows again. Against the tests' simulated engine (20 slots) a Gradient2
    baseline fed one median per 0.25 s crept from 1.2 to 1.8 times the slots in ten minutes
    (to 7 times with a 100-sample EMA); this module's stayed at 1.06. A gateway that wants
    the queue on its own side cannot have that drift; a pinned measurement never sees our
    queue, and takes a lasting change of the engine whole.

From Envoy's adaptive concurrency filter, gradient controller
    (source/extensions/filters/http/adaptive_concurrency/controller/gradient_controller.cc,
    https://www.envoyproxy.io/docs/envoy/latest/configuration/http/http_filters/
    adaptive_concurrency_filter): the minRTT measured at a pinned concurrency with jitter,
    samples from before the pin ignored, a buffer on the baseline, the median as aggregate,
    the gradient ceiling of 2, the sqrt headroom, and re-measuring when the limit looks
    stuck (Envoy: at its minimum for 5 windows). Different: Envoy pins to a fixed 3. LLM
    requests last seconds to minutes, so that would idle a batch of dozens for tens of
    seconds per measurement, and per-token latency at 3 in flight is far below its
    queue-free value at the working batch; half the limit is below the knee once the limit
    is right. Halving until latency stops falling keeps that safe when the limit is wrong,
    and "cut without relief" replaces "at the minimum", which the sqrt headroom keeps a
    stale baseline's limit above. Two latency kinds with their own baselines are new.

Over 400 lines: the limiter and its small helpers (per-kind latency windows, the
measurement at a pin, the watch on cuts) are one state machine; apart, each would need the
others' state passed in and out on every update.
"""

from __future__ import annotations

import math
import random
import statistics
from collections import deque
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Literal

LatencyKind = Literal["ttft", "per_token"]
Phase = Literal["measuring_min", "probing"]
# Why a series of baseline measurements began (module docstring, "The baseline").
Cause = Literal["start", "interval", "no_baseline", "outgrown", "slower_engine"]
KINDS: tuple[LatencyKind, ...] = ("ttft", "per_token")
Medians = Mapping[LatencyKind, float]  # one measurement's result, per kind

MIN_GRADIENT = 0.5  # one update cuts at most half: an outlier window is not an outage
# Near the knee the limit grows by the sqrt headroom only (a gradient of at most 1, as in
# Gradient2): TTFT gives no warning before the knee, and growing 10% an update overshot it
# into a steady 20-to-30 oscillation at C = 20. After this many updates without a cut the
# knee is clearly further up, and the gradient may reach 2 (Envoy's ceiling): from 4, a
# limit reaches C = 100 in 11 s instead of 21. A fresh limiter knows nothing of the knee,
# and grows so until its first cut: in front of vLLM's CPU build the wait for 8 updates was
# most of the 6 s a fresh gateway took to reach the batch the engine runs at load 1.
ACCELERATE_AFTER = 8
MAX_GRADIENT = 2.0
MIN_SAMPLES = 3  # a median of fewer is one request's luck
# A measurement counts samples from when in-flight first fell to its pin, or from this long
# after it began, whichever comes first. The gateway's top class counts only its own
# requests against a learned limit (gateway/traffic/scheduler.py), so at a low pin in-flight
# could stay above it and the pin held until `probe_max_s`: bench/capacity.py at 5x saw the
# limit at a quarter for 9 s, its batch queue timing out behind it.
DRAIN_MAX_S = 2.0
MAX_SAMPLE_AGE_S = 10.0  # a kind with no sample this recent has no say
KEPT_SAMPLES = 256  # per kind; the recent median needs no more
STALE_CUT = 0.3  # the limit fell this much since the latency last eased ...
STALE_RELIEF = 0.1  # ... and the latency fell less than this: the baseline is stale
# Halving the pin cut the knee kind's latency below this share: the pin was queueing. A
# latency linear in the batch never more than halves with it (a + bP < 2(a + bP/2)); TTFT
# sheds a whole queue wait, so "halved" tells a queue from the steepest rise (prefill-heavy
# steps doubled TTFT below the knee). Per-token latency above the knee only grows in
# proportion to the batch, so alone it needs 0.7, which its milder rise stays above.
HALVING_DROP: dict[LatencyKind, float] = {"ttft": 0.5, "per_token": 0.7}
# Latency rises with the batch even without a queue, so a baseline from a pin far below the
# limit can stop the limit early (whole answers stalled at two thirds of the capacity): met
# with a cut this far above the pin, the limit has the baselines re-measured nearer to it.
FAR_FROM_PIN = 2.5
# The step time is the median of this many streams' time per output token: enough that one
# stream of odd length does not move it, few enough to follow the batch as it grows.
STEP_SAMPLES = 16


@dataclass(frozen=True)
class KindSnapshot:
    baseline: float | None  # from the last measurement at the pinned limit
    recent: float | None  # the recent median at the last update
    samples: int  # valid samples observed so far


@dataclass(frozen=True)
class GradientSnapshot:
    limit: float
    phase: Phase
    gradient: float | None  # the one that decided the last update
    kinds: Mapping[LatencyKind, KindSnapshot]  # in steps when `step_s` is set, else seconds
    measurements: int  # measurements of the baseline started so far
    step_s: float | None = None  # the engine's step time, from streams; None: none yet
    cause: Cause | None = None  # why the series measuring now began; None while probing


class _KindLatency:
    """One kind's recent samples and its baseline."""

    def __init__(self) -> None:
        self.samples: deque[tuple[float, float]] = deque(maxlen=KEPT_SAMPLES)
        self.baseline: float | None = None
        self.recent: float | None = None
        self.count = 0
        self.fresh = False  # a sample came since the last update
        self.last_at = -math.inf  # the newest sample's time; a measurement's clear keeps it

    def add(self, now: float, seconds: float) -> None:
        self.samples.append((now, seconds))
        self.count += 1
        self.fresh = True
        self.last_at = max(self.last_at, now)

    def clear(self) -> None:
        self.samples.clear()
        self.recent = None
        self.fresh = False

    def refresh(self, now: float, window_s: float) -> None:
        """The median of the last `window_s`, or of the newest few when traffic is slow;
        None when even those are too old."""
        in_window = [s for t, s in self.samples if t > now - window_s]
        newest = list(self.samples)[-MIN_SAMPLES:]
        if len(in_window) >= MIN_SAMPLES:
            self.recent = statistics.median(in_window)
        elif len(newest) == MIN_SAMPLES and newest[0][0] > now - MAX_SAMPLE_AGE_S:
            self.recent = statistics.median(s for _, s in newest)
        else:
            self.recent = None

    def ratio(self) -> float | None:
        if self.recent is None or self.baseline is None:
            return None
        return self.recent / self.baseline


class _Measurement:
    """One baseline measurement at a pinned limit (Envoy's minRTT window)."""

    def __init__(self, pin: float, deferred: float, started_at: float | None, cause: Cause) -> None:
        self.pin = pin
        self.cause = cause  # why its series began
        self.deferred = deferred  # the limit to restore
        self.started_at = started_at
        self.drained_at: float | None = None
        self.skip = 0  # per-token samples still to drop
        self.samples: dict[LatencyKind, list[float]] = {kind: [] for kind in KINDS}

    def drain(self, now: float, in_flight: int) -> None:
        if self.started_at is None:
            self.started_at = now
        timed_out = now - self.started_at >= DRAIN_MAX_S
        if self.drained_at is None and (in_flight <= self.pin or timed_out):
            self.drained_at = now
            # A request still in flight began before this moment: its per-token latency
            # counts time at the old concurrency, and nothing tells which sample is whose.
            self.skip = in_flight

    def add(self, kind: LatencyKind, value: float, sent_at: float) -> None:
        if self.drained_at is None:
            return
        if kind == "ttft" and sent_at < self.drained_at:
            return  # sent before the drain: it may have queued behind the old crowd
        if kind == "per_token" and self.skip > 0:
            self.skip -= 1
            return
        self.samples[kind].append(value)

    def restart(self) -> None:
        """Drops what was taken so far (it was on another scale)."""
        self.samples = {kind: [] for kind in KINDS}

    def done(self, now: float, wanted: int, max_s: float) -> bool:
        taken = sum(len(values) for values in self.samples.values())
        # Fewer at a low pin: each sample there costs a whole request at low concurrency.
        enough = max(4 * MIN_SAMPLES, min(wanted, math.floor(2 * self.pin)))
        return taken >= enough or (self.started_at is not None and now - self.started_at >= max_s)

    def medians(self) -> dict[LatencyKind, float]:
        return {k: statistics.median(v) for k, v in self.samples.items() if len(v) >= MIN_SAMPLES}


class _CutWatch:
    """Notices the limit being cut without the latency easing: then the latency is the
    engine's own (it got slower), not our queue's, the cuts were the stale baseline's
    doing, and the baseline must be re-measured."""

    def __init__(self) -> None:
        self._since: tuple[float, float] | None = None  # (limit, ratio) when latency last eased

    def reset(self) -> None:
        self._since = None

    def wrongly_cut(self, before: float, after: float, ratio: float) -> float | None:
        """The limit from before the cuts, once they went too far without relief."""
        if after >= before:
            self._since = None
        elif self._since is None or ratio < (1 - STALE_RELIEF) * self._since[1]:
            self._since = (before, ratio)
        elif after <= (1 - STALE_CUT) * self._since[0]:
            return self._since[0]
        return None


class GradientLimiter:
    """The concurrency limit of one replica, learned from latency samples.

    Tunables, with their defaults:
    - `min_limit` 1, `max_limit` 256: the bounds, the pin of a measurement included.
    - `min_pin` (default `min_limit`): no measurement pins lower. The gateway passes half
      its starting limit: TTFT below it is too noisy to read a knee from (a short prompt
      sharing a step with a long prefill takes twice as long, which the halving took for a
      queue, and from a start at 8 it halved down to 1 and kept the limit at 2 under half
      load: bench/capacity.py, 39% refused at load 0.5).
    - `ttft_tolerance` 2.0, `per_token_tolerance` 1.25: latency up to this multiple of the
      baseline counts as no queue (Envoy's buffer; see the module docstring).
    - `smoothing` 0.2: the share of the way to the target taken per update (Gradient2).
    - `binding_fraction` 0.8: the limit grows only while in-flight reaches this share of it.
    - `window_s` 0.5: the span of the recent median (widened to the newest 3 samples when
      traffic is slow, ignored once those are over 10 s old).
    - `probe_fraction` 0.5: the pin of a measurement as a share of the limit, and the
      factor by which a series lowers it.
    - `probe_samples` 40: samples of both kinds per measurement (fewer at a low pin: at
      least 12, at most twice the pin).
    - `probe_max_s` 30: a measurement ends then with what it has.
    - `probe_interval_s` 300 and `probe_jitter` 0.15: the periodic series, delayed by up to
      15% at random so that replicas started together do not pin at once. Rare, since a
      series costs LLM replicas a couple of request durations at half their batch or less.
    - `rng`: the jitter's random numbers in [0, 1).
    """

    def __init__(
        self,
        initial_limit: float,
        *,
        min_limit: float = 1.0,
        min_pin: float | None = None,
        max_limit: float = 256.0,
        ttft_tolerance: float = 2.0,
        per_token_tolerance: float = 1.25,
        smoothing: float = 0.2,
        binding_fraction: float = 0.8,
        window_s: float = 0.5,
        probe_fraction: float = 0.5,
        probe_samples: int = 40,
        probe_max_s: float = 30.0,
        probe_interval_s: float = 300.0,
        probe_jitter: float = 0.15,
        rng: Callable[[], float] = random.random,
    ) -> None:
        if not 1 <= min_limit <= max_limit:
            raise ValueError("need 1 <= min_limit <= max_limit")
        if min(ttft_tolerance, per_token_tolerance) < 1:
            raise ValueError("tolerances must be >= 1")
        if not (0 < smoothing <= 1 and 0 < probe_fraction < 1 and 0 <= binding_fraction <= 1):
            raise ValueError("smoothing, probe_fraction and binding_fraction lie in (0, 1)")
        if probe_jitter < 0:
            raise ValueError("probe_jitter must be >= 0")
        if window_s <= 0 or probe_max_s <= 0 or probe_interval_s <= 0 or probe_samples < 1:
            raise ValueError("windows, intervals and probe_samples must be positive")
        self._min, self._max = min_limit, max_limit
        self._min_pin = max(min_limit, min_pin if min_pin is not None else min_limit)
        self._ttft_tolerance, self._per_token_tolerance = ttft_tolerance, per_token_tolerance
        self._smoothing = smoothing
        self._binding_fraction, self._window_s = binding_fraction, window_s
        self._probe_fraction, self._probe_samples = probe_fraction, probe_samples
        self._probe_max_s, self._probe_interval_s = probe_max_s, probe_interval_s
        self._probe_jitter = probe_jitter
        self._rng = rng
        self._limit = self._clamp(initial_limit)
        self._kinds = {kind: _KindLatency() for kind in KINDS}
        self._gradient: float | None = None
        self._watch = _CutWatch()
        self._uncut = 0  # updates in a row without a cut
        self._starting = True  # no cut yet: slow start (see ACCELERATE_AFTER)
        self._next_measurement = math.inf
        self._measurements = 0
        self._measuring: _Measurement | None = None
        self._series: list[tuple[float, Medians]] = []  # (pin, medians)
        self._baseline_pin = 0.0  # the pin the baselines were measured at
        self._below: tuple[float, Medians] | None = None  # outgrown baselines (`_outgrown`)
        self._steps: deque[float] = deque(maxlen=STEP_SAMPLES)  # streams' time per token
        self._step_s: float | None = None  # their median
        self._measure(None, self._pin(self._limit), "start")

    @property
    def limit(self) -> float:
        """The limit to admit against; the pin while measuring the baseline."""
        return self._measuring.pin if self._measuring is not None else self._limit

    @property
    def step_s(self) -> float | None:
        """The engine's step time: the median time per output token of the last
        STEP_SAMPLES finished streams; None before the first."""
        return self._step_s

    def observe(self, kind: LatencyKind, seconds: float, now: float) -> None:
        """One latency sample; negative, zero, NaN and infinite ones are ignored."""
        if not (math.isfinite(seconds) and seconds > 0 and math.isfinite(now)):
            return
        value = seconds / self._step_s if self._step_s is not None else seconds
        self._kinds[kind].add(now, value)
        if self._measuring is not None:
            self._measuring.add(kind, value, now - seconds)

    def observe_step(self, seconds: float) -> None:
        """A finished stream's time per output token after the first. The first one turns
        the samples from seconds into steps (module docstring). Baselines measured in
        seconds become steps at that stream's step time: it ran at their pin, or near it
        (the first streams end during the start's measurement or just after). A measurement
        under way starts again, in steps."""
        if not (math.isfinite(seconds) and seconds > 0):
            return
        first = self._step_s is None
        self._steps.append(seconds)
        self._step_s = statistics.median(self._steps)
        if not first:
            return
        for latency in self._kinds.values():
            if latency.baseline is not None:
                latency.baseline /= seconds
            latency.clear()
        self._series = []  # a halving compares medians: all of them in steps
        self._below = None
        if self._measuring is not None:
            self._measuring.restart()

    def update(self, now: float, in_flight: int) -> float:
        """Recompute the limit from the samples so far; returns it."""
        for latency in self._kinds.values():
            latency.refresh(now, self._window_s)
        if self._measuring is not None:
            self._continue_measuring(now, max(0, in_flight))
        elif now >= self._next_measurement:
            self._measure(now, self._pin(self._limit), "interval")
        else:
            self._adjust(now, max(0, in_flight))
        return self.limit

    def snapshot(self) -> GradientSnapshot:
        kinds = {k: KindSnapshot(v.baseline, v.recent, v.count) for k, v in self._kinds.items()}
        measuring = self._measuring
        phase: Phase = "measuring_min" if measuring is not None else "probing"
        cause = measuring.cause if measuring is not None else None
        return GradientSnapshot(
            self.limit, phase, self._gradient, kinds, self._measurements, self._step_s, cause
        )

    def _adjust(self, now: float, in_flight: int) -> None:
        fresh = any(latency.fresh for latency in self._kinds.values())
        for latency in self._kinds.values():
            latency.fresh = False
        ratios = {k: r for k, v in self._kinds.items() if (r := v.ratio()) is not None}
        if not ratios and self._unmeasured_traffic(now):
            self._measure(None, self._pin(self._limit), "no_baseline")
        elif fresh and ratios:
            self._step(ratios, in_flight)

    def _unmeasured_traffic(self, now: float) -> bool:
        """Whether the traffic is of kinds without a baseline: one has a recent median,
        and none with a baseline had a sample lately. Not merely the first to report
        after a series emptied the windows: whole answers that outlast the start's pin get
        no baseline there, and when three of them ended before three first tokens came, a
        second series of two pins followed the first (a likely cause, found in the code,
        of a double series at the onset of 5x in front of vLLM: docs/slo-goodput.md, seed
        233; the trace then had no cause to say)."""
        kinds = self._kinds.values()
        if not any(v.recent is not None and v.baseline is None for v in kinds):
            return False
        since = now - MAX_SAMPLE_AGE_S
        return not any(v.baseline is not None and v.last_at > since for v in kinds)

    def _step(self, ratios: Mapping[LatencyKind, float], in_flight: int) -> None:
        if in_flight < self._binding_fraction * self._limit:
            # App-limited: the limit admits everything, so latency says nothing about it,
            # neither more room nor less, nor that the baseline is stale. A cut here started
            # a re-measurement whose pins (9, then 4) queued requests that had room under
            # half load (bench/capacity.py, load 0.5: a TTFT spike at 6 in flight of 19).
            return
        pressure = max(r / self._tolerance(k, ratios) for k, r in ratios.items())
        fast = self._starting or self._uncut >= ACCELERATE_AFTER
        ceiling = MAX_GRADIENT if fast else 1.0
        self._gradient = min(ceiling, max(MIN_GRADIENT, 1 / pressure))
        scaled = self._limit * self._gradient
        target = scaled + math.sqrt(scaled)
        before = self._limit
        self._limit = self._clamp(before + self._smoothing * (target - before))
        self._uncut = self._uncut + 1 if self._limit >= before else 0
        self._starting = self._starting and self._limit >= before
        undo = self._watch.wrongly_cut(before, self._limit, pressure)
        if undo is not None:
            # Without it, x4 slower steps left the limit at 40% of the capacity for seconds.
            self._limit = undo
            self._measure(None, self._pin(undo), "slower_engine")
        elif self._limit < before and self._outgrown():
            baselines = {k: v.baseline for k, v in self._kinds.items() if v.baseline is not None}
            below = (self._baseline_pin, baselines)
            self._measure(None, self._pin(self._limit), "outgrown", below)

    def _outgrown(self) -> bool:
        """Whether the limit is far above the pin of its baselines (and a new pin would be
        higher): the rise of latency with the batch may be what holds it there."""
        pin = self._pin(self._limit)
        return self._limit >= FAR_FROM_PIN * self._baseline_pin and pin > self._baseline_pin

    def _tolerance(self, kind: LatencyKind, present: Collection[LatencyKind]) -> float:
        """TTFT finds the knee; per-token latency also rises with the batch below it, so it
        is held to its own tighter tolerance only where it is the only signal, and is
        otherwise a backstop (against preemption storms, say) at TTFT's."""
        if kind == "per_token" and "ttft" not in present:
            return self._per_token_tolerance
        return self._ttft_tolerance

    def _pin(self, limit: float) -> float:
        pin = max(math.ceil(self._min_pin), math.floor(self._probe_fraction * limit))
        return min(float(pin), limit)

    def _measure(
        self,
        now: float | None,
        pin: float,
        cause: Cause,
        below: tuple[float, Medians] | None = None,
    ) -> None:
        """Start a measurement at `pin`, of a series begun for `cause` (shown in snapshots:
        a pinned limit should say why); `below`, the baselines the limit outgrew, stand for
        the series' next pin down: a series needs two pins that agree, and on a slow engine
        each pin costs seconds at half the limit or less (vLLM's CPU build under 5x: 6 s at
        15, then 3.5 s at 7; bench/slo_goodput.py seed 225)."""
        self._below = below
        deferred = self._measuring.deferred if self._measuring is not None else self._limit
        self._measuring = _Measurement(pin, deferred, now, cause)
        self._measurements += 1
        self._uncut = 0
        self._watch.reset()
        for latency in self._kinds.values():
            latency.clear()

    def _continue_measuring(self, now: float, in_flight: int) -> None:
        measuring = self._measuring
        assert measuring is not None
        measuring.drain(now, in_flight)
        if not measuring.done(now, self._probe_samples, self._probe_max_s):
            return
        result = measuring.medians()
        if result:
            self._series.append((measuring.pin, result))
        below, self._below = self._below, None
        if below is not None and result and not _halving_dropped([*self._series, below]):
            self._series.append(below)  # they agree: no need to measure lower
        lower = self._pin(measuring.pin)
        if result and lower < measuring.pin and _halving_dropped(self._series):
            self._measure(now, lower, measuring.cause)  # the pin may be above the knee: halve it
        else:
            self._accept(now, measuring.deferred)

    def _accept(self, now: float, deferred: float) -> None:
        """Take the baselines from the higher pin of the last two that agreed (nearer the
        working batch, so per-token latency's rise with the batch is not counted as
        queueing), and restore the limit, but no higher than the lowest pin seen queueing."""
        series, self._series = self._series, []
        self._measuring = None
        self._limit = deferred
        if series:
            pin, accepted = series[-1] if _halving_dropped(series) else series[-2]
            self._baseline_pin = pin
            for kind, value in accepted.items():
                self._kinds[kind].baseline = value
            queueing = [p for p, _ in series if p > pin]  # halving each shed a queue
            self._limit = min([deferred, *queueing])
            self._starting = self._starting and not queueing  # a knee was found: no more
        jitter = 1 + self._probe_jitter * self._rng()
        self._next_measurement = now + self._probe_interval_s * jitter
        for latency in self._kinds.values():
            latency.clear()

    def _clamp(self, limit: float) -> float:
        return min(self._max, max(self._min, limit))


def _halving_dropped(series: list[tuple[float, Medians]]) -> bool:
    """Whether the last halving of the pin cut the knee kind's latency (TTFT where both
    halves have it) by its margin, or there was no halving yet: then the pin before it was
    queueing, and the floor lies lower."""
    if len(series) < 2:
        return True
    (_, before), (_, after) = series[-2:]
    common = [k for k in KINDS if k in before and k in after]
    return any(after[k] < HALVING_DROP[k] * before[k] for k in common[:1])
