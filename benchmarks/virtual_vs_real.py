#!/usr/bin/env python3
"""The virtual clock checked against real runs: each (profile, mode, seed) run twice, side by
side — once on the wall clock (emulated devices that sleep, fitted into this machine's cores,
real gloo sums between processes that share them) and once on the virtual clock calibrated to
the same run (its fitted slowdowns, the same reference step, links priced like this
machine's in-machine sums) — and their time to each target and final accuracy printed, with
the medians over seeds and the virtual/real ratio.

    .venv/bin/python benchmarks/virtual_vs_real.py --profiles "1,2;1,1;1,2,4,8" \
        --modes sync,diloco --seeds 0,1,2 --budget 40

A virtual figure is believed only as far as this table says it matches. Its "curve gap" is
the mean distance between the two accuracy curves at equal time after the first tenth of the
budget: near a target where a curve is flat, a time to the target swings by seconds on a
tenth of a point of accuracy. Keep the machine
quiet meanwhile: the real runs are the reference.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from hetsync.bench.results import median_never

ROOT = Path(__file__).resolve().parent.parent
HETSYNC = str(ROOT / ".venv" / "bin" / "hetsync")


def tta(evals: list[dict], target: float) -> float | None:
    """The training time at which the curve first reaches `target`: read between the last
    evaluation below it and the first at or above it (linearly), so the answer does not
    move by a whole evaluation interval (at 2 s, 10-17 % of a 12-20 s time) with the grain."""
    before = None
    for e in evals:
        if e["test_acc"] >= target:
            if before is None:
                return e["train_time"]
            (a0, t0), (a1, t1) = before, (e["test_acc"], e["train_time"])
            return t0 + (target - a0) / (a1 - a0) * (t1 - t0)
        before = (e["test_acc"], e["train_time"])
    return None


def run(args, log_dir: Path, name: str, profile: str, mode: str, seed: int,
        extra: list[str]) -> dict:
    workers = len(profile.split(","))
    # (a profile of devices, `calibrated`, gives their speeds itself)
    devices = ([] if "--profile" in extra else
               ["--slowdowns", profile, "--step-work", str(args.step_work)])
    argv = [HETSYNC, "launch", "-m", mode, "--workers", str(workers), *devices,
            "--time-budget", str(args.budget),
            "--epochs", "none", "--seed", str(seed), "--eval-interval", str(args.eval_interval),
            "--no-live", "--no-figures", "--quiet", "--log-dir", str(log_dir),
            "--run-name", name, *args.launch_args.split(), *extra]
    run_dir = log_dir / name
    started = time.monotonic()
    finished = run_dir / "run.json"
    if not (finished.is_file() and json.loads(finished.read_text()).get("end_time")):
        # (a run already there, complete, is read again: an interrupted comparison goes on)
        shutil.rmtree(run_dir, ignore_errors=True)
        done = subprocess.run(argv, capture_output=True, text=True,
                              timeout=args.budget * 10 + 300)
        if done.returncode != 0:
            raise SystemExit(f"{name}: failed ({done.returncode}): "
                             f"{(done.stderr or done.stdout).strip().splitlines()[-1:]}")
    evals = sorted((json.loads(line) for line in
                    (run_dir / "eval.jsonl").read_text().splitlines()),
                   key=lambda e: e["train_time"])  # (an evaluator may take the newest first)
    config = json.loads((run_dir / "config.json").read_text())
    last = evals[-1] if evals else {"samples_seen": 0, "train_time": 0.0, "test_acc": math.nan}
    return {"evals": evals, "speed_scale": config.get("speed_scale", 1.0),
            "server_work": server_work(run_dir),
            "real_s": time.monotonic() - started, "final": last["test_acc"],
            # samples per second of training time, to the last evaluation
            "throughput": last["samples_seen"] / last["train_time"] if last["train_time"]
            else math.nan}


def server_work(run_dir: Path) -> float | None:
    """The parameter server's seconds of work per megabyte it received and sent, as its
    `ps.jsonl` measured them (None: no server, or one that did not measure)."""
    path = run_dir / "ps.jsonl"
    if not path.is_file():
        return None
    last = json.loads(path.read_text().splitlines()[-1])
    moved = last.get("bytes_sent", 0) + last.get("bytes_recv", 0)
    return last["busy_s"] / (moved / 1e6) if "busy_s" in last and moved else None


def calibrated(real_dir: Path, sync_dir: Path, link: list[str]) -> list[str]:
    """Launch flags that give a virtual run what the real runs measured, as a profile
    (`--profile`, written beside the real run) of one device per worker:

    - `sample_s`: its seconds of computing per sample (its nominal speed ÷ the share of it
      its device kept);
    - `step_s`: its host's seconds per step outside computing, evaluation, communication
      and waiting (wall − those, over its steps), and the state server's queries: the local
      update, the round's bookkeeping and records, the plan's query — what a real step
      costs around its computing, which the nominal model leaves out;
    - a link latency that makes a ring sum cost what the real sync run's slowest worker
      spent in one per round (the median; it waits for nobody), at 10 Gbit/s (no real sync
      run of the profile and seed: the profile's `link`, LATENCY and BANDWIDTH).

    What stays the model's own: who waits for whom, and what a sum costs on the links."""
    summary = json.loads((real_dir / "summary.json").read_text())
    devices = []
    for w in summary["per_worker"]:
        steps = max(int(w["local_steps"]), 1)
        outside = (w["wall_s"] - w["compute_s"] - w["eval_s"] - w["comm_s"] - w["wait_s"]
                   + (w.get("query_s") or 0.0))  # (wait_s holds the queries too)
        devices.append({"name": f"rank {w['rank']}", "sample_s": w["compute_s"] / w["samples"],
                        "step_s": max(outside, 0.0) / steps})
    latency, bandwidth = link
    if (sync_dir / "summary.json").is_file():
        sync = json.loads((sync_dir / "summary.json").read_text())
        slowest = max(sync["per_worker"], key=lambda w: w["slowdown"])["rank"]
        records = [json.loads(line) for line in
                   (sync_dir / f"worker-{slowest}.jsonl").read_text().splitlines()]
        cost = statistics.median(r["comm_s"] for r in records[2:])
        workers = len(devices)
        latency = f"{max(cost, 0.0) / (2 * (workers - 1)) if workers > 1 else 0.0:.6f}"
        bandwidth = "10gbit"
    path = real_dir.parent / f"profile-{real_dir.name}.json"
    path.write_text(json.dumps({
        "format": "hetsync-profile", "version": 1,
        "source": f"calibrated to the real run {real_dir.name} (benchmarks/virtual_vs_real.py)",
        "devices": devices}, indent=1) + "\n")
    return ["--profile", str(path), "--link-latency", latency, "--link-bandwidth", bandwidth]


def curve_gap(real: list[dict], virtual: list[dict], start: float) -> float:
    """The mean |virtual - real| test accuracy, in points, at equal training time (each
    curve linear between its evaluations) from `start` to the end of the shorter curve: where
    a curve is flat near a target, its time to that target swings by seconds on a tenth of a
    point, so this says how far the curves themselves are apart."""
    import numpy as np

    (tr, ar), (tv, av) = ([np.array([e[k] for e in c]) for k in ("train_time", "test_acc")]
                          for c in (real, virtual))
    grid = np.linspace(start, min(tr[-1], tv[-1]), 200)
    return float(np.mean(np.abs(np.interp(grid, tv, av) - np.interp(grid, tr, ar)))) * 100


def fmt(x: float | None) -> str:
    return "—" if x is None else f"{x:.1f}"


def median(xs: list[float | None]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


#: the median time to a target over the seeds, a seed that never reached it read as never,
#: as the bench reads one (None when never is the median)
median_time = median_never


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--profiles", default="1,2;1,1;1,2,4,8",
                   help="slowdown profiles, separated by ';'")
    p.add_argument("--modes", default="sync,diloco,esync-outer")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--budget", type=float, default=50.0, help="seconds of training time")
    p.add_argument("--eval-interval", type=float, default=2.0)
    p.add_argument("--step-work", type=float, default=0.006,
                   help="the reference step (s per batch of 64), the same for both clocks")
    p.add_argument("--targets", default="0.8,0.85,0.88,0.9")
    p.add_argument("--links", default="2=0.0004:4.8gbit;4=0.0011:9.2gbit",
                   help="WORKERS=LATENCY:BANDWIDTH of the virtual links by the profile's "
                        "number of devices (';'), fitted to "
                        "this machine's in-machine sums: `hetsync bench comm --world-sizes "
                        "2,4 --sizes 1e2,6.2e4,1e6 --algorithms native` on 2026-11-28 gave "
                        "2 processes 0.80 ms for 100 floats and 7.48 ms for 1e6 (α 0.4 ms, "
                        "4.8 Gbit/s), 4 processes 6.54 and 11.78 ms (α 1.1 ms, 9.2 Gbit/s: "
                        "four processes on two cores wake each other at every hop)")
    p.add_argument("--calibrate", action="store_true",
                   help="give each virtual run what its real twin's records measured instead "
                        "of the nominal model (`calibrated`): each device at the speed it ran "
                        "at (seconds of computing per sample), its host's seconds per step "
                        "around its computing, and links whose latency makes a sum cost what "
                        "the real sync run's slowest worker spent in one (it waits for nobody)")
    p.add_argument("--server-work", default="0",
                   help="the virtual parameter server's seconds of work per megabyte "
                        "(`--server-work` of launch), or `measured`: each profile's median "
                        "over its real runs of what their servers measured (ps.jsonl's "
                        "busy_s per megabyte moved)")
    p.add_argument("--real-only", action="store_true",
                   help="run the real side only, and stop: several comparisons' real runs can "
                        "then share one quiet stretch of the machine (run again without it for "
                        "the virtual side; complete runs are read back, not run again)")
    p.add_argument("--launch-args", default="", help="more flags for every launch")
    p.add_argument("--log-dir", default="runs/virtual-vs-real")
    p.add_argument("--out", default=None, help="also write the table (markdown) here")
    args = p.parse_args()
    targets = [float(t) for t in args.targets.split(",")]
    log_dir = ROOT / args.log_dir
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    head = (["profile", "mode", "seed"]
            + [f"{c} tta {t:g}" for t in targets for c in ("real", "virtual")]
            + ["real final", "virtual final", "real samples/s", "virtual samples/s",
               "virtual run real s"])
    by_workers = {int(k): v.split(":") for k, v in
                  (entry.split("=") for entry in args.links.split(";"))}
    links = {profile: by_workers[len(profile.split(","))] for profile in args.profiles.split(";")}
    cases = [(profile, mode, seed) for profile in args.profiles.split(";")
             for mode in args.modes.split(",") for seed in map(int, args.seeds.split(","))]
    tag = {c: f"{c[1]}-{c[0].replace(',', '_')}-s{c[2]}" for c in cases}
    # every real run first, on a quiet machine; the virtual runs after (their records do
    # not depend on the load, so the machine may then be busy)
    real = {c: run(args, log_dir, f"real-{tag[c]}", *c, []) for c in cases}
    if args.real_only:
        return 0
    rows, groups = [], {}
    work = {profile: (median([real[c]["server_work"] for c in cases if c[0] == profile])
                      if args.server_work == "measured" else float(args.server_work))
            for profile in args.profiles.split(";")}
    for c in cases:
        if args.calibrate:
            extra = calibrated(log_dir / f"real-{tag[c]}",
                               log_dir / f"real-sync-{c[0].replace(',', '_')}-s{c[2]}",
                               links[c[0]])
        else:
            extra = ["--speed-scale", str(real[c]["speed_scale"]),
                     "--link-latency", links[c[0]][0], "--link-bandwidth", links[c[0]][1]]
        if work[c[0]]:
            extra += ["--server-work", f"{work[c[0]]:.6f}"]
        virtual = run(args, log_dir, f"{'calibrated' if args.calibrate else 'virtual'}-{tag[c]}",
                      *c, ["--clock", "virtual", *extra])
        row = list(map(str, c))
        for t in targets:
            a, b = tta(real[c]["evals"], t), tta(virtual["evals"], t)
            row += [fmt(a), fmt(b)]
            groups.setdefault((c[0], c[1], t), []).append((a, b))
        for key in ("final", "throughput"):
            groups.setdefault((c[0], c[1], key), []).append((real[c][key], virtual[key]))
        gap = curve_gap(real[c]["evals"], virtual["evals"], 0.1 * args.budget)
        groups.setdefault((c[0], c[1], "curve gap"), []).append((None, gap))
        row += [f"{real[c]['final']:.4f}", f"{virtual['final']:.4f}",
                f"{real[c]['throughput']:,.0f}", f"{virtual['throughput']:,.0f}",
                f"{virtual['real_s']:.0f}"]
        rows.append(row)
        print(" | ".join(row), flush=True)
    lines = [f"virtual clock against real runs, commit {commit}, {time.strftime('%Y-%m-%d')}, "
             f"budget {args.budget:g} s, reference step {args.step_work * 1000:g} ms, virtual "
             f"links (latency s:bandwidth) per profile: "
             + ", ".join(f"{k} {':'.join(v)}" for k, v in links.items())
             + "; the parameter server's work (s per MB) per profile: "
             + ", ".join(f"{k} {v or 0:.4f}" for k, v in work.items()), "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    lines += ["", "| profile | mode | target | real median | virtual median | virtual ÷ real |",
              "|---|---|---|---|---|---|"]
    for (profile, mode, t), pairs in groups.items():
        if t == "curve gap":
            gaps = [y for _, y in pairs]
            lines.append(f"| {profile} | {mode} | curve gap (pt) | | "
                         f"{statistics.median(gaps):.2f} (max {max(gaps):.2f}) | |")
            continue
        middle = median if t in ("final", "throughput") else median_time
        a, b = middle([x for x, _ in pairs]), middle([y for _, y in pairs])
        ratio = f"{b / a:.2f}" if a and b else "—"
        shown = {"final": lambda x: f"{x:.4f}", "throughput": lambda x: f"{x:,.0f}"}.get(
            t, fmt)
        lines.append(f"| {profile} | {mode} | {t} | {shown(a)} | {shown(b)} | {ratio} |")
    print("\n".join(lines))
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
