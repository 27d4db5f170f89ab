"""The bench's table, with each speed-up's bootstrap interval, for runs launched one at a time.

`hetsync bench --repeats N` reads its own runs; this reads run directories that `hetsync
launch` wrote one seed at a time (the claim's recipes were tried that way), groups them by
name without their `-sSEED` suffix, and prints the same Markdown table (medians over the
seeds with their range, and against the fastest device's best recipe: the speed-up with its
95 % interval over the seeds, `hetsync.bench.results.speedup_interval`).

    .venv/bin/python benchmarks/seed_table.py --targets 0.88 0.9 \\
        --reference 'runs/la05-h25-s*' -- 'runs/sla1-s*' 'runs/syncnes-s*'

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

from hetsync.bench import results as res
from hetsync.telemetry.summarize import summarize


def _group(pattern: str, kind: str, targets: list[float]) -> res.RunResult:
    seed = re.compile(r"-s(\d+)$")
    dirs = sorted((Path(p) for p in glob.glob(pattern)
                   if Path(p).is_dir() and seed.search(p)),
                  key=lambda p: int(seed.search(p.name).group(1)))
    if not dirs:
        sys.exit(f"seed_table: no run directory matches {pattern!r}")
    runs = []
    for d in dirs:
        if not (d / "summary.json").exists():
            print(f"left out: {d} (no summary.json: it did not finish)", file=sys.stderr)
            continue
        s = summarize(d, targets)
        runs.append(res.RunResult(re.sub(r"-s\d+$", "", d.name), kind, s["lr"], "given",
                                  run_dir=d, summary=s,
                                  seed=int(seed.search(d.name).group(1))))
    return res.combine(runs)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", type=float, nargs="+", default=[0.88, 0.9])
    ap.add_argument("--reference", nargs="+", required=True,
                    help="globs of the fastest device's runs, one a recipe (DIR/NAME-s*)")
    ap.add_argument("runs", nargs="+", help="globs of the cluster's runs, one a recipe")
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


if __name__ == "__main__":
    main()
