"""Every run ends (issue 59): a wedged peer cannot hold a wall-clock run past its
--time-budget by more than its grace (`Config.finish_grace`) -- launch's watchdog ends the run,
naming what it waited for, and each worker's own ends its process under torchrun -- with the
faults injected at a chosen rank and round (`runtime/faults.py`), not killed from outside."""

import json
import os
import subprocess
import sys
import time

import pytest

from hetsync.config import Config
from hetsync.options import ConfigError
from hetsync.runtime import faults


def test_a_fault_is_named_by_rank_round_and_kind_and_a_bad_one_refused_in_one_line():
    assert faults.parse("1:20:hang, 0:3:exit") == [faults.Fault(1, 20, "hang"),
                                                   faults.Fault(0, 3, "exit")]
    plan = [faults.Fault(1, 20, "hang")]
    assert faults.due(plan, 19) is None and faults.due(plan, 20) == plan[0]
    for bad in ("1:20", "1:x:hang", "-1:3:exit", "1:3:crash", "1:3:exit:now"):
        with pytest.raises(ConfigError) as err:
            faults.parse(bad)
        assert "\n" not in str(err.value) and repr(bad) in str(err.value), bad


def test_a_fault_happens_once_in_a_run_not_again_in_a_resumed_process(tmp_path, monkeypatch):
    monkeypatch.setenv(faults.ENV, "1:20:exit,1:40:slow,2:5:exit")
    assert faults.planned(1, tmp_path) == [faults.Fault(1, 20, "exit"), faults.Fault(1, 40, "slow")]
    faults.inject(faults.Fault(1, 40, "slow"), tmp_path, timer=type("T", (), {"factor": 1})())
    assert faults.planned(1, tmp_path) == [faults.Fault(1, 20, "exit")]  # (its run's events)
    assert faults.planned(2, tmp_path) == [faults.Fault(2, 5, "exit")]
    assert len(faults.planned(1)) == 2  # (no run directory: every one)


def test_the_grace_is_the_timeout_and_a_finish_unless_given_and_none_on_the_virtual_clock():
    assert Config(time_budget=10.0, timeout=15.0).finish_grace == 15.0 + 30.0
    assert Config(time_budget=10.0, grace=4.0).finish_grace == 4.0
    assert Config(epochs=1).finish_grace is None  # (no budget to pass)
    with pytest.raises(ConfigError, match="--grace"):
        Config(grace=0.0).validate()


def _launch_with_a_hang(tmp_path, mode: str, *flags: str):
    """`launch` of `mode` on 3 workers whose rank 1 hangs at round 5 (its peers' --timeout
    of 120 s never fires first), with a budget of 4 s and a grace of 5; its output, exit
    code and wall seconds."""
    start = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "hetsync", "launch", "-m", mode, "--workers", "3",
         "--slowdowns", "1,1,2", "-n", "mlp", "--dataset", "synthetic", "--time-budget", "4",
         "--epochs", "none", "--timeout", "120", "--grace", "5", *flags,
         "-ld", str(tmp_path), "--run-name", "run", "--quiet", "--no-figures", "--no-live"],
        capture_output=True, text=True, timeout=240,
        env={**os.environ, faults.ENV: "1:5:hang"})
    return out.stdout + out.stderr, out.returncode, time.monotonic() - start


def _ended_by_the_watchdog(tmp_path, output: str, code: int, wall: float) -> None:
    assert code == 1, output
    line = next(l for l in output.splitlines() if "stopped by the watchdog" in l)
    # it names what the run waited for: the hung rank, with its log's last line
    assert "passed its --time-budget 4 s" in line and "grace of 5 s (--grace)" in line, line
    assert "rank-1 (its log ends: rank 1: injected fault: hang after round 5" in line, line
    # (the start -- torch imported, the reference step measured -- is not in the budget)
    assert wall < 120, wall
    # and where each was: its stacks at the end of its log (SIGUSR1, before the stop)
    assert "in inject" in (tmp_path / "run" / "logs" / "rank-1.log").read_text()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["rounds"] >= 3, summary  # what its records hold is summarised


def test_a_hung_worker_cannot_hold_a_collective_run_past_its_budget_and_grace(tmp_path):
    """sync (torch.distributed collectives): rank 1 hangs; ranks 0 and 2 wait for it in an
    all-reduce whose --timeout is 120 s; launch ends the run 4 + 5 s after it began."""
    _ended_by_the_watchdog(tmp_path, *_launch_with_a_hang(tmp_path, "sync"))


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["async", "esync", "esync-outer"])
def test_a_hung_worker_cannot_hold_a_run_of_any_transport_past_its_budget(tmp_path, mode):
    """The parameter server (async: the others train on, then the server waits for the hung
    one's goodbye), ESync's state server (esync: its plan waits for the hung one) and
    background rounds (esync-outer)."""
    _ended_by_the_watchdog(tmp_path, *_launch_with_a_hang(tmp_path, mode))


@pytest.mark.slow
def test_a_hung_worker_ends_its_own_process_where_no_launch_watches_it(tmp_path):
    """`hetsync worker` alone (as under torchrun, where no launch watches): its watchdog
    fires 30 s after launch's would, prints where every thread was to its log, and exits."""
    config = tmp_path / "config.json"
    Config(mode="sync", workers=1, network="mlp", dataset="synthetic", time_budget=3.0,
           epochs=None, grace=2.0, log_dir=str(tmp_path)).save(config)
    start = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "hetsync", "worker", "--config", str(config), "--run-dir",
         str(tmp_path / "run")],
        capture_output=True, text=True, timeout=240,
        env={**os.environ, faults.ENV: "0:5:hang", "RANK": "0", "WORLD_SIZE": "1"})
    assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-2000:]
    assert "injected fault: hang" in out.stderr and "Timeout (0:00:35)!" in out.stderr, \
        out.stderr[-3000:]
    assert "in inject" in out.stderr  # the stack: where it hung
    assert time.monotonic() - start < 120
