"""Start a PyTorch baseline (:mod:`hetsync.bench.peers`) as a local cluster, like `launch`.

:func:`launch_peer` starts one process per worker (``python -m hetsync.bench.peer_launch``
with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT on loopback, through
:class:`hetsync.runtime.launcher.Cluster`), watches them, and stops every one as soon as one
fails (its log's last lines go into the :class:`LaunchError`), so a crash never leaves the
others hanging in a collective. The run directory is then summarised as hetsync's own runs are.

Run as a module, this file is the child process::

    python -m hetsync.bench.peer_launch --config RUN_DIR/config.json --run-dir RUN_DIR \\
        --baseline ddp [--period 8 --warmup-steps 0]
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import sys
import time
from pathlib import Path

from hetsync.bench.peers import BASELINES, PeerOptions, run_peer_process
from hetsync.config import Config
from hetsync.runtime.launcher import Cluster, LaunchError, finish_run, free_port, prepare_run_dir


def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no log at {path})"


class PeerCluster(Cluster):
    """The worker processes of one baseline run (no state server, no parameter server)."""

    module = "hetsync.bench.peer_launch"

    def __init__(self, cfg: Config, run_dir: Path, opts: PeerOptions):
        super().__init__(cfg, run_dir)
        self.opts = opts

    def start_ranks(self, config_path: Path) -> None:
        master_port = free_port()
        for rank in range(self.cfg.workers):
            self._spawn(f"rank-{rank}", [
                "--config", str(config_path), "--run-dir", str(self.run_dir),
                "--baseline", self.opts.baseline, "--period", str(self.opts.period),
                "--warmup-steps", str(self.opts.warmup_steps)], env={
                "RANK": str(rank), "WORLD_SIZE": str(self.cfg.workers),
                "LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(master_port)})


def peer_config(cfg: Config) -> Config:
    """`cfg` as the baseline processes read it: `mode` is a placeholder (`sync`, which passes
    validation with any number of workers); run.json names the baseline."""
    return dataclasses.replace(cfg, mode="sync", collective="native")


def launch_peer(cfg: Config, opts: PeerOptions, *, progress=None, figures: bool = False,
                stream=None) -> Path:
    """Run baseline `opts.baseline` with `cfg` on a local cluster; return its run directory.

    `progress`, when given, is called every half second while the run goes (e.g. a
    :class:`hetsync.bench.progress.RunProgress`'s ``update``). The summary table goes to
    `stream` (default: discarded). Raises LaunchError when a process fails.
    """
    opts.validate()
    if cfg.run_name is None:
        cfg = dataclasses.replace(
            cfg, run_name=f"{opts.baseline}-{cfg.network}-{time.strftime('%Y%m%d-%H%M%S')}")
    cfg = peer_config(cfg).validate()
    cfg, run_dir = prepare_run_dir(cfg)
    cfg.save(run_dir / "config.json")
    cluster = PeerCluster(cfg, run_dir, opts)
    try:
        cluster.start_ranks(run_dir / "config.json")
        while not cluster.done():
            failure = cluster.failed()
            if failure is not None:
                name, code = failure
                cluster.stop()
                raise LaunchError(f"{opts.baseline}: {name} exited with code {code}; the others "
                                  f"were stopped. Its log ({cluster.logs / (name + '.log')}) "
                                  f"ends with:\n{_tail(cluster.logs / (name + '.log'))}")
            if progress is not None:
                progress()
            time.sleep(0.5)
    finally:
        cluster.stop()
    finish_run(run_dir, figures=figures, stream=stream or io.StringIO())
    return run_dir


def main(argv: list[str] | None = None) -> int:
    """The child process: one worker of a baseline run."""
    parser = argparse.ArgumentParser(prog="python -m hetsync.bench.peer_launch",
                                     description="One worker of a PyTorch baseline run.")
    parser.add_argument("--config", required=True, help="the run's config.json")
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--baseline", required=True, choices=BASELINES)
    parser.add_argument("--period", type=int, default=8)
    parser.add_argument("--warmup-steps", type=int, default=0)
    args = parser.parse_args(argv)
    opts = PeerOptions(args.baseline, args.period, args.warmup_steps)
    run_peer_process(Config.load(args.config), opts, args.run_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
