"""One request's hold on its backend's pool (gateway/traffic/pool.py), from dispatch until
its answer is over: the queue slot, the replica serving it, the cold-start handle; `release`
gives all of it back, exactly once."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from gateway.traffic.deadline import Deadline
from gateway.traffic.replica_set import ReplicaHandle
from gateway.traffic.scheduler import Slot
from gateway.usage import TokenUsage
from warmpool.manager import ColdStartHandle

if TYPE_CHECKING:
    from gateway.traffic.pool import Admitted, Pool


class Lease:
    """One request's hold on its pool, from dispatch until its answer is over."""

    def __init__(
        self,
        pool: Pool,
        slot: Slot,
        deadline: Deadline,
        cold: ColdStartHandle | None,
        cold_wait_s: float | None,
        tokens: int = 0,
        request: Admitted | None = None,
    ) -> None:
        self.pool = pool
        self.tokens = tokens  # expected KV tokens: prompt + max_tokens
        self.affinity = request.affinity if request else None  # the replica it would rather go to
        self.trace = request.trace if request else None  # its attempts are this trace's
        self.slot = slot
        self.deadline = deadline
        self.cold = cold
        self.cold_wait_s = cold_wait_s
        self.replica: ReplicaHandle | None = None
        self.sent_at: float | None = None  # perf_counter when `forward` began
        self.streamed = False  # set by `forward`: a stream's sample is its first token
        self.first_token_at: float | None = None  # perf_counter at a stream's first token
        self.attempts = 0  # upstream calls made (`use`): 0 when none could be
        self._released = False

    @property
    def cold_start_ms(self) -> int | None:
        """How long the cold start this request waited for took, once it is over."""
        if self.cold is None or self.cold.cold_start_s is None:
            return None
        return round(self.cold.cold_start_s * 1000)

    def use(self, replica: ReplicaHandle) -> None:
        """The attempt about to be made goes to `replica` (replacing the last one's)."""
        self.leave_replica()
        self.attempts += 1
        replica.in_flight += 1
        replica.capacity.sent(self.tokens)
        self.replica = replica

    def leave_replica(self) -> None:
        if self.replica is not None:
            self.replica.done()
            self.replica = None

    def first_byte(self) -> None:
        """The answer's first byte goes to the client (for the cold-start timeline)."""
        if self.cold is not None and self.cold.cold_start_s is not None:
            self.cold.first_byte()

    def release(self, usage: TokenUsage, *, completed: bool = True) -> None:
        """Gives everything back, once, charging the fair queue with what the model used
        (a request that never reached one abandons its slot: no charge, no sample).

        Only a `completed` answer's duration is a service-time sample: one cut short (the
        client left, its deadline passed, the upstream failed) says nothing about how long
        answers take, and counting it once made an idle backend refuse short deadlines."""
        if self._released:
            return
        self._released = True
        replica = self.replica
        self.leave_replica()
        if self.sent_at is None:
            self.slot.abandon()
            return
        self.slot.release(usage.prompt, usage.completion, sampled=completed)
        took_s = time.perf_counter() - self.sent_at
        self.pool.metrics.upstream_done(self.pool.name, took_s)
        if replica is None or not completed or usage.completion < 1:
            return
        if not self.streamed:
            replica.capacity.observe("per_token", took_s / usage.completion, time.monotonic())
        elif self.first_token_at is not None and usage.completion > 1:
            after_first = time.perf_counter() - self.first_token_at
            replica.capacity.observe_step(after_first / (usage.completion - 1))
