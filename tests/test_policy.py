"""ESync's readiness rule with scripted times (pure logic, no processes)."""

import time
from types import SimpleNamespace

import pytest

from hetsync.algorithms.base import PhaseClock, Step
from hetsync.algorithms.esync import StatePlan
from hetsync.state.client import StateServerUnreachable
from hetsync.state.policy import (Decision, ReadinessTracker, WorkerRecord, auto_epsilon, decide,
                                  round_length, steps_until_overrun, would_overrun)


def test_steps_until_overrun_is_the_last_step_that_still_fits():
    # 10 ms steps, 75 ms left, no margin: after 6 more steps 15 ms are left (one more fits:
    # 10 < 15), after 7 more 5 ms are left and one more step would overrun.
    assert steps_until_overrun(0.010, 0.075, 0.0) == 7
    # exactly one step left: it fits (it ends with, not after, the slowest's step)
    assert steps_until_overrun(0.010, 0.010, 0.0) == 1
    assert steps_until_overrun(0.010, 0.005, 0.0) == 0
    assert steps_until_overrun(0.010, -1.0, 0.0) == 0
    with pytest.raises(ValueError, match="step_time"):
        steps_until_overrun(0.0, 1.0, 0.0)


def test_the_margin_stops_a_worker_earlier():
    assert steps_until_overrun(0.010, 0.075, 0.0) == 7
    assert steps_until_overrun(0.010, 0.075, 0.006) == 6


def test_first_round_is_a_warm_up_where_everyone_stops_after_one_step():
    t = ReadinessTracker(workers=3, epsilon=0.0)
    assert t.report(0, round=1, steps=1, step_time=0.01, now=0.01).ready
    assert t.report(1, round=1, steps=1, step_time=0.02, now=0.02).ready
    assert t.report(2, round=1, steps=1, step_time=0.08, now=0.08).ready


def _warm(t: ReadinessTracker, times):
    for r, c in enumerate(times):
        t.report(r, round=1, steps=1, step_time=c, now=c)


def test_slowest_stops_after_one_step_and_fast_ones_fill_its_step():
    t = ReadinessTracker(workers=4, epsilon=0.0)
    _warm(t, [0.010, 0.020, 0.040, 0.080])
    start = 1.0  # round 2 begins for everyone at server time 1.0
    # The fastest reports after its first step: 70 ms of the slowest's 80 ms are left.
    d0 = t.report(0, round=2, steps=1, step_time=0.010, now=start + 0.010)
    assert d0.steps_left == 7  # 1 + 7 = 8 steps of 10 ms fill the slowest's 80 ms
    d1 = t.report(1, round=2, steps=1, step_time=0.020, now=start + 0.020)
    assert d1.steps_left == 3  # 1 + 3 = 4 steps of 20 ms
    d2 = t.report(2, round=2, steps=1, step_time=0.040, now=start + 0.040)
    assert d2.steps_left == 1  # 1 + 1 = 2 steps of 40 ms
    d3 = t.report(3, round=2, steps=1, step_time=0.080, now=start + 0.080)
    assert d3.ready and "slowest" in d3.reason
    # With a margin of 5 % of its step, the fastest stops one step early at an exact fit.
    t.epsilon = 0.05
    assert t.report(0, round=3, steps=1, step_time=0.010, now=2.010).steps_left == 6


def test_a_lost_worker_is_never_the_slowest_and_its_reports_are_refused():
    t = ReadinessTracker(workers=3, epsilon=0.0, lost=frozenset({2}))
    _warm(t, [0.010, 0.020])
    assert t.report(0, round=2, steps=1, step_time=0.010, now=1.01).steps_left == 1
    with pytest.raises(ValueError, match="rank 2 was lost"):
        t.report(2, round=2, steps=1, step_time=0.08, now=1.08)
    with pytest.raises(ValueError, match="some, not all"):
        ReadinessTracker(workers=2, lost=frozenset({0, 1}))


def test_anyone_asking_after_the_slowest_stopped_stops_at_once():
    t = ReadinessTracker(workers=2, epsilon=0.0)
    _warm(t, [0.010, 0.080])
    assert t.report(1, round=2, steps=1, step_time=0.080, now=1.08).ready
    # A late report of the fast one (it was busy): the slowest already stopped.
    assert t.report(0, round=2, steps=1, step_time=0.010, now=1.09).ready


