"""summarize: figures of hand-made run directories whose values are known by construction."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from hetsync.telemetry.runlog import RunLogError, RunLogWarning, read_jsonl, read_run
from hetsync.telemetry.summarize import (
    esync_device_names,
    esync_summary,
    speedup,
    summarize,
    target_key,
    time_to_target,
    write_summary,
)

# --- a run directory known by construction ---------------------------------------------------
#
# 2 workers, 4 rounds each; round i spans [0.6 + 2i, 2.6 + 2i], so each worker's wall is 8 s.
#   rank 0 (cpu, ×1): 3 local steps × 32 = 96 samples/round; compute 1.5 s, wait 0.25 s (of
#          which query 0.05 s), comm 0.25 s; in round 4 it also evaluates 0.5 s and computes
#          only 1.0 s.  Σ compute = 5.5, Σ eval = 0.5 → ratio 5.5 / (8 − 0.5).
#   rank 1 (cuda:0, ×4): 1 local step = 32 samples/round; compute 1.75, wait 0, comm 0.25.
#          Σ compute = 7.0 → ratio 7 / 8.
# Every round sends 1000 bytes; the parameter server ends at 2000 bytes sent, the state
# server at 400: 10400 bytes over the run's 10 s wall.
# Evaluations: train_time 2, 4, 6, 7.5 (t = 2.5, 5, 7.5, 9.5) with accuracy .5, .75, .82, .80.


def worker_records(rank: int, rounds: int = 4, offset: float = 0.6, span: float = 2.0) -> list[dict]:
    out = []
    for i in range(rounds):
        t0 = offset + span * i
        if rank == 0:
            evaluating = i == rounds - 1
            rec = dict(local_steps=3, samples=96, compute_s=1.0 if evaluating else 1.5,
                       wait_s=0.25, comm_s=0.25, eval_s=0.5 if evaluating else 0.0, query_s=0.05)
        else:
            rec = dict(local_steps=1, samples=32, compute_s=1.75, wait_s=0.0, comm_s=0.25,
                       eval_s=0.0, query_s=0.0)
        out.append(dict(rank=rank, device="cpu" if rank == 0 else "cuda:0", round=i + 1,
                        t_start=t0, t_end=t0 + span, bytes_sent=1000, bytes_recv=1000,
                        loss=2.0 / (i + 1), lr=0.01, **rec))
    return out


EVALS = [
    dict(t=2.5, train_time=2.0, round=1, samples_seen=128, test_acc=0.5, test_loss=1.5),
    dict(t=5.0, train_time=4.0, round=2, samples_seen=256, test_acc=0.75, test_loss=0.9),
    dict(t=7.5, train_time=6.0, round=3, samples_seen=384, test_acc=0.82, test_loss=0.7),
    dict(t=9.5, train_time=7.5, round=4, samples_seen=512, test_acc=0.80, test_loss=0.6),
]


def write_jsonl(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def write_run(
    run_dir: Path,
    mode: str = "esync",
    workers: dict[int, list[dict]] | None = None,
    evals: list[dict] | None = None,
    ranks: list[dict] | None = None,
    slowdowns: list[float] | None = None,
    wall_s: float | None = 10.0,
    ps: list[dict] | None = None,
    service: dict | None = None,
) -> Path:
    """Write a run directory in the workers' format; defaults give the run described above."""
    run_dir.mkdir(parents=True, exist_ok=True)
    workers = workers if workers is not None else {0: worker_records(0), 1: worker_records(1)}
    slowdowns = slowdowns if slowdowns is not None else [1.0, 4.0][: len(workers)] + [1.0] * max(0, len(workers) - 2)
    if ranks is None:
        ranks = [dict(rank=r, host="cloud1", device=recs[0]["device"] if recs else "cpu",
                      slowdown=slowdowns[r] if r < len(slowdowns) else 1.0)
                 for r, recs in sorted(workers.items())]
    run = dict(run_name=run_dir.name, mode=mode,
               config=dict(mode=mode, workers=len(workers), slowdowns=slowdowns, network="mlp",
                           batch_size=32, lr=0.01, collective="ring"),
               hetsync_version="0.1.0", torch_version="2.x", start_time=1.7e9,
               world_size=len(workers), workers=len(workers), ranks=ranks,
               # (as `Mode.record` writes it: ESync's rounds end with an aggregation pass)
               mode_info={"aggregation_pass": True} if mode == "esync" else {})
    if wall_s is not None:
        run.update(end_time=1.7e9 + wall_s, wall_s=wall_s)
    (run_dir / "run.json").write_text(json.dumps(run))
    for rank, records in workers.items():
        write_jsonl(run_dir / f"worker-{rank}.jsonl", records)
    write_jsonl(run_dir / "eval.jsonl", EVALS if evals is None else evals)
    if ps is not None:
        write_jsonl(run_dir / "ps.jsonl", ps)
    if service is not None:
        (run_dir / "service.json").write_text(json.dumps(service))
    return run_dir


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return write_run(
        tmp_path / "run-esync",
        ps=[dict(t=2.0, bytes_sent=500, bytes_recv=700), dict(t=8.0, bytes_sent=2000, bytes_recv=3000)],
        service=dict(bytes_sent=400, bytes_recv=300, requests=50),
    )


