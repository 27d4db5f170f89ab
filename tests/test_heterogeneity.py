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


def test_a_random_straggler_sleeps_its_delay_with_its_probability():
    from hetsync.options import parse_delay
    from hetsync.runtime.heterogeneity import RandomStraggler

    draws = RandomStraggler(0.25, 0.3, seed=7).draws()
    delays = [next(draws) for _ in range(4000)]
    assert set(delays) == {0.0, 0.3}
    assert abs(delays.count(0.3) / len(delays) - 0.25) < 0.03
    again = RandomStraggler(0.25, 0.3, seed=7).draws()
    assert [next(again) for _ in range(100)] == delays[:100]  # seeded: reproducible
    assert parse_delay("0.32") == (0.32, False) and parse_delay("4x") == (4.0, True)
    with pytest.raises(ValueError):
        parse_delay("-1")


def test_the_timer_adds_a_drawn_straggler_delay_to_the_step():
    from hetsync.runtime.heterogeneity import RandomStraggler

    timer = StepTimer(1.0, straggler=RandomStraggler(1.0, 0.05))  # every step straggles
    started = timer.begin()
    timer.emulate()
    assert time.perf_counter() - started >= 0.05  # a lower bound holds on a busy machine


def test_a_step_on_a_smaller_batch_is_topped_up_to_its_share_of_the_devices_step(
        monkeypatch):
    """A lost worker's batch of another size (`runtime/shards.py`) takes its samples' time:
    a quarter of the batch, a quarter of F x the reference work."""
    from types import SimpleNamespace

    import hetsync.runtime.heterogeneity as heterogeneity

    slept, ticks = [], iter(range(1000))
    clock = SimpleNamespace(perf_counter=lambda: next(ticks) * 0.001, sleep=slept.append,
                            thread_time=time.thread_time, process_time=time.process_time)
    monkeypatch.setattr(heterogeneity, "time", clock)  # each reading 1 ms after the last
    timer = StepTimer(4.0, work=0.010)
    for share in (1.0, 0.25, 1.0):
        timer.begin()
        timer.emulate(share)
    # each step's own wall time is 1 ms: topped up to 4 x 10 ms, then to a quarter of it
    assert slept == pytest.approx([0.039, 0.009, 0.039])
    # a timer that calibrates its own work takes a quarter batch's 1 ms as 4 ms of a whole
    slept.clear()
    timer = StepTimer(4.0, cpu_device=False)
    for share in (0.25, 1.0):
        timer.begin()
        timer.emulate(share)
    # 4 x 4 ms x 1/4 less 1 ms; then 4 x the median of 4 and 1 ms, less 1 ms
    assert slept == pytest.approx([0.003, 0.009])


def test_a_sleep_that_wakes_late_is_made_up_by_the_next_ones(monkeypatch):
    """A device sleeps to its step's time, and every sleep here wakes 2 ms late (a busy
    core): the overrun comes off the next sleep, so that ten steps last ten steps' time
    (plus the last one's overrun), not 2 ms more each."""
    from types import SimpleNamespace

    import hetsync.runtime.heterogeneity as heterogeneity

    now, slept, late = [0.0], [], [0.002]

    def sleep(seconds):
        slept.append(seconds)
        now[0] += seconds + late[0]

    def perf_counter():
        now[0] += 0.0001  # every reading 0.1 ms after the last
        return now[0]

    clock = SimpleNamespace(perf_counter=perf_counter, sleep=sleep,
                            thread_time=time.thread_time, process_time=time.process_time)
    monkeypatch.setattr(heterogeneity, "time", clock)
    timer = StepTimer(4.0, cpu_device=False, work=0.010)  # a step of 40 ms
    started = timer.begin()
    for _ in range(10):
        timer.emulate()
        timer.begin()
    # (each step 40 ms, and 0.1 ms between steps: the next step's first reading)
    assert now[0] - started == pytest.approx(10 * 0.0401 + 0.002, abs=0.0003)
    assert slept[:2] == pytest.approx([0.0399, 0.0378])
    # A sleep that wakes a second late (a stalled process) is made up for one step's time
    # at most: the device does not then run on without sleeping for 25 steps.
    slept.clear()
    for overrun in (1.0, 0.0, 0.0):
        late[0] = overrun
        timer.emulate()
        timer.begin()
    # (the first less the 2 ms still owed; the next made up; then a step's sleep again)
    assert slept == pytest.approx([0.0378, 0.0, 0.0398], abs=0.0002)
