"""Chaos runs: `hetsync launch` under a seeded schedule of faults, beside the same run undisturbed.

For each mode and seed, two runs of the same cluster (3 workers, slowdowns 1, 2, 2, LeNet on
Fashion-MNIST): one left alone, one under a schedule of `--events` faults drawn from the seed
and spread over the middle of the time budget:

- ``kill-worker`` — kill -9 of a random worker, rank 0 among them;
- ``stop-worker`` — SIGSTOP of a random worker for 1-3 s, then SIGCONT (a pause, not a loss:
  it must not be taken for dead unless it outlasts `--timeout`);
- ``kill-state-server`` (ESync's modes) and ``kill-ps`` (parameter-server modes);
  (a kill of a worker is drawn twice as often as each other kind)
- ``kill-evaluator``.

A kill that would leave no worker is skipped. The regrouping modes (`regroups`, asked of the
registry) and the asynchronous ones go on without a killed worker (rank 0 too) — and where
the mode admits one `launch` starts it again and it joins the running job (`hetsync worker
--join`); the others are resumed from their last checkpoint by `launch` (`--max-restarts`),
as are the asynchronous modes when their parameter server is killed. Each run is judged by what a user
would check: `launch` exits 0 (not lost), within its budget plus the restarts' cost (not
hung: `--timeout` bounds every wait), one accuracy curve (no training time twice in
`eval.jsonl`) to the budget, a complete summary, the data ledger's batches drawn twice and
skipped, and the final accuracy against the undisturbed run's. The table goes to stdout and,
with `--out`, to a Markdown file.

    .venv/bin/python benchmarks/chaos.py --modes esync-outer,async,sync --seeds 0,1 \\
        --budget 60 --events 6 --out results/chaos.md

`--at-rounds` puts faults at chosen rounds instead, on the virtual clock: workers 1, 2 and 0
exit (`HETSYNC_FAULT`, as a crash: no goodbye) at a quarter, a half and three quarters of the
rounds each recorded in its undisturbed twin, which runs first (rank 0's left out where it
would be the last worker: a mode that neither admits a worker back nor resumes). A virtual
run's devices keep their nominal speeds whatever the machine does, so the twins are the same
run up to the first fault: the accuracy at equal samples compares what the faults did, not
this machine's speed from one run to the next (0.7-1.4 points between undisturbed runs of
the same seed on the wall clock).

What it does not do: add a worker that was never part of the run (`--spare-workers`:
`benchmarks/spare_bench.py`).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _as_launched(mode: str):
    from hetsync.config import Config

    return Config(mode=mode, workers=3)


def has_ps(mode: str) -> bool:
    """Whether `mode` runs a parameter server (as `run` launches it)."""
    return _as_launched(mode).needs_ps


def service(mode: str) -> str | None:
    """The name of the process `launch` runs beside `mode`'s workers (ESync's state server)."""
    svc = _as_launched(mode).spec.service
    return None if svc is None else svc.name


def regroups(mode: str) -> bool:
    """Whether `mode`'s workers regroup without a lost one, any rank (as `run` launches it):
    asked of the registry, so a mode that learns to go on is scheduled as one."""
    return _as_launched(mode).regroups


@dataclass
class Event:
    at: float      # seconds after the run's first record
    kind: str
    rank: int | None = None
    pause: float = 0.0

    def describe(self) -> str:
        who = f" rank {self.rank}" if self.rank is not None else ""
        return f"{self.at:5.1f} s {self.kind}{who}" + (f" {self.pause:.1f} s" if self.pause else "")


def schedule(mode: str, seed: int, budget: float, events: int, workers: int) -> list[Event]:
    """`events` faults for `mode`, at times in [0.15, 0.8] of `budget`, from `seed`."""
    rng = random.Random(seed)
    kinds = ["kill-worker", "kill-worker", "stop-worker", "kill-evaluator"]  # (kills twice as
    if has_ps(mode):                                                          # often)
        kinds.append("kill-ps")
    elif service(mode) == "state-server":
        kinds.append("kill-state-server")
    times = sorted(rng.uniform(0.15, 0.8) * budget for _ in range(events))
    out = []
    for at in times:
        kind = rng.choice(kinds)
        rank = rng.randrange(workers) if kind.endswith("worker") else None
        out.append(Event(at, kind, rank, rng.uniform(1.0, 3.0) if kind == "stop-worker" else 0))
    return out


def running(pid: int) -> bool:
    """Whether `pid` is a process that has not exited (not a zombie)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def target(run_dir: Path, event: Event) -> int | None:
    """The pid the event hits among the run's processes, as launch names them in
    logs/pids.json (None: not running now)."""
    try:
        pids = json.loads((run_dir / "logs" / "pids.json").read_text())
    except (OSError, ValueError):
        return None
    name = {"kill-ps": "ps", "kill-state-server": "state-server",
            "kill-evaluator": "evaluator"}.get(event.kind, f"rank-{event.rank}")
    pid = pids.get(name)
    return pid if pid is not None and running(pid) else None


