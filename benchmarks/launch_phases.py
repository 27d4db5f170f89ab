"""How long `hetsync launch` takes to start and to end: a 2-second run, timed by its output
lines and by when its run directory's files first appear.

    python benchmarks/launch_phases.py [--workers N] [--repo DIR] [--runs K]

Prints, per run, the seconds from the command's start to: config.json (launch's own start:
torch, the data, the emulation's fit and reference step), worker-0.jsonl (the first round
recorded: every process started, the rendezvous, the data, the initial evaluation),
summary.json, the command's exit, and the end of its output (what a caller reading it waits
for: a process that inherited it and lives on holds it open). `--repo`: another checkout to
time (its `.venv`), for a before/after on one machine.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

FILES = ("config.json", "worker-0.jsonl", "summary.json")


def one_run(repo: Path, workers: int) -> dict[str, float]:
    slowdowns = ",".join(str(2 ** (i % 4)) for i in range(workers))
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "r"
        cmd = [str(repo / ".venv" / "bin" / "python"), "-m", "hetsync", "launch",
               "--time-budget", "2", "--epochs", "none", "--no-figures", "--no-live", "--quiet",
               "--workers", str(workers), "--slowdowns", slowdowns, "-ld", tmp,
               "--run-name", "r"]
        start, started_at = time.monotonic(), time.time()
        proc = subprocess.Popen(cmd, cwd=repo, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)
        seen: dict[str, float] = {}

        def read() -> None:
            while proc.stdout.read(65536):
                pass
            seen["output closed"] = time.monotonic() - start

        reader = threading.Thread(target=read, daemon=True)
        reader.start()

        def watch() -> None:
            while proc.poll() is None:
                for name in FILES:
                    path = run / name
                    if name not in seen and path.exists() and path.stat().st_size:
                        seen[name] = time.monotonic() - start
                time.sleep(0.05)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        code = proc.wait()
        seen["exit"] = time.monotonic() - start
        watcher.join()
        reader.join()
        for name in FILES:  # (written in the watcher's last 50 ms: its time of writing)
            if name not in seen and (run / name).exists():
                seen[name] = (run / name).stat().st_mtime - started_at
    if code != 0:
        raise SystemExit(f"launch exited with code {code}")
    return seen


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--repo", type=Path, default=Path(__file__).resolve().parent.parent)
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()
    commit = subprocess.run(["git", "-C", str(args.repo), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    print(f"{args.repo} at {commit}, {args.workers} workers, 2-s budget, wall clock")
    print("| run | " + " | ".join(FILES) + " | exit | output closed |")
    print("|---|" + "---|" * (len(FILES) + 2))
    for k in range(args.runs):
        seen = one_run(args.repo, args.workers)
        print(f"| {k + 1} | " + " | ".join(f"{seen.get(n, float('nan')):.1f}"
                                           for n in (*FILES, "exit", "output closed")) + " |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
