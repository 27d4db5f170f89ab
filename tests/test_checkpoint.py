"""Checkpoints: atomic files that load with weights_only, a corrupt one skipped for the one
before; runs whose worker is killed with SIGKILL resume from their last checkpoint, or, in an
asynchronous mode, go on without it."""

from __future__ import annotations

import json
import math
import os
import socket
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hetsync.runtime import checkpoint
from hetsync.telemetry.rundir import RunDir

from processes import live_records, pid_of_rank


def _state(value: float) -> dict:
    return {"global": {"w": torch.full((3,), value)}, "round": int(value),
            "optimizer": {"state": {}, "param_groups": [{"lr": 0.1, "params": [0]}]},
            "mode": {"round": int(value)}, "data": {"epoch": 0, "batch": 1},
            "loop": {"t": 1.0, "train_time": 1.0}}


def test_a_checkpoint_round_trips_with_weights_only(tmp_path):
    ck = checkpoint.Checkpointer(tmp_path, rank=0)
    path = ck.write(_state(4.0))
    loaded = checkpoint.load(path)
    assert loaded["index"] == 1 and loaded["round"] == 4
    torch.testing.assert_close(loaded["global"]["w"], torch.full((3,), 4.0))
    assert not list(path.parent.glob(".*.tmp"))  # no temporary file left behind


def test_only_the_last_checkpoints_are_kept(tmp_path):
    ck = checkpoint.Checkpointer(tmp_path, rank=0, keep=2)
    for v in range(5):
        ck.write(_state(float(v)))
    assert checkpoint.indices(tmp_path) == [5, 4]


def test_a_file_whose_directory_another_process_empties_and_removes_is_still_written(
        tmp_path, monkeypatch):
    """The last rank out of an old checkpoint removes its directory, and an evaluator once
    removed the emptied snapshots/: one that goes between `save_atomic`'s making of the
    directory and of its file costs a retry, not the run (here, the first time)."""
    real, removed = checkpoint.tempfile.mkstemp, []

    def removing_first(dir, **kwargs):
        if not removed:
            os.rmdir(dir)
            removed.append(dir)
        return real(dir=dir, **kwargs)

    monkeypatch.setattr(checkpoint.tempfile, "mkstemp", removing_first)
    path = tmp_path / "snapshots" / "000001.pt"
    checkpoint.save_atomic(path, {"version": checkpoint.VERSION, "w": torch.ones(2)})
    assert removed and checkpoint.load(path)["w"].sum() == 2


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty", "pickle"])
def test_a_corrupt_checkpoint_is_reported_and_the_previous_one_used(tmp_path, damage, capsys):
    ck = checkpoint.Checkpointer(tmp_path, rank=0)
    ck.write(_state(1.0))
    newest = ck.write(_state(2.0))
    data = newest.read_bytes()
    if damage == "truncate":
        newest.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        newest.write_bytes(b"\x00not a checkpoint" * 10)
    elif damage == "empty":
        newest.write_bytes(b"")
    else:  # a pickle that would run code if loaded without weights_only
        import pickle

        class Evil:
            def __reduce__(self):
                return (os.system, ("echo pwned > " + str(tmp_path / "pwned"),))
        newest.write_bytes(pickle.dumps({"version": 1, "x": Evil()}, protocol=2))
    assert checkpoint.loadable(tmp_path, rank=0) == [1]
    err = capsys.readouterr().err
    assert "skipping checkpoint 2" in err and str(newest) in err
    assert not (tmp_path / "pwned").exists()


def test_collective_modes_resume_where_every_worker_can():
    led = {i: {0: float(i)} for i in (3, 4, 5)}  # (rank 0's files hold the global model)
    assert checkpoint.choose([[5, 4], [4, 3]], 0, True, {}, led) == 4
    assert checkpoint.choose([[5, 4], [4, 3]], 1, True, {}, led) == 4
    assert checkpoint.choose([[5, 4], [4, 3]], 0, False, {}, led) == 5
    assert checkpoint.choose([[5], [4]], 1, True, {}, led) is None


def test_checkpoints_written_after_a_loss_are_complete_without_the_lost_rank():
    # rank 1 was lost after checkpoint 2; 5 and 6 were written by ranks 0 and 2 without it
    per_rank, lost = [[6, 5], [2, 1], [6, 5]], {6: {1}, 5: {1}}
    holders = {i: {0: float(i)} for i in (6, 5, 2, 1)}  # (rank 0 led throughout)
    assert all(checkpoint.choose(per_rank, r, True, lost, holders) == 6 for r in range(3))
    assert checkpoint.choose(per_rank, 1, True, {}, holders) is None  # (not knowing it was lost)
    # rank 2 has no 6 and was not lost: the newest complete one is 5
    assert checkpoint.choose([[6, 5], [2, 1], [5]], 2, True, lost, holders) == 5
    # rank 0 was lost too: 6 is rank 2's, the lowest left, which holds its global model
    assert checkpoint.reference([[], [2], [6]], True, {6: {0, 1}}, {6: {2: 6.0}}) == 6
    assert checkpoint.leader(6, {6: {2: 6.0}}) == 2
    assert checkpoint.choose([[], [2], [6]], 0, True, {6: {0, 1}}, {6: {2: 6.0}}) == 6
    # eager-SGD (no common checkpoint): each its own newest, a lost rank the leader's
    holders = {7: {0: 7.0}}  # (rank 0 led: its 7 holds the global model)
    assert checkpoint.choose([[7], [3], [8]], 2, False, {7: {1}}, holders) == 8
    assert checkpoint.choose([[7], [3], [8]], 1, False, {7: {1}}, holders) == 7
    # an asynchronous spare that joined after 7 and wrote none yet: the leader's 7 (a
    # collective mode has no checkpoint every worker can load, as before)
    assert checkpoint.choose([[7], [8], []], 2, False, {}, holders) == 7
    assert checkpoint.choose([[7], [7], []], 2, True, {}, holders) is None


