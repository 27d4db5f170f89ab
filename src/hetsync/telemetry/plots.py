"""Figures comparing runs (PNG, matplotlib's Agg canvas; pyplot's global state is never used).

:func:`plot_runs` draws, for several run directories:

1. ``accuracy.png`` (``loss.png`` for language modelling: the runs' figure of merit,
   :mod:`hetsync.telemetry.metric`): test accuracy or validation loss vs training time (eval
   ``train_time``, evaluation excluded), one line per run, a sequential-SGD reference dashed;
2. ``throughput.png``: samples/s per run, with each run's throughput limit marked;
3. ``traffic.png``: MB/s sent by all processes per run;
4. ``computing_time_ratio.png``: per worker per run;
5. ``speedup.png``: time-to-target of the ``sync`` run ÷ each run's (skipped, with a warning,
   when there is no sync run or it never reached the target);
6. ``timeline-{label}.png``: per run, one lane per rank with each round's compute, wait, comm
   and evaluation time.

Figures are computed by :mod:`hetsync.telemetry.summarize`; the pure helpers
:func:`timeline_window` and :func:`timeline_segments` define what a timeline shows.
"""

from __future__ import annotations

import io
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from hetsync.telemetry.metric import Metric, metric_of
from hetsync.telemetry.runlog import RunLog, read_run
from hetsync.telemetry.summarize import SPEEDUP_BASELINE, speedup, summarize_log, target_key

__all__ = [
    "PHASES",
    "PlotWarning",
    "plot_runs",
    "plot_run",
    "timeline_window",
    "timeline_segments",
]

#: Timeline phases in the order they are drawn within a round, with their colours.
PHASES: tuple[tuple[str, str, str], ...] = (
    ("compute_s", "compute", "#2ca02c"),
    ("wait_s", "wait", "#d62728"),
    ("comm_s", "comm", "#1f77b4"),
    ("eval_s", "evaluation", "#9467bd"),
)
TIMELINE_MAX_SECONDS = 60.0
TIMELINE_MAX_ROUNDS = 200
SEQUENTIAL_LABEL = "sequential SGD"
_RUN_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")


class PlotWarning(UserWarning):
    """A figure was skipped (and why)."""


@dataclass
class _Run:
    label: str
    log: RunLog
    summary: dict[str, Any]
    colour: str


# --- pure helpers --------------------------------------------------------------------------

def timeline_window(
    workers: Mapping[int, Sequence[Mapping[str, Any]]],
    max_seconds: float = TIMELINE_MAX_SECONDS,
    max_rounds: int = TIMELINE_MAX_ROUNDS,
) -> tuple[float, float]:
    """The time window ``(t0, t1)`` a timeline shows: from the first round's start, for at most
    ``max_seconds``, ending earlier where a worker finishes its ``max_rounds``-th round (so no
    lane holds more than ``max_rounds`` rounds and every lane covers the same time), and never
    after the last round's end."""
    starts = [float(r["t_start"]) for recs in workers.values() for r in recs]
    ends = [float(r["t_end"]) for recs in workers.values() for r in recs]
    if not starts:
        return 0.0, 0.0
    t0 = min(starts)
    t1 = min(t0 + max_seconds, max(ends))
    for recs in workers.values():
        if len(recs) > max_rounds:
            t1 = min(t1, sorted(float(r["t_end"]) for r in recs)[max_rounds - 1])
    return t0, t1


def timeline_segments(
    records: Sequence[Mapping[str, Any]], t1: float = float("inf")
) -> dict[str, list[tuple[float, float]]]:
    """{phase key: [(start, width), …]} for one worker's rounds: within each round's
    [t_start, t_end], compute, then wait, then comm, then evaluation, laid end to end (the
    record keeps durations, not their order; this is the order a round runs them). Segments are
    clipped to the round's end and to ``t1``; zero-width ones are dropped. What is left of a
    round after them is untracked time (shown blank)."""
    out: dict[str, list[tuple[float, float]]] = {key: [] for key, _, _ in PHASES}
    for r in records:
        start, end = float(r["t_start"]), min(float(r["t_end"]), t1)
        for key, _, _ in PHASES:
            width = min(max(0.0, float(r.get(key) or 0.0)), end - start)
            if width > 0:
                out[key].append((start, width))
                start += width
    return out


