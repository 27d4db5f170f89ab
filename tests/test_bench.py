"""`hetsync bench` and the PyTorch baselines (real processes, gloo on loopback; no timings)."""

import dataclasses
import json
import math
import os
import threading
import time
from pathlib import Path

import pytest

from hetsync.algorithms.esync import ESync, global_update
from hetsync.bench import modes
from hetsync.bench import results as res
from hetsync.bench.lr import best_of_sweep, linear_scaling
from hetsync.comm.meter import ring_bytes
from hetsync.config import Config
from hetsync.runtime.launcher import LaunchError, launch
from hetsync.telemetry.metric import LOSS
from hetsync.telemetry.summarize import summarize

from processes import pid_of_rank

SMALL = dict(dataset="synthetic", network="mlp", workers=2, slowdowns=(1.0, 2.0),
             epochs=None, eval_interval=0.5, timeout=30.0, lr=0.1)
BENCH_FLAGS = ["--workers", "2", "--slowdowns", "1,2", "-n", "mlp", "--dataset", "synthetic",
               "--time-budget", "3", "--eval-interval", "0.5", "--targets", "0.5,0.7",
               "--speedup-at", "0.7", "--timeout", "30", "--quiet"]


def _losses(run_dir: Path, rank: int) -> list[float]:
    lines = (run_dir / f"worker-{rank}.jsonl").read_text().splitlines()
    return [json.loads(line)["loss"] for line in lines]


def _check_trained(run_dir: Path, mode: str) -> dict:
    s = summarize(run_dir)
    assert s["complete"] and s["mode"] == mode and s["missing_workers"] == []
    assert s["final_accuracy"] > 0.5  # 10 classes: chance is 0.1
    for rank in (0, 1):
        losses = _losses(run_dir, rank)
        assert sum(losses[-5:]) / 5 < 0.5 * losses[0], (rank, losses[0], losses[-5:])
    evals = [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines()]
    assert evals[0]["train_time"] == 0.0 and len(evals) >= 3
    return s


# ---------------------------------------------------------------------- pure rules
def test_linear_scaling_and_sweep_choice():
    assert linear_scaling("sync", 0.05, 4).lr == pytest.approx(0.2)
    assert linear_scaling("ddp", 0.05, 4).lr == pytest.approx(0.2)
    assert linear_scaling("sync", 0.05, 1.875).lr == pytest.approx(0.09375)  # balanced
    for mode in ("esync", "post-local-sgd", "async", "dcasgd", "local"):
        assert linear_scaling(mode, 0.05, 4).lr == 0.05
    # the table names the global rate the runs used: the default, or --global-lr's
    assert linear_scaling("diloco", 0.1, 4).how == "base, inner rate, outer 0.7"
    assert linear_scaling("diloco", 0.1, 4, global_lr=1.0).how == "base, inner rate, outer 1"
    assert linear_scaling("esync", 0.1, 4, global_lr=0.5).how == "base, local rate, global 0.5"
    assert best_of_sweep({0.05: 0.7, 0.1: 0.8, 0.2: None}).lr == 0.1
    assert best_of_sweep({0.05: 0.8, 0.1: 0.8}).lr == 0.05  # a tie: the smaller rate
    # a best at the sweep's edge is a bound: the table says so (a failed rate brackets it)
    assert "lowest tried" in best_of_sweep({0.05: 0.8, 0.1: 0.8}).how
    assert "highest tried" in best_of_sweep({0.05: 0.7, 0.1: 0.8}).how
    assert "tried:" not in best_of_sweep({0.05: 0.7, 0.1: 0.8, 0.2: None}).how
    with pytest.raises(ValueError):
        best_of_sweep({0.1: None})
    assert ring_bytes(1000, 4, 0, 4)[0] == 6000 and ring_bytes(1000, 1, 0, 4)[0] == 0


