"""common/window.py: sums per key over a sliding window, against a brute-force recount."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.window import WindowSums


def test_an_entry_counts_until_exactly_window_s_after_it() -> None:
    sums: WindowSums[str] = WindowSums(2.0)
    sums.add(1.0, "a")
    sums.add(1.5, "a", 3.0)
    sums.add(2.0, "b", 0.5)
    assert sums.expire(2.9) == [] and (sums.get("a"), sums.get("b")) == (4.0, 0.5)
    assert sums.expire(3.0) == [] and sums.get("a") == 3.0  # 1.0 left at 3.0 exactly
    assert sums.expire(3.5) == ["a"] and sums.get("a") == 0.0
    assert list(sums) == ["b"] and sums.get("b") == 0.5 and sums
    assert sums.expire(4.0) == ["b"] and not sums and list(sums) == []


def test_a_forgotten_key_keeps_no_float_residue() -> None:
    sums: WindowSums[None] = WindowSums(1.0)
    for i in range(10):
        sums.add(0.1 * i, None, 0.1)
    sums.expire(5.0)
    sums.add(5.0, None, 0.3)
    assert sums.get(None) == 0.3


def test_window_s_must_be_positive() -> None:
    with pytest.raises(ValueError, match="window_s"):
        WindowSums(0.0)


@given(
    st.lists(st.tuples(st.floats(0, 5), st.sampled_from("abc"), st.integers(1, 4)), max_size=40),
    st.floats(0, 10),
)
def test_the_sums_are_a_recount_of_what_is_in_the_window(
    records: list[tuple[float, str, int]], late: float
) -> None:
    sums: WindowSums[str] = WindowSums(1.5)
    records.sort(key=lambda r: r[0])
    for at, key, amount in records:
        sums.add(at, key, amount)
    now = (records[-1][0] if records else 0.0) + late
    sums.expire(now)
    kept = [(key, amount) for at, key, amount in records if at > now - 1.5]
    for key in "abc":
        assert sums.get(key) == sum(a for k, a in kept if k == key)
    assert set(sums) == {k for k, _ in kept}