def test_a_resume_after_rank_0_joined_again_starts_from_the_checkpoint_of_the_rank_that_led():
    """Rank 0 was lost after checkpoint 3, rank 1 took the lead (4 names rank 0 lost), rank 0
    joined again and rank 1 kept the lead (`runtime/membership.py`): 5 names nobody lost and
    its global model is rank 1's. The resume starts from 5, its leader rank 1 — not from 4,
    as it did while the leader was taken to be the lowest rank not lost (losing the rounds
    since rank 0 joined again)."""
    per_rank, lost = [[5, 3], [5, 4, 3], [5, 4, 3]], {5: set(), 4: {0}, 3: set()}
    holders = {5: {1: 5.0}, 4: {1: 4.0}, 3: {0: 3.0}}
    assert checkpoint.reference(per_rank, True, lost, holders) == 5
    assert checkpoint.leader(5, holders) == 1
    assert all(checkpoint.choose(per_rank, r, True, lost, holders) == 5 for r in range(3))


def test_an_asynchronous_resume_starts_from_a_file_that_holds_the_global_model():
    """Asynchronous ranks number their checkpoints apart: rank 1 wrote its 5 before it took
    the lead from rank 0 (no global model), rank 0's new process (joined again, below the
    leader) wrote its own 5 naming itself lost. The resume starts from 4, rank 0's file
    written while it led, not from rank 1's 5."""
    per_rank, lost = [[5, 4], [5, 4], [5, 4]], {5: {0}, 4: set()}
    holders = {4: {0: 4.0}}
    assert checkpoint.reference(per_rank, False, lost, holders) == 4
    assert checkpoint.choose(per_rank, 0, False, lost, holders) == 5  # its own newest



def test_an_asynchronous_resume_starts_from_the_global_model_written_last_whatever_its_number():
    """Asynchronous ranks number their checkpoints apart: rank 0 led and wrote its 6 (t=60 s),
    then was lost; rank 1, whose count was behind, took the lead and wrote its 5 (t=80 s).
    The resume starts from rank 1's 5, the newer global model — not rank 0's 6, the higher
    number; where two files of one number hold one, the newer leads."""
    per_rank, lost = [[6, 5], [5, 4], [5, 4]], {6: set(), 5: {0}, 4: set()}
    holders = {6: {0: 60.0}, 5: {0: 50.0, 1: 80.0}}
    assert checkpoint.reference(per_rank, False, lost, holders) == 5
    assert checkpoint.leader(5, holders) == 1
    assert checkpoint.choose(per_rank, 0, False, lost, holders) == 5  # (lost at 5: restarted)
    assert checkpoint.choose(per_rank, 2, False, lost, holders) == 5  # (its own newest)

def test_a_lost_rank_resumes_from_rank_0s_checkpoint_with_its_own_data_position(tmp_path):
    def write(rank, index, **extra):
        checkpoint.Checkpointer(tmp_path, rank, start=index - 1).write(
            {"round": 10 * index, "recorded_round": 10 * index, "optimizer": {"state": {}},
             "mode": {"round": 10 * index}, "data": {"epoch": index, "batch": rank},
             "loop": {"t": float(index)}, **extra})

    write(1, 1)
    write(0, 3, lost=[1], **{"global": {"w": torch.ones(2)}})
    write(2, 3, lost=[1])
    assert checkpoint.survey(tmp_path, 0) == {3: {"lost": [1], "global": True, "t": 3.0}}
    assert checkpoint.resumable(tmp_path, 3, collective=True)
    state = checkpoint.for_restarted_rank(tmp_path, 3, 1, leader=0, own_newest=1)
    assert (state["round"], state["mode"], state["loop"]) == (30, {"round": 30}, {"t": 3.0})
    assert state["data"] == {"epoch": 1, "batch": 1}  # its own shard's position
    assert state["optimizer"] is None and "global" not in state and state["rank"] == 1
    fresh = checkpoint.for_restarted_rank(tmp_path, 3, 1, leader=0, own_newest=None)
    assert fresh["data"] == {"epoch": 0, "batch": 0}
    # its records before the checkpoint (t 3.0) stand: it draws on after them; a record
    # after it (an attempt since, e.g. a resume that failed) does not
    records = [{"round": 40, "t_end": 2.0, "drawn": [[0, 5, 9]]},
               {"round": 41, "t_end": 2.5, "drawn": [[0, 9, 12]]},
               {"round": 31, "t_end": 3.5, "drawn": [[0, 12, 20]]}]
    state = checkpoint.for_restarted_rank(tmp_path, 3, 1, leader=0, own_newest=1,
                                          records=records)
    assert state["data"] == {"epoch": 0, "batch": 12} and state["records_until"] == 3.0
    # rank 0 drew its shard once it was lost (runtime/shards.py), in records the resume
    # keeps: it draws on after those
    held = [{"rank": 0, "round": 42, "t_end": 2.8, "drawn": [[3, 0, 4]],
             "held": [{"shard": 1, "drawn": [[0, 12, 15]], "epoch_batches": 30}]},
            {"rank": 0, "round": 43, "t_end": 3.2, "drawn": [[3, 4, 6]],
             "held": [{"shard": 2, "drawn": [[0, 0, 17]], "epoch_batches": 30}]}]
    state = checkpoint.for_restarted_rank(tmp_path, 3, 1, leader=0, own_newest=1,
                                          records=records, held=held)
    assert state["data"] == {"epoch": 0, "batch": 15}
    assert (state["round"], state["mode"]) == (30, {"round": 30})  # the leader's count
    # asynchronous: it counts on from its own last kept round, not the leader's
    counting = checkpoint.for_restarted_rank(tmp_path, 3, 1, leader=0, own_newest=1,
                                             records=records, own_rounds=True)
    assert (counting["round"], counting["recorded_round"], counting["mode"]) == \
        (42, 41, {"round": 42})