# --- the figures ------------------------------------------------------------------------------

def test_throughput_and_utilisation(run_dir):
    s = summarize(run_dir)
    assert s["wall_s"] == 10.0
    assert s["samples"] == 4 * 96 + 4 * 32
    assert s["throughput"] == pytest.approx(512 / 10.0)
    limit = 384 / 5.5 + 128 / 7.0
    assert s["throughput_limit"] == pytest.approx(limit)
    assert s["utilisation"] == pytest.approx(51.2 / limit)
    assert s["rounds"] == 4
    assert s["mode"] == "esync" and s["run_name"] == "run-esync"
    assert s["workers"] == 2 and s["slowdowns"] == [1.0, 4.0] and s["lr"] == 0.01
    assert s["complete"] is True and s["missing_workers"] == []


def test_a_spare_that_joined_late_counts_in_the_throughput_limit_for_its_part_of_the_run(
        tmp_path):
    """Rank 1 a spare that took part in 2 of its rounds (4 s of the 10 s): its isolated
    throughput counts 0.4 of it; rank 0, there throughout, counts whole."""
    run = write_run(tmp_path / "spare", workers={0: worker_records(0),
                                                1: worker_records(1, rounds=2, offset=6.0)})
    info = json.loads((run / "run.json").read_text())
    info["ranks"][1]["spare"] = True
    info["joined_workers"] = [1]
    (run / "run.json").write_text(json.dumps(info))
    s = summarize(run)
    assert [w["present_fraction"] for w in s["per_worker"]] == [1.0, pytest.approx(0.4)]
    assert s["throughput_limit"] == pytest.approx(384 / 5.5 + 0.4 * 64 / 3.5)
    assert s["utilisation"] == pytest.approx((384 + 64) / 10.0 / s["throughput_limit"])


def test_evaluation_pauses_of_every_worker_are_not_training_time(run_dir):
    run = json.loads((run_dir / "run.json").read_text())
    run["paused_s"] = 2.0  # every worker stood still 2 s for rank 0's evaluations
    (run_dir / "run.json").write_text(json.dumps(run))
    s = summarize(run_dir)
    assert s["wall_s"] == 10.0 and s["paused_s"] == 2.0
    assert s["throughput"] == pytest.approx(512 / 8.0)
    assert s["traffic_Bps"] == pytest.approx(s["bytes_sent_total"] / 8.0)


def test_traffic_counts_workers_ps_and_the_modes_service(run_dir):
    s = summarize(run_dir)
    assert s["bytes_sent_workers"] == 8000
    assert s["bytes_sent_ps"] == 2000  # the last cumulative record, not the sum of records
    assert s["bytes_sent_service"] == 400
    assert s["bytes_sent_total"] == 10400
    assert s["bytes_recv_total"] == 8000 + 3000 + 300
    assert s["traffic_Bps"] == pytest.approx(1040.0)
    assert s["bytes_per_worker_round"] == pytest.approx(1000.0)
    assert s["service_requests"] == 50


