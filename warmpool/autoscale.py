"""How many replicas a backend should have: a pure function of a snapshot, clock passed in.

Demand is "requests queued + in flight" for the backend, sampled by the driver
(`warmpool.manager`) once per tick. Two windows, as in Knative's autoscaler:

- stable window (`stable_window_s`, 60 s): the average demand over it sets the number of
  replicas, `ceil(avg / per_replica)`, where `per_replica` is what one replica carries:
  the learned concurrency limit of the ready replicas when the snapshot gives one
  (`capacity_per_replica`), else `target_queue_per_replica`. Scaling up and down both follow it,
  so a burst shorter than the window barely moves it (hysteresis).
- panic window (`panic_window_s`, 6 s): when the average over it reaches
  `panic_threshold` times what the ready replicas are meant to carry (twice by default), the
  backend panics: it scales to the panic-window need at once, and never scales down
  until a whole stable window has passed without the panic condition.

On top of that:

- cold-start fast path: demand with nothing ready or starting asks for at least one
  replica now, whatever the windows say (the activator calls this on the request path);
- `min_replicas` is a floor; `max_replicas` a ceiling nothing exceeds; `floors` in the
  snapshot raise it until each one's `until` (a pre-warm, a scheduled window), and then
  the usual idle rules take the replicas down again;
- `warm_pool` keeps that many extra replicas, ready and idle, while the backend is in
  use (its demand-based need or `min_replicas` is at least 1), so a scale-up finds one
  loaded already; a backend idle for a stable window with `min_replicas: 0` lets them go;
- scale-down removes one replica per decision, only a ready one with nothing in flight
  that has had no work for `idle_s`, and never while another replica is still starting
  (loading) or while panicking;
- 1 → 0 is the only way to zero: it needs `min_replicas == 0`, no demand at all, and
  `last_replica_idle_s` (longer than `idle_s`, as Knative's scale-to-zero grace and
  Ray Serve's downscale-to-zero delay) without work on the replica or requests arriving.

With a sleep tier (`sleep_s` set: an engine that can sleep, vLLM's sleep mode), the last
replica has three states, and the same rules move it between them:

    warm ──(idle_s without work: `sleep`)──► asleep ──(sleep_s without work: `stop`)──► stopped
     ▲ ▲                                       │                                          │
     │ └───────(demand: `wake`, the fast path)─┘                                          │
     └─────────────────────────────(demand: a start, the fast path)───────────────────────┘

`sleep_s` counts from the replica's last work, like `idle_s` (so it sleeps for
sleep_s - idle_s); `last_replica_idle_s` is not used. Demand with nothing warm or starting
wakes an asleep replica rather than starting one; a scale-up wakes asleep replicas before
it starts new ones. n → n-1 (n > 1) still stops a replica: one asleep replica is enough
to come back fast, and each one holds its weights in host memory. Asleep replicas are not
ready and do not count toward `min_replicas`.

`Decision.target` is what to apply now (never below ready + starting unless `stop` names
the replica to remove; asleep replicas count as there, not as ready); `Decision.desired`
is what the windows ask for, for metrics.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple


@dataclass(frozen=True)
class ScalePolicy:
    min_replicas: int = 0
    max_replicas: int = 1
    target_queue_per_replica: float = 2.0  # waiting + in flight per replica above which to add
    stable_window_s: float = 60.0
    panic_window_s: float = 6.0
    panic_threshold: float = 2.0  # panic when panic-window demand >= 2x ready capacity
    idle_s: float = 60.0  # a replica without work this long may go (n -> n-1, n > 1)
    last_replica_idle_s: float = 300.0  # ... and this long for the last one (1 -> 0)
    warm_pool: int = 0  # extra idle replicas kept ready while the backend is in use
    sleep_s: float | None = None  # the sleep tier: an asleep replica stops after this long

    def __post_init__(self) -> None:
        if not 0 <= self.min_replicas <= self.max_replicas or self.max_replicas < 1:
            raise ValueError("need 0 <= min_replicas <= max_replicas and max_replicas >= 1")
        if self.target_queue_per_replica <= 0 or self.panic_threshold < 1:
            raise ValueError("target_queue_per_replica must be > 0, panic_threshold >= 1")
        if not 0 < self.panic_window_s <= self.stable_window_s:
            raise ValueError("need 0 < panic_window_s <= stable_window_s")
        if min(self.idle_s, self.last_replica_idle_s, self.warm_pool) < 0:
            raise ValueError("idle times and warm_pool must be >= 0")
        if self.sleep_s is not None and self.sleep_s <= self.idle_s:
            raise ValueError("sleep_s must be longer than idle_s (both count from the last work)")


class Floor(NamedTuple):
    """At least `replicas` wanted until `until` (on the snapshot's clock)."""

    replicas: int
    until: float


def held_floor(floors: Sequence[Floor], now: float) -> int:
    return max((f.replicas for f in floors if now < f.until), default=0)


class ReplicaLoad(NamedTuple):
    """One replica's work as the request path counts it."""

    in_flight: int  # requests on it now
    served: int  # requests finished on it, ever (a change means it was busy)


@dataclass(frozen=True)
class ScaleSnapshot:
    now: float
    ready: tuple[str, ...] = ()  # ids of ready replicas (not those being stopped)
    starting: int = 0  # asked for, not ready yet (loading)
    demand_samples: tuple[tuple[float, int], ...] = ()  # (t, queued + in flight), oldest first
    in_flight_by_replica: Mapping[str, int] = field(default_factory=dict)
    last_active_by_replica: Mapping[str, float] = field(default_factory=dict)
    last_request_at: float | None = None  # last request for the backend, any replica
    last_panic_at: float | None = None  # from the previous Decision.panic_at
    capacity_per_replica: float | None = None  # learned: overrides target_queue_per_replica
    asleep: Mapping[str, float] = field(default_factory=dict)  # asleep id -> its last work
    floors: tuple[Floor, ...] = ()  # raised minimums, each until its time


@dataclass(frozen=True)
class Decision:
    target: int  # replicas to have now: ensure() it when above ready + starting
    desired: int  # what demand and bounds ask for (target lags it on the way down)
    stop: tuple[str, ...] = ()  # idle ready replicas to stop now (target already counts it)
    reason: str = ""
    panic_at: float | None = None  # last time the panic condition held: feed it back
    sleep: tuple[str, ...] = ()  # idle ready replicas to put to sleep now
    wake: tuple[str, ...] = ()  # asleep replicas to wake now (they count toward target)

    def panicking(self, now: float, policy: ScalePolicy) -> bool:
        return self.panic_at is not None and now - self.panic_at < policy.stable_window_s


def average_demand(samples: Sequence[tuple[float, int]], since: float) -> float:
    values = [value for t, value in samples if t >= since]
    return sum(values) / len(values) if values else 0.0


def desired_replicas(snapshot: ScaleSnapshot, policy: ScalePolicy) -> Decision:
    decision = _decide(snapshot, policy)
    tired = () if decision.wake else _tired(snapshot, policy)
    if not tired:
        return decision
    why = f"{decision.reason}; stop {', '.join(tired)}: asleep {policy.sleep_s:g} s"
    return replace(decision, stop=(*decision.stop, *tired), reason=why)


def _decide(s: ScaleSnapshot, p: ScalePolicy) -> Decision:
    current = len(s.ready) + s.starting
    demand_now = s.demand_samples[-1][1] if s.demand_samples else 0
    stable = average_demand(s.demand_samples, s.now - p.stable_window_s)
    burst = average_demand(s.demand_samples, s.now - p.panic_window_s)
    per_replica = s.capacity_per_replica or p.target_queue_per_replica
    need = math.ceil(stable / per_replica)
    capacity = per_replica * len(s.ready)
    panic_now = bool(s.ready) and burst >= p.panic_threshold * capacity
    panic_at = s.now if panic_now else s.last_panic_at
    panicking = panic_at is not None and s.now - panic_at < p.stable_window_s
    if panicking:  # scale to the burst at once...
        need = max(need, math.ceil(burst / per_replica))
    floor = held_floor(s.floors, s.now)
    base = max(need, p.min_replicas, floor)
    desired = min(p.max_replicas, base + (p.warm_pool if base > 0 else 0))
    if panicking:  # ...and never down while it lasts
        desired = max(desired, min(current, p.max_replicas))
    if demand_now > 0 and current == 0:
        desired = max(desired, 1)
        if s.asleep:  # waking takes seconds where a start takes minutes
            why = "wake: demand with every replica asleep"
            return Decision(desired, desired, (), why, panic_at, wake=_to_wake(s, desired))
        return Decision(desired, desired, (), "cold start: demand with no replica", panic_at)
    if desired > current and s.asleep:
        wake = _to_wake(s, desired - current)
        why = f"wake {len(wake)}: scale up {current} -> {desired}"
        return Decision(desired, desired, (), why, panic_at, wake=wake)
    if desired >= current:
        why = _why_up(desired, current, panicking, p, floor)
        return Decision(desired, desired, (), why, panic_at)
    return _scale_down(s, p, desired, current, demand_now, panic_at)


def _why_up(desired: int, current: int, panicking: bool, p: ScalePolicy, floor: int) -> str:
    if desired == current:
        return "panic: holding" if panicking else "steady"
    if panicking:
        return f"panic: scale up {current} -> {desired}"
    if current < floor and floor > p.min_replicas:
        return f"floor {floor}: scale up {current} -> {desired}"
    if current < p.min_replicas:
        return f"min_replicas: scale up {current} -> {desired}"
    return f"scale up {current} -> {desired}"


def _scale_down(
    s: ScaleSnapshot,
    p: ScalePolicy,
    desired: int,
    current: int,
    demand_now: int,
    panic_at: float | None,
) -> Decision:
    def hold(why: str) -> Decision:
        return Decision(current, desired, (), f"hold {current} (want {desired}): {why}", panic_at)

    if s.starting:
        return hold("a replica is still starting")
    to_zero = current == 1
    if to_zero and demand_now > 0:
        return hold("requests are waiting")
    sleeps = to_zero and p.sleep_s is not None  # the last replica sleeps after idle_s
    idle_s = p.last_replica_idle_s if to_zero and not sleeps else p.idle_s
    last_request = s.last_request_at if to_zero and s.last_request_at is not None else -math.inf
    idle = [
        (max(s.last_active_by_replica[r], last_request), -i, r)
        for i, r in enumerate(s.ready)
        if s.in_flight_by_replica.get(r, 0) == 0 and r in s.last_active_by_replica
    ]
    idle = [entry for entry in idle if s.now - entry[0] >= idle_s]
    if not idle:
        return hold(f"no replica idle for {idle_s:g} s")
    *_, victim = min(idle)  # idle longest; of equals, the newest
    if sleeps:
        why = f"sleep: {victim} idle {idle_s:g} s"
        return Decision(current - 1, desired, (), why, panic_at, sleep=(victim,))
    why = "scale to zero" if to_zero else "scale down"
    return Decision(current - 1, desired, (victim,), f"{why}: {victim} idle {idle_s:g} s", panic_at)


def _to_wake(s: ScaleSnapshot, count: int) -> tuple[str, ...]:
    """Up to `count` asleep replicas, the most recently busy first (of equals, by id)."""
    latest = sorted(s.asleep, key=lambda r: (-s.asleep[r], r))
    return tuple(latest[:count])


def _tired(s: ScaleSnapshot, p: ScalePolicy) -> tuple[str, ...]:
    """Asleep replicas without work (nor requests for the backend) for `sleep_s`."""
    if p.sleep_s is None or (s.demand_samples and s.demand_samples[-1][1] > 0):
        return ()
    last_request = s.last_request_at if s.last_request_at is not None else -math.inf
    return tuple(
        sorted(r for r, last in s.asleep.items() if s.now - max(last, last_request) >= p.sleep_s)
    )