def test_an_asynchronous_rank_whose_shard_was_drawn_on_after_its_checkpoint_goes_on_after():
    """Rank 1 checkpointed at batch 10 (round 5), drew to batch 14 (round 8) and was lost;
    rank 0 drew its shard on to batch 20 in records the resume keeps. Rank 1 keeps all its
    records, draws on from 20 and counts on from round 9; where nobody drew past its
    checkpoint, the checkpoint stands."""
    own = {"rank": 1, "round": 6, "recorded_round": 5, "mode": {"round": 6},
           "data": {"epoch": 0, "batch": 10}, "optimizer": {"state": {}}}
    records = [{"round": r, "t_end": float(r), "drawn": [[0, first, end]]}
               for r, first, end in ((5, 8, 10), (6, 10, 12), (7, 12, 13), (8, 13, 14))]
    held = [{"rank": 0, "round": 40, "drawn": [[2, 0, 9]],
             "held": [{"shard": 1, "drawn": [[0, 14, 20]], "epoch_batches": 30}]}]
    state = checkpoint.drawn_on_since(own, records, held)
    assert state["data"] == {"epoch": 0, "batch": 20} and "records_until" not in state
    assert (state["round"], state["recorded_round"], state["mode"]) == (9, 8, {"round": 9})
    assert state["optimizer"] == own["optimizer"] and state["restarted"]
    assert checkpoint.drawn_on_since(own, records, held[:0] + [
        {"rank": 0, "held": [{"shard": 2, "drawn": [[0, 0, 30]]}]}]) is own
    # Rank 1 joined again and drew on from batch 24, where rank 0 had got to; rank 0's draws
    # after its checkpoint (20 to 24) are cut by the resume. Rank 1 draws them again, and its
    # own since (its records of rounds 9 and 10 are cut), from 20: none twice, none skipped.
    again = records + [{"round": r, "t_end": float(r), "drawn": [[0, r + 15, r + 16]]}
                       for r in (9, 10)]
    state = checkpoint.drawn_on_since(own, again, held)
    assert state["data"] == {"epoch": 0, "batch": 20}
    assert (state["round"], state["recorded_round"]) == (9, 8)  # (rounds 9 and 10 are cut)
    # at an epoch's end the draws go on in the next epoch
    ended = [{"rank": 0, "held": [{"shard": 1, "drawn": [[0, 14, 30], [1, 0, 3]],
                                   "epoch_batches": 30}]}]
    assert checkpoint.drawn_on_since(own, records, ended)["data"] == {"epoch": 1, "batch": 3}


def test_resume_is_suggested_only_where_every_worker_has_a_checkpoint(tmp_path):
    led = {"global": {"w": torch.ones(1)}}  # (the leader's file holds the global model)
    for rank in (0, 1):
        checkpoint.Checkpointer(tmp_path, rank).write({"x": torch.ones(1), **(
            led if rank == 0 else {})})
    checkpoint.Checkpointer(tmp_path, 0, start=1).write({"x": torch.ones(1), **led})
    assert checkpoint.resumable(tmp_path, 2, collective=True)  # checkpoint 1, both ranks
    assert checkpoint.resumable(tmp_path, 3, collective=True) is False  # rank 2 has none
    # asynchronous: rank 2 (a spare that joined late, or died early) restarts from the
    # leader's file
    assert checkpoint.resumable(tmp_path, 3, collective=False)
    (tmp_path / "checkpoints" / "000001" / "rank-0.pt").write_bytes(b"torn")
    assert checkpoint.resumable(tmp_path, 2, collective=True) is False  # no common one
    assert checkpoint.resumable(tmp_path, 2, collective=False)  # each its own newest


def test_logs_are_cut_back_to_the_checkpoint(tmp_path):
    path = tmp_path / "worker-0.jsonl"
    path.write_text("".join(json.dumps({"round": r}) + "\n" for r in range(1, 6))
                    + '{"round": 6, "tr')
    assert checkpoint.cut_jsonl(path, lambda r: r["round"] <= 3) == 3
    assert [json.loads(line)["round"] for line in path.read_text().splitlines()] == [1, 2, 3]


