"""A machine that becomes free mid-run: `--spare-workers` against the same cluster without it
and with it from the start.

For each seed, three `hetsync launch` runs of one mode (by default esync-outer, LeNet on
Fashion-MNIST, the emulated devices fitted to the cores as `launch` fits them):

- ``without`` — the first workers alone (``--workers P-1``, the spare's device absent);
- ``spare`` — all P, the last a spare that `launch` starts `--spare-start` seconds in
  (``--spare-workers 1``): it joins the running job at a round's end;
- ``from start`` — all P from the start.

Each row says what a user would look at: the cluster's samples per second before the spare
was started and from 5 s after it (the spare's process start on a busy machine) to the end,
when the spare's first round began, the times to the targets,
the final accuracy and each device's speed against its nominal one (the emulation held, or
not). The default cluster, ``2,4,8,1``, makes the spare the fastest device.

    .venv/bin/python benchmarks/spare_bench.py --seeds 0,1,2 --out results/spare.md
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KINDS = ("without", "spare", "from start")


def launch(kind: str, args, seed: int, log_dir: Path) -> Path:
    """Run one `hetsync launch`; its run directory."""
    slowdowns = args.slowdowns.split(",")
    name = f"{kind.replace(' ', '-')}-s{seed}"
    cluster = (["--workers", str(len(slowdowns) - 1), "--slowdowns", ",".join(slowdowns[:-1])]
               if kind == "without" else
               ["--workers", str(len(slowdowns)), "--slowdowns", args.slowdowns])
    if kind == "spare":
        cluster += ["--spare-workers", "1", "--spare-start", str(args.spare_start)]
    if kind == "without":  # the same emulated speeds as the runs with every device
        cluster += ["--speed-scale", str(args.scale)]
    cmd = [sys.executable, "-m", "hetsync", "launch", "-m", args.mode, *cluster,
           "--time-budget", str(args.budget), "--seed", str(seed), "-ld", str(log_dir),
           "--run-name", name, "--quiet", "--no-figures", "--no-live", *args.extra]
    started = time.monotonic()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{name}: launch exited {done.returncode}:\n{done.stdout[-2000:]}"
                 f"{done.stderr[-2000:]}")
    print(f"  {name}: {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    return log_dir / name


def records(run: Path) -> dict[int, list[dict]]:
    out = {}
    for path in run.glob("worker-*.jsonl"):
        out[int(path.stem.split("-")[1])] = [json.loads(line) for line in
                                             path.read_text().splitlines() if line.endswith("}")]
    return out


def rate(recs: dict[int, list[dict]], start: float, end: float) -> float:
    """Samples per second of rounds that ended in [start, end)."""
    return sum(r["samples"] for rs in recs.values() for r in rs
               if start <= r["t_end"] < end) / (end - start)


def row(kind: str, run: Path, args) -> dict:
    summary = json.loads((run / "summary.json").read_text())
    recs = records(run)
    spare = len(args.slowdowns.split(",")) - 1
    first = min((r["t_start"] for r in recs.get(spare, [])), default=None)
    return {"kind": kind,
            "before": rate(recs, 1.0, args.spare_start),
            "after": rate(recs, args.spare_start + 5.0, args.budget),
            "first_round": None if kind != "spare" or first is None else first,
            "tta": summary["time_to_target"], "final": summary["final_accuracy"],
            "speeds": [w["speed_of_nominal"] for w in summary["per_worker"]],
            "joined": summary.get("joined_workers", [])}


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def table(rows: list[dict], seeds: list[int]) -> str:
    targets = list(rows[0]["tta"])
    head = ("| run | samples/s before the spare's start | samples/s from 5 s after it | "
            "spare's first round (s) | " + " | ".join(f"tta {t}" for t in targets)
            + " | final | devices (of nominal) |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for kind in KINDS:
        mine = [r for r in rows if r["kind"] == kind]

        def cell(values, fmt):
            m = median(values)
            got = [v for v in values if v is not None]
            if m is None:
                return "—"
            spread = f" ({fmt.format(min(got))}–{fmt.format(max(got))})" if len(got) > 1 else ""
            missed = f", {len(values) - len(got)} not" if len(got) < len(values) else ""
            return fmt.format(m) + spread + missed

        speeds = [s for r in mine for s in r["speeds"] if s is not None]
        lines.append(
            f"| {kind} | {cell([r['before'] for r in mine], '{:,.0f}')} | "
            f"{cell([r['after'] for r in mine], '{:,.0f}')} | "
            f"{cell([r['first_round'] for r in mine], '{:.1f}') if kind == 'spare' else '—'} | "
            + " | ".join(cell([r["tta"][t] for r in mine], "{:.1f}") for t in targets)
            + f" | {cell([r['final'] for r in mine], '{:.4f}')} | "
            f"{min(speeds):.0%}–{max(speeds):.0%} |")
    return "\n".join(lines) + f"\n\nMedians (ranges) over seeds {', '.join(map(str, seeds))}.\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", default="esync-outer")
    p.add_argument("--slowdowns", default="2,4,8,1", help="the cluster; the last is the spare")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--budget", type=float, default=60.0)
    p.add_argument("--spare-start", type=float, default=20.0)
    p.add_argument("-ld", "--log-dir", default="runs/spare")
    p.add_argument("--out", help="also write the table to this Markdown file")
    args, args.extra = p.parse_known_args()
    if not 1.0 < args.spare_start < args.budget - 5.0:
        p.error(f"--spare-start {args.spare_start:g}: expected more than 1 s and at least 5 s "
                f"before --budget {args.budget:g} ends (the windows measured around it)")
    seeds = [int(s) for s in args.seeds.split(",")]
    log_dir = (ROOT / args.log_dir).resolve()
    rows = []
    for seed in seeds:
        for kind in ("spare", "from start", "without"):
            if kind == "without":  # the scale launch fitted for all P devices
                spare = json.loads((log_dir / f"spare-s{seed}" / "config.json").read_text())
                args.scale = spare["speed_scale"]
            rows.append(row(kind, launch(kind, args, seed, log_dir), args))
    commit = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    text = (f"`benchmarks/spare_bench.py --mode {args.mode} --slowdowns {args.slowdowns} "
            f"--budget {args.budget:g} --spare-start {args.spare_start:g}` at {commit}, "
            f"{len(seeds)} seed(s), emulated speeds scaled by {args.scale:g} (launch's fit)\n\n"
            + table(rows, seeds))
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