def test_a_run_written_before_service_json_still_counts_its_state_server(run_dir):
    (run_dir / "service.json").rename(run_dir / "state-server.json")
    s = summarize(run_dir)
    assert s["bytes_sent_service"] == 400 and s["service_requests"] == 50


def test_slowdowns_default_to_one_per_worker(tmp_path):
    run_dir = write_run(tmp_path / "r", slowdowns=[])  # the config default: no slowdown anywhere
    run = json.loads((run_dir / "run.json").read_text())
    for entry in run["ranks"]:
        del entry["slowdown"]
    (run_dir / "run.json").write_text(json.dumps(run))
    s = summarize(run_dir)
    assert s["slowdowns"] == [1.0, 1.0] and [w["slowdown"] for w in s["per_worker"]] == [1.0, 1.0]


def test_traffic_without_servers(tmp_path):
    s = summarize(write_run(tmp_path / "r"))
    assert s["bytes_sent_total"] == 8000 and s["bytes_sent_ps"] == 0
    assert s["bytes_sent_service"] == 0
    assert s["traffic_Bps"] == pytest.approx(800.0)


def test_per_worker_figures(run_dir):
    w0, w1 = summarize(run_dir)["per_worker"]
    assert (w0["rank"], w0["host"], w0["device"], w0["slowdown"]) == (0, "cloud1", "cpu", 1.0)
    assert (w1["rank"], w1["device"], w1["slowdown"]) == (1, "cuda:0", 4.0)
    assert w0["rounds"] == 4 and w0["local_steps"] == 12 and w0["samples"] == 384
    assert w0["compute_s"] == pytest.approx(5.5) and w0["eval_s"] == pytest.approx(0.5)
    assert w0["wait_s"] == pytest.approx(1.0) and w0["comm_s"] == pytest.approx(1.0)
    assert w0["query_s"] == pytest.approx(0.2)
    assert w0["wall_s"] == pytest.approx(8.0)
    # evaluation is excluded from the worker's time
    assert w0["computing_time_ratio"] == pytest.approx(5.5 / 7.5)
    assert w0["throughput"] == pytest.approx(384 / 8.0)
    assert w0["isolated_throughput"] == pytest.approx(384 / 5.5)
    assert w1["computing_time_ratio"] == pytest.approx(7.0 / 8.0)
    assert w1["isolated_throughput"] == pytest.approx(128 / 7.0)
    assert w1["bytes_sent"] == 4000


def test_the_fields_a_mode_adds_to_its_records_are_summarised_as_their_means(tmp_path):
    # (a plugin's field, SelSync's `synced`, and a field only some rounds have)
    records = worker_records(0)
    for i, r in enumerate(records):
        r.update(pushes_refused=i, synced=int(i % 2 == 0), note="text is not summarised")
    records[0]["late"] = 3.0
    summary = summarize(write_run(tmp_path / "run", workers={0: records}))
    w0 = summary["per_worker"][0]
    assert w0["mean_pushes_refused"] == pytest.approx(1.5) and w0["mean_late"] == 3.0
    assert w0["mean_synced"] == 0.5 and summary["synced_fraction"] == 0.5
    assert "mean_note" not in w0 and "mean_loss" not in w0  # (a standard field)


def test_every_field_of_the_loops_round_record_is_a_standard_one():
    import types

    from hetsync.runtime.rounds import RoundAccount
    from hetsync.telemetry.runlog import ROUND_FIELDS

    from hetsync.algorithms.base import PhaseClock

    clock = PhaseClock()
    clock.add("wait", 0.1)
    mode = types.SimpleNamespace(comm=types.SimpleNamespace(clock=clock, device_name="cpu"),
                                 lr=0.1, round_record=lambda: {})
    rnd = RoundAccount()
    rnd.draw(0, 0)
    record = rnd.record(mode, 0, 1, 0.0, 0.0, 0)
    # (the loop adds the shards' batches per epoch, and the draws of shards held for others)
    assert set(record) | {"epoch_batches", "held"} == ROUND_FIELDS


