"""The bench's outputs: the comparison table (text and Markdown), the JSON, the machine.

One row per run: the learning rate and how it was chosen, time-to-accuracy per target (training
time, evaluation excluded), speedup over the `sync` run of the same bench at the speedup target,
final accuracy, epochs of data trained, throughput, utilisation and traffic (DESIGN.md
"Definitions of the figures"). A run that failed keeps its row, with the reason.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from hetsync.telemetry.report import table
from hetsync.telemetry.summarize import speedup, target_key


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


def compute_speedups(results: Sequence[RunResult], targets: Sequence[float]) -> bool:
    """Fill each result's `speedup` {target: tta(sync) / tta(run)}; False when no sync run."""
    done = {r.label: r.summary for r in results if r.summary is not None}
    if "sync" not in done:
        return False
    for t in targets:
        for label, value in speedup(done, baseline="sync", target=t).items():
            next(r for r in results if r.label == label).speedup[target_key(t)] = value
    return True


def _num(value, fmt: str) -> str:
    return "—" if value is None else format(value, fmt)


def rows(results: Sequence[RunResult], targets: Sequence[float], speedup_at: float,
         train_size: int | None) -> tuple[list[str], list[list[str]]]:
    """Headers and cells of the comparison table."""
    headers = (["run", "lr (how chosen)"] + [f"tta {t:g} (s)" for t in targets]
               + [f"speedup vs sync @{speedup_at:g}", "final acc", "epochs", "samples/s",
                  "utilisation", "MB/s"])
    out = []
    for r in results:
        lr = f"{r.lr:g} ({r.lr_how})"
        s = r.summary
        if s is None:
            out.append([r.label, lr] + ["—"] * len(targets)
                       + ["failed: " + (r.error or "").splitlines()[0][:60]] + ["—"] * 5)
            continue
        epochs = s["samples"] / train_size if train_size else None
        traffic = s.get("traffic_Bps")
        out.append([r.label, lr]
                   + [_num(s["time_to_accuracy"].get(target_key(t)), ".1f") for t in targets]
                   + [_num(r.speedup.get(target_key(speedup_at)), ".2f"),
                      _num(s["final_accuracy"], ".4f"), _num(epochs, ".2f"),
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
    return {"label": r.label, "kind": r.kind, "lr": r.lr, "lr_how": r.lr_how,
            "run_dir": str(r.run_dir) if r.run_dir else None, "error": r.error,
            "speedup_vs_sync": r.speedup, "summary": s}


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