def _summary(tta: float | None, acc: float, throughput: float) -> dict:
    return {"mode": "esync", "time_to_target": {"0.8": tta}, "final_accuracy": acc,
            "samples": 1000, "throughput": throughput, "utilisation": 0.9, "traffic_Bps": 1e6}


def test_repeats_are_combined_into_medians_with_their_range():
    runs = [res.RunResult("esync", "mode", 0.2, "base", run_dir=Path(f"esync-seed{i}"),
                          summary=_summary(tta, acc, thr), seed=i)
            for i, (tta, acc, thr) in enumerate([(4.0, 0.88, 100.0), (None, 0.86, 300.0),
                                                 (6.0, 0.87, 200.0)])]
    row = res.combine(runs)
    assert row.run_dir == Path("esync-seed0") and row.error is None and len(row.repeats) == 3
    # a missed target counts as never: the median of 4, 6 and never is 6
    assert row.summary["time_to_target"]["0.8"] == 6.0
    assert row.summary["final_accuracy"] == 0.87 and row.summary["throughput"] == 200.0
    headers, cells = res.rows([row], [0.8], 0.8, train_size=500)
    cell = dict(zip(headers, cells[0]))
    assert cell["tta 0.8 (s)"] == "6.0 (4.0–6.0, 1 —)"
    assert cell["final accuracy"] == "0.8700 (0.8600–0.8800)" and cell["samples/s"] == "200"
    # two of three seeds missing the target: the median misses it too
    runs[0].summary = _summary(None, 0.88, 100.0)
    assert res.combine(runs).summary["time_to_target"]["0.8"] is None
    # a failed seed is named; the others still make the row
    runs[1] = res.RunResult("esync", "mode", 0.2, "base", error="worker 3 died", seed=1)
    row = res.combine(runs)
    assert row.error == "seed 1: worker 3 died" and row.summary["runs"] == 2
    assert res.combine(runs[:1]) is runs[0]  # one seed: the run itself


def _timed(kind: str, label: str, tta: dict, acc: float, speed: float) -> res.RunResult:
    summary = {"mode": label, "time_to_target": tta, "final_accuracy": acc,
               "throughput_limit": speed, "samples": 1000, "throughput": speed,
               "utilisation": 1.0, "traffic_Bps": None}
    return res.RunResult(label, kind, 0.1, "base", summary=summary)


def test_runs_are_read_against_the_fastest_devices_best_recipe():
    sgd = _timed("reference", "fastest-sgd", {"0.85": 10.0, "0.9": None, "0.89": 50.0},
                 0.895, 1000.0)
    nesterov = _timed("reference", "fastest-nesterov", {"0.85": 12.0, "0.9": 40.0,
                                                        "0.89": 30.0}, 0.905, 1100.0)
    cluster = _timed("mode", "esync-outer", {"0.85": 5.0, "0.9": 20.0, "0.89": 15.0},
                     0.91, 1875.0)
    slow = _timed("mode", "async", {"0.85": 20.0, "0.9": None, "0.89": None}, 0.88, 1500.0)
    rows = [cluster, slow, sgd, nesterov]
    # the end target is the best final accuracy of the device's recipes
    assert res.reference_end(rows) == ("fastest-nesterov", 0.905)
    for r in rows:  # as summarize would give it, with that target too
        r.summary["time_to_target"]["0.905"] = {"fastest-nesterov": 60.0,
                                                  "esync-outer": 24.0}.get(r.label)
    fastest = res.compare_with_fastest(rows, [0.85, 0.9], ("fastest-nesterov", 0.905))
    assert fastest.speed == 1050.0  # the median of the device's runs
    assert cluster.capacity == pytest.approx(1875 / 1050)
    assert fastest.capacity == pytest.approx((1875 + 1500) / 2 / 1050)
    # each target read against the recipe that reached it first
    assert fastest.best == {"0.85": ("fastest-sgd", 10.0), "0.9": ("fastest-nesterov", 40.0),
                            "end": ("fastest-nesterov", 60.0)}
    assert cluster.vs_fastest == {"0.85": 2.0, "0.9": 2.0, "end": 2.5}
    assert cluster.efficiency["end"] == pytest.approx(2.5 / (1875 / 1050))
    assert slow.vs_fastest["0.85"] == 0.5 and slow.vs_fastest["0.9"] is None
    assert slow.efficiency["end"] is None  # below the device's final accuracy
    headers, cells = res.rows(rows, [0.85, 0.9], 0.9, None, with_sync=False)
    cell = dict(zip(headers, cells[0]))
    assert (cell["capacity"], cell["x fastest @0.9"], cell["x fastest @end"]) == \
        ("1.79", "2.00", "2.50")
    assert "speedup vs sync @0.9" not in headers
    assert res.compare_with_fastest([cluster], [0.85], None) is None  # no reference run


