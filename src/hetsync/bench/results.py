"""The bench's outputs: the comparison table (text and Markdown), the JSON, the machine.

One row per run: the learning rate and how it was chosen, time-to-target per target (training
time, evaluation excluded; targets of accuracy, or of loss for language modelling), the final
figure, the run read against the fastest device alone
(:func:`compare_with_fastest`: capacity ratio, speed-up per target and at the end, efficiency),
speedup over the `sync` run of the same bench, epochs of data trained, throughput, utilisation
and traffic (docs/design.md "Definitions of the figures"). A run that failed keeps its row,
with the reason.

With repeats (one run per seed), a row holds the median of each figure over the seeds, and the
time-to-target and final figure cells show their range: one evaluation every few seconds
and a first crossing of a noisy curve make a single run's time-to-accuracy vary by a third.
With 3 seeds or more on both sides, each speed-up over the fastest device carries its
bootstrap interval over the seeds (:func:`speedup_interval`).
"""

from __future__ import annotations

import json
import math
import os
import platform
import random
import statistics
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from hetsync.telemetry.metric import ACCURACY, Metric
from hetsync.telemetry.report import table
from hetsync.telemetry.summarize import SPEEDUP_BASELINE, speedup, target_key


@dataclass
class RunResult:
    """One run of the bench: what it was, where it wrote, and its summary (None: failed)."""

    label: str
    kind: str                      # "mode" (hetsync), "baseline" (PyTorch) or "reference"
    lr: float
    lr_how: str
    run_dir: Path | None = None
    summary: dict[str, Any] | None = None
    error: str | None = None
    speedup: dict[str, float | None] = field(default_factory=dict)
    #: Σ its devices' samples per second of computing ÷ the fastest device's alone
    capacity: float | None = None
    #: tta(the fastest device's best recipe) / tta(run), per target key and "end"
    vs_fastest: dict[str, float | None] = field(default_factory=dict)
    #: vs_fastest ÷ capacity, per target key and "end"
    efficiency: dict[str, float | None] = field(default_factory=dict)
    #: with repeats on both sides: vs_fastest's 95 % interval over the seeds, per target key
    vs_fastest_interval: dict[str, tuple[float, float]] = field(default_factory=dict)
    #: with repeats: every seed's run (``summary`` then holds their medians)
    repeats: list["RunResult"] = field(default_factory=list)
    seed: int | None = None


def median_never(values: Sequence[float | None]) -> float | None:
    """Median, `None` read as never (infinite): a target missed by most seeds stays missed."""
    m = statistics.median([math.inf if v is None else v for v in values])
    return None if math.isinf(m) else m


