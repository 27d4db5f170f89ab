#!/usr/bin/env python3
"""Clusters this machine could never emulate, on the virtual clock: each mode on a profile of
many devices, with the real time and the peak memory each simulation took.

Profiles (LeNet on Fashion-MNIST, batch 64, the reference step given so every device's speed
is stated, not measured):

- `gpus16`: 16 workers of four kinds, 4 each, at the relative speeds of ResNet-50 v1.5
  training throughput published in NVIDIA's DeepLearningExamples (PyTorch README,
  pytorch-21.03 container, one GPU): A100 80GB mixed precision 2,470 img/s, V100 16GB mixed
  precision 1,200, A100 TF32 938, V100 FP32 367 — slowdowns 1, 2.06, 2.63, 6.73;
- `esync64`: the ESync paper's kind of mix, a few fast devices among many slow ones: 4 at
  slowdown 1 and 60 at 300 (its CPU : GPU ratio up to 300 : 1).

    .venv/bin/python benchmarks/virtual_scale.py --profile esync64 \\
        --modes sync,async,esync,esync-outer --budget 60

Prints, per mode, the time to each target and the final accuracy (virtual seconds), the
speed-up over sync and over the fastest device alone (the best of its recipes on slowdown 1,
the same step: `--references`),
and the real seconds and the peak memory (the machine's used memory above what it was
before) of the simulation. Each run is deterministic: one seed says what it does.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HETSYNC = str(ROOT / ".venv" / "bin" / "hetsync")
#: the fastest device's recipes (--references)
REFERENCES = ("local", "lookahead -l 0.0375", "local --momentum 0.9 --nesterov 1 -l 0.0375")
PROFILES = {
    "gpus16": [1.0] * 4 + [2.06] * 4 + [2.63] * 4 + [6.73] * 4,
    "esync64": [1.0] * 4 + [300.0] * 60,
}


def used_mb() -> float:
    info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    kb = lambda key: float(info[key].split()[0])  # noqa: E731
    return (kb("MemTotal") - kb("MemAvailable")) / 1024


def batch_of(flags: list[str]) -> int:
    """The batch `flags` give the launch (-b/--batch-size; the last wins, as in argparse)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("-b", "--batch-size", type=int, default=64)
    return p.parse_known_args(flags)[0].batch_size


def run(args, name: str, mode: str, slowdowns: list[float], extra: str = "") -> dict:
    flags = [*args.launch_args.split(), *extra.split()]
    # --step-work is launch's work for a step of -b samples: at another -b (balanced batches on
    # this mix need -b 300) the same value would be another, faster device; every run here is
    # given the same device, 64 samples in --step-work seconds
    step_work = args.step_work * batch_of(flags) / 64
    argv = [HETSYNC, "launch", "-m", mode, "--clock", "virtual", "--workers",
            str(len(slowdowns)), "--slowdowns", ",".join(f"{s:g}" for s in slowdowns),
            "--step-work", f"{step_work:.9g}", "--time-budget", str(args.budget),
            "--epochs", "none", "--seed", str(args.seed), "--eval-interval",
            str(args.eval_interval), "--no-live", "--no-figures", "--quiet", "--log-dir",
            str(ROOT / args.log_dir), "--run-name", name, "--link-bandwidth", args.link,
            "--timeout", "600", *flags]
    base, peak, done = used_mb(), [0.0], threading.Event()

    def sample() -> None:
        while not done.wait(0.5):
            peak[0] = max(peak[0], used_mb() - base)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.monotonic()
    result = subprocess.run(argv, capture_output=True, text=True)
    real = time.monotonic() - started
    done.set()
    sampler.join()
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        return {"mode": mode, "error": " / ".join(tail), "real_s": real, "peak_mb": peak[0]}
    run_dir = ROOT / args.log_dir / name
    evals = sorted((json.loads(line) for line in
                    (run_dir / "eval.jsonl").read_text().splitlines()),
                   key=lambda e: e["train_time"])  # (an evaluator may take the newest first)
    return {"mode": mode, "evals": evals, "real_s": real, "peak_mb": peak[0],
            "final": evals[-1]["test_acc"]}