@dataclass
class Outcome:
    mode: str
    seed: int
    chaos: bool
    code: int = -1
    wall: float = 0.0
    applied: list[str] = field(default_factory=list)
    restarts: int = 0
    lost: list[int] = field(default_factory=list)
    joined: list[int] = field(default_factory=list)
    final: float | None = None
    one_curve: bool = False
    complete: bool = False
    reached_budget: bool = False
    ledger: dict | None = None   # summary.json's data ledger
    samples: int | None = None   # samples trained (every worker's)
    curve: list[tuple[int, float]] = field(default_factory=list)  # (samples seen, accuracy)


def at_rounds(mode: str, calm_dir: Path, workers: int) -> str:
    """`HETSYNC_FAULT`'s value for `--at-rounds`: ranks 1, 2, 0 exit at 1/4, 1/2, 3/4 of the
    rounds each recorded in the undisturbed run `calm_dir` (rank 0's left out where the mode
    would go on with no worker: one that neither admits nor is resumed by launch)."""
    def last_round(rank: int) -> int:
        lines = (calm_dir / f"worker-{rank}.jsonl").read_text().splitlines()
        return max(json.loads(line).get("round", 0) for line in lines if line.strip())

    cfg = _as_launched(mode)
    last_worker = cfg.regroups and not cfg.admits_workers
    plan = [(1, 0.25), (2, 0.5)] + ([] if last_worker else [(0, 0.75)])
    return ",".join(f"{rank}:{max(1, int(share * last_round(rank)))}:exit"
                    for rank, share in plan if rank < workers)