def test_a_speed_up_over_seeds_carries_its_bootstrap_interval():
    # every draw of constant times gives the same speed-up
    assert res.speedup_interval([10.0] * 3, [5.0] * 3) == (2.0, 2.0)
    ref, run = [16.0, 17.0, 19.0, 18.0, 16.5], [10.0, 12.5, 11.0, 10.5, 13.0]
    lo, hi = res.speedup_interval(ref, run)
    # inside what any draw can give, and around the medians' ratio (17 / 11)
    assert 16.0 / 13.0 <= lo < 17.0 / 11.0 < hi <= 19.0 / 10.0
    assert res.speedup_interval(ref, run) == (lo, hi)  # seeded
    # a run that misses the target in most draws: never (a speed-up of 0) at the low end
    assert res.speedup_interval(ref, [10.0, None, None])[0] == 0.0
    assert res.speedup_interval([None] * 3, [10.0] * 3) == (math.inf, math.inf)

    def seeds(kind, label, times, speed):
        return res.combine([_timed(kind, label, {"0.9": t}, 0.9, speed)
                            for t in times])
    device = seeds("reference", "fastest-lookahead", [16.0, 17.0, 19.0], 1000.0)
    cluster = seeds("mode", "sync", [10.0, 12.5, 11.0], 1875.0)
    short = seeds("mode", "diloco", [9.0, 9.0], 1875.0)  # 2 seeds: no interval
    res.compare_with_fastest([cluster, short, device], [0.9], None)
    assert cluster.vs_fastest["0.9"] == pytest.approx(17.0 / 11.0)
    lo, hi = cluster.vs_fastest_interval["0.9"]
    assert lo < 17.0 / 11.0 < hi and "0.9" not in short.vs_fastest_interval
    headers, cells = res.rows([cluster, short], [0.9], 0.9, None, with_sync=False)
    assert dict(zip(headers, cells[0]))["x fastest @0.9"] == f"1.55 [{lo:.2f}–{hi:.2f}]"
    assert dict(zip(headers, cells[1]))["x fastest @0.9"] == "1.89"


@pytest.mark.parametrize("argv, flag", [
    (["--reference", "adam"], "--reference"),
    (["--oversubscribe", "2"], "--oversubscribe"),
    (["--modes", "sync,nope"], "--modes"),
    (["--baselines", "horovod"], "--baselines"),
    (["--lr-sweep", "0.1,-1"], "--lr-sweep"),
    (["--targets", "0.9,-1"], "--targets"),
    (["--horizons", "30,0"], "--horizons"),
])
def test_bad_flag_values_are_rejected_naming_the_flag(capsys, argv, flag):
    with pytest.raises(SystemExit) as exit_:
        modes.main(argv)
    assert exit_.value.code == 2 and flag in capsys.readouterr().err


