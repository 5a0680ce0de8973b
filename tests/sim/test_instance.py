"""kvsched.sim.instance: which steps of a stretch happen before the next event."""

from __future__ import annotations

import pytest

from kvsched.sim.instance import async_stretch_times, stretch_times

DURATIONS = [1.0, 2.0, 0.5, 4.0, 1.5, 3.0, 2.5, 1.0] * 12  # 96 steps, several chunks


def _times(j: int, n: int) -> list[float]:
    return DURATIONS[j:j + n]


@pytest.mark.parametrize("bound, kept", [
    (0.0, 1),      # at or before the start: the first step alone
    (1.0, 1),      # step 1 starts at 1.0, not before the bound
    (1.01, 2),
    (3.5, 3),      # steps start at 0, 1, 3, 3.5
    (3.51, 4),
    (1e9, 96),     # no bound: the limit
])
def test_steps_starting_before_the_bound_are_kept(bound: float, kept: int) -> None:
    durations, ends = stretch_times(0.0, 96, bound, _times)
    assert durations == DURATIONS[:kept]
    assert len(ends) == kept and ends[0] == 1.0


@pytest.mark.parametrize("bound, kept", [
    (0.0, 1),      # iteration 1 would happen at 0.0 (new batch 0 starts): not before
    (0.01, 2),
    (1.0, 2),      # iteration 2 happens at 1.0 (new batch 1 starts)
    (1.01, 3),
    (3.51, 5),
    (1e9, 96),
])
def test_async_keeps_one_more_batch_scheduled_before_the_bound(bound: float, kept: int) -> None:
    durations, ends = async_stretch_times(0.0, 96, bound, _times)
    assert durations == DURATIONS[:kept]
    assert ends[-1] == sum(DURATIONS[:kept])


def test_the_limit_caps_both() -> None:
    assert len(stretch_times(0.0, 5, 1e9, _times)[0]) == 5
    assert len(async_stretch_times(0.0, 5, 1e9, _times)[0]) == 5
    # A bound deep into the second chunk (16 steps first, then 64).
    t17 = sum(DURATIONS[:17])
    assert len(stretch_times(0.0, 96, t17 + 0.01, _times)[0]) == 18
    assert len(async_stretch_times(0.0, 96, t17 + 0.01, _times)[0]) == 19