def median_summary(summaries: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The median over several seeds' runs of each figure of the table."""
    out: dict[str, Any] = {"mode": summaries[0]["mode"], "runs": len(summaries),
                           "metric": summaries[0].get("metric")}
    for key in ("final_accuracy", "final_loss", "samples", "throughput", "throughput_limit",
                "utilisation", "traffic_Bps", "synced_fraction"):
        out[key] = median_never([s.get(key) for s in summaries])
    out["time_to_target"] = {t: median_never([s["time_to_target"].get(t) for s in summaries])
                             for t in summaries[0]["time_to_target"]}
    return out


def speedup_interval(reference: Sequence[float | None], run: Sequence[float | None],
                     level: float = 0.95, draws: int = 10_000,
                     seed: int = 0) -> tuple[float, float]:
    """The percentile-bootstrap interval of the speed-up median(reference) ÷ median(run),
    from each side's time to a target over its seeds (Efron & Tibshirani, *An Introduction
    to the Bootstrap*, 1993, ch. 13):

    1. `draws` times, draw as many of each side's seeds as it has, with replacement, each side
       on its own (the seeds of a cluster and of a device are not paired);
    2. that draw's speed-up: the median of the reference's times ÷ the median of the run's,
       a missed target read as never (a speed-up of 0, or of infinity);
    3. the interval: that speed-up's (1 - level) / 2 and (1 + level) / 2 quantiles.

    Seeded, so the same times give the same interval. With a handful of seeds it is wide, and
    that is its point: a first crossing at an accuracy near the model's ceiling moves by a
    tenth with the seed.
    """
    ref = [math.inf if t is None else t for t in reference]
    mine = [math.inf if t is None else t for t in run]
    rng = random.Random(seed)

    def ratio(a: float, b: float) -> float:
        if math.isinf(b):
            return 0.0
        return a / b

    ratios = sorted(ratio(statistics.median(rng.choices(ref, k=len(ref))),
                          statistics.median(rng.choices(mine, k=len(mine))))
                    for _ in range(draws))
    lo = ratios[int((1 - level) / 2 * (draws - 1))]
    hi = ratios[int(round((1 + level) / 2 * (draws - 1)))]
    return lo, hi


def combine(runs: Sequence[RunResult]) -> RunResult:
    """One result for the runs of one label over several seeds (the runs themselves when one).

    Its summary is the median over the seeds that completed; its run directory (drawn in the
    figures) is the first completed seed's; a seed that failed is named in its error.
    """
    if len(runs) == 1:
        return runs[0]
    first = runs[0]
    done = [r for r in runs if r.summary is not None]
    failed = [r for r in runs if r.summary is None]
    error = "; ".join(f"seed {r.seed}: {(r.error or 'failed').splitlines()[0]}"
                      for r in failed)
    return RunResult(first.label, first.kind, first.lr, first.lr_how,
                     run_dir=done[0].run_dir if done else None,
                     summary=median_summary([r.summary for r in done]) if done else None,
                     error=error or None, repeats=list(runs))


@dataclass
class FastestDevice:
    """The cluster's fastest device trained alone, as the bench measured it."""

    #: samples per second of computing (median over its runs)
    speed: float
    #: the cluster's capacity ratio: median over the cluster runs (None: no cluster run)
    capacity: float | None
    #: target key -> (the recipe that reached it first, its time to target)
    best: dict[str, tuple[str, float]]
    #: the best final figure (accuracy or loss) of its recipes, and which
    end_value: float | None
    end_label: str | None


def reference_end(results: Sequence[RunResult],
                  metric: Metric = ACCURACY) -> tuple[str, float] | None:
    """(label, final figure) of the fastest device's recipe that ended best (highest
    accuracy, lowest loss); None: no reference run completed."""
    key = f"final_{metric.short}"
    ends = [(r.summary[key], r.label) for r in results
            if r.kind == "reference" and r.summary and r.summary.get(key)]
    if not ends:
        return None
    value = metric.best(v for v, _ in ends)
    return next(label for v, label in ends if v == value), value


def _times(r: RunResult, key: str) -> list[float | None]:
    """Each seed's time to the target `key` (None: missed, or the seed's run failed)."""
    return [x.summary["time_to_target"].get(key) if x.summary is not None else None
            for x in r.repeats]


def compare_with_fastest(results: Sequence[RunResult], targets: Sequence[float],
                         end: tuple[str, float] | None) -> FastestDevice | None:
    """Read every run against the fastest device alone (its `reference` runs); None when no
    reference run completed.

    1. its speed: the median of its runs' measured samples per second of computing;
    2. each run's capacity ratio: Σ its devices' measured speeds ÷ that speed;
    3. the best recipe at each target: the one with the shortest time to target;
    4. each run's speed-up at each target: that recipe's time ÷ the run's; "end": at the best
       recipe's final accuracy or loss (`end`), so a speed-up there means the run got as far
       sooner;
    5. its efficiency: speed-up ÷ capacity ratio (1: every sample worth one of the device's);
    6. with 3 seeds or more on both sides, the speed-up's interval over them
       (:func:`speedup_interval`).
    """
    refs = [r for r in results if r.kind == "reference" and r.summary is not None]
    speeds = [r.summary["throughput_limit"] for r in refs if r.summary.get("throughput_limit")]
    if not speeds:
        return None
    speed = statistics.median(speeds)
    for r in results:
        if r.summary is not None and r.summary.get("throughput_limit"):
            r.capacity = r.summary["throughput_limit"] / speed
    keys = {target_key(t): target_key(t) for t in targets}
    if end is not None:
        keys["end"] = target_key(end[1])
    best: dict[str, tuple[str, float]] = {}
    for name, key in keys.items():
        reached = [(r.summary["time_to_target"].get(key), r.label) for r in refs]
        reached = [(t, label) for t, label in reached if t is not None]
        if reached:
            tta, label = min(reached)
            best[name] = (label, tta)
    for r in results:
        if r.summary is None:
            continue
        for name, key in keys.items():
            mine = r.summary["time_to_target"].get(key)
            ratio = (best[name][1] / mine if name in best and mine else None)
            r.vs_fastest[name] = ratio
            r.efficiency[name] = (ratio / r.capacity if ratio is not None and r.capacity
                                  else None)
            if name in best:
                ref = next(x for x in refs if x.label == best[name][0])
                seeds = [_times(x, key) for x in (ref, r)]
                if all(len(t) >= 3 for t in seeds):
                    r.vs_fastest_interval[name] = speedup_interval(*seeds)
    cluster = [r.capacity for r in results if r.kind != "reference" and r.capacity]
    return FastestDevice(speed, statistics.median(cluster) if cluster else None, best,
                         end and end[1], end and end[0])


def compute_speedups(results: Sequence[RunResult], targets: Sequence[float],
                     baseline: str = SPEEDUP_BASELINE, into: str = "speedup") -> bool:
    """Fill each result's `into` field {target: tta(baseline) / tta(run)}; False when there
    is no successful `baseline` run."""
    done = {r.label: r.summary for r in results if r.summary is not None}
    if baseline not in done:
        return False
    for t in targets:
        for label, value in speedup(done, baseline=baseline, target=t).items():
            getattr(next(r for r in results if r.label == label), into)[target_key(t)] = value
    return True


def _num(value, fmt: str) -> str:
    return "—" if value is None else format(value, fmt)


def _with_interval(value: float | None, interval: tuple[float, float] | None) -> str:
    """A speed-up, with its 95 % interval over the seeds where there is one."""
    if value is None or interval is None:
        return _num(value, ".2f")
    return f"{value:.2f} [{interval[0]:.2f}–{interval[1]:.2f}]".replace("inf", "∞")


def _spread(r: RunResult, value: Any, fmt: str, get) -> str:
    """`value` alone, or with the range over the seeds when `r` has repeats."""
    text = _num(value, fmt)
    if len(r.repeats) < 2:
        return text
    each = [get(x.summary) if x.summary is not None else None for x in r.repeats]
    got = [v for v in each if v is not None]  # a failed seed or a missed target: None
    if not got:
        return text
    span = format(min(got), fmt) + (f"–{format(max(got), fmt)}" if len(got) > 1 else "")
    missed = len(each) - len(got)
    return f"{text} ({span}{f', {missed} —' if missed else ''})"


def rows(results: Sequence[RunResult], targets: Sequence[float], speedup_at: float,
         train_size: int | None, with_sync: bool = True,
         metric: Metric = ACCURACY) -> tuple[list[str], list[list[str]]]:
    """Headers and cells of the comparison table (`with_sync`: the speedup-vs-sync column)."""
    keys = [target_key(t) for t in targets] + ["end"]
    last, final = keys[-2], f"final_{metric.short}"
    headers = (["run", "lr (how chosen)"] + [f"tta {t:g} (s)" for t in targets]
               + [f"final {metric.short}", "capacity"]
               + [f"x fastest @{t:g}" for t in targets] + ["x fastest @end",
                  f"efficiency @{targets[-1]:g}", "efficiency @end"]
               + ([f"speedup vs sync @{speedup_at:g}"] if with_sync else [])
               + ["epochs", "samples/s", "utilisation", "MB/s"])
    out = []
    for r in results:
        lr = f"{r.lr:g} ({r.lr_how})"
        s = r.summary
        if s is None:
            row = [r.label, lr] + ["—"] * len(targets) + [
                "failed: " + (r.error or "").splitlines()[0][:60]]
            out.append(row + ["—"] * (len(headers) - len(row)))
            continue
        epochs = s["samples"] / train_size if train_size else None
        traffic = s.get("traffic_Bps")
        out.append([r.label, lr]
                   + [_spread(r, s["time_to_target"].get(target_key(t)), ".1f",
                              lambda x, t=t: x["time_to_target"].get(target_key(t)))
                      for t in targets]
                   + [_spread(r, s[final], ".4f", lambda x: x[final]),
                      _num(r.capacity, ".2f")]
                   + [_with_interval(r.vs_fastest.get(k), r.vs_fastest_interval.get(k))
                      for k in keys]
                   + [_num(r.efficiency.get(last), ".2f"), _num(r.efficiency.get("end"), ".2f")]
                   + ([_num(r.speedup.get(target_key(speedup_at)), ".2f")] if with_sync else [])
                   + [_num(epochs, ".2f"),
                      _num(s["throughput"], ",.0f"), _num(s["utilisation"], ".2f"),
                      _num(traffic and traffic / 1e6, ".2f")])
    return headers, out


def text_table(headers, cells) -> str:
    return table(headers, cells)


def markdown_table(headers: Sequence[str], cells: Sequence[Sequence[str]]) -> str:
    def esc(c) -> str:
        return str(c).replace("|", "\\|")
    lines = ["| " + " | ".join(esc(h) for h in headers) + " |",
             "|" + "|".join([":---"] + ["---:"] * (len(headers) - 1)) + "|"]
    lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in cells]
    return "\n".join(lines)