@pytest.mark.parametrize("argv, flag", [  # every run's Config validated as launch's
    (["--workers", "0"], "--workers"),
    (["--workers", "4", "--slowdowns", "1,2"], "--slowdowns"),
    (["--slowdowns", "1,2", "--modes", "", "--baselines", "", "--reference", "sgd"],
     "--slowdowns"),  # one-device runs alone: still the cluster's fastest device
    (["--workers", "0", "--modes", "local", "--baselines", "", "--reference", ""], "--workers"),
    (["--epochs", "1", "--time-budget", "5"], "--epochs"),
    (["--modes", "", "--baselines", "", "--reference", ""], "--modes"),
    (["-n", "nonet"], "--network"),
    (["--targets", "1.5"], "--targets"),  # an accuracy above 1 (a loss would do for text)
    (["--balanced-batches", "1"], "--modes/--baselines: async, dcasgd, ddp, post-local-sgd "
                                  "weigh each worker's update alike"),
    (["--horizons", "30,45", "--epochs", "2"], "--horizons/--epochs"),
    (["--horizons", "30,45,30.0000001"], "--horizons: 30,45,30 names a horizon twice"),
    (["--horizons", "30,45", "--time-budget", "60"], "--horizons/--time-budget"),
    (["--modes", "esync-outer", "--baselines", "", "--spare-workers", "1"],
     "--spare-workers: the bench compares clusters whose devices all train from the start"),
])
def test_inconsistent_flags_are_rejected_naming_the_flag(tmp_path, capsys, argv, flag):
    assert modes.main(argv + ["-ld", str(tmp_path)]) == 2
    assert flag in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # nothing ran


def test_plan_gives_every_run_the_same_cluster_and_its_fair_rate(tmp_path):
    args = modes.build_parser().parse_args(["--dataset", "synthetic", "-n", "mlp",
                                            "--partition", "shared"])
    base = modes.base_config(args)
    assert base.workers == 4 and base.slowdowns == (1, 2, 4, 8) and base.time_budget == 60
    runs = {label: modes.make_run(args, base, label, linear_scaling(label, 0.05, 4))
            for label in ("local", "sync", "esync", "ddp", "post-local-sgd")}
    # a one-device mode runs alone on the cluster's fastest device, at its speed
    assert runs["local"].cfg.workers == 1 and runs["local"].cfg.slowdowns == (1.0,)
    assert runs["local"].kind == "reference"
    rows = {e.label: e for e in modes.entries(args)}
    assert "local" not in rows and rows["esync-outer"].mode == "esync-outer"
    nesterov = modes.make_run(args, base, "fastest-nesterov", rows["fastest-nesterov"].rate(
        linear_scaling("local", 0.1, 4)), mode="local", **rows["fastest-nesterov"].changes)
    # the listed rate is the effective one, lr / (1 - momentum)
    assert (nesterov.cfg.momentum, nesterov.cfg.nesterov) == (0.9, True)
    assert nesterov.cfg.lr == pytest.approx(0.01) and nesterov.cfg.slowdowns == (1.0,)
    assert rows["fastest-lookahead"].mode == "lookahead" and rows["fastest-sgd"].mode == "local"
    assert runs["sync"].cfg.lr == pytest.approx(0.2) and runs["ddp"].cfg.lr == pytest.approx(0.2)
    esync = runs["esync"].cfg.mode_options()
    assert ESync.optimizer_lr(runs["esync"].cfg.lr, esync) == 0.05
    assert global_update(ESync.defaults, esync)["global_lr"] == 1
    assert runs["post-local-sgd"].cfg.mode_options().period == 8 and runs["ddp"].kind == "baseline"
    for run in runs.values():
        assert run.cfg.time_budget == 60 and run.cfg.seed == 0 and run.cfg.network == "mlp"
        assert run.cfg.partition == "shared"
    swept = modes.make_run(args, base, "sync", best_of_sweep({0.1: 0.5}), run_name="sync-lr0.1")
    assert swept.cfg.run_name == "sync-lr0.1" and swept.cfg.lr == 0.1
    trial = modes.sweep_config(base, 60.0, tmp_path)
    # a trial is judged by its final accuracy: as long as asked, evaluated at its end only
    assert (trial.time_budget, trial.epochs, trial.eval_every, trial.eval_interval) == \
        (60.0, None, 0, 60.0)
    assert trial.log_dir == str(tmp_path / "sweep") and trial.network == base.network


