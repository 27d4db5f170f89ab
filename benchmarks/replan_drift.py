#!/usr/bin/env python3
"""Balanced batches re-planned as a device drifts, against the same run planned once: `sync`
on balanced batches, the fastest device slowed to half its speed at a chosen round
(`HETSYNC_FAULT=0:ROUND:slow`), side by side over seeds, on the virtual clock (the figures do
not depend on this machine's load; its real time does).

    .venv/bin/python benchmarks/replan_drift.py --seeds 0,1,2 --at 100 --budget 30

Prints, per run, the time to each target, the throughput and the cluster's utilisation, the
round of the re-plan and the batches it chose; then the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGETS = (0.8, 0.85)


def run(out: Path, name: str, seed: int, drift: float, args) -> dict:
    shutil.rmtree(out / name, ignore_errors=True)
    subprocess.run([str(ROOT / ".venv" / "bin" / "hetsync"), "launch", "-m", "sync",
                    "--workers", "4", "--slowdowns", "1,2,4,8", "--balanced-batches", "1",
                    "--clock", "virtual", "--step-work", str(args.step_work), "-n", "lenet",
                    "--time-budget", str(args.budget), "--epochs", "none",
                    "--eval-interval", "1", "--seed", str(seed), "--replan-drift", str(drift),
                    "-ld", str(out), "--run-name", name, "--quiet", "--no-figures",
                    "--no-live"],
                   check=True, stdout=subprocess.DEVNULL,
                   env={**os.environ, "HETSYNC_FAULT": f"0:{args.at}:slow"})
    from hetsync.telemetry.summarize import summarize

    summary = summarize(out / name, targets=TARGETS)
    events = [json.loads(line) for line in (out / name / "events.jsonl").read_text().splitlines()]
    replans = [e for e in events if e["event"] == "replan"]
    return {"tta": [summary["time_to_target"][str(t)] for t in TARGETS],
            "throughput": summary["throughput"], "utilisation": summary["utilisation"],
            "final": summary["final_accuracy"],
            "replan": (replans[0]["round"], replans[0]["batches"]) if replans else None}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--at", type=int, default=100, help="the round after which rank 0 slows")
    p.add_argument("--budget", type=float, default=30.0, help="virtual seconds")
    p.add_argument("--step-work", type=float, default=0.006,
                   help="the reference step (s per batch of 64)")
    p.add_argument("--out", default="runs/replan-drift")
    args = p.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    print(f"re-planned batches against batches planned once: commit {commit}, "
          f"{platform.node()}, virtual clock; sync, LeNet, 4 devices 1, 2, 4, 8, -b 64, "
          f"balanced; rank 0 at half speed after round {args.at}; {args.budget:g} s; seeds "
          f"{args.seeds}", flush=True)
    out = ROOT / args.out
    rows = {}
    for drift, label in ((0.2, "re-planned (--replan-drift 0.2)"), (0.0, "planned once (0)")):
        rows[label] = []
        for seed in map(int, args.seeds.split(",")):
            r = run(out, f"{'replan' if drift else 'once'}-s{seed}", seed, drift, args)
            rows[label].append(r)
            print(f"{label}, seed {seed}: to {TARGETS[0]} {r['tta'][0]}, to {TARGETS[1]} "
                  f"{r['tta'][1]}, {r['throughput']:,.0f} samples/s, utilisation "
                  f"{r['utilisation']:.2f}, final {r['final']:.4f}, re-plan {r['replan']}",
                  flush=True)

    def med(values):
        got = [v for v in values if v is not None]
        return (f"{statistics.median(got):.1f} s" + ("" if len(got) == len(values) else
                                                     f" ({len(got)} of {len(values)})")
                if got else "—")

    print(f"\n| run | to {TARGETS[0]} | to {TARGETS[1]} | samples/s | utilisation | final | "
          f"re-plan |\n|---|---:|---:|---:|---:|---:|---|")
    for label, runs in rows.items():
        plans = sorted({f"round {r['replan'][0]}: {'/'.join(map(str, r['replan'][1]))}"
                        for r in runs if r["replan"]}) or ["none"]
        print(f"| {label} | {med([r['tta'][0] for r in runs])} | "
              f"{med([r['tta'][1] for r in runs])} | "
              f"{statistics.median(r['throughput'] for r in runs):,.0f} | "
              f"{statistics.median(r['utilisation'] for r in runs):.2f} | "
              f"{statistics.median(r['final'] for r in runs):.4f} | {'; '.join(plans)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