def test_wall_time_falls_back_to_latest_record_when_run_crashed(tmp_path):
    s = summarize(write_run(tmp_path / "r", wall_s=None))
    assert s["complete"] is False
    assert s["wall_s"] == pytest.approx(9.5)  # last eval t (9.5) > last t_end (8.6)
    assert s["throughput"] == pytest.approx(512 / 9.5)


def test_time_to_target_uses_train_time_of_first_crossing(run_dir):
    s = summarize(run_dir)
    # 0.8 is first reached by the 3rd eval (train_time 6.0, t 7.5), not the 4th (exactly 0.80)
    assert s["time_to_target"] == {"0.7": 4.0, "0.8": 6.0, "0.85": None, "0.9": None}
    assert s["final_accuracy"] == pytest.approx(0.80)
    assert s["best_accuracy"] == pytest.approx(0.82)
    assert s["final_loss"] == pytest.approx(0.6)
    assert s["evaluations"] == 4


def test_time_to_target_boundary_and_custom_targets():
    evals = [dict(t=1, train_time=1.0, test_acc=0.5), dict(t=3, train_time=2.0, test_acc=0.8)]
    assert time_to_target(evals, [0.8, 0.5, 0.95]) == {"0.8": 2.0, "0.5": 1.0, "0.95": None}
    assert target_key(0.80) == "0.8" and target_key(1) == "1.0"


def test_no_evaluations(tmp_path):
    s = summarize(write_run(tmp_path / "r", evals=[]))
    assert s["time_to_target"] == {"0.7": None, "0.8": None, "0.85": None, "0.9": None}
    assert s["final_accuracy"] is None and s["best_accuracy"] is None and s["final_loss"] is None


def test_speedup_is_ratio_of_times_to_accuracy():
    def summ(tta):
        return {"time_to_target": {"0.8": tta, "0.9": None}}

    runs = {"sync": summ(60.0), "esync": summ(6.0), "async": summ(None), "dcasgd": summ(20.0)}
    assert speedup(runs) == {"sync": 1.0, "esync": 10.0, "async": None, "dcasgd": 3.0}
    assert speedup(runs, target=0.9) == {name: None for name in runs}  # baseline never reached it
    assert speedup(runs, baseline="dcasgd")["esync"] == pytest.approx(20.0 / 6.0)
    with pytest.raises(ValueError, match="baseline 'ssgd'"):
        speedup(runs, baseline="ssgd")
    with pytest.raises(ValueError, match="0.7"):
        speedup(runs, target=0.7)


def test_speedup_from_summaries(tmp_path):
    fast = summarize(write_run(tmp_path / "fast"))
    slow_evals = [dict(e, train_time=e["train_time"] * 4) for e in EVALS]
    slow = summarize(write_run(tmp_path / "slow", mode="sync", evals=slow_evals))
    assert speedup({"sync": slow, "esync": fast}) == {"sync": 1.0, "esync": pytest.approx(4.0)}


# --- ESync's schema ----------------------------------------------------------------------------

def test_esync_device_names_unique_per_host():
    ranks = [dict(rank=0, host="cloud1", device="cpu"), dict(rank=1, host="cloud1", device="cuda:0"),
             dict(rank=2, host="cloud1", device="cuda:1"), dict(rank=3, host="cloud3", device="cpu"),
             dict(rank=4, host="cloud3", device="cpu"), dict(rank=5, host="cloud3", device="cuda"),
             dict(rank=6, host="cloud3", device="gpu1")]  # the runtime's own label
    assert esync_device_names(ranks) == {
        0: ("cloud1", "cpu"), 1: ("cloud1", "gpu0"), 2: ("cloud1", "gpu1"),
        3: ("cloud3", "cpu"), 4: ("cloud3", "cpu_1"), 5: ("cloud3", "gpu0"), 6: ("cloud3", "gpu1"),
    }


