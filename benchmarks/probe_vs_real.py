#!/usr/bin/env python3
"""`hetsync probe` checked against what it predicts: a profile of three emulated devices
measured under `torchrun --nproc-per-node 3`, then a real (wall-clock) run of the same devices,
and `hetsync bench comm` on the same three processes; prints each device's speed by the probe
and by the run's records, and the ring's α and β by the probe and by the bench.

    .venv/bin/python benchmarks/probe_vs_real.py --slowdowns 1,2,4 --budget 20

Keep the machine quiet: both sides are wall-clock measurements.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT / ".venv" / "bin"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--slowdowns", default="1,2,4")
    p.add_argument("--budget", type=float, default=20.0, help="the real run's seconds")
    p.add_argument("--out", default="runs/probe-vs-real")
    args = p.parse_args()
    out = ROOT / args.out
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    ranks = len(args.slowdowns.split(","))
    profile = out / "profile.json"
    subprocess.run([str(BIN / "torchrun"), "--standalone", "--nproc-per-node", str(ranks),
                    "-m", "hetsync", "probe", "--slowdowns", args.slowdowns, "-o",
                    str(profile)], check=True)
    subprocess.run([str(BIN / "hetsync"), "launch", "-m", "sync", "--workers", str(ranks),
                    "--slowdowns", args.slowdowns, "--oversubscribe", "1", "--time-budget",
                    str(args.budget), "--epochs", "none", "--no-live", "--no-figures",
                    "--eval-interval", str(args.budget),  # (one evaluation: its end)
                    "--quiet", "--log-dir", str(out), "--run-name", "real"], check=True,
                   stdout=subprocess.DEVNULL)
    sizes = json.loads(profile.read_text())
    summary = json.loads((out / "real" / "summary.json").read_text())
    print("\n| rank | slowdown | probe samples/s at 64 | run samples per compute s | "
          "run ÷ probe |\n|---|---|---|---|---|")
    for d, w in zip(sizes["devices"], summary["per_worker"]):
        probe = 64 / (d["step_s"] + 64 * d["sample_s"])
        run = w["samples"] / w["compute_s"]
        print(f"| {w['rank']} | {w['slowdown']:g} | {probe:,.0f} | {run:,.0f} | "
              f"{run / probe:.2f} |")
    comm = out / "comm.json"
    subprocess.run([str(BIN / "hetsync"), "bench", "comm", "--world-sizes", str(ranks),
                    "--sizes", "16,4194304", "--algorithms", "native", "--json", str(comm)],
                   check=True, stdout=subprocess.DEVNULL)
    from hetsync.bench.probe import fit_ring

    rows = sorted(json.loads(comm.read_text()), key=lambda r: r["bytes"])
    bench = fit_ring([r["bytes"] for r in rows], [r["latency_s"] for r in rows], ranks)
    link = sizes["link"]
    print(f"\nring link: probe α {1e6 * link['latency_s']:.0f} µs, β "
          f"{link['bandwidth_bps'] / 1e9:.2f} Gbit/s; bench comm (fitted the same way) α "
          f"{1e6 * bench.latency_s:.0f} µs, β {bench.bandwidth_bps / 1e9:.2f} Gbit/s; "
          f"probe ÷ bench: α {link['latency_s'] / bench.latency_s:.2f}, β "
          f"{link['bandwidth_bps'] / bench.bandwidth_bps:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
