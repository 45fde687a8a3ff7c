"""Replica affinity: a session's or prefix's requests go to one replica while it has room
(rendezvous hashing with a load bound), and spill when it has none
(gateway/traffic/affinity.py)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from gateway.traffic.affinity import affinity_key, choose, load_bound


@dataclass
class Replica:
    id: str
    in_flight: int = 0
    room: bool = True

    def has_headroom(self) -> bool:
        return self.room


def _home(replicas: list[Replica], key: str) -> str:
    chosen = choose(replicas, key, load_bound([r.in_flight for r in replicas]))
    assert chosen is not None
    return chosen.id


def test_a_session_header_outranks_the_body_and_the_prefix() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "user": "u1"}
    by_header = affinity_key({"x-session-id": "s1"}, body)
    assert by_header == affinity_key({"session_id": "s1"}, {**body, "user": "other"})
    assert by_header != affinity_key({}, body)  # then `user`
    assert affinity_key({}, body) == affinity_key({}, {**body, "prompt_cache_key": None})
    assert affinity_key({}, {**body, "prompt_cache_key": "k"}) != affinity_key({}, body)
    assert by_header != affinity_key({"x-session-id": "s1"}, {**body, "model": "other"})


def test_the_turns_of_one_conversation_share_a_prefix_key() -> None:
    first = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "q1"}]
    later = [*first, {"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"}]
    other = [first[0], {"role": "user", "content": "another question"}]
    key = affinity_key({}, {"model": "m", "messages": first})
    assert key == affinity_key({}, {"model": "m", "messages": later})
    assert key != affinity_key({}, {"model": "m", "messages": other})


def test_keys_spread_over_replicas_and_each_stays_home() -> None:
    replicas = [Replica(f"r{i}") for i in range(3)]
    homes = {f"s{i}": _home(replicas, f"s{i}") for i in range(300)}
    assert all(_home(replicas, key) == home for key, home in homes.items())
    spread = Counter(homes.values())
    assert len(spread) == 3 and min(spread.values()) > 70  # about 100 each


def test_a_replica_leaving_moves_only_its_own_keys() -> None:
    replicas = [Replica(f"r{i}") for i in range(3)]
    homes = {f"s{i}": _home(replicas, f"s{i}") for i in range(300)}
    remaining = replicas[:2]
    moved = [k for k, home in homes.items() if _home(remaining, k) != home]
    assert all(homes[k] == "r2" for k in moved)
    assert len(moved) == sum(1 for home in homes.values() if home == "r2")


def test_a_busy_home_spills_to_the_next_and_no_room_means_no_preference() -> None:
    replicas = [Replica("r0"), Replica("r1")]
    key = next(f"s{i}" for i in range(100) if _home(replicas, f"s{i}") == "r0")
    replicas[0].in_flight = 10  # bound: ceil(1.25 * 11 / 2) = 7
    assert _home(replicas, key) == "r1"
    replicas[0].in_flight, replicas[0].room = 0, False  # its limit is reached
    assert _home(replicas, key) == "r1"
    replicas[1].room = False
    assert choose(replicas, key, load_bound([0, 0])) is None
