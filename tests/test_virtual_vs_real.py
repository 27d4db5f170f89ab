"""`benchmarks/virtual_vs_real.py`'s readings: a time to target between evaluations, its
median over seeds, and the profile its calibration writes from a real run's summary."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from virtual_vs_real import calibrated, median_time, tta  # noqa: E402

from hetsync.clock.profile import load


def test_the_time_to_a_target_is_read_between_the_evaluations_around_it():
    evals = [{"train_time": 1.0, "test_acc": 0.70}, {"train_time": 2.0, "test_acc": 0.80},
             {"train_time": 3.0, "test_acc": 0.90}]
    assert tta(evals, 0.85) == pytest.approx(2.5)
    assert tta(evals, 0.80) == 2.0      # reached at an evaluation
    assert tta(evals, 0.60) == 1.0      # already at the first
    assert tta(evals, 0.95) is None


def test_a_seed_that_never_reached_a_target_counts_in_its_median_as_never():
    """Three seeds, one of which missed: the median is the slower of the other two (dropping
    the miss would have made it their mean, and the side that missed look faster)."""
    assert median_time([63.6, 68.5, None]) == 68.5
    assert median_time([61.3, 62.0, 77.3]) == 62.0
    assert median_time([12.0, None, None]) is None


def test_the_calibration_gives_each_device_its_computing_and_its_hosts_time_per_step(tmp_path):
    real = tmp_path / "real-x"
    real.mkdir()
    worker = {"rank": 0, "samples": 6400, "local_steps": 100, "wall_s": 10.0,
              "compute_s": 8.0, "eval_s": 0.5, "comm_s": 0.0, "wait_s": 1.0, "query_s": 0.2}
    (real / "summary.json").write_text(json.dumps({"per_worker": [
        worker, {**worker, "rank": 1, "samples": 3200, "local_steps": 50}]}))
    flags = calibrated(real, tmp_path / "no-sync-run", ["0.0004", "4.8gbit"])
    assert flags[flags.index("--link-latency") + 1] == "0.0004"
    profile = load(flags[flags.index("--profile") + 1])
    fast, slow = profile.devices
    assert fast.sample_s == pytest.approx(8.0 / 6400)
    # outside computing, evaluation, communication and waiting: 10 - 8 - 0.5 - 1.0, and the
    # queries (in wait_s) again: 0.7 s over its steps
    assert fast.step_s == pytest.approx(0.7 / 100)
    assert slow.step_s == pytest.approx(0.7 / 50)