def run(mode: str, seed: int, args, events: list[Event], faults: str = "") -> Outcome:
    """One run of `mode` under `events` or, on the virtual clock, `faults` (HETSYNC_FAULT's
    value; neither: undisturbed); `args`: budget, timeout, log_dir, events (the restarts
    allowed), at_rounds."""
    chaos = bool(events or faults)
    events = list(events)
    name = f"chaos-{mode}-s{seed}-{'chaos' if chaos else 'calm'}"
    run_dir = Path(args.log_dir) / name
    workers = 3
    cmd = [sys.executable, "-m", "hetsync", "launch", "-m", mode, "--workers", str(workers),
           "--slowdowns", "1,2,2", "--time-budget", str(args.budget), "--seed", str(seed),
           "--eval-interval", "1", "--checkpoint-every", "5", "--timeout", str(args.timeout),
           "--regroup-grace", "2", "--max-restarts", str(args.events + 1),
           "-ld", args.log_dir, "--run-name", name, "--quiet", "--no-figures", "--no-live"]
    if args.lr_schedule is not None:
        cmd += ["--lr-schedule", args.lr_schedule]
    if args.at_rounds:  # (the reference step given, not measured: each twin the same devices)
        cmd += ["--clock", "virtual", "--step-work", "0.006"]
    out = Outcome(mode, seed, chaos)
    if faults:
        out.applied.append(" ".join(f"rank {f.split(':')[0]} exits after round "
                                    f"{f.split(':')[1]};" for f in faults.split(","))[:-1])
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, "HETSYNC_FAULT": faults})
    first = None
    killed: set[int] = set()
    joined_before: dict[int, int] = {}
    # (a hang is what --timeout must prevent: give up on the run well after it)
    deadline = (start + args.budget * (10 if args.at_rounds else 3)
                + args.timeout * (2 + args.events) + 120)
    while proc.poll() is None and time.monotonic() < deadline:
        if first is None and (run_dir / "worker-0.jsonl").exists():
            first = time.monotonic()
        killed -= {r for r in killed if joins(run_dir, r) > joined_before.get(r, 0)}
        while first is not None and events and time.monotonic() - first >= events[0].at:
            event = events.pop(0)
            if event.kind == "kill-worker" and len(killed | {event.rank}) >= workers:
                out.applied.append(event.describe() + " (skipped: the last worker)")
                continue
            pid = target(run_dir, event)
            if pid is None:
                out.applied.append(event.describe() + " (not running)")
                continue
            if event.kind == "stop-worker":
                os.kill(pid, signal.SIGSTOP)
                time.sleep(event.pause)
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:  # killed while stopped (the run's end stops all)
                    pass
            else:
                os.kill(pid, signal.SIGKILL)
                if not regroups(mode) and (event.kind == "kill-ps" or not has_ps(mode)):
                    killed.clear()  # the run stops, and launch resumes it with every worker
                elif event.kind == "kill-worker":
                    killed.add(event.rank)  # (until it joins again, where the mode admits it)
                    joined_before[event.rank] = joins(run_dir, event.rank)
            out.applied.append(event.describe())
        time.sleep(0.1)
    if proc.poll() is None:  # hung
        proc.kill()
    text = proc.communicate()[0]
    out.code, out.wall = proc.returncode, time.monotonic() - start
    out.restarts = text.count("resuming the run from its last checkpoint")
    if run_dir.exists():
        (run_dir / "chaos.log").write_text("\n".join(out.applied) + "\n\n" + text)
    try:
        evals = [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines()]
        times = [e["train_time"] for e in evals]
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return out
    out.one_curve = len(times) == len(set(times))
    out.reached_budget = bool(times) and max(times) >= args.budget
    out.final = summary.get("final_accuracy")
    out.complete = bool(summary.get("complete"))
    out.lost = summary.get("lost_workers") or []
    out.joined = summary.get("joined_workers") or []
    out.ledger = summary.get("ledger")
    out.samples = summary.get("samples")
    out.curve = [(e["samples_seen"], e["test_acc"]) for e in evals if "samples_seen" in e]
    return out


def at_samples(curve: list[tuple[int, float]], samples: int) -> float | None:
    """The accuracy of an evaluation curve at `samples` samples seen (linear between its
    evaluations; None past its end)."""
    import numpy as np

    if not curve or samples > curve[-1][0]:
        return None
    seen, acc = zip(*sorted(curve))
    return float(np.interp(samples, seen, acc))


def joins(run_dir: Path, rank: int) -> int:
    """How many times `rank` has joined the running job (its log says so each time)."""
    try:
        return (run_dir / "logs" / f"rank-{rank}.log").read_text().count("joined the run at")
    except OSError:
        return 0


def _ledger(ledger: dict | None) -> str:
    return "-" if not ledger else f"{ledger['batches_twice']} / {ledger['batches_skipped']}"


