"""A run's processes forked from one warm parent, so that each starts in a fraction of a second.

Every process of a `launch` runs `python -m hetsync ...` (a worker, the mode's service, the
evaluator), and each would import torch and the torch._dynamo the first optimizer imports:
about 4.5 s of CPU apiece on this project's 2-core machine, paid again by every rank of every
run. Here one server -- multiprocessing's forkserver, as the tests' ranks and torch's own
`torch.multiprocessing` use -- imports them once, in the background while `launch` measures
its reference step, and forks each process from that state:

1. :func:`warm_up` starts the server with :data:`PRELOAD` on every core of the caller's but
   one (it imports while the caller goes on: :func:`quiet_core` measures on the one left);
2. :func:`start` asks it for a child that takes the caller's environment, working directory,
   `sys.path` and cores as they are now (the server's are those of its own start), becomes a
   session of its own (so `killpg` stops it whole), dies with its parent, runs on the given
   cores, writes its output to its log and runs `hetsync ARGS` as `python -m hetsync` would;
3. the returned :class:`Child` answers `poll`, `wait` and `pid` as `subprocess.Popen` does,
   with the same exit codes (a signal's negative);
4. the server ends without Python's teardown once its caller has exited
   (`runtime/forkserver_exit.py`).

A child is a process of the server's, not of `launch`'s, and its /proc cmdline is the
server's: `launch` names each process's pid in `logs/pids.json` (`Cluster.pids`).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
from pathlib import Path

#: what the server imports once for every child (nothing that starts a thread; nothing above
#: this layer: the command line a child runs imports the rest)
PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "hetsync.runtime.worker",
           "hetsync.runtime.evaluation", "hetsync.runtime.forkserver_exit"]


def _context():
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)  # (once started, the server keeps its own)
    return ctx


_warming = False  # whether this process started the server (`warm_up`)
_quiet: set[int] = set()  # the core `warm_up` left the caller (empty: it left none)


def warm_up() -> None:
    """Start the server now, so that its imports overlap the caller's own work (`python -m
    hetsync launch` starts it before it imports torch itself: the two import side by side).
    Where the caller may run on several cores, the server starts on all but the first of
    them, which `quiet_core` keeps for a measurement meanwhile."""
    global _warming
    _context()
    from multiprocessing import forkserver

    if _warming:
        return
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) > 1:
        os.sched_setaffinity(0, cores[1:])  # (the server inherits it: its imports stay off
        try:                                # the core a measurement runs on)
            forkserver.ensure_running()
        finally:
            os.sched_setaffinity(0, cores)
        _quiet.update(cores[:1])
    else:
        forkserver.ensure_running()
    _warming = True


def _nothing() -> None:
    pass


def ready() -> None:
    """Wait until a server this process started has done its imports (its first fork comes
    after them). No-op where no server was started."""
    if _warming:
        child = _context().Process(target=_nothing, daemon=True)
        child.start()
        child.join()


@contextlib.contextmanager
def quiet_core(threads: int = 1):
    """Run the body (on `threads` threads) where the server's imports do not reach: on the
    core `warm_up` kept from them, else (one core, or more threads) once they are done. A
    step measured beside them on a shared core came out 20-40 % slower; on a core of its own,
    within the run-to-run spread (6.6-7.2 ms either way for LeNet here)."""
    if len(_quiet) < threads:
        ready()
        yield
        return
    cores = os.sched_getaffinity(0)
    os.sched_setaffinity(0, _quiet)
    try:
        yield
    finally:
        os.sched_setaffinity(0, cores)


def die_with_parent() -> None:
    """Ask Linux to SIGTERM this process when its parent dies, so that even a killed launcher
    leaves no worker behind (no-op elsewhere)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Child:
    """A forked child, answering as `subprocess.Popen` does where `launch` asks."""

    def __init__(self, process: multiprocessing.process.BaseProcess, args: list[str]):
        self._process, self.args = process, args
        self.pid = process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def send_signal(self, sig: int) -> None:
        if self._process.exitcode is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self._process.exitcode


def start(args: list[str], log: Path, *, append: bool, env: dict[str, str],
          cores: list[int] | None = None) -> Child:
    """Fork `hetsync ARGS` with `env` as its whole environment, its output to `log`, on
    `cores` (None: the caller's)."""
    cores = cores or sorted(os.sched_getaffinity(0))  # (not the server's: see `warm_up`)
    process = _context().Process(
        target=_run, args=(list(args), str(log), append, dict(env), cores, os.getcwd(),
                           list(sys.path)), name=f"hetsync {' '.join(args[:1])}")
    process.start()
    return Child(process, ["hetsync", *args])


def _run(args: list[str], log: str, append: bool, env: dict[str, str],
         cores: list[int] | None, cwd: str, path: list[str]) -> None:
    """The child: set up as `Popen(start_new_session=True, preexec_fn=...)` would, then run
    `hetsync.__main__` as `python -m hetsync ARGS` does (its exit code is the child's)."""
    # The server lives while any holder of its "alive" pipe does: each child is given one
    # (to start processes of its own), so a child that kept it would keep the server -- and
    # so itself, which dies with the server -- alive after launch died.
    from multiprocessing import forkserver

    alive = getattr(forkserver._forkserver, "_forkserver_alive_fd", None)
    if alive is not None:
        os.close(alive)
        forkserver._forkserver._forkserver_alive_fd = None
    os.setsid()
    die_with_parent()
    if cores:
        os.sched_setaffinity(0, cores)
    out = os.open(log, os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC),
                  0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    for fd, to in ((out, 1), (out, 2), (null, 0)):
        os.dup2(fd, to)
    os.close(out)
    os.close(null)
    for stream in (sys.stdout, sys.stderr):  # (as PYTHONUNBUFFERED: each line as written)
        stream.reconfigure(line_buffering=True, write_through=True)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    sys.path[:] = path
    sys.argv = [sys.executable, *args]
    runpy.run_module("hetsync", run_name="__main__", alter_sys=True)