def tta(evals: list[dict], target: float) -> float | None:
    return next((e["train_time"] for e in evals if e["test_acc"] >= target), None)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--profile", choices=sorted(PROFILES), default="esync64")
    p.add_argument("--modes", default="sync,async,esync,esync-outer")
    p.add_argument("--budget", type=float, default=60.0, help="virtual seconds of training")
    p.add_argument("--eval-interval", type=float, default=5.0)
    p.add_argument("--step-work", type=float, default=0.006,
                   help="the fastest device's step on 64 samples, s (a launch given another -b "
                        "gets this device's step on its batch)")
    p.add_argument("--link", default="10gbit")
    p.add_argument("--targets", default="0.8,0.85,0.88,0.9")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--launch-args", default="", help="flags for every launch")
    p.add_argument("--mode-args", default="",
                   help="flags for the cluster's modes, not the fastest device's run (e.g. "
                        "--weighting samples)")
    p.add_argument("--references", default=";".join(REFERENCES),
                   help="the fastest device's recipes, ';'-separated 'MODE [FLAGS]'; its time "
                        "to a target is the best of them (default: plain SGD, and lookahead "
                        "and SGD with Nesterov momentum at 0.0375, its best on the 1, 2, 4, 8 "
                        "study's LeNet)")
    p.add_argument("--log-dir", default="runs/virtual-scale")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    slowdowns = PROFILES[args.profile]
    targets = [float(t) for t in args.targets.split(",")]
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    stamp = time.strftime("%m%d-%H%M")
    references = []
    for i, recipe in enumerate(r.split() for r in args.references.split(";")):
        references.append(run(args, f"{args.profile}-device{i}-{stamp}", recipe[0],
                              [min(slowdowns)], " ".join(recipe[1:])))
        references[-1]["mode"] = " ".join(recipe) + " (fastest device alone)"
    rows = list(references)
    for mode in args.modes.split(","):
        rows.append(run(args, f"{args.profile}-{mode}-{stamp}", mode, slowdowns,
                        args.mode_args))
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "evals"}), flush=True)
    capacity = sum(min(slowdowns) / s for s in slowdowns)
    sync = next((r for r in rows if r["mode"] == "sync" and "evals" in r), None)
    device_tta = {t: min((x for x in (tta(r["evals"], t) for r in references if "evals" in r)
                         if x is not None), default=None) for t in targets}
    lines = [f"{args.profile}: {len(slowdowns)} workers, slowdowns "
             f"{','.join(f'{s:g}' for s in sorted(set(slowdowns)))}, capacity {capacity:.2f} "
             f"fastest devices; LeNet, batch 64, reference step {args.step_work * 1e3:g} ms; "
             f"links {args.link}; {args.budget:g} virtual s; commit {commit}, "
             f"{time.strftime('%Y-%m-%d')}, virtual clock", "",
             "| mode | " + " | ".join(f"tta {t:g} (s)" for t in targets)
             + f" | final | x sync @{targets[-2]:g} | x fastest @{targets[-2]:g} | ideal x "
               "| efficiency | real s | peak MB |",
             "|---|" + "---|" * (len(targets) + 7)]
    at = targets[-2]
    for r in rows:
        if "evals" not in r:
            lines.append(f"| {r['mode']} | failed: {r['error'][:200]} |")
            continue
        times = [tta(r["evals"], t) for t in targets]
        mine = tta(r["evals"], at)
        x_sync = (f"{tta(sync['evals'], at) / mine:.2f}" if sync and mine
                  and tta(sync["evals"], at) else "—")
        x_fast = f"{device_tta[at] / mine:.2f}" if mine and device_tta[at] else "—"
        ideal = 1.0 if r in references else capacity
        eff = f"{float(x_fast) / ideal:.2f}" if x_fast != "—" else "—"
        lines.append(f"| {r['mode']} | "
                     + " | ".join("—" if t is None else f"{t:.1f}" for t in times)
                     + f" | {r['final']:.4f} | {x_sync} | {x_fast} | {ideal:.2f} | {eff} | "
                       f"{r['real_s']:.0f} | {r['peak_mb']:,.0f} |")
    print("\n".join(lines))
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