def table(outcomes: list[Outcome], budget: float) -> str:
    rows = ["| mode | seed | run | events applied | launch exit | wall s | restarts | lost "
            "workers | joined again | one curve to the budget | complete | batches twice / "
            "skipped | samples trained | final accuracy | vs undisturbed | vs undisturbed at "
            "equal samples |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    calm = {(o.mode, o.seed): o for o in outcomes if not o.chaos}
    for o in outcomes:
        ref = calm.get((o.mode, o.seed))
        delta = (f"{100 * (o.final - ref.final):+.2f} pt" if o.chaos and o.final is not None
                 and ref is not None and ref.final is not None else "")
        # (the undisturbed run's accuracy when it had seen as many samples as this one)
        equal = (at_samples(ref.curve, o.curve[-1][0]) if o.chaos and ref is not None
                 and o.curve else None)
        at_equal = f"{100 * (o.curve[-1][1] - equal):+.2f} pt" if equal is not None else ""
        applied = "; ".join(o.applied) if o.chaos else "none"
        rows.append(f"| {o.mode} | {o.seed} | {'chaos' if o.chaos else 'undisturbed'} | "
                    f"{applied} | {o.code} | {o.wall:.0f} | {o.restarts} | "
                    f"{','.join(map(str, o.lost)) or '-'} | "
                    f"{','.join(map(str, o.joined)) or '-'} | "
                    f"{'yes' if o.one_curve and o.reached_budget else 'NO'} | "
                    f"{'yes' if o.complete else 'NO'} | "
                    f"{_ledger(o.ledger)} | "
                    f"{'-' if o.samples is None else f'{o.samples / 1000:.0f}k'} | "
                    f"{'' if o.final is None else f'{o.final:.4f}'} | {delta} | {at_equal} |")
    chaos = [o for o in outcomes if o.chaos]
    lost = sum(o.code != 0 for o in chaos)
    hung = sum(o.wall > budget * 3 + 120 for o in chaos)
    rows.append("")
    rows.append(f"{len(chaos)} chaos runs, {sum(len(o.applied) for o in chaos)} events: "
                f"{lost} run(s) lost (launch exit != 0), {hung} hung past the bound, "
                f"{sum(not (o.one_curve and o.reached_budget) for o in chaos)} without one "
                f"curve to the budget")
    return "\n".join(rows)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--modes", default="esync-outer,async,sync")
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--budget", type=float, default=60.0, help="each run's time budget (s)")
    p.add_argument("--events", type=int, default=6, help="faults per chaos run")
    p.add_argument("--timeout", type=float, default=15.0, help="the runs' --timeout")
    p.add_argument("--lr-schedule", help="the runs' --lr-schedule (default: launch's). A "
                   "schedule by time trains a chaos run's samples later in it, at other rates "
                   "than its twin's at equal samples; `constant` leaves the faults alone to "
                   "tell them apart")
    p.add_argument("--at-rounds", action="store_true",
                   help="faults at chosen rounds on the virtual clock instead of kills by the "
                        "wall clock (the module docstring); --events is then unused")
    p.add_argument("-ld", "--log-dir", default="runs/chaos")
    p.add_argument("--out", help="also write the table to this Markdown file")
    args = p.parse_args()
    outcomes = []
    for mode in args.modes.split(","):
        for seed in map(int, args.seeds.split(",")):
            for chaos in (False, True):
                events = (schedule(mode, seed, args.budget, args.events, 3)
                          if chaos and not args.at_rounds else [])
                faults = (at_rounds(mode, Path(args.log_dir) / f"chaos-{mode}-s{seed}-calm", 3)
                          if chaos and args.at_rounds else "")
                o = run(mode, seed, args, events, faults)
                print(f"{mode} seed {seed} {'chaos' if chaos else 'calm'}: exit {o.code}, "
                      f"{o.wall:.0f} s, final {o.final}, events {o.applied}", flush=True)
                outcomes.append(o)
    text = table(outcomes, args.budget)
    print(text)
    if args.out:
        Path(args.out).write_text(f"Chaos runs (`benchmarks/chaos.py {' '.join(sys.argv[1:])}`)"
                                  f"\n\n{text}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