# --- figure plumbing ---------------------------------------------------------------------------

def _figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Figure, path: Path) -> Path:
    """A PNG in 256 colours (Pillow, matplotlib's own image library): line plots lose
    nothing to the eye at about 40 % of the size, which keeps results/ small."""
    if Path(path).suffix.lower() != ".png":
        fig.savefig(path, dpi=110)
        return path
    from PIL import Image

    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=110, format="png")
    buffer.seek(0)
    image = Image.open(buffer).convert("RGB").quantize(
        colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    image.save(path, format="PNG", optimize=True)
    return path


def _filename_part(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", label).strip("_") or "run"


def _unique_labels(labels: Sequence[str], runs: Sequence[RunLog]) -> list[str]:
    """Labels as given; a label shared by several runs gets the run's name appended."""
    out = []
    for label, log in zip(labels, runs):
        if labels.count(label) > 1:
            label = f"{label} ({log.run.get('run_name', log.run_dir.name)})"
        out.append(label)
    return out


def _metric(logs: Sequence[RunLog]) -> Metric:
    """The figure of merit every run shares; ValueError for runs judged differently."""
    metrics = {metric_of(log.config.get("dataset")) for log in logs}
    if len(metrics) > 1:
        raise ValueError("the runs are judged by different figures (" + ", ".join(
            sorted(m.label for m in metrics)) + "); plot runs of one kind of data set together")
    return metrics.pop()


def _load(run_dirs: Sequence[str | Path], labels: Sequence[str] | None,
          target: float | None) -> tuple[list[_Run], Metric, float]:
    """The runs, their figure of merit, and `target` (by default its second target)."""
    logs = [read_run(d) for d in run_dirs]
    metric = _metric(logs)
    target = metric.default_targets[1] if target is None else metric.check_target(float(target))
    targets = sorted(set(metric.default_targets) | {target})
    if labels is None:
        labels = [str(log.mode or log.run_dir.name) for log in logs]
    elif len(labels) != len(logs):
        raise ValueError(f"labels has {len(labels)} entries for {len(logs)} run directories")
    labels = _unique_labels(list(labels), logs)
    return [
        _Run(label, log, summarize_log(log, targets), _RUN_COLOURS[i % len(_RUN_COLOURS)])
        for i, (label, log) in enumerate(zip(labels, logs))
    ], metric, target


def _bar_labels(ax, bars, texts: Sequence[str]) -> None:
    for bar, text in zip(bars, texts):
        ax.annotate(text, (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    xytext=(0, 3), textcoords="offset points", ha="center", va="bottom", fontsize=8)


def _number(v: float) -> str:
    """A bar value with 3 significant digits at most scales: 1,533 · 45.2 · 0.000812."""
    if abs(v) >= 100:
        return f"{v:,.0f}"
    if abs(v) >= 1 or v == 0:
        return f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}"
    return f"{v:.3g}"


def _bytes(n: float) -> str:
    """``n`` bytes in decimal units: 812 B, 44.0 MB."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def _no_data(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color="0.4")


def _workers_caption(run: _Run) -> str:
    s = run.summary
    slow = ", ".join(f"{x:g}" for x in s["slowdowns"])
    return f"{s['workers']} workers, slowdowns ×[{slow}]"


# --- the figures --------------------------------------------------------------------------------

def _plot_metric(runs: Sequence[_Run], path: Path, sequential: _Run | None,
                 target: float | None, metric: Metric, ideal: float | None = None) -> Path:
    """Test accuracy (or validation loss) vs training time (eval ``train_time``: wall time
    minus evaluation time); the sequential run dashed, and its curve at `ideal` times its
    speed dotted."""
    fig = _figure(8, 5)
    ax = fig.add_subplot()
    lines = [(r, "-", 1.0) for r in runs] + ([(sequential, "--", 1.0)] if sequential else [])
    if sequential and ideal:
        lines.append((sequential, ":", ideal))
    drawn = 0
    for run, style, speed in lines:
        evals = [e for e in run.log.evals if metric.of(e) is not None]
        if not evals:
            continue
        x = [float(e["train_time"]) / speed for e in evals]
        y = [metric.of(e) for e in evals]
        best = run.summary[f"best_{metric.short}"]
        label = (f"ideal: {run.label} x {speed:.2f} capacity" if speed != 1
                 else f"{run.label} (best {best:.3f})")
        ax.plot(x, y, style, color="black" if style != "-" else run.colour, lw=1.8,
                marker="o" if len(x) <= 40 and style == "-" else None, ms=3.5, label=label)
        drawn += 1
    if target is not None:
        ax.axhline(target, color="0.5", lw=1, ls=":", label=f"target {target:g}")
    if not drawn:
        _no_data(ax, "no evaluations recorded")
    # near the target is where runs part: the first seconds' climb (or fall) is cut
    ax.set(title=f"{metric.label.split(' (')[0].capitalize()} vs training time",
           xlabel="training time (s, evaluation excluded)", ylabel=metric.label)
    if metric.higher_is_better:
        ax.set_ylim(0 if target is None else max(0.0, target - 0.3), 1)
    elif target is not None:
        ax.set_ylim(top=target + 0.8)
    ax.set_xlim(left=0)
    ax.grid(alpha=0.3)
    if drawn or target is not None:
        ax.legend(loc="lower right" if metric.higher_is_better else "upper right")
    return _save(fig, path)


def _plot_throughput(runs: Sequence[_Run], path: Path) -> Path:
    """Throughput = samples of all workers ÷ run wall time, with the throughput limit (Σ workers'
    isolated throughput) marked on each bar."""
    fig = _figure(max(5.0, 1.3 * len(runs) + 2.5), 4.8)
    ax = fig.add_subplot()
    x = range(len(runs))
    values = [r.summary["throughput"] or 0.0 for r in runs]
    bars = ax.bar(x, values, color=[r.colour for r in runs], width=0.6)
    texts = []
    for r, v in zip(runs, values):
        u = r.summary["utilisation"]
        texts.append(_number(v) + (f"\n{u:.0%} of limit" if u is not None else ""))
    _bar_labels(ax, bars, texts)
    limits = [r.summary["throughput_limit"] for r in runs]
    for i, lim in zip(x, limits):
        if lim is not None:
            ax.hlines(lim, i - 0.35, i + 0.35, color="black", lw=2)
    ax.set_xticks(list(x), [r.label for r in runs])
    ax.set(title="Data throughput", ylabel="samples/s (all workers)")
    top = max([v for v in values] + [v for v in limits if v is not None] + [1e-9])
    ax.set_ylim(0, top * 1.22)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(handles=[Patch(color="0.6", label="throughput = samples ÷ run wall time"),
                       Line2D([], [], color="black", lw=2,
                              label="limit = Σ each worker's throughput if it never waited")],
              loc="upper left", fontsize=8)
    return _save(fig, path)


def _plot_traffic(runs: Sequence[_Run], path: Path) -> Path:
    """Traffic = bytes sent by all processes (workers, servers) ÷ run wall time, in MB/s."""
    fig = _figure(max(5.0, 1.3 * len(runs) + 2.5), 4.8)
    ax = fig.add_subplot()
    x = range(len(runs))
    values = [(r.summary["traffic_Bps"] or 0.0) / 1e6 for r in runs]
    bars = ax.bar(x, values, color=[r.colour for r in runs], width=0.6)
    texts = []
    for r, v in zip(runs, values):
        per_round = r.summary["bytes_per_worker_round"]
        texts.append(_number(v) + (f"\n{_bytes(per_round)} per worker-round" if per_round else ""))
    _bar_labels(ax, bars, texts)
    ax.set_xticks(list(x), [r.label for r in runs])
    ax.set(title="Traffic load (bytes sent by workers and servers)", ylabel="MB/s (1 MB = 10⁶ bytes)")
    ax.set_ylim(0, max(values + [1e-9]) * 1.22)
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def _plot_computing_time_ratio(runs: Sequence[_Run], path: Path) -> Path:
    """Per worker: compute time ÷ (its wall time − its evaluation time); grouped by rank."""
    ranks = sorted({w["rank"] for r in runs for w in r.summary["per_worker"]})
    n = len(runs)
    fig = _figure(max(6.0, 0.9 * len(ranks) * max(1, n) * 0.6 + 3), 4.8)
    ax = fig.add_subplot()
    width = 0.8 / max(1, n)
    show_values = len(ranks) * n <= 24
    for i, run in enumerate(runs):
        by_rank = {w["rank"]: w for w in run.summary["per_worker"]}
        xs = [k + (i - (n - 1) / 2) * width for k, rank in enumerate(ranks) if rank in by_rank]
        ys = [by_rank[rank]["computing_time_ratio"] or 0.0 for rank in ranks if rank in by_rank]
        bars = ax.bar(xs, ys, width=width * 0.95, color=run.colour, label=run.label)
        if show_values:
            _bar_labels(ax, bars, [f"{y:.2f}" for y in ys])
    ticks = []
    for rank in ranks:
        workers = [w for r in runs for w in r.summary["per_worker"] if w["rank"] == rank]
        slowdowns = sorted({w["slowdown"] for w in workers})
        devices = sorted({str(w["device"]) for w in workers})
        ticks.append(f"rank {rank}\n{'/'.join(devices)} ×{'/'.join(f'{s:g}' for s in slowdowns)}")
    ax.set_xticks(range(len(ranks)), ticks)
    ax.set(title="Computing time ratio per worker", xlabel="worker (device, slowdown)",
           ylabel="compute ÷ (worker wall time − evaluation)", ylim=(0, 1.1))
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="upper left", ncols=min(n, 4), fontsize=8)
    return _save(fig, path)


def _plot_speedup(runs: Sequence[_Run], path: Path, target: float, metric: Metric) -> Path | None:
    """Speedup = time-to-target of the ``sync`` run ÷ each run's own."""
    base = next((r for r in runs if r.summary["mode"] == SPEEDUP_BASELINE), None)
    if base is None:
        warnings.warn(f"speedup.png skipped: no run with mode 'sync' among {[r.label for r in runs]}",
                      PlotWarning, stacklevel=3)
        return None
    if base.summary["time_to_target"].get(target_key(target)) is None:
        warnings.warn(f"speedup.png skipped: the sync run ({base.label}) never reached "
                      f"{metric.label} {target:g}", PlotWarning, stacklevel=3)
        return None
    factors = speedup({r.label: r.summary for r in runs}, baseline=base.label, target=target)
    fig = _figure(max(5.0, 1.3 * len(runs) + 2.5), 4.8)
    ax = fig.add_subplot()
    x = range(len(runs))
    values = [factors[r.label] or 0.0 for r in runs]
    bars = ax.bar(x, values, color=[r.colour for r in runs], width=0.6)
    texts = []
    for r in runs:
        f, tta = factors[r.label], r.summary["time_to_target"][target_key(target)]
        texts.append(f"{f:.2f}×\n{tta:,.0f} s to {target:g}" if f is not None else f"never reached {target:g}")
    _bar_labels(ax, bars, texts)
    ax.axhline(1.0, color="0.3", lw=1, ls="--")
    ax.set_xticks(list(x), [r.label for r in runs])
    ax.set(title=f"Speedup over {base.label} to {metric.label.split(' (')[0]} {target:g}",
           ylabel=f"time-to-target of {base.label} ÷ own (×)")
    ax.set_ylim(0, max(values + [1.0]) * 1.25)
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def _plot_timeline(run: _Run, path: Path) -> Path:
    """One lane per rank; each round's compute, wait, comm and evaluation time end to end
    (:func:`timeline_segments`) over :func:`timeline_window`."""
    workers = run.log.workers
    ranks = sorted(workers)
    t0, t1 = timeline_window(workers)
    span = max(t1 - t0, 1e-9)
    fig = _figure(13, 1.6 + 0.75 * len(ranks))
    ax = fig.add_subplot()
    ticks = []
    for lane, rank in enumerate(ranks):
        records = [r for r in workers[rank] if float(r["t_start"]) < t1]
        segments = timeline_segments(records, t1)
        y = len(ranks) - 1 - lane  # rank 0 on top
        for key, _, colour in PHASES:
            if segments[key]:
                # crisp pixel edges: hundreds of thin antialiased bars blur into a moiré
                ax.broken_barh(segments[key], (y - 0.35, 0.7), facecolors=colour,
                               edgecolors="none", antialiased=False)
        shares = " · ".join(
            f"{label} {sum(w for _, w in segments[key]) / span:.0%}"
            for key, label, _ in PHASES if key != "eval_s" or segments[key]
        )
        info = run.log.rank_info(rank)
        ticks.append((y, f"rank {rank} · {info['device']} · ×{float(info['slowdown']):g} · "
                         f"{len(records)} rounds\n{shares}"))
    ax.set_yticks([y for y, _ in ticks], [t for _, t in ticks], fontsize=8)
    ax.set_ylim(-0.6, len(ranks) - 0.4)
    ax.set_xlim(t0, t0 + span)
    whole = max((float(r["t_end"]) for recs in workers.values() for r in recs), default=t1) <= t1
    shown = (f"whole run, {span:.1f} s" if whole else
             f"first {span:.1f} s of training (at most {TIMELINE_MAX_SECONDS:g} s or "
             f"{TIMELINE_MAX_ROUNDS} rounds per worker)")
    ax.set(title=f"Timeline of {run.label}: {shown}", xlabel="time since run start (s)")
    ax.grid(axis="x", alpha=0.3)
    handles = [Patch(color=colour, label=label) for _, label, colour in PHASES]
    handles.append(Patch(facecolor="white", edgecolor="0.6", label="untracked"))
    fig.legend(handles=handles, loc="outside upper right", ncols=len(handles), fontsize=8, frameon=False)
    return _save(fig, path)


# --- entry points ---------------------------------------------------------------------------------

def plot_runs(
    run_dirs: Sequence[str | Path],
    out_dir: str | Path,
    labels: Sequence[str] | None = None,
    sequential: str | Path | None = None,
    target: float | None = None,
    sequential_label: str | None = None,
    ideal: float | None = None,
    speedup: bool = True,
) -> list[Path]:
    """Write the comparison figures of ``run_dirs`` into ``out_dir`` and return their paths:
    ``accuracy.png`` (``loss.png`` for runs judged by loss), ``throughput.png``, ``traffic.png``, ``computing_time_ratio.png``,
    ``speedup.png`` (at ``target``; skipped with a :class:`PlotWarning` when no run has mode
    ``sync`` or it never reached the target; by default the metric's second default target:
    accuracy 0.8, loss 2.0) and one ``timeline-{label}.png`` per run.

    A run's label is its mode unless ``labels`` are given (runs sharing a label get their run
    name appended). ``sequential`` is a one-device run directory drawn in the accuracy figure
    as a dashed line (labelled ``sequential_label``, by default "sequential SGD"); with
    ``ideal`` (a capacity ratio), also its curve with time divided by it, dotted: where a
    cluster of that capacity would be if every sample counted as one of the device's.
    ``speedup`` False: no ``speedup.png`` (runs at several horizons have a sync run each).
    """
    if not run_dirs:
        raise ValueError("plot_runs needs at least one run directory")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    runs, metric, target = _load(run_dirs, labels, target)
    seq = None
    if sequential is not None:
        log = read_run(sequential)
        seq = _Run(sequential_label or SEQUENTIAL_LABEL, log, summarize_log(log), "black")
    paths = [
        _plot_metric(runs, out / f"{metric.short}.png", seq, target, metric, ideal),
        _plot_throughput(runs, out / "throughput.png"),
        _plot_traffic(runs, out / "traffic.png"),
        _plot_computing_time_ratio(runs, out / "computing_time_ratio.png"),
    ]
    sp = speedup and _plot_speedup(runs, out / "speedup.png", target, metric)
    if sp:
        paths.append(sp)
    paths += [_plot_timeline(r, out / f"timeline-{_filename_part(r.label)}.png") for r in runs]
    return paths


def plot_run(run_dir: str | Path, out_dir: str | Path | None = None, target: float | None = None) -> list[Path]:
    """Write one run's figures (``accuracy.png`` or ``loss.png``, ``computing_time_ratio.png``,
    ``timeline-{mode}.png``) into ``out_dir`` (default: the run directory) and return their
    paths. ``target``, when given, is drawn as a line in the accuracy figure."""
    out = Path(run_dir if out_dir is None else out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (run,), metric, _ = _load([run_dir], None, target)
    return [
        _plot_metric([run], out / f"{metric.short}.png", None, target, metric),
        _plot_computing_time_ratio([run], out / "computing_time_ratio.png"),
        _plot_timeline(run, out / f"timeline-{_filename_part(run.label)}.png"),
    ]
