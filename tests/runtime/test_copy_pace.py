"""The copy's pace (`rlog replica --catchup-rate`): how long the copy waits after each span so
that it takes at most `rate` bytes per second on average, on a clock the test turns."""

from __future__ import annotations

import pytest

from rlog.runtime.learned_copy import Pace


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_no_rate_never_waits():
    pace = Pace(0, Clock())
    assert [pace.delay(size) for size in (1, 10**9, 0)] == [0.0, 0.0, 0.0]


def test_the_wait_keeps_the_average_at_the_rate():
    clock = Clock()
    pace = Pace(1000, clock)
    assert pace.delay(500) == pytest.approx(0.5)  # the first bytes count too
    clock.now += 0.5
    assert pace.delay(2000) == pytest.approx(2.0)
    clock.now += 2.0
    assert pace.delay(0) == 0.0


def test_time_spent_fetching_is_not_waited_again():
    clock = Clock()
    pace = Pace(1000, clock)
    assert pace.delay(1000) == pytest.approx(1.0)
    clock.now += 3.0  # waited 1 s, then a slow span: 2 s behind the rate, not ahead
    assert pace.delay(1000) == 0.0
    assert pace.delay(1000) == 0.0
    assert pace.delay(1000) == pytest.approx(1.0)  # 4000 bytes by 4 s after the first


def test_a_negative_rate_is_refused():
    with pytest.raises(ValueError, match="rate"):
        Pace(-1)
