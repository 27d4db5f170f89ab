"""The bench's table, with each speed-up's bootstrap interval, for runs launched one at a time.

`hetsync bench --repeats N` reads its own runs; this reads run directories that `hetsync
launch` wrote one seed at a time (the claim's recipes were tried that way), groups them by
name without their `-sSEED` suffix, and prints the same Markdown table (medians over the
seeds with their range, and against the fastest device's best recipe: the speed-up with its
95 % interval over the seeds, `hetsync.bench.results.speedup_interval`).

    .venv/bin/python benchmarks/seed_table.py --targets 0.88 0.9 \\
        --reference 'runs/la05-h25-s*' -- 'runs/sla1-s*' 'runs/syncnes-s*'

`--figure PATH` also draws each recipe's median accuracy curve over its seeds with the band
of their range (a seed's accuracy at a time is its last evaluation by then).

A group of the fastest device's runs (`--reference`, one glob a recipe) is read as the bench
reads its `--reference` recipes; every other glob is a cluster recipe. Seeds are the ones on
disk: a run that did not finish (no summary.json) is left out and named.
"""

from __future__ import annotations

import argparse
import glob
import re
import sys
from pathlib import Path

import numpy as np

from hetsync.bench import results as res
from hetsync.telemetry.rundir import RunDir
from hetsync.telemetry.runlog import EVAL_FIELDS, read_jsonl
from hetsync.telemetry.summarize import summarize


SEED = re.compile(r"-s(\d+)$")


def _dirs(pattern: str) -> list[Path]:
    """The finished runs `pattern` matches, by seed (an unfinished one named and left out)."""
    dirs = sorted((Path(p) for p in glob.glob(pattern)
                   if Path(p).is_dir() and SEED.search(p)),
                  key=lambda p: int(SEED.search(p.name).group(1)))
    if not dirs:
        sys.exit(f"seed_table: no run directory matches {pattern!r}")
    for d in dirs:
        if not (d / "summary.json").exists():
            print(f"left out: {d} (no summary.json: it did not finish)", file=sys.stderr)
    return [d for d in dirs if (d / "summary.json").exists()]


def _group(pattern: str, kind: str, targets: list[float]) -> res.RunResult:
    runs = []
    for d in _dirs(pattern):
        s = summarize(d, targets)
        runs.append(res.RunResult(re.sub(r"-s\d+$", "", d.name), kind, s["lr"], "given",
                                  run_dir=d, summary=s,
                                  seed=int(SEED.search(d.name).group(1))))
    return res.combine(runs)


def _curve(run_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    """A run's evaluations: their times and accuracies."""
    evals = read_jsonl(RunDir(run_dir).eval, EVAL_FIELDS)
    return (np.array([e["train_time"] for e in evals]),
            np.array([e["test_acc"] for e in evals]))


def _at(times: np.ndarray, curve: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """A curve's accuracy at each of `times`: its last evaluation by then (NaN before its
    first), as a reader of it would take it."""
    t, acc = curve
    i = np.searchsorted(t, times, side="right") - 1
    return np.where(i >= 0, acc[np.maximum(i, 0)], np.nan)


def draw(groups: list[tuple[str, list[Path]]], target: float, path: Path,
         capacity: float | None = None) -> None:
    """Each recipe's median accuracy over its seeds against (virtual) time, with the band
    from its worst seed to its best: near the target the seeds, not the recipes, part. With
    `capacity`, also the ideal cluster: the last recipe's (the device's) median with its
    time divided by the cluster's capacity ratio, dotted."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 5), dpi=110)
    ax = fig.add_subplot()
    for i, (label, dirs) in enumerate(groups):
        runs = [_curve(d) for d in dirs]
        times = np.linspace(0.0, max(t[-1] for t, _ in runs), 400)
        curves = np.array([_at(times, c) for c in runs])
        median = np.median(curves, axis=0)
        ax.plot(times, median, color=f"C{i}", lw=1.8,
                label=f"{label} (median of {len(dirs)} seeds)")
        ax.fill_between(times, curves.min(axis=0), curves.max(axis=0), color=f"C{i}",
                        alpha=0.15, lw=0)
    if capacity:  # (the last group is the device's: `main` passes the references last)
        ax.plot(times / capacity, median, ":", color="black", lw=1.4,
                label=f"ideal cluster: the device's median at {capacity:.4g}x its speed")
    ax.axhline(target, color="0.5", lw=1, ls=":", label=f"target {target:g}")
    ax.set(title="Test accuracy vs training time: median and range over the seeds",
           xlabel="training time (virtual s)", ylabel="test accuracy",
           ylim=(target - 0.06, target + 0.015), xlim=(0, None))
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, bbox_inches="tight")
    print(f"figure: {path}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", type=float, nargs="+", default=[0.88, 0.9])
    ap.add_argument("--reference", nargs="+", required=True,
                    help="globs of the fastest device's runs, one a recipe (DIR/NAME-s*)")
    ap.add_argument("runs", nargs="+", help="globs of the cluster's runs, one a recipe")
    ap.add_argument("--figure", type=Path, help="also draw each recipe's median curve over "
                    "its seeds, with their range, and the ideal cluster (the last reference's "
                    "curve sped up by the capacity ratio) into this PNG")
    ap.add_argument("--labels", nargs="+", help="the figure's names of the recipes, cluster's "
                    "then reference's (default: the run names without the seed)")
    args = ap.parse_args(argv)
    rows = ([_group(p, "mode", args.targets) for p in args.runs]
            + [_group(p, "reference", args.targets) for p in args.reference])
    fastest = res.compare_with_fastest(rows, args.targets, None)
    headers, cells = res.rows(rows, args.targets, args.targets[-1], None, with_sync=False)
    keep = [i for i, h in enumerate(headers) if "@end" not in h and h != "epochs"]
    seeds = {r.label: ",".join(str(x.seed) for x in r.repeats) or str(r.seed) for r in rows}
    print(res.markdown_table(["run", "seeds"] + [headers[i] for i in keep[1:]],
                             [[c[0], seeds[c[0]]] + [c[i] for i in keep[1:]] for c in cells]))
    for t, (label, tta) in fastest.best.items():
        print(f"\nthe fastest device's best at {t}: {label}, {tta:.1f} s (median)")
    if args.figure:
        patterns = args.runs + args.reference
        labels = args.labels or [r.label for r in rows]
        if len(labels) != len(patterns):
            sys.exit(f"seed_table: --labels: {len(labels)} names for {len(patterns)} recipes")
        draw([(lab, _dirs(p)) for lab, p in zip(labels, patterns)], args.targets[-1],
             args.figure, fastest.capacity)


if __name__ == "__main__":
    main()
