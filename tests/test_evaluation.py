"""Deferred evaluation: rank 0's snapshots on disk, evaluated in order or newest first, by rank 0
after training or by the evaluator process while the run goes on."""

import dataclasses
import json
import os
import subprocess
import sys
import time

import pytest
import torch

from hetsync.config import Config
from hetsync.data import load_dataset
from hetsync.models import build_model
from hetsync.runtime import evaluation
from hetsync.telemetry.recorder import write_json_atomic


def _state(value: float) -> dict:
    return {"w": torch.full((2,), value)}


def test_snapshots_are_numbered_on_disk_and_those_after_a_resumed_checkpoint_dropped(tmp_path):
    writer = evaluation.SnapshotWriter(tmp_path)
    for t in (1.0, 2.0, 3.0):
        writer.put({"train_time": t, "round": int(t)}, _state(t))
    writer.close()
    assert [p.name for p in evaluation.pending(tmp_path)] == ["000001.pt", "000002.pt",
                                                             "000003.pt"]
    evaluation.drop_after(tmp_path, 2.0)  # resumed at 2.0 s: the 3.0 s one is lost work
    stamps = [evaluation.load_snapshot(p)[0]["train_time"] for p in evaluation.pending(tmp_path)]
    assert stamps == [1.0, 2.0]
    writer = evaluation.SnapshotWriter(tmp_path)  # a resumed run numbers after what is there
    writer.put({"train_time": 2.5, "round": 2}, _state(2.5))
    writer.close()
    assert evaluation.pending(tmp_path)[-1].name == "000003.pt"
    stamp, state = evaluation.load_snapshot(evaluation.pending(tmp_path)[-1])
    assert stamp["train_time"] == 2.5 and "taken_at" in stamp
    torch.testing.assert_close(state["w"], torch.full((2,), 2.5))


def test_a_snapshot_that_cannot_be_written_is_reported_by_the_next_call(tmp_path):
    (tmp_path / "snapshots").write_text("a file where the directory should be")
    writer = evaluation.SnapshotWriter(tmp_path)
    writer.put({"train_time": 1.0, "round": 1}, _state(1.0))
    with pytest.raises(RuntimeError, match="could not be written"):
        writer.flush()


def _tiny_run(run_dir, snapshots: int) -> tuple[torch.nn.Module, object]:
    """A run directory of a synthetic-data MLP run with `snapshots` snapshots of models that
    differ: the first its initial model, the others after more and more steps."""
    cfg = Config(dataset="synthetic", network="mlp", workers=1, log_dir=str(run_dir.parent),
                 run_name=run_dir.name)
    run_dir.mkdir()
    cfg.save(run_dir / "config.json")
    data = load_dataset("synthetic", None, seed=0)
    torch.manual_seed(0)
    model = build_model("mlp", data.input_shape, data.num_classes)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    writer = evaluation.SnapshotWriter(run_dir)
    for k in range(snapshots):
        writer.put({"t": float(k), "train_time": float(k), "round": 20 * k,
                    "samples_seen": 20 * 64 * k},
                   {n: v.clone() for n, v in model.state_dict().items()})
        for _ in range(20):
            idx = torch.randint(len(data.train), (64,))
            x, y = data.train.batch(idx)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    writer.close()
    return model, data


def test_pending_snapshots_are_evaluated_in_order_and_removed(tmp_path):
    run = tmp_path / "run"
    model, data = _tiny_run(run, 3)
    records = []
    assert evaluation.evaluate_pending(run, model, data.test, torch.device("cpu"),
                                       records.append, newest=True) == 1
    assert [r["train_time"] for r in records] == [2.0]  # the newest first, alone
    assert evaluation.evaluate_pending(run, model, data.test, torch.device("cpu"),
                                       records.append) == 2
    assert [r["train_time"] for r in records] == [2.0, 0.0, 1.0]
    # emptied, the directory stays: the run's writer may be making its next file in it
    assert not evaluation.pending(run) and (run / "snapshots").is_dir()
    evaluation.remove_if_empty(run)  # (after the run)
    assert not (run / "snapshots").exists()
    assert records[1]["test_acc"] < records[2]["test_acc"] < records[0]["test_acc"]
    assert all(r["lag_s"] >= 0 and r["round"] == 20 * r["train_time"] for r in records)