def test_the_bench_builds_its_runs_from_launchs_flags():
    """Every flag of launch but the few the bench sets per run is the bench's too, and
    reaches every run as it would a launched one."""
    bench_flags = {flag for action in modes.build_parser()._actions
                   for flag in action.option_strings}
    for f in dataclasses.fields(Config):
        assert (set(f.metadata["flags"]) <= bench_flags) == (f.name not in modes.PER_RUN), f.name
    args = modes.build_parser().parse_args(["--dataset", "synthetic", "-n", "mlp", "--epochs",
                                            "2", "--momentum", "0.5", "--inject-alpha", "0.5",
                                            "--workers", "2", "-gl", "0.7"])
    base = modes.base_config(args)
    assert (base.epochs, base.time_budget, base.slowdowns) == (2.0, None, (1.0, 2.0))
    run = modes.make_run(args, base, "esync-outer", linear_scaling("esync-outer", 0.05, 2))
    assert (run.cfg.momentum, run.cfg.inject_alpha, run.cfg.workers) == (0.5, 0.5, 2)
    assert run.cfg.mode_options().global_lr == 0.7 and run.cfg.evaluator
    recipes = [e for e in modes.entries(args) if e.label.startswith(modes.REFERENCE_PREFIX)]
    for e in recipes:  # the fastest device's recipes keep their own momentum
        cfg = modes.make_run(args, base, e.label, e.rate(linear_scaling(e.mode, 0.05, 1)),
                             mode=e.mode, **e.changes).cfg
        assert cfg.momentum == (0.9 if e.label == "fastest-nesterov" else 0.0), e.label
    text = modes.base_config(modes.build_parser().parse_args(["--dataset", "shakespeare"]))
    assert (text.network, text.optimizer, text.lr) == ("gpt-char", "adamw", 0.003)  # launch's


# ---------------------------------------------------------------------- real processes
@pytest.mark.slow
def test_post_local_sgd_baseline_trains_and_writes_a_run_directory(tmp_path):
    cfg = Config(mode="post-local-sgd", log_dir=str(tmp_path), time_budget=3.0,
                 options={"period": 4, "warmup_steps": 3}, **SMALL)
    run_dir = launch(cfg, show_progress=False, figures=False, stream=open(os.devnull, "w"))
    s = _check_trained(run_dir, "post-local-sgd")
    records = [json.loads(line) for line in (run_dir / "worker-1.jsonl").read_text().splitlines()]
    assert [r["local_steps"] for r in records[:4]] == [1, 1, 1, 1]  # warm-up, then averaging
    assert all(r["local_steps"] == 4 for r in records[4:])
    assert s["per_worker"][0]["local_steps"] == s["per_worker"][1]["local_steps"]


@pytest.mark.slow
def test_a_killed_baseline_worker_stops_the_run(tmp_path):
    cfg = Config(mode="ddp", log_dir=str(tmp_path), time_budget=120.0, run_name="killed",
                 **SMALL)
    outcome = {}

    def run():
        try:
            launch(cfg, show_progress=False, figures=False, stream=open(os.devnull, "w"))
        except LaunchError as err:
            outcome["error"] = str(err)

    thread = threading.Thread(target=run)
    thread.start()
    run_dir, deadline = tmp_path / "killed", time.monotonic() + 60
    while not (run_dir / "worker-1.jsonl").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    pid = pid_of_rank(run_dir, 1)
    assert pid is not None
    os.kill(pid, 9)
    thread.join(timeout=30)
    assert not thread.is_alive(), "the run did not stop after a worker died"
    assert "rank-1" in outcome.get("error", "")
    assert pid_of_rank(run_dir, 0) is None


