"""The slots a class may take (gateway/traffic/slots.py): pure counts, no clock."""

from __future__ import annotations

from gateway.traffic.slots import RESERVED_SHARE, Slots

TOP, LOWER = 0, 1


def test_a_class_counts_only_its_own_and_higher_classes_against_the_limit() -> None:
    slots = Slots(4, TOP)
    for _ in range(4):
        slots.take(LOWER)
    # Batch fills the limit, and an interactive arrival still goes: the limit counts only
    # its own class for it (the ceiling, here the limit too, binds everyone below it).
    assert not slots.may_dispatch(LOWER, top_active=False)
    slots.set(4, ceiling=8)
    assert slots.free(TOP, top_active=True) == 4
    assert slots.may_dispatch(TOP, top_active=True)
    slots.take(TOP)
    assert slots.held(TOP) == 1 and slots.held(LOWER) == 5
    slots.give_back(LOWER)
    assert slots.in_flight == 4 and slots.held(LOWER) == 4


def test_lower_classes_leave_a_share_of_the_ceiling_while_the_top_class_is_active() -> None:
    slots = Slots(20, TOP)
    reserved = int(RESERVED_SHARE * 20)
    assert reserved >= 1
    assert slots.cap(LOWER, top_active=True) == 20 - reserved
    assert slots.cap(LOWER, top_active=False) == slots.cap(TOP, top_active=True) == 20
    for _ in range(20 - reserved):
        slots.take(LOWER)
    assert not slots.may_dispatch(LOWER, top_active=True)
    assert slots.may_dispatch(LOWER, top_active=False)
    assert slots.may_dispatch(TOP, top_active=True)


def test_lower_classes_wait_while_a_top_class_prompt_is_computed() -> None:
    slots = Slots(10, TOP)
    slots.prefills = 1
    assert not slots.may_dispatch(LOWER, top_active=True)
    assert slots.may_dispatch(TOP, top_active=True)
    slots.prefills = 0
    assert slots.may_dispatch(LOWER, top_active=True)