def machine_info() -> dict[str, Any]:
    """What the numbers were measured on."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    import torch

    return {"platform": platform.platform(), "processor": platform.processor() or None,
            "cpus": os.cpu_count(), "python": platform.python_version(),
            "torch": torch.__version__, "git_commit": commit,
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}


def load_text(load: Sequence[float]) -> str:
    return " / ".join(f"{x:.2f}" for x in load)


def write_json(path: Path, doc: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    return path


def result_doc(r: RunResult) -> dict[str, Any]:
    s = r.summary
    doc = {"label": r.label, "kind": r.kind, "lr": r.lr, "lr_how": r.lr_how,
           "run_dir": str(r.run_dir) if r.run_dir else None, "error": r.error,
           "speedup_vs_sync": r.speedup, "capacity": r.capacity, "vs_fastest": r.vs_fastest,
           "efficiency": r.efficiency, "vs_fastest_interval": r.vs_fastest_interval,
           "summary": s}
    if r.repeats:
        doc["repeats"] = [{"seed": x.seed, "run_dir": str(x.run_dir) if x.run_dir else None,
                           "error": x.error, "summary": x.summary} for x in r.repeats]
    return doc


def write_markdown(path: Path, *, name: str, command: str, machine: dict, setup: dict,
                   headers, cells, notes: Sequence[str], figures: Sequence[Path]) -> Path:
    lines = [f"# hetsync bench `{name}`", "",
             f"Command: `{command}`", "",
             "Machine: " + ", ".join(f"{k} {v}" for k, v in machine.items() if v is not None),
             "", "Setup: " + ", ".join(f"{k} {v}" for k, v in setup.items()), "",
             markdown_table(headers, cells), ""]
    lines += [f"- {n}" for n in notes]
    if figures:
        lines += ["", "Figures:", ""]
        lines += [f"- [{p.name}]({Path(os.path.relpath(p, path.parent)).as_posix()})"
                  for p in figures]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path