def test_esync_summary_lists(run_dir):
    out = esync_summary(read_run(run_dir))
    assert set(out) == {"cloud1"} and set(out["cloud1"]) == {"cpu", "gpu0"}
    cpu, gpu = out["cloud1"]["cpu"], out["cloud1"]["gpu0"]
    assert cpu == {
        "accuracy_list": [0.5, 0.75, 0.82, 0.8],
        "num_samples_list": [96, 96, 96, 96],
        "self_iters_list": [4, 4, 4, 4],  # esync: local steps + the aggregation pass
        "elapsed_time_list": [3, 5, 7, 9],  # int(round(t_end)): t_end = 2.6, 4.6, 6.6, 8.6
        "aggregate_time_list": [0.45, 0.45, 0.45, 0.45],  # comm + wait − query, 4 dp
    }
    assert gpu["accuracy_list"] == []  # only rank 0 evaluates
    assert gpu["self_iters_list"] == [2, 2, 2, 2]
    assert gpu["aggregate_time_list"] == [0.25] * 4
    assert all(type(v) is int for v in cpu["elapsed_time_list"])


def test_esync_summary_sync_mode_counts_one_entry_per_step(tmp_path):
    out = esync_summary(read_run(write_run(tmp_path / "s", mode="sync")))
    assert out["cloud1"]["gpu0"]["self_iters_list"] == [1, 1, 1, 1]


def test_write_summary(run_dir):
    path = write_summary(run_dir, esync_json=True)
    assert path == run_dir / "summary.json"
    assert json.loads(path.read_text()) == json.loads(json.dumps(summarize(run_dir)))
    esync = json.loads((run_dir / "esync-summary.json").read_text())
    assert esync["cloud1"]["cpu"]["accuracy_list"] == [0.5, 0.75, 0.82, 0.8]
    assert not list(run_dir.glob("*.tmp"))


def test_write_summary_without_esync_and_with_nan_loss(tmp_path):
    run_dir = write_run(tmp_path / "r", evals=[dict(EVALS[0], test_loss=math.nan)])  # a diverged run
    assert "NaN" in (run_dir / "eval.jsonl").read_text()
    data = json.loads(write_summary(run_dir).read_text())  # strict JSON: NaN written as null
    assert data["final_loss"] is None
    assert not (run_dir / "esync-summary.json").exists()


# --- reading: truncation, corruption, missing files -------------------------------------------

def test_truncated_last_line_is_skipped_with_warning(run_dir):
    full = summarize(run_dir)
    for name in ("worker-1.jsonl", "eval.jsonl", "ps.jsonl"):
        with open(run_dir / name, "a") as fp:
            fp.write('{"rank": 1, "round": 5, "t_sta')
    with pytest.warns(RunLogWarning) as caught:
        assert summarize(run_dir) == full
    messages = sorted(str(w.message) for w in caught)
    assert [m.split("/")[-1].split(":")[:2] for m in messages] == [
        ["eval.jsonl", "5"], ["ps.jsonl", "3"], ["worker-1.jsonl", "5"]]