@pytest.mark.slow
def test_bench_runs_modes_and_a_baseline_and_writes_table_json_figures(tmp_path, capsys):
    # on the virtual clock: what the table says of the runs, not how fast this machine was
    results = tmp_path / "results"
    code = modes.main(BENCH_FLAGS + ["--modes", "sync,esync", "--baselines", "ddp",
                                     "--reference", "sgd", "--clock", "virtual",
                                     "--step-work", "0.01",
                                     "--name", "t", "-ld", str(tmp_path / "runs"),
                                     "--results-dir", str(results)])
    out = capsys.readouterr().out
    assert code == 0, out
    doc = json.loads((results / "bench-t.json").read_text())
    runs = {r["label"]: r for r in doc["runs"]}
    assert list(runs) == ["sync", "esync", "ddp", "fastest-sgd"]
    assert runs["sync"]["lr"] == pytest.approx(0.1) and runs["esync"]["lr"] == 0.05
    _check_trained(Path(runs["ddp"]["run_dir"]), "ddp")  # the DDP baseline trained
    sync_tta = runs["sync"]["summary"]["time_to_target"]["0.7"]
    assert sync_tta is not None
    for r in runs.values():
        tta = r["summary"]["time_to_target"]["0.7"]
        expected = None if tta is None else sync_tta / tta
        assert r["speedup_vs_sync"]["0.7"] == pytest.approx(expected)
    # every run got the same speeds (one step time for all)
    scale = doc["runs"][0]["summary"]["speed_scale"]
    for r in runs.values():
        assert r["summary"]["speed_scale"] == scale and r["summary"]["step_work"] > 0
    fastest = runs["fastest-sgd"]["summary"]
    assert fastest["workers"] == 1 and fastest["slowdowns"] == [1.0]
    assert fastest["per_worker"][0]["slowdown"] == pytest.approx(scale)  # the fastest device
    speed = fastest["throughput_limit"]
    for r in runs.values():  # capacity: measured speeds over the device's own
        assert r["capacity"] == pytest.approx(r["summary"]["throughput_limit"] / speed)
        ref_tta = fastest["time_to_target"]["0.7"]
        tta = r["summary"]["time_to_target"]["0.7"]
        expected = ref_tta / tta if ref_tta and tta else None
        assert r["vs_fastest"]["0.7"] == pytest.approx(expected)
    assert doc["fastest_device"]["end_label"] == "fastest-sgd"
    table = (results / "bench-t.md").read_text()
    assert "x fastest @end" in table and "capacity" in table
    assert "speedup vs sync @0.7" in table and "| ddp |" in table and "hetsync bench" in table
    for png in ("accuracy.png", "throughput.png", "speedup.png", "timeline-ddp.png"):
        assert (results / "bench-t" / png).stat().st_size > 0, png
    assert "speedup vs sync" in out


