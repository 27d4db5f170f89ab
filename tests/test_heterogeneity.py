"""The emulated slowdown (pure rule, and the timer on the real clocks)."""

import time

import pytest

from hetsync.runtime.heterogeneity import StepTimer, emulated_sleep


def test_a_step_is_topped_up_to_factor_times_the_typical_work():
    assert emulated_sleep(4.0, wall=0.010, work=0.010) == pytest.approx(0.030)
    # Preempted for 5 ms (wall 15 ms, work 10 ms): the step still lasts 4 x 10 ms in all.
    assert emulated_sleep(4.0, wall=0.015, work=0.010) == pytest.approx(0.025)
    # A step already longer than F x work is not cut; factor 1 never sleeps.
    assert emulated_sleep(2.0, wall=0.050, work=0.010) == 0.0
    assert emulated_sleep(1.0, wall=0.010, work=0.010) == 0.0
    with pytest.raises(ValueError, match="0.5"):
        emulated_sleep(0.5, 0.01, 0.01)


def test_the_timer_makes_a_cpu_bound_step_last_factor_times_its_cpu_time():
    timer = StepTimer(3.0)
    durations = []
    for _ in range(3):
        start = timer.begin()
        end = time.process_time() + 0.02
        while time.process_time() < end:  # 20 ms of real work
            pass
        timer.emulate()
        durations.append(time.perf_counter() - start)
    # ~60 ms each (3 x 20 ms of CPU), whatever else the machine was doing meanwhile.
    assert all(0.055 <= d <= 0.25 for d in durations), durations