def test_resuming_a_directory_without_checkpoints_is_one_line(tmp_path, capsys):
    from hetsync.cli import main

    run = tmp_path / "run"
    run.mkdir()
    assert main(["launch", "--resume", str(run)]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "config.json" in err[0] and str(run) in err[0]


# ------------------------------------------------------------------ kill -9, then resume

#: the run trained on, well above chance (0.1): how far it gets in its seconds of wall time
#: depends on the machine's load (an uninterrupted 8 s run of this size: 0.78-0.82 when quiet,
#: 0.67 beside a bench on two cores)
LEARNED = 0.5

def _records(run_dir: Path, rank: int, field: str) -> list:
    return [record[field] for record in live_records(run_dir / f"worker-{rank}.jsonl")]


def _rounds(run_dir: Path, rank: int) -> list[int]:
    return _records(run_dir, rank, "round")


def _evals(run_dir: Path) -> list[dict]:
    """The evaluations in training-time order (an evaluator may take the newest first)."""
    return sorted((json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines()),
                  key=lambda e: e["train_time"])


#: the families that go on without the killed worker by regrouping (dropping a round)
REGROUPING = {"sync", "esync", "eager-solo", "esync-outer-rank-0"}
FAMILIES = {  # mode, cluster: a collective mode, ESync (state server), eager-SGD's partial
    # all-reduce, a parameter server, one that cannot go on (torch's DDP)
    "sync": ["-m", "sync", "--workers", "3", "--slowdowns", "1,2,2"],
    "ddp": ["-m", "ddp", "--workers", "2", "--slowdowns", "1,2"],
    "esync": ["-m", "esync", "--workers", "3", "--slowdowns", "1,2,2"],
    "eager-solo": ["-m", "eager-solo", "--workers", "3", "--slowdowns", "1,2,2"],
    # rank 0 — the leader, which evaluates and decides when to stop — killed (issue 31)
    "esync-outer-rank-0": ["-m", "esync-outer", "--workers", "3", "--slowdowns", "1,2,2"],
    # (its parameter server gives the silent worker up after min(--timeout, 30) s, and the
    # run ends only then: 15, not 30)
    "async": ["-m", "async", "--workers", "2", "--slowdowns", "1,2", "--timeout", "15"],
    # a mode registered outside hetsync (tests/test_mode_registry.py): it stops, and resumes
    "plugin": ["--plugin", "test_mode_registry", "-m", "toy-every-k", "--toy-period", "3",
               "--workers", "2", "--slowdowns", "1,2"],
}
#: the families whose workers cannot go on without one: `launch` resumes the run from its
#: last checkpoint by itself (ddp), or, with --max-restarts 0, stops and is resumed (plugin)
STOPS = ("ddp", "plugin")


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_worker_killed_with_sigkill_loses_nothing_and_the_run_resumes(tmp_path, family):
    """kill -9 of rank 1 (or rank 0): a mode that goes on without it does, to its budget, on
    one accuracy curve, and the run is then resumed with it (restarted from checkpoints
    written without it, issue 31); one that cannot is resumed by launch from its last
    checkpoint, or, with --max-restarts 0, stops, suggests --resume, and resumes."""
    run = tmp_path / "run"
    mode = FAMILIES[family][1]
    victim = 0 if family.endswith("rank-0") else 1
    cmd = [sys.executable, "-m", "hetsync", "launch", "--timeout", "30", *FAMILIES[family],
           "--time-budget", "8", "--eval-interval", "0.5", "--checkpoint-every", "2",
           "-ld", str(tmp_path), "--run-name", "run", "--quiet", "--no-figures",
           # (a survivor waits the grace only where `launch` has not yet marked the rank dead)
           "--regroup-grace", "2", "--max-restarts", "0" if family == "plugin" else "1",
           "--no-rejoin"]  # (the lost worker rejoining: the test below)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).parent)] + [p for p in os.environ.get("PYTHONPATH", "").split(
            os.pathsep) if p])}  # the plugin's module
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)
    # kill the victim at a random moment once both ranks 0 and 1 wrote a checkpoint
    deadline = time.monotonic() + 120
    while (not all(any(run.glob(f"checkpoints/*/rank-{r}.pt")) for r in (0, 1))
           and proc.poll() is None and time.monotonic() < deadline):
        time.sleep(0.1)
    time.sleep(float(torch.rand(()) * 1.5))
    pid = pid_of_rank(run, victim)
    assert pid is not None, f"rank {victim} is not running"
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    if family not in STOPS:  # async: each worker talks only to the parameter server; sync,
        # esync, eager-solo: the others regroup without it (runtime/membership.py): all go on
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, out
        assert f"rank-{victim} exited with code -9; {mode} goes on without it" in out
        assert "exited with code -6" not in out, out  # no survivor aborts at its exit
        if family == "async":
            ps = [json.loads(line) for line in (run / "ps.jsonl").read_text().splitlines()]
            assert ps[-1]["lost"] == [1], (ps, out)
        else:
            assert json.loads((run / "run.json").read_text())["lost_workers"] == [victim], out
            assert json.loads((run / "summary.json").read_text())["lost_workers"] == [victim]
        survivors = [r for r in range(3) if r != victim]
        if mode.startswith("esync") or mode == "sync":
            # the survivors went on together after the victim was lost: they recorded the
            # same rounds to the end, well past its last one
            lost_at = max(_rounds(run, victim), default=0)
            ends = [_rounds(run, rank)[-5:] for rank in survivors]
            assert ends[0] == ends[1] and ends[0][0] > lost_at + 2, (ends, lost_at, out)
        elif family == "eager-solo":  # no common round: both stepped on, long after it died
            lost_at = max(_records(run, 1, "t_end"), default=0.0)
            ends = [max(_records(run, rank, "t_end")) for rank in survivors]
            assert min(ends) > lost_at + 2, (ends, lost_at, out)
        evals = _evals(run)
        times = [e["train_time"] for e in evals]
        # one curve to the budget: the leader's, then its successor's (rank 0 killed)
        assert len(set(times)) == len(times) and times[-1] >= 8.0, (times, out)
        assert evals[-1]["test_acc"] >= LEARNED, (evals, out)
        summary = json.loads((run / "summary.json").read_text())
        assert summary["complete"] and summary["final_accuracy"] == pytest.approx(
            evals[-1]["test_acc"])
        lost_at = max(_rounds(run, victim), default=0)
        budget = ["--time-budget", "12"]  # then it is resumed, with the victim, 4 s further
    elif family == "ddp":  # launch resumes it from its last checkpoint by itself
        out, _ = proc.communicate(timeout=180)
        assert proc.returncode == 0, out
        assert ("rank-1 exited with code -9; resuming the run from its last checkpoint (1 of "
                "--max-restarts 1)") in out
        evals = _evals(run)
        times = [e["train_time"] for e in evals]
        assert len(set(times)) == len(times) and times[-1] >= 8.0, (times, out)
        assert evals[-1]["test_acc"] >= LEARNED, (evals, out)
        summary = json.loads((run / "summary.json").read_text())
        assert summary["complete"] and json.loads((run / "run.json").read_text())[
            "resumed_from"]["checkpoint"] >= 1
        for rank in (0, 1):  # no round recorded twice
            assert _rounds(run, rank) == sorted(set(_rounds(run, rank))), rank
        return
    else:
        out, _ = proc.communicate(timeout=60)
        stopped_in = time.monotonic() - killed
        assert proc.returncode != 0 and "rank-1 exited with code -9" in out
        assert f"hetsync launch --resume {run}" in out
        assert stopped_in < 30  # nobody waits for the dead peer past the timeout
        budget = []
    # the run directory is intact: every record line parses, the checkpoints load
    for path in run.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            json.loads(line)
    for rank in (0, 1):  # (in async modes each worker checkpoints on its own schedule)
        assert checkpoint.loadable(run, rank), f"rank {rank} has no loadable checkpoint"
    leader = 1 if victim == 0 else 0
    newest = checkpoint.loadable(run, leader)[0]
    at_checkpoint = checkpoint.load(checkpoint.file_of(run, newest, leader))["loop"]["train_time"]

    resumed = subprocess.run([sys.executable, "-m", "hetsync", "launch", "--resume", str(run),
                              *budget, "--quiet", "--no-figures"], capture_output=True,
                             text=True, timeout=180, env=env)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    evals = _evals(run)
    times = [e["train_time"] for e in evals]
    end = 12.0 if budget else 8.0
    assert len(set(times)) == len(times) and times[-1] >= end  # one curve, to the budget
    assert any(abs(t - at_checkpoint) < 1.0 for t in times)  # it went on from the checkpoint
    for rank in (0, 1):  # no round recorded twice
        assert _rounds(run, rank) == sorted(set(_rounds(run, rank))), rank
    assert evals[-1]["test_acc"] >= LEARNED
    summary = json.loads((run / "summary.json").read_text())
    assert summary["final_accuracy"] == pytest.approx(evals[-1]["test_acc"])
    assert summary["complete"]
    # the data ledger: no batch drawn twice across the kill and the resume (a regroup's
    # dropped round shows as skipped; the others skip none)
    assert summary["ledger"]["batches_twice"] == 0, summary["ledger"]
    if family not in REGROUPING:
        assert summary["ledger"]["batches_skipped"] == 0, summary["ledger"]
    if budget:  # the lost rank trained again in the resumed run
        assert _rounds(run, victim)[-1] > lost_at + 2, (_rounds(run, victim), lost_at)
        if family != "async":  # restarted in the leader's checkpoint, written without it
            restarted = json.loads((run / "run.json").read_text())["resumed_from"]["restarted"]
            assert restarted == [victim], resumed.stderr