@pytest.mark.slow
def test_each_row_runs_at_each_horizon_and_the_fastest_is_read_at_its_best(tmp_path):
    results = tmp_path / "results"
    flags = [f for f in BENCH_FLAGS if f not in ("--time-budget", "3")]
    code = modes.main(flags + ["--modes", "sync,esync", "--baselines", "ddp", "--reference",
                               "sgd", "--horizons", "2,4", "--name", "h",
                               "-ld", str(tmp_path / "runs"), "--results-dir", str(results)])
    assert code == 0
    doc = json.loads((results / "bench-h.json").read_text())
    runs = {r["label"]: r for r in doc["runs"]}
    assert list(runs) == [f"{row}@{t}s" for row in ("sync", "esync", "ddp", "fastest-sgd")
                          for t in (2, 4)]
    for label, r in runs.items():  # read against the sync run of its own horizon
        sync = runs["sync@" + label.split("@")[1]]["summary"]["time_to_target"]["0.7"]
        tta = r["summary"]["time_to_target"]["0.7"]
        assert r["speedup_vs_sync"]["0.7"] == pytest.approx(sync / tta if sync and tta
                                                            else None), label
    for label, r in runs.items():  # trained as long as its horizon, its rate kept
        config = json.loads((Path(r["run_dir"]) / "config.json").read_text())
        assert config["time_budget"] == float(label.split("@")[1].rstrip("s"))
        assert r["lr"] == runs[label.split("@")[0] + "@2s"]["lr"]
        evals = (Path(r["run_dir"]) / "eval.jsonl").read_text().splitlines()
        # (the evaluator writes the snapshots it skipped after the final model)
        assert max(json.loads(e)["train_time"] for e in evals) == pytest.approx(
            config["time_budget"], abs=1.0)
    # the fastest device's best recipe at each target: the best of its recipes at each horizon
    for key, (label, tta) in doc["fastest_device"]["best"].items():
        if key == "end":
            continue
        reached = {k: r["summary"]["time_to_target"][key] for k, r in runs.items()
                   if k.startswith("fastest-") and r["summary"]["time_to_target"][key]}
        assert (label, tta) == min(reached.items(), key=lambda item: item[1])
    table = (results / "bench-h.md").read_text()
    assert "LABEL@Ts = the row trained T s" in table and "same horizon" in table
    assert "ddp@2s = " in table and not (results / "bench-h" / "speedup.png").exists()


@pytest.mark.slow
def test_bench_repeats_each_run_with_the_next_seeds(tmp_path):
    results = tmp_path / "results"
    code = modes.main(BENCH_FLAGS + ["--modes", "local", "--baselines", "", "--reference", "",
                                     "--repeats", "2",
                                     "--seed", "3", "--name", "r", "-ld", str(tmp_path / "runs"),
                                     "--results-dir", str(results)])
    assert code == 0
    first = json.loads((results / "bench-r.json").read_text())
    (run,), run_command = first["runs"], first["command"]
    seeds = {r["seed"]: r for r in run["repeats"]}
    assert list(seeds) == [3, 4]
    for seed, r in seeds.items():
        assert Path(r["run_dir"]).name == f"local-seed{seed}"
        assert json.loads((Path(r["run_dir"]) / "config.json").read_text())["seed"] == seed
    losses = [_losses(Path(r["run_dir"]), 0) for r in seeds.values()]
    assert losses[0] != losses[1]  # another seed, another run
    # the row is the median (here the mean) of the two seeds, and shows their range
    assert run["summary"]["runs"] == 2
    for key in ("final_accuracy", "throughput"):
        each = [r["summary"][key] for r in seeds.values()]
        assert run["summary"][key] == pytest.approx(sum(each) / 2), key
    accs = [r["summary"]["final_accuracy"] for r in seeds.values()]
    assert f"{min(accs):.4f}–{max(accs):.4f}" in (results / "bench-r.md").read_text()
    # the table again at other targets, from the same runs: nothing runs, the times are the
    # runs' own at those targets
    before = sorted(p.name for p in (tmp_path / "runs" / "bench-r").iterdir())
    assert modes.main(["--report", "r", "--targets", "0.3,0.5", "--results-dir",
                       str(results)]) == 0
    again = json.loads((results / "bench-r.json").read_text())
    (row,) = again["runs"]
    assert again["targets"] == [0.3, 0.5] and again["command"] == run_command
    for r in row["repeats"]:
        assert r["summary"]["time_to_target"]["0.5"] == summarize(
            Path(r["run_dir"]), (0.5,))["time_to_target"]["0.5"]
    assert "tta 0.3 (s)" in (results / "bench-r.md").read_text()
    assert sorted(p.name for p in (tmp_path / "runs" / "bench-r").iterdir()) == before
    assert modes.main(["--report", "nope", "--results-dir", str(results)]) == 2