def test_k_at_least_one_step():
    # The round begins (k = 0). With ESync's safety margin of half a step, even the slowest's
    # whole 20 ms step has no room for one 15 ms step, yet the caller takes one (and its answer
    # says so).
    records = {0: WorkerRecord(0, step_time=0.015, steps=0),
               1: WorkerRecord(1, step_time=0.02, step_started=0.0)}
    assert decide(records, 0, now=0.0, epsilon=0.5).steps_left == 1
    # After that step (k = 1) it stops.
    records[0].steps = 1
    assert decide(records, 0, now=0.015, epsilon=0.5).ready


def test_a_report_at_the_rounds_start_plans_the_whole_round():
    """The worker reports when its round begins (k = 0) and steps while the answer travels."""
    t = ReadinessTracker(workers=4)  # the default margin lets the last step overrun a little
    _warm(t, [0.010, 0.020, 0.040, 0.080])
    start = 1.0  # everyone leaves the aggregation and reports within a millisecond
    plans = [t.report(r, round=2, steps=0, step_time=c, now=start + r * 0.0002)
             for r, c in enumerate([0.010, 0.020, 0.040, 0.080])]
    # The slowest is told to stop after its one step; the others how much time is left.
    assert plans[3].steps_left == 1 and plans[3].time_left is None
    assert [p.steps_left for p in plans[:3]] == [8, 4, 2]  # they fill its 80 ms step
    assert plans[0].time_left == pytest.approx(0.080)
    # A fast worker whose first step already overruns stops after it, but takes it.
    slow_start = t.report(2, round=3, steps=0, step_time=0.200, now=2.0)
    assert slow_start.steps_left == 1


def test_the_slowest_is_found_from_its_step_time_not_its_rank():
    t = ReadinessTracker(workers=3, epsilon=0.0)
    _warm(t, [0.090, 0.010, 0.030])
    assert t.report(0, round=2, steps=1, step_time=0.090, now=2.09).ready  # rank 0 is slowest
    t2 = ReadinessTracker(workers=3, epsilon=0.0)
    _warm(t2, [0.090, 0.010, 0.030])
    d = t2.report(1, round=2, steps=1, step_time=0.010, now=2.01)
    assert d.steps_left == 8  # 80 ms left of rank 0's 90 ms step: 8 more 10 ms steps fit


def test_no_clock_from_workers_is_used():
    # Same durations, server clock shifted by an hour: same answers.
    a, b = ReadinessTracker(2, 0.0), ReadinessTracker(2, 0.0)
    _warm(a, [0.01, 0.05])
    for r, c in enumerate([0.01, 0.05]):
        b.report(r, round=1, steps=1, step_time=c, now=3600 + c)
    assert (a.report(0, 2, 1, 0.01, now=10.01).steps_left
            == b.report(0, 2, 1, 0.01, now=3610.01).steps_left)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="workers"):
        ReadinessTracker(workers=0)
    with pytest.raises(ValueError, match="epsilon"):
        ReadinessTracker(workers=2, epsilon=1.5)
    with pytest.raises(ValueError, match="rank 5"):
        ReadinessTracker(workers=2).report(5, 1, 1, 0.1, now=0.0)


def test_the_answer_carries_the_slowests_remaining_time_for_the_worker_to_recheck():
    t = ReadinessTracker(workers=2, epsilon=0.05)
    _warm(t, [0.010, 0.080])
    d = t.report(0, round=2, steps=1, step_time=0.010, now=1.010)
    assert d.time_left == pytest.approx(0.070) and d.epsilon == 0.05
    # The worker re-applies rule 5 on its own clock: steps fit until less than c·(1+ε) is left.
    assert not would_overrun(0.010, 0.0106, 0.05)
    assert would_overrun(0.010, 0.0104, 0.05)
    # A step that became slower (a busy machine) stops it earlier than the first forecast.
    assert would_overrun(0.030, 0.025, 0.05)


def test_the_round_is_the_slowests_step_when_the_others_fill_it():
    assert round_length([0.010, 0.020, 0.040, 0.080]) == pytest.approx(0.080)
    assert round_length([0.080]) == pytest.approx(0.080)
    with pytest.raises(ValueError, match="step times"):
        round_length([0.0, 0.1])


