"""The bench's outputs: the comparison table (text and Markdown), the JSON, the machine.

One row per run: the learning rate and how it was chosen, time-to-accuracy per target (training
time, evaluation excluded), speedup over the `sync` run of the same bench at the speedup target,
final accuracy, epochs of data trained, throughput, utilisation and traffic (docs/design.md
"Definitions of the figures"). A run that failed keeps its row, with the reason.

With repeats (one run per seed), a row holds the median of each figure over the seeds, and the
time-to-accuracy and final accuracy cells show their range: one evaluation every few seconds
and a first crossing of a noisy curve make a single run's time-to-accuracy vary by a third.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from hetsync.telemetry.report import table
from hetsync.telemetry.summarize import SPEEDUP_BASELINE, speedup, target_key


@dataclass
class RunResult:
    """One run of the bench: what it was, where it wrote, and its summary (None: failed)."""

    label: str
    kind: str                      # "mode" (hetsync) or "baseline" (PyTorch)
    lr: float
    lr_how: str
    run_dir: Path | None = None
    summary: dict[str, Any] | None = None
    error: str | None = None
    speedup: dict[str, float | None] = field(default_factory=dict)
    #: tta(sequential SGD on the fastest device alone) / tta(run), per target
    vs_fastest: dict[str, float | None] = field(default_factory=dict)
    #: with repeats: every seed's run (``summary`` then holds their medians)
    repeats: list["RunResult"] = field(default_factory=list)
    seed: int | None = None


def _median(values: Sequence[float | None]) -> float | None:
    """Median, `None` read as never (infinite): a target missed by most seeds stays missed."""
    m = statistics.median([math.inf if v is None else v for v in values])
    return None if math.isinf(m) else m


def median_summary(summaries: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The median over several seeds' runs of each figure of the table."""
    out: dict[str, Any] = {"mode": summaries[0]["mode"], "runs": len(summaries)}
    for key in ("final_accuracy", "samples", "throughput", "utilisation", "traffic_Bps",
                "synced_fraction"):
        out[key] = _median([s.get(key) for s in summaries])
    out["time_to_accuracy"] = {t: _median([s["time_to_accuracy"].get(t) for s in summaries])
                               for t in summaries[0]["time_to_accuracy"]}
    return out


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


#: the run that stands for the fastest device training alone (sequential SGD)
FASTEST_ALONE = "local"


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
         train_size: int | None) -> tuple[list[str], list[list[str]]]:
    """Headers and cells of the comparison table."""
    headers = (["run", "lr (how chosen)"] + [f"tta {t:g} (s)" for t in targets]
               + [f"speedup vs sync @{speedup_at:g}", f"vs fastest alone @{speedup_at:g}",
                  "final acc", "epochs", "samples/s", "utilisation", "MB/s"])
    out = []
    for r in results:
        lr = f"{r.lr:g} ({r.lr_how})"
        s = r.summary
        if s is None:
            out.append([r.label, lr] + ["—"] * len(targets)
                       + ["failed: " + (r.error or "").splitlines()[0][:60]] + ["—"] * 6)
            continue
        epochs = s["samples"] / train_size if train_size else None
        traffic = s.get("traffic_Bps")
        out.append([r.label, lr]
                   + [_spread(r, s["time_to_accuracy"].get(target_key(t)), ".1f",
                              lambda x, t=t: x["time_to_accuracy"].get(target_key(t)))
                      for t in targets]
                   + [_num(r.speedup.get(target_key(speedup_at)), ".2f"),
                      _num(r.vs_fastest.get(target_key(speedup_at)), ".2f"),
                      _spread(r, s["final_accuracy"], ".4f", lambda x: x["final_accuracy"]),
                      _num(epochs, ".2f"),
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
           "speedup_vs_sync": r.speedup, "vs_fastest_alone": r.vs_fastest, "summary": s}
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
