"""The local learning rate over a run (`--lr-schedule`): the pure schedule, and what a run's
records say it used."""

import json
import os

import pytest

from hetsync.config import Config
from hetsync.options import ConfigError
from hetsync.runtime.launcher import launch
from hetsync.runtime.schedule import lr_factor, run_progress


def test_cosine_starts_at_one_ends_at_the_final_fraction_and_never_rises():
    factors = [lr_factor("cosine", p / 100, 0.1) for p in range(101)]
    assert factors[0] == 1.0 and factors[-1] == pytest.approx(0.1)
    assert factors[50] == pytest.approx(0.55)
    assert all(a >= b for a, b in zip(factors, factors[1:]))
    assert lr_factor("cosine", 1.7, 0.0) == pytest.approx(0.0)  # past the end: the end
    assert lr_factor("constant", 0.7, 0.1) == 1.0


def test_progress_follows_whichever_rule_stops_the_run_first():
    assert run_progress(30.0, 0, time_budget=60.0, epochs=None, train_size=100) == 0.5
    assert run_progress(0.0, 150, time_budget=None, epochs=2.0, train_size=100) == 0.75
    assert run_progress(30.0, 150, time_budget=60.0, epochs=2.0, train_size=100) == 0.75
    assert run_progress(90.0, 0, time_budget=60.0, epochs=None, train_size=100) == 1.0


def test_a_schedule_needs_a_length_to_decay_over():
    with pytest.raises(ConfigError, match="lr_schedule|lr-schedule"):
        Config(lr_schedule="cosine", epochs=None, time_budget=None, target_acc=0.9).validate()
    with pytest.raises(ConfigError, match="lr-final|lr_final"):
        Config(lr_schedule="cosine", lr_final=1.5).validate()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["esync-outer", "sync"])
def test_a_cosine_run_decays_every_workers_rate_to_the_final_fraction(tmp_path, mode):
    cfg = Config(mode=mode, dataset="synthetic", network="mlp", workers=2, slowdowns=(1.0, 2.0),
                 epochs=None, time_budget=3.0, eval_interval=1.0, timeout=30.0, lr=0.1,
                 lr_schedule="cosine", lr_final=0.1, log_dir=str(tmp_path))
    run_dir = launch(cfg, show_progress=False, figures=False, stream=open(os.devnull, "w"))
    for rank in (0, 1):
        rates = [json.loads(line)["lr"]
                 for line in (run_dir / f"worker-{rank}.jsonl").read_text().splitlines()]
        assert rates[0] == pytest.approx(0.1, rel=0.02), rank   # the start: -l
        assert all(a >= b for a, b in zip(rates, rates[1:])), rank
        # the last round's rate: near the end of the budget, near the final fraction
        assert 0.01 - 1e-9 <= rates[-1] < 0.02, (rank, rates[-1])