def test_the_round_stretches_to_fit_steps_that_just_miss_the_slowests():
    # Speeds near 1 : 2 : 4 : 8: in the slowest's 76.2 ms the others fit 7, 3 and 1 steps and
    # idle 2.7, 14.4 and 36.2 ms. Stretched to 84 ms (8 steps of 10.5 ms) they fit 8, 4 and 2,
    # and only the slowest idles (7.8 ms): the mean computing time ratio goes from 0.83 to 0.96.
    times = [0.0105, 0.0206, 0.040, 0.0762]
    assert round_length(times) == pytest.approx(0.084)
    t = ReadinessTracker(workers=4)
    _warm(t, times)
    plans = [t.report(r, round=2, steps=0, step_time=c, now=1.0) for r, c in enumerate(times)]
    assert [p.steps_left for p in plans] == [8, 4, 2, 1]
    assert plans[0].time_left == pytest.approx(0.084) and t.length == pytest.approx(0.084)
    # ESync's own rule (a numeric epsilon) keeps the round to the slowest's step.
    t0 = ReadinessTracker(workers=4, epsilon=0.0)
    _warm(t0, times)
    assert [t0.report(r, 2, 0, c, now=1.0).steps_left for r, c in enumerate(times[:3])] == [7, 3, 1]


def test_a_stretch_that_idles_the_slowest_more_than_it_fills_is_not_taken():
    # 30 ms and 100 ms: 3 steps fill 90 of the slowest's 100 ms (mean ratio 0.95); a fourth
    # would stretch the round to 120 ms and idle the slowest for 20 (mean 0.92).
    assert round_length([0.030, 0.100]) == pytest.approx(0.100)


def test_a_planned_step_may_overrun_the_round_by_a_pth_of_itself():
    # Worth it while the P - 1 others wait less in all than the caller would idle.
    assert auto_epsilon(4) == -0.25
    with pytest.raises(ValueError, match="workers"):
        auto_epsilon(0)
    t = ReadinessTracker(workers=4)
    _warm(t, [0.010, 0.020, 0.040, 0.080])
    d = t.report(1, round=2, steps=0, step_time=0.020, now=1.0)
    assert d.epsilon == -0.25
    assert not would_overrun(0.020, 0.016, d.epsilon)  # ends 4 ms late: taken
    assert would_overrun(0.020, 0.014, d.epsilon)      # ends 6 ms late: not worth it


# ---- a worker's round length while the state server cannot be reached (scripted client)
class _Server:
    """Answers every report with a plan of 40 ms left, or, while `up` is False, does not
    answer (as `StateClient` when it cannot connect within its retries)."""

    host, port = "127.0.0.1", 1

    def __init__(self):
        self.up, self.reports = True, 0

    def report_async(self, rank, round, steps, step_time, device="", retry_s=None):
        self.reports += 1
        if self.up:
            return lambda: Decision(3, "fits", time_left=0.040)

        def unanswered():
            raise StateServerUnreachable("did not answer") from ConnectionRefusedError()
        return unanswered


def _round(plan, step_s=0.010):
    """One round of `step_s` steps on a scripted clock: how many steps it took."""
    plan.poll()
    t, steps = 0.0, 0
    while True:
        steps += 1
        if plan.ends_round(Step(t, t + step_s), steps):
            plan.round_over(0)
            return steps
        t += step_s


def test_a_worker_follows_the_last_plan_while_the_state_server_is_down_and_retries_later(
        monkeypatch):
    server = _Server()
    plan = StatePlan(SimpleNamespace(clock=PhaseClock(), service=server, rank=0,
                                     device_name="cpu"))
    plan.round_over(0)   # the first report
    assert [_round(plan) for _ in range(2)] == [4, 4]   # 40 ms left: four 10 ms steps
    server.up = False
    assert _round(plan) == 4   # (answered: reported before the server went down)
    with pytest.warns(RuntimeWarning, match=r"rank 0: the state server at 127.0.0.1:1 did not "
                      r"answer \(ConnectionRefusedError\); the rounds follow its last plan"):
        assert _round(plan) == 4   # its answer did not come: the last plan
    reports = server.reports
    # paused: no report for RETRY_S (1 s, on the real clock), the last plan meanwhile
    assert [_round(plan) for _ in range(3)] == [4, 4, 4] and server.reports == reports
    server.up = True
    now = time.monotonic()
    monkeypatch.setattr(time, "monotonic", lambda: now + StatePlan.RETRY_S + 0.1)
    _round(plan)   # reports again
    assert server.reports == reports + 1 and _round(plan) == 4
    assert plan._retry_at is None   # back: no pause