def test_corrupt_middle_line_is_an_error_naming_file_and_line(run_dir):
    lines = (run_dir / "worker-0.jsonl").read_text().splitlines()
    lines[1] = lines[1][:20]
    (run_dir / "worker-0.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(RunLogError, match=r"worker-0\.jsonl:2: corrupt record"):
        summarize(run_dir)


def test_record_lacking_a_field_is_an_error(tmp_path):
    path = tmp_path / "w.jsonl"
    path.write_text('{"round": 1}\n{"round": 2}\n')
    with pytest.raises(RunLogError, match=r"w\.jsonl:1: record lacks field\(s\) samples"):
        read_jsonl(path, ("round", "samples"))


def test_blank_lines_are_ignored(tmp_path):
    path = tmp_path / "w.jsonl"
    path.write_text('{"a": 1}\n\n{"a": 2}\n\n')
    assert read_jsonl(path) == [{"a": 1}, {"a": 2}]


def test_missing_run_json(run_dir):
    (run_dir / "run.json").unlink()
    with pytest.raises(RunLogError, match=r"run-esync has no run\.json"):
        summarize(run_dir)


def test_missing_worker_files(run_dir):
    for p in run_dir.glob("worker-*.jsonl"):
        p.unlink()
    with pytest.raises(RunLogError, match=r"run-esync has no worker-\{rank\}\.jsonl"):
        summarize(run_dir)


def test_missing_directory(tmp_path):
    with pytest.raises(RunLogError, match="does not exist"):
        summarize(tmp_path / "nope")


def test_worker_declared_but_never_wrote(tmp_path):
    run_dir = write_run(tmp_path / "r")
    run = json.loads((run_dir / "run.json").read_text())
    run["ranks"].append(dict(rank=2, host="cloud1", device="cuda:1", slowdown=1.0, role="worker"))
    run["ranks"].append(dict(rank=3, host="cloud1", device="ps", slowdown=1.0, role="parameter-server"))
    (run_dir / "run.json").write_text(json.dumps(run))
    assert summarize(run_dir)["missing_workers"] == [2]


def test_summarize_of_a_directory_that_is_no_run_says_so_in_one_line(tmp_path, capsys):
    from hetsync.cli import main

    assert main(["summarize", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has no run.json" in err and "Traceback" not in err


def test_targets_are_read_by_the_runs_figure_of_merit(tmp_path, capsys):
    from hetsync.cli import main

    accuracy_run = write_run(tmp_path / "acc")
    assert main(["summarize", str(accuracy_run), "--targets", "1.5"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--targets: invalid target 1.5; expected an accuracy in " \
        "(0, 1]" in err and "test accuracy" in err
    # a language-modelling run is judged by its loss: lower is better, 1.5 is a fine target
    loss_run = write_run(tmp_path / "loss", evals=[
        dict(t=t, train_time=t, round=r, samples_seen=0, test_acc=0.3, test_loss=v)
        for t, r, v in ((1.0, 1, 3.0), (4.0, 4, 1.6), (8.0, 8, 1.4))])
    run = json.loads((loss_run / "run.json").read_text())
    run["config"]["dataset"] = "shakespeare"
    (loss_run / "run.json").write_text(json.dumps(run))
    assert main(["summarize", str(loss_run), "--targets", "2.0", "1.5"]) == 0
    out = capsys.readouterr().out
    assert "time to loss <= 2.0: 4.0s  1.5: 8.0s" in out and "final loss 1.4000" in out
    s = json.loads((loss_run / "summary.json").read_text())
    assert s["metric"] == "test_loss" and s["best_loss"] == 1.4


def test_the_data_ledger_counts_batches_drawn_twice_skipped_and_left():
    from hetsync.telemetry.ledger import run_ledger

    clean = [{"drawn": [[0, 0, 4]], "epoch_batches": 6},
             {"drawn": [[0, 4, 6], [1, 0, 1]], "epoch_batches": 6}]
    # a resume that redrew batch 3, and a round whose batches 1-2 of epoch 1 were dropped
    faulty = [{"drawn": [[0, 0, 4]], "epoch_batches": 6},
              {"drawn": [[0, 3, 6], [1, 0, 1]], "epoch_batches": 6},
              {"drawn": [[1, 3, 4]], "epoch_batches": 6}]
    short = [{"drawn": [[0, 0, 5]], "epoch_batches": 6}, {"drawn": [[1, 0, 6]]}]
    led = run_ledger({0: clean, 1: faulty, 2: short, 3: [{"round": 1}]})
    per = led["per_worker"]
    assert per["0"] == {"epochs": 2, "batches_twice": 0, "batches_skipped": 0,
                        "batches_left_in_last_epoch": 5, "epoch_batches": 6, "drawn_by": [0]}
    assert per["1"]["batches_twice"] == 1 and per["1"]["batches_skipped"] == 2
    assert per["1"]["batches_left_in_last_epoch"] == 2
    assert per["2"]["batches_skipped"] == 1       # epoch 0's last batch, never drawn
    assert "3" not in per                         # no draws recorded (hetsync.wrap's)
    assert (led["batches_twice"], led["batches_skipped"]) == (1, 3)
