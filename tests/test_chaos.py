"""A short chaos run per mode family (`benchmarks/chaos.py` runs the long ones): faults of every
kind in one run — a worker paused, the state server or parameter server killed, rank 0 killed
(in esync-outer, started again to join the run; in async, rank 1 leads on, or rank 0's new
process where it is back first), the evaluator killed — and the run
still ends well: launch exits 0 within its bound, one
accuracy curve to the budget, a complete summary."""

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from chaos import Event, at_rounds, at_samples, run  # noqa: E402

SCHEDULES = {
    # goes on without a lost worker, rank 0 included (the lowest survivor leads on), which
    # launch starts again to join the running job
    "esync-outer": [Event(2.0, "stop-worker", 1, pause=1.5), Event(4.0, "kill-worker", 0),
                    Event(6.0, "kill-state-server"), Event(7.0, "kill-evaluator")],
    # rank 0 lost (2.5 s after its checkpoint at 5 s of training, which pulls the model
    # from the server and may take a second on a busy machine): rank 1 leads on (or rank 0's
    # new process, back first); the parameter server killed: launch resumes the run from the
    # last checkpoint of a leader, with every worker
    "async": [Event(2.0, "stop-worker", 2, pause=1.5), Event(4.0, "kill-evaluator"),
              Event(7.5, "kill-worker", 0), Event(10.0, "kill-ps")],
}


@pytest.mark.slow
@pytest.mark.parametrize("mode", sorted(SCHEDULES))
def test_a_run_under_faults_of_every_kind_ends_well(tmp_path, mode):
    args = SimpleNamespace(budget=12.0, timeout=15.0, events=len(SCHEDULES[mode]),
                           log_dir=str(tmp_path), lr_schedule=None, at_rounds=False)
    out = run(mode, 0, args, SCHEDULES[mode])
    log = (tmp_path / f"chaos-{mode}-s0-chaos" / "chaos.log").read_text()
    assert out.code == 0, log
    assert not any("not running" in a for a in out.applied), log  # every fault happened
    assert out.one_curve and out.reached_budget and out.complete, log
    # well above chance (0.1): how far 12 s of wall time gets depends on the machine's load
    assert out.final is not None and out.final >= 0.5, log
    if mode == "esync-outer":  # (rank 0 joins again unless the run ends before it is up)
        assert out.lost + out.joined == [0] and out.restarts == 0, log
        assert out.ledger["batches_twice"] == out.ledger["batches_skipped"] == 0, log
    else:  # (the resumed run starts every worker again: none is lost at its end)
        assert out.restarts == 1, log  # the parameter server lost: resumed


def test_the_undisturbed_accuracy_at_equal_samples_is_read_between_its_evaluations():
    curve = [(0, 0.10), (100, 0.50), (200, 0.70)]
    assert at_samples(curve, 150) == pytest.approx(0.60)
    assert at_samples(curve, 200) == pytest.approx(0.70)
    assert at_samples(curve, 250) is None   # past the run's end: nothing to compare with


def test_faults_at_rounds_follow_each_ranks_rounds_in_the_undisturbed_twin(tmp_path):
    """--at-rounds: ranks 1, 2, 0 exit at 1/4, 1/2, 3/4 of the rounds each recorded in its
    twin (an asynchronous mode's ranks count apart); rank 0's is left out where the mode
    goes on but takes no one back (it would be the last worker)."""
    for rank, rounds in ((0, 400), (1, 200), (2, 100)):
        (tmp_path / f"worker-{rank}.jsonl").write_text(
            "".join(f'{{"round": {r}}}\n' for r in range(1, rounds + 1)))
    assert at_rounds("async", tmp_path, 3) == "1:50:exit,2:50:exit,0:300:exit"
    assert at_rounds("eager-solo", tmp_path, 3) == "1:50:exit,2:50:exit"
