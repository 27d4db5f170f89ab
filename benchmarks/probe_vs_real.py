#!/usr/bin/env python3
"""`hetsync probe` checked against what it predicts: a profile of emulated devices measured
under `torchrun --nproc-per-node P`, then a real (wall-clock) `sync` run of the same devices,
then `hetsync bench comm` on the same P processes; each device's speed by the probe and by the
run's records, and the ring's α and β by the probe and by the bench, repeat after repeat, with
the medians.

    .venv/bin/python benchmarks/probe_vs_real.py --slowdowns 2.333,4.667,9.333 --repeats 3

The run's emulated devices are the probe's: it runs on the probe's reference step
(`--step-work`, the fastest emulated device's time at the largest batch over its factor). An
emulated device is its factor × a reference step, and this machine's speed drifts by 10-20 %
from one minute to the next: a reference measured again by `launch` would make the run's
devices other devices than the probe's. Slowdowns that fit in the cores (as `launch` fits
them: 1, 2, 4 × 2.333 on two cores) keep either side from timing the oversubscription.

Keep the machine quiet: both sides are wall-clock measurements.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT / ".venv" / "bin"


def one(out: Path, slowdowns: list[float], budget: float) -> dict:
    """One repeat: the probe, the run on its reference, the comm bench; their figures."""
    from hetsync.bench.probe import fit_ring

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    ranks, text = len(slowdowns), ",".join(f"{f:g}" for f in slowdowns)
    profile = out / "profile.json"
    subprocess.run([str(BIN / "torchrun"), "--standalone", "--nproc-per-node", str(ranks),
                    "-m", "hetsync", "probe", "--slowdowns", text, "-o", str(profile)],
                   check=True, stdout=subprocess.DEVNULL)
    probed = json.loads(profile.read_text())
    at = 64  # (the run's batch, -b's default; the probe's largest by default)
    times = [d["step_s"] + at * d["sample_s"] for d in probed["devices"]]
    fastest = min(range(ranks), key=lambda r: slowdowns[r])
    reference = times[fastest] / slowdowns[fastest]
    subprocess.run([str(BIN / "hetsync"), "launch", "-m", "sync", "--workers", str(ranks),
                    "--slowdowns", text, "--oversubscribe", "1", "--step-work",
                    f"{reference:.6f}", "--time-budget", str(budget), "--epochs", "none",
                    "--no-live", "--no-figures", "--eval-interval", str(budget),
                    "--quiet", "--log-dir", str(out), "--run-name", "real"], check=True,
                   stdout=subprocess.DEVNULL)
    summary = json.loads((out / "real" / "summary.json").read_text())
    comm = out / "comm.json"
    subprocess.run([str(BIN / "hetsync"), "bench", "comm", "--world-sizes", str(ranks),
                    "--sizes", "16,4194304", "--algorithms", "native", "--json", str(comm)],
                   check=True, stdout=subprocess.DEVNULL)
    rows = sorted(json.loads(comm.read_text()), key=lambda r: r["bytes"])
    bench = fit_ring([r["bytes"] for r in rows], [r["latency_s"] for r in rows], ranks)
    link = probed["link"]
    return {"reference_ms": 1000 * reference,
            "probe": [at / t for t in times],
            "run": [w["samples"] / w["compute_s"] for w in summary["per_worker"]],
            "of_nominal": [w.get("speed_of_nominal") for w in summary["per_worker"]],
            "alpha": link["latency_s"] / bench.latency_s,
            "beta": link["bandwidth_bps"] / bench.bandwidth_bps,
            "links": (link["latency_s"], link["bandwidth_bps"], bench.latency_s,
                      bench.bandwidth_bps)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--slowdowns", default="2.333,4.667,9.333")
    p.add_argument("--budget", type=float, default=20.0, help="the real run's seconds")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default="runs/probe-vs-real")
    args = p.parse_args()
    slowdowns = [float(f) for f in args.slowdowns.split(",")]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    print(f"probe against a real run: commit {commit}, {platform.node()}, "
          f"{len(slowdowns)} emulated devices {args.slowdowns}, {args.repeats} repeat(s), "
          f"wall clock", flush=True)
    results = []
    for i in range(args.repeats):
        results.append(one(ROOT / args.out / str(i), slowdowns, args.budget))
        r = results[-1]
        print(f"repeat {i}: reference {r['reference_ms']:.2f} ms at 64; run ÷ probe "
              + ", ".join(f"{run / probe:.2f}" for run, probe in zip(r["run"], r["probe"]))
              + f"; links probe ÷ bench α {r['alpha']:.2f}, β {r['beta']:.2f}", flush=True)
    print("\n| rank | slowdown | probe samples/s at 64 | run samples per compute s "
          "(of nominal) | run ÷ probe, each repeat | median |\n|---|---|---|---|---|---|")
    for rank, f in enumerate(slowdowns):
        ratios = [r["run"][rank] / r["probe"][rank] for r in results]
        print(f"| {rank} | {f:g} | "
              + " / ".join(f"{r['probe'][rank]:,.0f}" for r in results) + " | "
              + " / ".join(f"{r['run'][rank]:,.0f} ({r['of_nominal'][rank]:.0%})"
                           for r in results) + " | "
              + " / ".join(f"{x:.2f}" for x in ratios) + f" | {statistics.median(ratios):.2f} |")
    print("\n| ring link | probe | bench comm | probe ÷ bench |\n|---|---|---|---|")
    for name, k in (("α", "alpha"), ("β", "beta")):
        cells = [(r["links"][0] * 1e6, r["links"][2] * 1e6) if k == "alpha" else
                 (r["links"][1] / 1e9, r["links"][3] / 1e9) for r in results]
        unit = "µs" if k == "alpha" else "Gbit/s"
        print(f"| {name} ({unit}) | " + " / ".join(f"{a:.{0 if k == 'alpha' else 2}f}"
                                                   for a, _ in cells)
              + " | " + " / ".join(f"{b:.{0 if k == 'alpha' else 2}f}" for _, b in cells)
              + " | " + " / ".join(f"{r[k]:.2f}" for r in results)
              + f", median {statistics.median(r[k] for r in results):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
