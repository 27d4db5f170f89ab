"""Balanced batches re-planned as the devices' measured speeds drift (`runtime/replan.py`)."""

import json
import os
import subprocess
import sys

import pytest
import torch

from distributed import run_ranks
from tiny import batch as _batch, linear_net, sgd_on_every_sample

from hetsync.algorithms import CommContext, Step
from hetsync.algorithms.base import flatten
from hetsync.algorithms.sync import SynchronousSGD
from hetsync.config import Config
from hetsync.options import ConfigError
from hetsync.runtime import faults, replan
from hetsync.telemetry.rundir import RunDir
from hetsync.telemetry.summarize import summarize

LR = 0.1


# ------------------------------------------------------------------ the pure parts
def test_the_speeds_are_compared_every_few_rounds_and_a_drift_is_relative_to_the_plan():
    assert [r for r in range(1, 35) if replan.due(r)] == [10, 20, 30]
    planned = [1.0, 0.5, 0.25]
    # the fastest device halved: relative to the fastest measured, the others gained
    assert replan.relative([50.0, 50.0, 25.0], planned) == [1.0, 1.0, 0.5]
    assert replan.drifted(planned, [1.0, 1.0, 0.5], drift=0.2)
    # within the drift: no re-plan (a real device wanders by a few per cent)
    assert not replan.drifted(planned, [1.0, 0.55, 0.24], drift=0.2)
    # a lost worker (no speed in the sum) keeps the one it was planned with
    assert replan.relative([100.0, 0.0, 20.0], planned) == [1.0, 0.5, 0.2]


def test_a_plan_follows_new_speeds_with_batches_and_weights_that_count_samples():
    plan = replan.BatchPlan(64, [1.0, 0.5, 0.25], drift=0.2)
    assert plan.batches == [64, 32, 16]
    plan.meter(32, 0.5)
    plan.meter(32, 0.5)
    assert plan.measured(1).tolist() == [0.0, 64.0, 0.0]  # its own slot: samples per second
    assert plan.measured(1).tolist() == [0.0, 0.0, 0.0]   # (the meter started over)
    assert plan.replanned([64.0, 64.0, 32.0]) == [1.0, 1.0, 0.5]
    assert plan.replanned([128.0, 64.0, 32.0]) is None  # as planned
    plan.adopt([1.0, 1.0, 0.5])
    assert plan.batches == [64, 64, 32]
    assert [plan.sample_weight_of(r) for r in range(3)] == pytest.approx(
        [3 * 64 / 160, 3 * 64 / 160, 3 * 32 / 160])


def test_only_a_sync_run_with_balanced_batches_re_plans_them():
    assert Config(mode="sync", workers=2, slowdowns=(1.0, 2.0), balanced_batches=True).replans
    assert not Config(mode="sync", workers=2, slowdowns=(1.0, 2.0), balanced_batches=True,
                      replan_drift=0).replans
    assert not Config(mode="esync-outer", workers=2, slowdowns=(1.0, 2.0),
                      balanced_batches=True).replans
    with pytest.raises(ConfigError, match=r"--replan-drift: invalid value 0.5; expected 0.2 "
                                          r"\(unused\) unless --balanced-batches 1.*"
                                          r"\(sync, sync-lookahead\)"):
        Config(mode="esync-outer", workers=2, slowdowns=(1.0, 2.0), balanced_batches=True,
               replan_drift=0.5).validate()
    with pytest.raises(ConfigError, match=r"--replan-drift: invalid value -1.*a fraction in 0..10"):
        Config(mode="sync", workers=2, balanced_batches=True, replan_drift=-1).validate()