@pytest.mark.slow
def test_a_worker_lost_during_a_regroup_is_lost_too_and_the_others_go_on(tmp_path):
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "hetsync", "launch", "-m", "esync", "--workers", "4",
           "--slowdowns", "1,2,2,2", "--time-budget", "30", "--eval-interval", "1",
           "-ld", str(tmp_path), "--run-name", "run", "--quiet", "--no-figures",
           "--timeout", "10", "--regroup-grace", "5", "--no-rejoin"]  # (the regroups alone)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).parent)] + [p for p in os.environ.get("PYTHONPATH", "").split(
            os.pathsep) if p])}  # the plugin's module
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)
    deadline = time.monotonic() + 120
    # both have recorded a round: a rank that dies before its first record died setting up,
    # and the launcher stops the run (`Cluster.lose`)
    while not all((run / f"worker-{r}.jsonl").exists() and _rounds(run, r) for r in (1, 2)):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
        time.sleep(0.1)
    pid = pid_of_rank(run, 1)
    assert pid is not None, "rank 1 is not running"
    os.kill(pid, signal.SIGKILL)
    # rank 2 dies within the regroup (around when `launch`, which looks every 0.1 s, marks
    # rank 1 dead): counted in, or not yet — either way the groups are made without it
    time.sleep(0.1)
    pid = pid_of_rank(run, 2)
    assert pid is not None, proc.communicate(timeout=60)[0]
    os.kill(pid, signal.SIGKILL)
    out, _ = proc.communicate(timeout=150)
    assert proc.returncode == 0, out
    assert json.loads((run / "run.json").read_text())["lost_workers"] == [1, 2], out
    lost = RunDir(run).read_events("lost")
    assert lost and lost[-1]["ranks"] == [1, 2] and lost[-1]["workers"] == [0, 3], lost
    ends = [_rounds(run, rank)[-3:] for rank in (0, 3)]  # on together, to the end
    assert ends[0] == ends[1] and ends[0][0] > max(_rounds(run, 2)), (ends, out)


def test_the_data_position_resumes_at_the_next_batch():
    import numpy as np

    from hetsync.data import ShardSampler

    sampler = ShardSampler(np.arange(20), batch_size=4, seed=3)
    stream = iter(sampler)
    taken = [next(stream) for _ in range(7)]  # epoch 0's 5 batches, then 2 of epoch 1
    resumed = ShardSampler(np.arange(20), batch_size=4, seed=3)
    resumed.resume_at(1, 2)
    epoch, batch = next(iter(resumed))
    expected = sampler.epoch(1)[2]
    assert epoch == 1 and batch.tolist() == expected.tolist()
    assert taken[-1][1].tolist() == sampler.epoch(1)[1].tolist()


@pytest.mark.slow
def test_torchrun_max_restarts_rejoins_from_the_last_checkpoint(tmp_path):
    """A worker killed under `torchrun --max-restarts 1`: torchrun restarts the group, which
    finds its run directory's checkpoints and resumes; the run ends well, on one curve."""
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--max-restarts", "1", "--standalone", "-m", "hetsync", "worker", "-m", "sync",
           "--workers", "2", "--slowdowns", "1,2", "--time-budget", "6",
           "--eval-interval", "0.5", "--checkpoint-every", "2", "-ld", str(tmp_path),
           "--run-name", "run", "--no-figures", "--timeout", "30"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.monotonic() + 120
    while (not all(any(run.glob(f"checkpoints/*/rank-{r}.pt")) for r in (0, 1))
           and proc.poll() is None and time.monotonic() < deadline):
        time.sleep(0.1)
    pid = pid_of_rank(tmp_path, 1)
    assert pid is not None, "rank 1 is not running"
    os.kill(pid, signal.SIGKILL)
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, out[-3000:]
    assert "torchrun restart 1: resuming" in out
    resumed, = RunDir(run).read_events("resumed")
    assert resumed["round"] > 0 and resumed["train_time"] > 0, resumed
    evals = _evals(run)
    times = [e["train_time"] for e in evals]
    assert len(set(times)) == len(times) and times[-1] >= 6.0
    assert evals[-1]["test_acc"] >= LEARNED