@pytest.mark.slow
def test_a_bench_at_another_link_takes_the_same_virtual_runs_instead_of_running_them(
        tmp_path, capsys):
    """The fastest device's runs cross no link: a bench at 100 Mbit/s takes them from one at
    10 Gbit/s (--reuse), and runs its cluster's rows, which the link changes."""
    flags = [f for f in BENCH_FLAGS if f not in ("--quiet",)] + [
        "--clock", "virtual", "--step-work", "0.01", "--modes", "sync", "--baselines", "",
        "--reference", "sgd", "-ld", str(tmp_path / "runs")]
    assert modes.main(flags + ["--name", "fast", "--link-bandwidth", "10gbit",
                               "--results-dir", str(tmp_path / "results")]) == 0
    assert (tmp_path / "results" / "bench-fast.json").is_file()  # kept where asked
    capsys.readouterr()
    fast = tmp_path / "runs" / "bench-fast"
    assert modes.main(flags + ["--name", "slow", "--link-bandwidth", "100mbit",
                               "--reuse", str(fast)]) == 0
    out = capsys.readouterr().out
    slow = tmp_path / "runs" / "bench-slow"
    assert f"fastest-sgd: the same virtual run as {fast / 'fastest-sgd'}, taken" in out
    assert "sync: the same virtual run" not in out  # its sums cross the slower link
    # not asked to keep them: the table, JSON and figures lie beside the runs
    assert (tmp_path / "runs" / "bench-slow.md").is_file()
    assert (tmp_path / "runs" / "bench-slow" / "accuracy.png").is_file()
    for name in ("eval.jsonl", "worker-0.jsonl"):
        assert (slow / "fastest-sgd" / name).read_bytes() == \
            (fast / "fastest-sgd" / name).read_bytes()
    rounds = [len((d / "sync" / "worker-0.jsonl").read_text().splitlines()) for d in (fast, slow)]
    assert rounds[1] < rounds[0]  # fewer steps in the same virtual time behind a slow link
    with pytest.raises(SystemExit):
        modes.main(flags + ["--name", "x", "--reuse", str(tmp_path / "nowhere")])
    err = capsys.readouterr().err.strip().splitlines()
    assert "--reuse" in err[-1] and "nowhere: not a directory" in err[-1]


def test_a_failed_runs_note_ends_with_the_exception_its_log_ends_with():
    error = ("seed 2: rank-0 exited with code 1; the others were stopped. Its log (r.log) ends "
             "with:\n  File \"x.py\", line 3\nImportError: cannot import name 'X'\n"
             "To continue from its last checkpoint: hetsync launch --resume runs/r")
    assert modes.in_one_line(error).endswith("ends with: ImportError: cannot import name 'X'")
    assert modes.in_one_line("seed 0: no accuracy\nmore") == "seed 0: no accuracy"


def test_a_loss_sweep_and_the_fastest_devices_end_take_the_lowest_loss():
    assert best_of_sweep({0.001: 2.1, 0.003: 1.9, 0.01: None}, higher_is_better=False).lr == 0.003
    refs = [res.RunResult(f"fastest-{name}", "reference", 0.003, "base",
                          summary={"final_loss": loss, "final_accuracy": 0.5})
            for name, loss in (("adamw", 1.8), ("lookahead", 1.9))]
    assert res.reference_end(refs, LOSS) == ("fastest-adamw", 1.8)
    assert res.reference_end(refs) == ("fastest-adamw", 0.5)  # (accuracy: the highest)


def test_adamw_takes_the_square_root_rule_where_sgd_takes_the_linear_one():
    assert linear_scaling("sync", 0.003, 4, "adamw").lr == pytest.approx(0.006)
    assert linear_scaling("sync", 0.05, 4).lr == pytest.approx(0.2)
    assert linear_scaling("esync-outer", 0.003, 4, "adamw").lr == 0.003