# ------------------------------------------------------------------ on real gloo ranks
def _replanned_sync_step(rank, world):
    """Planned for speeds 1, 1/2, 1/4 (batches 8, 4, 2); rank 0's device then runs at half
    its speed: the members sum their measured speeds, all adopt batches 8, 8, 4, and the next
    sync step is SGD on the mean gradient over those 20 samples."""
    comm = CommContext(rank=rank, workers=world, collective="ring")
    plan = replan.BatchPlan(8, [1.0, 0.5, 0.25], drift=0.2)
    seconds = {0: 0.2, 1: 0.1, 2: 0.1}[rank]  # 40, 40 and 20 samples per second
    plan.meter(plan.batches[rank], seconds)
    speeds = plan.replanned(comm.barrier(plan.measured(rank), phase="comm").tolist())
    plan.adopt(speeds)
    comm.sample_weight = plan.sample_weight_of(rank)

    torch.manual_seed(0)
    model = linear_net()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    algo = SynchronousSGD(model, opt, comm)
    algo.setup()
    x, y = _batch(rank, plan.batches[rank])
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    algo.perform(algo.decide(Step(0.0, 0.01)))
    # by hand: one SGD step on the mean gradient over every sample of the step
    return (plan.batches, flatten(list(model.parameters())),
            sgd_on_every_sample([8, 8, 4], LR))


def test_re_planned_batches_are_agreed_by_every_rank_and_the_sum_counts_their_samples():
    for rank, (batches, got, expected) in enumerate(run_ranks(_replanned_sync_step, 3)):
        assert batches == [8, 8, 4], rank
        torch.testing.assert_close(got, expected, msg=f"rank {rank}")


# ------------------------------------------------------------------ a run
def _records(run_dir, rank):
    return [json.loads(line) for line in
            (run_dir / f"worker-{rank}.jsonl").read_text().splitlines()]


def _busy(records) -> float:
    """The fraction of the rounds' time the device computed."""
    return (sum(r["compute_s"] for r in records)
            / sum(r["t_end"] - r["t_start"] for r in records))


def test_a_device_slowed_mid_run_gets_a_re_planned_batch_and_every_device_is_busy_again(
        tmp_path):
    """sync on the virtual clock, devices 1, 2, 4 with balanced batches 32, 16, 8; rank 0's
    device runs at half its speed after round 30 (HETSYNC_FAULT ...:slow). Until the plan
    follows, ranks 1 and 2 wait for it about half of each step; from the first check that
    sees the drift, the batches are 32, 32, 16 and every device computes again."""
    run = tmp_path / "run"
    out = subprocess.run(
        [sys.executable, "-m", "hetsync", "launch", "-m", "sync", "--workers", "3",
         "--slowdowns", "1,2,4", "--balanced-batches", "1", "-b", "32", "-n", "lenet",
         "--dataset", "synthetic", "--clock", "virtual", "--step-work", "0.01",
         "--time-budget", "1.5", "--eval-interval", "0.5", "--timeout", "20", "-ld",
         str(tmp_path), "--run-name", "run", "--quiet", "--no-figures", "--no-live"],
        capture_output=True, text=True, timeout=240,
        env={**os.environ, faults.ENV: "0:30:slow"})
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    event, = RunDir(run).read_events("replan")
    assert event["before"] == [32, 16, 8] and event["batches"] == [32, 32, 16], event
    assert event["round"] == 41, event  # the check after 10 rounds that were all slow
    records = {rank: _records(run, rank) for rank in range(3)}
    for rank, batch in enumerate([32, 16, 8]):
        assert {r["batch"] for r in records[rank] if r["round"] < 41} == {batch}
    for rank, batch in enumerate([32, 32, 16]):
        after = [r for r in records[rank] if r["round"] >= 41]
        assert len(after) >= 20 and {r["batch"] for r in after} == {batch}
        assert {r["samples"] for r in after} == {batch}
        assert _busy(after) >= 0.9, (rank, _busy(after))
        slowed = [r for r in records[rank] if 31 <= r["round"] <= 40]
        if rank > 0:  # they waited for the slowed device
            assert _busy(slowed) < 0.6, (rank, _busy(slowed))
    summary = summarize(run)
    assert summary["ledger"]["unit"] == "sample"
    assert summary["ledger"]["batches_twice"] == summary["ledger"]["batches_skipped"] == 0
    assert "0 sample(s) drawn twice, 0 skipped" in out.stdout