def test_a_resumed_run_keeps_what_its_checkpoints_depend_on(tmp_path, capsys):
    from hetsync.cli import main
    from hetsync.config import Config

    run = tmp_path / "run"
    run.mkdir()
    Config(mode="sync", workers=2, slowdowns=(1.0, 1.0)).save(run / "config.json")
    assert main(["launch", "--resume", str(run), "-m", "esync"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "mode 'esync' differs from the run's 'sync'" in err[0]


def test_a_resumed_run_refuses_a_changed_mode_option_it_would_not_apply(tmp_path, capsys):
    from hetsync.cli import main
    from hetsync.config import Config

    run = tmp_path / "run"
    run.mkdir()
    Config(mode="esync-outer", workers=2, slowdowns=(1.0, 2.0),
           options={"global_lr": 0.7}).save(run / "config.json")
    assert main(["launch", "--resume", str(run), "-gl", "0.3"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--global-lr 0.3 differs from the run's 0.7" in err[0], err


def _kill_rank_1_then_the_leader(tmp_path, leader_dies) -> tuple[Path, str]:
    """esync-outer, 3 workers, into tmp_path/run: kill -9 of rank 1 once it has recorded a
    round (past the start, where a loss ends the run), then of rank 0 (the leader) once
    `leader_dies(events)`; the run's directory and output (launch must exit 0)."""
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "hetsync", "launch", "-m", "esync-outer", "--workers", "3",
         "--slowdowns", "1,2,2", "--timeout", "30", "--time-budget", "30",
         "--eval-interval", "0.5", "--regroup-grace", "2", "-ld", str(tmp_path),
         "--run-name", "run", "--quiet", "--no-figures"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    events = RunDir(run)
    for victim, after in ((1, lambda: True), (0, lambda: leader_dies(events))):
        while not (run / "worker-1.jsonl").exists() or not _rounds(run, 1) or not after():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
            time.sleep(0.02)
        pid = pid_of_rank(run, victim)
        assert pid is not None, f"rank {victim} is not running"
        os.kill(pid, signal.SIGKILL)
    out, _ = proc.communicate(timeout=150)
    assert proc.returncode == 0, out
    return run, out


def _each_joined_again_on_one_curve(run: Path, out: str, learned: bool = True) -> None:
    """Ranks 1 and 0 were lost and joined again: planned for by the state server to the
    end, on one accuracy curve (`learned`: that reaches LEARNED), with no batch drawn twice
    or skipped."""
    info = json.loads((run / "run.json").read_text())
    assert sorted(info["joined_workers"]) == [0, 1] and "lost_workers" not in info, info
    # the state server's last run planned for all three, to the end
    plan = json.loads((run / "service.json").read_text())
    assert plan["lost"] == [] and min(plan["last_round"].values()) >= _rounds(run, 2)[-1] - 2
    ends = [_rounds(run, rank)[-3:] for rank in range(3)]
    assert ends[0] == ends[1] == ends[2], ends
    evals = _evals(run)
    times = [e["train_time"] for e in evals]
    assert len(set(times)) == len(times) and times[-1] >= 30.0, times  # one curve
    summary = json.loads((run / "summary.json").read_text())
    assert summary["complete"] and (not learned or evals[-1]["test_acc"] >= LEARNED)
    assert sorted(summary["joined_workers"]) == [0, 1] and "lost and joined again" in out
    assert summary["ledger"]["batches_twice"] == summary["ledger"]["batches_skipped"] == 0, \
        summary["ledger"]


@pytest.mark.slow
def test_a_lost_worker_is_started_again_and_joins_the_running_job(tmp_path):
    """esync-outer, 3 workers: kill -9 of rank 1, then, once it is back, of rank 0 (the
    leader); launch starts both again with --join, and each is admitted at a round's end
    (issue 31): in the round the leader offered it a place, in the records within two rounds
    of it, planned for by the state server to the end, on one accuracy curve, with no batch
    drawn twice or skipped (a survivor draws the round its regroup dropped again). The lead
    stays with a survivor of rank 0's loss."""
    def rank_1_is_back(events: RunDir) -> bool:
        return any(e["rank"] == 1 for e in events.read_events("joined"))

    run, out = _kill_rank_1_then_the_leader(tmp_path, rank_1_is_back)
    events = RunDir(run)
    offers = [(set(e["ranks"]), e["round"]) for e in events.read_events("offered")]
    exits = {e["process"]: e for e in events.read_events("exited")}
    for victim in (1, 0):
        assert exits[f"rank-{victim}"]["code"] == -9 and exits[f"rank-{victim}"]["rejoins"]
        joined = [e for e in events.read_events("joined") if e["rank"] == victim][-1]
        offered_at = [at for ranks, at in offers if victim in ranks][-1]
        assert offered_at <= joined["round"] <= offered_at + 2, (offered_at, joined)
        assert joined["waited_s"] < 10.0, joined  # asked → admitted: a round or two
        after = [r for r in _rounds(run, victim) if r >= offered_at]
        assert after and after[0] <= joined["round"] + 2, (after[:5], joined)
    _each_joined_again_on_one_curve(run, out)


@pytest.mark.slow
def test_a_leader_lost_while_it_admits_a_worker_leaves_one_run_that_both_join(tmp_path):
    """esync-outer, 3 workers: kill -9 of rank 1, then of rank 0 (the leader) as soon as it
    has offered rank 1 a place — the admission is cut short (the CI failure of 85fdcba: the
    survivor counted the lost twice, offered a joiner twice and died waiting on its request).
    The survivor admits as the offer agreed and regroups; the joiner whose admission was cut
    short exits and is started again; both lost ranks join the one run."""
    def rank_1_was_offered(events: RunDir) -> bool:
        return any(1 in e["ranks"] for e in events.read_events("offered"))

    run, out = _kill_rank_1_then_the_leader(tmp_path, rank_1_was_offered)
    lost = [e["ranks"] for e in RunDir(run).read_events("lost")]
    assert all(len(set(ranks)) == len(ranks) for ranks in lost), lost
    # (the admission cut short may cost the survivor gloo's connection retries, about 25 s
    # of the 30 s budget: the run then trains too little for LEARNED; 0.119 once, on a fresh
    # clone's slow tier)
    _each_joined_again_on_one_curve(run, out, learned=False)


def _launch_with_a_spare(tmp_path, mode: str, *flags: str) -> str:
    """`launch` of 3 workers (slowdowns 1, 2, 2), rank 2 a spare, into tmp_path/run; its
    output (it must exit 0)."""
    out = subprocess.run(
        [sys.executable, "-m", "hetsync", "launch", "-m", mode, "--workers", "3",
         "--slowdowns", "1,2,2", "--spare-workers", "1", "--eval-interval", "0.5", *flags,
         "-ld", str(tmp_path), "--run-name", "run", "--quiet", "--no-figures", "--no-live"],
        capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout


@pytest.mark.slow
def test_a_spare_that_was_never_part_of_the_run_joins_it(tmp_path):
    """esync-outer, 3 workers of which the last is a spare (`--spare-workers 1`): ranks 0 and
    1 start the run alone, planned for by the state server without rank 2; launch starts
    rank 2 with --join 3 s in, and it is admitted at a round's end (issue 31: a machine that
    becomes free mid-run): in the records within two rounds of the leader's offer, planned
    for to the end, on one accuracy curve, with no batch drawn twice or skipped."""
    run = tmp_path / "run"
    # (30 s: the spare's process starts 3 s in and takes 5-15 s to ask, on a busy machine)
    out = _launch_with_a_spare(tmp_path, "esync-outer", "--spare-start", "3", "--timeout",
                               "30", "--time-budget", "30")
    info = json.loads((run / "run.json").read_text())
    assert info["joined_workers"] == [2] and "absent_workers" not in info, info
    assert [r.get("spare", False) for r in info["ranks"]] == [False, False, True]
    # where the spare ran, as its process said when it joined (not known at the start)
    assert info["ranks"][2]["host"] == socket.gethostname() and info["ranks"][2]["cores"], info
    offered, = RunDir(run).read_events("offered")
    joined, = RunDir(run).read_events("joined")
    assert offered["ranks"] == [2] and joined["rank"] == 2, (offered, joined)
    offered_at, joined_at = offered["round"], joined["round"]
    assert offered_at <= joined_at <= offered_at + 2, (offered_at, joined_at)
    rounds = _rounds(run, 2)
    assert rounds[0] <= joined_at + 2 and min(_records(run, 2, "t_start")) >= 3.0
    # the first workers' rounds before it: without it (none of its records there)
    assert _rounds(run, 0)[0] < rounds[0] - 10, (_rounds(run, 0)[:3], rounds[:3])
    plan = json.loads((run / "service.json").read_text())
    assert plan["lost"] == [] and min(plan["last_round"].values()) >= rounds[-1] - 2, plan
    ends = [_rounds(run, rank)[-3:] for rank in range(3)]
    assert ends[0] == ends[1] == ends[2], ends
    times = [e["train_time"] for e in _evals(run)]
    assert len(set(times)) == len(times) and times[-1] >= 30.0, times  # one curve
    summary = json.loads((run / "summary.json").read_text())
    assert summary["complete"] and summary["final_accuracy"] >= LEARNED, summary
    assert "spare rank 2 joined" in out and "lost and joined again" not in out
    assert summary["ledger"]["batches_twice"] == summary["ledger"]["batches_skipped"] == 0, \
        summary["ledger"]
    # its shard was drawn from the start, by rank 0 (runtime/shards.py: holder(2, [0, 1]))
    # until it joined, then by itself from where rank 0 had got to
    assert summary["ledger"]["per_worker"]["2"]["drawn_by"] == [0, 2], summary["ledger"]
    records = [[json.loads(line) for line in (run / f"worker-{rank}.jsonl").read_text()
                .splitlines()] for rank in (0, 2)]
    held = [h for r in records[0] for h in r.get("held", ())]
    own = [r["drawn"] for r in records[1] if r.get("drawn")]
    epoch, _, end = held[-1]["drawn"][-1]  # (where its draws go on: an epoch may end there)
    after = [epoch + 1, 0] if end == held[-1]["epoch_batches"] else [epoch, end]
    assert held[0]["drawn"][0][:2] == [0, 0] and own[0][0][:2] == after, (held, own[:2])


@pytest.mark.slow
def test_a_spare_joins_an_asynchronous_run_on_a_link_of_its_own(tmp_path):
    """async, 3 workers of which the last is a spare: the parameter server serves ranks 0
    and 1 alone, then rank 2, started 3 s in with --join, on its own link; every push is
    counted once in the ledger, and the summary names the spare."""
    run = tmp_path / "run"
    # 25 s: the spare imports torch beside two busy workers on two cores (up to ~15 s)
    out = _launch_with_a_spare(tmp_path, "async", "--spare-start", "3", "--timeout", "30",
                               "--time-budget", "25")
    assert "started spare rank(s) 2 to join the run" in out, out
    ps = json.loads((run / "ps.jsonl").read_text().splitlines()[-1])
    assert ps["rejoined"] == [2] and ps["lost"] == [], ps
    joined, = RunDir(run).read_events("joined")
    assert joined["rank"] == 2 and joined["waited_s"] < 30.0, joined
    starts = _records(run, 2, "t_start")
    assert len(starts) > 20 and starts[0] >= 3.0 and _records(run, 0, "t_start")[0] < 3.0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["complete"] and summary["final_accuracy"] >= LEARNED, summary
    assert summary["spare_workers"] == [2] and summary["absent_workers"] == []
    spare, = [r for r in json.loads((run / "run.json").read_text())["ranks"] if r["rank"] == 2]
    assert spare["device"] == "cpu" and spare["host"] == socket.gethostname(), spare
    assert "spare rank 2 joined" in out and summary["missing_workers"] == []
    assert summary["ledger"]["batches_twice"] == summary["ledger"]["batches_skipped"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["esync-outer", "async"])
def test_a_run_whose_spare_never_joined_resumes_with_it(tmp_path, mode):
    """A spare not started before the budget ends (`--spare-start` past it): the run ends
    without it and says so, naming it absent, not lost (async: rank 0's mark keeps it out of
    the lead rule); its checkpoints name it with the lost ranks, so a resume starts every
    rank, the spare from the leader's checkpoint."""
    run = tmp_path / "run"
    out = _launch_with_a_spare(tmp_path, mode, "--spare-start", "600", "--time-budget", "5")
    assert "spare rank 2 never joined" in out and "went on without" not in out, out
    info = json.loads((run / "run.json").read_text())
    assert info["absent_workers"] == [2] and "lost_workers" not in info, info
    assert not (run / "worker-2.jsonl").exists()
    resumed = subprocess.run(
        [sys.executable, "-m", "hetsync", "launch", "--resume", str(run), "--time-budget",
         "9", "--quiet", "--no-figures", "--no-live"], capture_output=True, text=True,
        timeout=120)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    info = json.loads((run / "run.json").read_text())
    assert info["resumed_from"]["restarted"] == [2] and "absent_workers" not in info, info
    assert _records(run, 2, "t_start")[0] >= 4.0  # from the checkpoint's time on
    summary = json.loads((run / "summary.json").read_text())
    assert summary["complete"] and summary["ledger"]["batches_twice"] == 0


@pytest.mark.slow
def test_an_asynchronous_run_goes_on_without_rank_0_and_rank_1_leads(tmp_path):
    """async, 3 workers, not started again (`--no-rejoin`): kill -9 of rank 0 (which
    evaluated and proposed the stop): the parameter server loses it at once, rank 1 takes
    the lead once launch has marked it dead, and the run ends at its budget on one accuracy
    curve (issue 31); it resumes from a checkpoint written after the loss."""
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "hetsync", "launch", "-m", "async", "--workers", "3",
         "--slowdowns", "1,2,2", "--timeout", "30", "--time-budget", "10",
         "--eval-interval", "0.5", "-ld", str(tmp_path), "--run-name", "run", "--quiet",
         "--no-figures", "--no-rejoin"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # late enough that rank 0 (twice rank 1's speed) has recorded more rounds than rank 1
    # will have at its last checkpoint
    while proc.poll() is None and max(_records(run, 0, "t_end") if (
            run / "worker-0.jsonl").exists() else [0.0], default=0.0) < 6.5:
        time.sleep(0.1)
    pid = pid_of_rank(run, 0)
    assert pid is not None, "rank 0 is not running"
    os.kill(pid, signal.SIGKILL)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert "rank-0 exited with code -9; async goes on without it" in out, out
    assert [(e["rank"], e["lost"]) for e in RunDir(run).read_events("lead")] == [(1, 0)]
    ps = [json.loads(line) for line in (run / "ps.jsonl").read_text().splitlines()]
    assert ps[-1]["lost"] == [0], ps
    lost_at = max(_records(run, 0, "t_end"))
    evals = _evals(run)
    times = [e["train_time"] for e in evals]
    assert len(set(times)) == len(times) and times[-1] >= 10.0, times  # one curve, to the end
    assert sum(t > lost_at + 1.0 for t in times) >= 3, (times, lost_at)  # rank 1's evaluations
    summary = json.loads((run / "summary.json").read_text())
    assert summary["complete"] and summary["lost_workers"] == [0]
    assert summary["final_accuracy"] == pytest.approx(evals[-1]["test_acc"]) and \
        evals[-1]["test_acc"] >= LEARNED
    assert summary["ledger"]["batches_twice"] == 0, summary["ledger"]
    # its checkpoints after the loss name rank 0 lost: the run resumes from the newest
    # (rank 1's global model), rank 0 restarted in it
    before = _rounds(run, 0)
    resumed = subprocess.run(
        [sys.executable, "-m", "hetsync", "launch", "--resume", str(run), "--time-budget",
         "13", "--quiet", "--no-figures"], capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    started = json.loads((run / "run.json").read_text())["resumed_from"]
    assert started["restarted"] == [0] and started["train_time"] >= 9.0, started
    summary = json.loads((run / "summary.json").read_text())
    assert summary["complete"]
    # rank 0, restarted in rank 1's checkpoint, keeps every round it recorded before its
    # loss (their work is in the global model) and goes on numbering after them
    assert summary["ledger"]["batches_twice"] == summary["ledger"]["batches_skipped"] == 0, \
        summary["ledger"]
    after = _rounds(run, 0)
    assert after[:len(before)] == before and len(after) > len(before), (before, after)
    assert after == sorted(set(after)), after


@pytest.mark.slow
def test_a_lost_asynchronous_worker_joins_the_running_job_again(tmp_path):
    """async, 3 workers: kill -9 of rank 1, then, once it is back, of rank 0 (the leader);
    launch starts each again with --join and its new process links to the parameter server
    (`runtime/server_link.py`, issue 31): it trains on to the budget, its rounds numbered on
    from its own, drawing on where its records end (no batch twice or skipped); the lead
    changes hands once at most: rank 1 takes it, or, where rank 0's new process linked
    before rank 1 looked (launch starts it again in well under a second), rank 0 leads on;
    one accuracy curve."""
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "hetsync", "launch", "-m", "async", "--workers", "3",
         "--slowdowns", "1,2,2", "--timeout", "30", "--time-budget", "40",
         "--eval-interval", "0.5", "-ld", str(tmp_path), "--run-name", "run", "--quiet",
         "--no-figures"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 150  # (a new process starts in seconds, more when busy)
    killed_at = {}
    def back(rank: int) -> bool:
        return any(e["rank"] == rank for e in RunDir(run).read_events("joined"))

    for victim, after in ((1, None), (0, 1)):
        while (max(_records(run, victim, "t_end") if (run / f"worker-{victim}.jsonl").exists()
                   else [0.0], default=0.0) < 3.0 or after is not None and not back(after)):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
            time.sleep(0.1)
        time.sleep(1.0)
        pid = pid_of_rank(run, victim)
        assert pid is not None, f"rank {victim} is not running"
        killed_at[victim] = max(_records(run, victim, "t_end"))
        os.kill(pid, signal.SIGKILL)
    out, _ = proc.communicate(timeout=150)
    assert proc.returncode == 0, out
    events = RunDir(run)
    exits = {e["process"]: e for e in events.read_events("exited")}
    for victim in (1, 0):
        assert exits[f"rank-{victim}"]["code"] == -9 and exits[f"rank-{victim}"]["rejoins"]
        joined, = [e for e in events.read_events("joined") if e["rank"] == victim]
        assert joined["waited_s"] < 10.0, joined
        rounds = _rounds(run, victim)
        assert rounds == sorted(set(rounds)), rounds  # counted on from its own
        # it trained again after its loss (the run's clock goes on in its records)
        assert sum(t > killed_at[victim] + 1.0 for t in _records(run, victim, "t_end")) >= 5
    # one leader at a time: rank 1 took the lead from the lost rank 0 and kept it (rank 0's
    # new process did not take it back), or rank 0's new process reclaimed it first
    assert [(e["rank"], e["lost"]) for e in events.read_events("lead")] in ([(1, 0)], [(0, 0)])
    ps = [json.loads(line) for line in (run / "ps.jsonl").read_text().splitlines()]
    assert ps[-1]["lost"] == [1, 0] and ps[-1]["rejoined"] == [1, 0], ps
    evals = _evals(run)
    times = [e["train_time"] for e in evals]
    assert len(set(times)) == len(times) and times[-1] >= 40.0, times  # one curve, to the end
    summary = json.loads((run / "summary.json").read_text())
    assert summary["complete"] and summary["lost_workers"] == [], summary["lost_workers"]
    assert summary["joined_workers"] == [1, 0] and "lost and joined again" in out
    assert summary["ledger"]["batches_twice"] == summary["ledger"]["batches_skipped"] == 0, \
        summary["ledger"]
    assert evals[-1]["test_acc"] >= LEARNED
