"""The ready set: the replicas a request may be sent to, and who hears when it changes.

A replica is ready when the provider says so (`provider.ready()`), it is not being
stopped, and it is not in the sleep tier (`warmpool.sleep`: dozing, asleep or waking).
The manager refreshes the set after anything that may change it (a provider event, a stop
begun or done, a tier change, each tick). On a change, in this order: the scale signals
forget replicas gone and count new ones as active now; the cold start under way settles,
if a replica is ready; `on_change` listeners get the new set.

`on_sleep_change` listeners get the number of replicas in the tier after every change,
told so that they never see a moment where a replica is neither ready nor in the tier.
"""

from __future__ import annotations

from collections.abc import Callable

from backends.providers.replicas import Replica, ReplicaEvent, ReplicaProvider
from warmpool.cold_start import ColdStarts
from warmpool.listeners import notify
from warmpool.signals import ScaleSignals
from warmpool.sleep import SleepTier

ReadyListener = Callable[[list[Replica]], None]


class ReadySet:
    def __init__(
        self,
        provider: ReplicaProvider,
        tier: SleepTier | None,
        signals: ScaleSignals,
        starts: ColdStarts,
        clock: Callable[[], float],
    ) -> None:
        self.replicas: list[Replica] = []
        self.stopping: set[str] = set()
        self.on_change: list[ReadyListener] = []
        self.on_sleep_change: list[Callable[[int], None]] = []
        self._provider = provider
        self._tier = tier
        self._signals = signals
        self._starts = starts
        self._clock = clock
        self._in_tier = 0  # replicas in the tier, as the listeners last heard

    def find(self, replica_id: str) -> Replica | None:
        return next((r for r in self.replicas if r.id == replica_id), None)

    def refresh(self) -> None:
        tier = self._tier
        ready = [
            r
            for r in self._provider.ready()
            if r.id not in self.stopping and (tier is None or not tier.holds(r.id))
        ]
        if ready == self.replicas:
            return
        now = self._clock()
        self._signals.track((replica.id for replica in ready), now)
        self.replicas = ready
        if ready:
            self._starts.ready(now)
        notify(self.on_change, list(ready))

    def replica_event(self, event: ReplicaEvent) -> None:
        """A provider event, once the provider's state is settled: marked on the cold
        start under way (if any), then the set refreshed."""
        episode = self._starts.current
        if event.phase == "process_started" or _grew(event):
            self._starts.mark(episode, "process_started")
        elif event.phase == "crashed":
            self._starts.mark(episode, "crashed")
        elif event.phase == "ready" and event.phases:
            # Before the refresh marks it ready, which may end the timeline.
            self._starts.engine_phases(episode, event.phases)
        if event.phase in ("crashed", "stopped") and event.replica_id:
            self.forget_sleeper(event.replica_id)  # it comes back (if at all) awake
        self.refresh()

    # -- the sleep tier ------------------------------------------------------------------

    def in_tier(self) -> int:
        return self._tier.count() if self._tier is not None else 0

    def waking(self) -> int:
        return self._tier.waking() if self._tier is not None else 0

    def asleep(self) -> dict[str, float]:
        """Asleep (or dozing) replicas -> their last work; not those being stopped."""
        asleep = self._tier.asleep() if self._tier is not None else {}
        return {r: last for r, last in asleep.items() if r not in self.stopping}

    def mid_call(self, replica_id: str) -> bool:
        """The replica's engine is being put to sleep or woken."""
        return self._tier is not None and self._tier.state(replica_id) in ("dozing", "waking")

    def forget_sleeper(self, replica_id: str) -> None:
        if self._tier is not None:
            self._tier.forget(replica_id)

    def tier_changed(self) -> None:
        """Listeners hear of a replica entering the tier before it leaves the ready set,
        and of one leaving it after it is back (if it comes back): never a moment with
        neither."""
        count = self.in_tier()
        before, self._in_tier = self._in_tier, count
        if count <= before:
            self.refresh()
        notify(self.on_sleep_change if count != before else (), count)
        if count > before:
            self.refresh()


def _grew(event: ReplicaEvent) -> bool:
    """A Kubernetes "scaled" event that raised the count ("0->1")."""
    if event.phase != "scaled":
        return False
    before, _, after = event.detail.partition("->")
    return before.isdigit() and after.isdigit() and int(after) > int(before)