def test_the_evaluator_process_evaluates_until_the_run_ends_then_what_is_left(tmp_path):
    """`hetsync evaluate RUN_DIR --follow`: at the lowest priority, every snapshot evaluated
    once into eval.jsonl; it ends when run.json says the run has ended and none is left."""
    run = tmp_path / "run"
    _tiny_run(run, 4)
    proc = subprocess.Popen([sys.executable, "-m", "hetsync", "evaluate", str(run), "--follow"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(1.0)
    assert proc.poll() is None  # the run has not ended: it waits for more
    write_json_atomic(run / "run.json", {"run_name": "run", "end_time": time.time() + 1.0})
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert "SCHED_IDLE" in out or "nice 19" in out
    times = sorted(json.loads(line)["train_time"]
                   for line in (run / "eval.jsonl").read_text().splitlines())
    assert times == [0.0, 1.0, 2.0, 3.0] and not (run / "snapshots").exists()  # (run ended)


def test_the_evaluator_stops_following_a_run_whose_workers_fell_silent(tmp_path):
    """A run whose workers died without ending it: no evaluator waits for it forever."""
    run = tmp_path / "run"
    _tiny_run(run, 2)
    cfg = dataclasses.replace(Config.load(run / "config.json"), timeout=1.0)
    cfg.save(run / "config.json")
    (run / "worker-0.jsonl").write_text("")
    old = time.time() - 60
    os.utime(run / "worker-0.jsonl", (old, old))
    proc = subprocess.run([sys.executable, "-m", "hetsync", "evaluate", str(run), "--follow"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "the run is taken as dead" in proc.stderr
    assert len((run / "eval.jsonl").read_text().splitlines()) == 2  # what was left, evaluated
    assert not evaluation.pending(run)


def test_the_evaluator_refuses_a_directory_that_is_not_a_run(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "hetsync", "evaluate", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "has no config.json" in lines[0]


@pytest.mark.skipif(not hasattr(os, "sched_setscheduler"), reason="Linux scheduling only")
def test_lower_priority_is_the_lowest_the_system_allows():
    code = ("import os; from hetsync.runtime.evaluation import lower_priority; "
            "got = lower_priority(); print(got, os.sched_getscheduler(0) == os.SCHED_IDLE, "
            "os.nice(0))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60).stdout.split()
    assert (out[0] == "SCHED_IDLE" and out[1] == "True") or (out[:2] == ["nice", "19"]
                                                               and out[-1] == "19")


def test_the_evaluator_of_a_run_that_ended_before_it_started_does_not_wait(tmp_path):
    """A short run can end while the evaluator still imports torch: it evaluates what is
    left at once instead of waiting --timeout for workers that are done."""
    run = tmp_path / "run"
    _tiny_run(run, 2)
    write_json_atomic(run / "run.json", {"run_name": "run", "end_time": time.time() - 30})
    cfg = dataclasses.replace(Config.load(run / "config.json"), timeout=600.0)
    cfg.save(run / "config.json")
    proc = subprocess.run([sys.executable, "-m", "hetsync", "evaluate", str(run), "--follow"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "taken as dead" not in proc.stderr
    assert len((run / "eval.jsonl").read_text().splitlines()) == 2 and not evaluation.pending(run)


def test_the_evaluators_rest_between_evaluations_ends_when_the_run_does(tmp_path):
    """The evaluator rests (1/duty - 1) times an evaluation's CPU time; a run that ends
    meanwhile is not kept waiting for that rest (here at least 50 s: duty 1e-4)."""
    import threading

    run = tmp_path / "run"
    _tiny_run(run, 3)
    threads = torch.get_num_threads()
    counted = []
    follower = threading.Thread(target=lambda: counted.append(
        evaluation.follow(run, duty=1e-4)), daemon=True)
    follower.start()
    while not (run / "eval.jsonl").exists() or not (run / "eval.jsonl").read_text():
        time.sleep(0.05)   # the newest is evaluated; the rest begins
    write_json_atomic(run / "run.json", {"run_name": "run", "end_time": time.time()})
    follower.join(timeout=30)
    torch.set_num_threads(threads)
    assert not follower.is_alive() and counted == [3]
    assert not evaluation.pending(run)


def test_on_a_virtual_clock_the_evaluator_keeps_eval_jsonl_in_order(tmp_path):
    """Where the wall clock's evaluator takes the newest snapshot first (its accuracy is the
    one worth showing while the run goes on), a virtual run's evaluator evaluates every one
    in order: its eval.jsonl's lines then do not follow the machine's load."""
    import threading

    run = tmp_path / "run"
    _tiny_run(run, 3)
    cfg = dataclasses.replace(Config.load(run / "config.json"), clock="virtual")
    cfg.save(run / "config.json")
    threads = torch.get_num_threads()
    follower = threading.Thread(target=lambda: evaluation.follow(run, duty=1e-4), daemon=True)
    follower.start()
    while not (run / "eval.jsonl").exists() or not (run / "eval.jsonl").read_text():
        time.sleep(0.05)   # the first evaluated while the run goes on
    write_json_atomic(run / "run.json", {"run_name": "run", "end_time": time.time()})
    follower.join(timeout=30)
    torch.set_num_threads(threads)
    times = [json.loads(line)["train_time"]
             for line in (run / "eval.jsonl").read_text().splitlines()]
    assert not follower.is_alive() and times == [0.0, 1.0, 2.0]
