"""`hetsync launch`: a whole cluster on this machine.

Starts the service the mode declares (`ModeSpec.service`, e.g. ESync's planner; started again
when it dies), then one `hetsync worker` process per rank (the last one is the parameter
server when the run needs one) — with `--bandwidth`,
each on its own emulated host behind a rate-limited link (`runtime/network.py`) — and, with
`--evaluator 1`, the evaluator (`hetsync evaluate --follow`, at the lowest CPU priority) once
rank 0 has started the run; shows one progress line for the cluster, and stops every child on
Ctrl-C or as soon as a worker fails (its log's last lines are shown) where the mode cannot go
on without it — then resumes the run from its last checkpoint (or, stopped before its first,
starts it again from its start), up to `max_restarts` times; a worker whose training loss
diverged stops the run for good (a restart would diverge again).
It hosts the workers' key-value store itself, so that no worker's loss takes the store with
it (`runtime/membership.py`), and marks there the workers it saw die. At the end it waits for
the evaluator to finish the last snapshots (or evaluates them itself if the evaluator died),
summarises the run directory, draws the figures and prints the summary table.
"""

from __future__ import annotations

import contextlib
import dataclasses
import secrets
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from hetsync.algorithms.base import ControlPath
from hetsync.config import FINISH_S, Config
from hetsync.options import ConfigError
from hetsync.runtime import forked
from hetsync.runtime.training import DIVERGED_EXIT_CODE
from hetsync.runtime.worker import default_run_name
from hetsync.serving import is_loopback
from hetsync.telemetry.progress import ClusterProgress
from hetsync.telemetry.recorder import write_json_atomic
from hetsync.telemetry.rundir import RunDir


class LaunchError(RuntimeError):
    pass


class PortTaken(LaunchError):
    """Another run's service holds the port a restarted one must keep (the workers')."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def _child_setup(cores: list[int] | None):
    """What a child runs before exec: die with the launcher, and run on `cores` (None: where
    the launcher may; `runtime/emulation.py` places emulated devices)."""
    def setup() -> None:
        forked.die_with_parent()
        if cores:
            os.sched_setaffinity(0, cores)
    return setup


class _Terminated(BaseException):
    """SIGTERM reached the launcher: shut down as for Ctrl-C (a BaseException, as
    KeyboardInterrupt is: no `except Exception` on the way swallows it)."""


#: while a child is forked (`stop_signals_held`): the stop signals taken meanwhile
_deferred: list[int] | None = None


def _on_stop_signal(signum, frame):
    """Ctrl-C or SIGTERM reached the launcher: raise KeyboardInterrupt or `_Terminated`, or
    while a child is forked, note it for `stop_signals_held` to raise."""
    if _deferred is not None:
        _deferred.append(signum)
        return
    raise KeyboardInterrupt if signum == signal.SIGINT else _Terminated()


@contextlib.contextmanager
def stop_signals_held():
    """Take Ctrl-C and SIGTERM only once the child forked inside is recorded.

    A `preexec_fn` makes Popen run Python's at-fork handlers, and an exception a signal handler
    raises inside one is printed and dropped: a SIGTERM landing there was lost and the launcher
    went on. (A mask would not do: the store's and the progress's threads take the signal, and
    the main thread's handler still runs at its next bytecode, in the at-fork handler.)"""
    global _deferred
    _deferred = []
    try:
        yield
    finally:
        taken, _deferred = _deferred, None
        if taken:
            _on_stop_signal(taken[0], None)


def _last_line(path: Path) -> str:
    """`path`'s last non-empty line, cut to 160 characters ('no log' where there is none)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
            lines = [x for x in f.read().decode(errors="replace").splitlines() if x.strip()]
    except OSError:
        return "no log"
    return f"its log ends: {lines[-1].strip()[:160]}" if lines else "its log is empty"


def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no log at {path})"


class Cluster:
    """The child processes of one local run."""

    #: The module every child runs as `python -m MODULE ARGS...` (a subclass may start another).
    module = "hetsync"

    #: the child that evaluates for the workers: the run goes on when it fails (the launcher
    #: evaluates what it left)
    EVALUATOR = "evaluator"
    #: the parameter server's process (the last rank), where the mode has one: it trains
    #: nothing, so a run whose workers are all lost cannot go on with it alone
    PS = "ps"

    def __init__(self, cfg: Config, run_dir: Path, network=None, resume: bool = False,
                 rejoins: int = 0):
        self.cfg, self.run_dir, self.resume = cfg, run_dir, resume
        #: how many times each lost worker is started again to join the running job (where
        #: the mode admits one: `Config.admits_workers`)
        self.rejoins = rejoins if cfg.admits_workers else 0
        self.rejoined: dict[str, int] = {}
        #: a worker started to join: its log's length then (it says there when it joined)
        self.joining: dict[str, int] = {}
        #: the spares still to start (`--spare-workers`; a resumed run starts every rank)
        self.spares = [] if resume else cfg.spare_ranks
        self.started = time.time()
        #: when this attempt's first record appeared (training had begun): the watchdog's start
        self.first_record: float | None = None
        self.logs = RunDir(run_dir).logs
        self.logs.mkdir(parents=True, exist_ok=True)
        self.procs: dict[str, subprocess.Popen | forked.Child] = {}  # (forked, or exec'd)
        #: the service the mode declares, its port once started, and its restarts so far
        self.service = cfg.spec.service
        self.service_port: int | None = None
        self.service_restarts = 0
        self.lost: set[str] = set()  # workers that died in a mode that goes on without them
        self.store = None  # torch's key-value store of the workers (`start_ranks`)
        #: a `runtime.network.LimitedNetwork`: rank k runs on its host k (None: loopback)
        self.network = network
        #: the service's shared secret, given to every child: the user's own, or a fresh one
        #: when the service listens on an address other machines could reach
        self.token = os.environ.get("HETSYNC_TOKEN") or (
            None if is_loopback(cfg.service_ip) else secrets.token_urlsafe(24))
        from hetsync.runtime.emulation import affinities

        #: each child's cores, by name (the emulated devices' placement)
        self.cores = affinities(cfg)

    def _spawn(self, name: str, args: list[str], env: dict | None = None,
               host: int | None = None, argv: list[str] | None = None):
        """Start `python -m MODULE ARGS...` (or `argv`) as the child `name`: forked from the
        warm parent (`runtime/forked.py`) where it is hetsync's command on this host, else
        exec'd (an emulated host's runs behind `ip netns exec`)."""
        again = self.resume or name in self.procs  # (a restart keeps what the last one said)
        argv = argv if argv is not None else [sys.executable, "-m", self.module, *args]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {}),
               **({"HETSYNC_TOKEN": self.token} if self.token else {})}
        log_path = self.logs / f"{name}.log"
        with stop_signals_held():  # (recorded before a stop is taken: `stop` ends it)
            if host is None and argv[:3] == [sys.executable, "-m", "hetsync"]:
                proc = forked.start(argv[3:], log_path, append=again, env=env,
                                    cores=self.cores.get(name))
            else:
                if host is not None:
                    argv = self.network.command(host, argv)
                with open(log_path, "a" if again else "w") as log:
                    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, env=env,
                                            start_new_session=True,
                                            preexec_fn=_child_setup(self.cores.get(name)))
            self.procs[name] = proc
        write_json_atomic(RunDir(self.run_dir).pids,
                          {n: p.pid for n, p in self.procs.items() if p.poll() is None})
        return proc

    def start_service(self, port: int | None = None, restart: bool = False) -> int:
        """Start the mode's service (on `port`; a `restart` keeps the workers' port)."""
        svc, host = self.service, self.cfg.service_ip
        if port is None:
            port = self.cfg.service_port
            if not _port_free(host, port):
                port = free_port(host)  # another run holds the default port: take any free one
        instance = secrets.token_hex(8)  # (its /healthz says it: ours, not another run's)
        proc = self._spawn(svc.name, [], argv=svc.command(host, port, self.cfg.workers,
                                                          self.cfg.mode_options(), instance))
        self.service_port = port
        client = svc.connect(host, port, 5.0, self.token)
        deadline = time.monotonic() + 30
        try:
            while True:  # (not waiting for one that exited)
                try:
                    answer = client.wait_until_up(deadline_s=0.5)
                except Exception as err:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise LaunchError(f"the {svc.title} did not start:\n"
                                          f"{_tail(self.logs / f'{svc.name}.log')}") from err
                    continue
                if answer.get("instance") == instance:
                    return port
                # another run's service, started on the port since we found it free: ours
                # cannot listen there (a restart must keep the workers' port)
                proc.kill()
                proc.wait()
                if restart:
                    raise PortTaken(f"the {svc.title} cannot be started again on port {port}: "
                                    f"another run's holds it now")
                return self.start_service(free_port(host))
        finally:
            client.close()

    def restart_service(self) -> bool:
        """Start the service that died again on its port; False once its restarts ran out.
        One that dies again as it starts (killed again) is the next look's to restart."""
        if self.service_restarts >= self.service.restarts:
            return False
        self.service_restarts += 1
        try:
            self.start_service(self.service_port, restart=True)
        except PortTaken:
            raise
        except LaunchError:
            if self.procs[self.service.name].poll() is None:
                raise  # running, but not answering
        return True

    def start_ranks(self, config_path: Path) -> None:
        import datetime

        import torch.distributed as dist

        world = self.cfg.world_size
        net = self.network
        # torch's key-value store lives here, not in rank 0's process (where torch puts it), so
        # that any worker may be lost (runtime/membership.py); the workers connect to it as
        # torchrun's do to its agent's. (Like torch's own, it listens on every interface.)
        store_host = "127.0.0.1" if net is None else net.bridge_address
        self.store = dist.TCPStore(store_host, 0, is_master=True, wait_for_workers=False,
                                   timeout=datetime.timedelta(seconds=self.cfg.timeout))
        self.config_path = config_path
        for rank in range(world):
            if rank not in self.spares:
                self._start_rank(rank)

    def start_spares(self) -> list[int]:
        """Start the spares to join the run once it has run `--spare-start` seconds (by
        its run.json's start); the ranks started now."""
        if not self.spares:
            return []
        try:
            run = json.loads(RunDir(self.run_dir).run.read_text())
        except (OSError, ValueError):
            return []  # (not written yet, or being replaced)
        start = run.get("start_time")
        if start is None or start < self.started - 1.0 or \
                time.time() - start < self.cfg.spare_start:
            return []
        started, self.spares = self.spares, []
        for rank in started:
            self.joining[f"rank-{rank}"] = 0
            self._start_rank(rank, join=True)
        return started

    def _start_rank(self, rank: int, join: bool = False) -> None:
        """Start rank `rank`'s process (`join`: a lost worker's, joining the running job)."""
        world, net = self.cfg.world_size, self.network
        name = self.PS if self.cfg.needs_ps and rank == world - 1 else f"rank-{rank}"
        args = ["worker", "--config", str(self.config_path),
                "--resume" if self.resume and not join else "--run-dir", str(self.run_dir)]
        if join:
            args.append("--join")
        if self.service_port is not None:
            args += ["-port", str(self.service_port)]
        env = {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
               "MASTER_ADDR": self.store.host, "MASTER_PORT": str(self.store.port),
               "TORCHELASTIC_USE_AGENT_STORE": "True"}
        if net is not None:  # gloo would look its address up by the machine's name
            env["GLOO_SOCKET_IFNAME"] = net.interface
        self._spawn(name, args, env=env, host=None if net is None else rank)

    def ranks(self) -> dict[str, subprocess.Popen]:
        helpers = (self.EVALUATOR, *((self.service.name,) if self.service else ()))
        return {k: p for k, p in self.procs.items() if k not in helpers}

    def start_evaluator(self) -> None:
        """Start the evaluator with the workers where the run evaluates in one (`--evaluator
        1`, deferred evaluation), so that its start (torch, the data, the model) is not at
        the run's end; it evaluates once rank 0 has started this attempt (its run.json newer
        than the launch: a resumed run's rank 0 first cuts eval.jsonl back)."""
        if self.cfg.evaluator and self.cfg.deferred:
            self._spawn(self.EVALUATOR, ["evaluate", str(self.run_dir), "--follow",
                                         "--start-after", f"{self.started - 1.0:.3f}"])

    def finish_evaluation(self, progress, stream) -> None:
        """After the workers: wait for the evaluator to evaluate the last snapshots; evaluate
        what a failed one left here."""
        proc = self.procs.get(self.EVALUATOR)
        while proc is not None and proc.poll() is None:
            progress.update()
            try:
                proc.wait(0.2)
            except subprocess.TimeoutExpired:
                pass
        from hetsync.runtime.evaluation import follow, pending

        if pending(self.run_dir):
            print(f"\nthe evaluator left {len(pending(self.run_dir))} snapshot(s); evaluating "
                  f"them here", file=stream, flush=True)
            follow(self.run_dir, until_end=False)

    def overdue(self) -> str | None:
        """The watchdog: once a wall-clock run has gone on past its --time-budget by more
        than `Config.finish_grace`, what it is still waiting for -- each process still
        running, with its log's last line; else None. The budget counts from this attempt's
        first record (so a resumed run's bound is looser); an evaluation written after it
        (the leader evaluating the deferred snapshots) moves the bound on by as much."""
        grace = self.cfg.finish_grace
        if grace is None:
            return None
        if self.first_record is None:
            for records in RunDir(self.run_dir).worker_files():
                if records.stat().st_mtime >= self.started and records.stat().st_size:
                    self.first_record = time.time()
                    break
            return None
        end = self.first_record + self.cfg.time_budget
        try:
            end = max(end, RunDir(self.run_dir).eval.stat().st_mtime)
        except OSError:
            pass
        if time.time() - end <= grace:
            return None
        over = time.time() - self.first_record - self.cfg.time_budget
        waiting = [f"{name} ({_last_line(self.logs / f'{name}.log')})"
                   for name, proc in self.procs.items()
                   if proc.poll() is None and name not in self.lost]
        source = "--grace" if self.cfg.grace is not None else f"--timeout + {FINISH_S:g} s"
        return (f"the run passed its --time-budget {self.cfg.time_budget:g} s by {over:.0f} "
                f"s, more than its grace of {grace:g} s ({source}); still running: "
                f"{'; '.join(waiting) or 'none'}")

    def dump_stacks(self) -> None:
        """Ask every rank still running to print its threads' stacks to its log (SIGUSR1:
        the worker's faulthandler), and give them a moment to."""
        for name, proc in self.ranks().items():
            if proc.poll() is None:
                try:
                    os.kill(proc.pid, signal.SIGUSR1)
                except ProcessLookupError:
                    pass
        time.sleep(1.0)

    def failed(self) -> tuple[str, int] | None:
        """A process that failed (name, exit code), not one already lost; where several have
        by now, one a signal ended (a kill is the cause; the others' errors followed it: a
        forked child's status reaches launch through its parent, a moment late)."""
        failures = [(name, code) for name, proc in self.procs.items()
                    if (code := proc.poll()) not in (None, 0) and name not in self.lost]
        return min(failures, key=lambda f: f[1] >= 0, default=None)

    def done(self) -> bool:
        return all(p.poll() == 0 for name, p in self.ranks().items() if name not in self.lost)

    def lose(self, name: str) -> bool:
        """Go on without the worker `name` that died, where the mode can: one whose workers
        regroup (`Config.regroups`: ESync in the background, eager-SGD), or an asynchronous
        mode (each worker talks only to the parameter server, agreement through the store)
        — any worker, rank 0 included (the lowest survivor leads on; the store lives here).
        Whether it can."""
        rank = name.removeprefix("rank-")
        if not rank.isdigit():
            return False
        asynchronous = self.cfg.needs_ps and self.cfg.spec.asynchronous
        if not (self.cfg.regroups or asynchronous):
            return False
        records = RunDir(self.run_dir).worker(rank)
        if name not in self.joining and not (
                records.exists() and records.stat().st_size > 0
                and records.stat().st_mtime >= self.started):  # (a resumed run's are older)
            return False  # it died setting up: the others wait for it in a collective
        others = [o for o in self.ranks() if o not in (name, self.PS)]
        if not any(self._member(other) for other in others) and not (
                asynchronous and (any(self._joining(other) for other in others)
                                  or self.may_rejoin(name))):
            # nobody left to go on, or to let a joiner in (an asynchronous mode's server
            # lets one in alone: another started to join, or this one, started again).
            # (The server, alone, once waited out its --timeout for a worker.)
            return False

        self.lost.add(name)
        # the others need not wait for it (`membership.shared`: the workers read these keys
        # under torch's prefixes)
        from hetsync.runtime.membership import JOIN, LOST
        from hetsync.runtime.server_link import ASK

        self.store.set(f"{LOST}/{rank}", "1")
        for key in (JOIN, ASK):  # (one that died asking to join; the server would answer)
            self.store.delete_key(f"{key}/{rank}")
        return True

    def _member(self, name: str) -> bool:
        """Whether worker `name` is running as a member of the job (not lost, and not a
        process started to join that has not joined yet)."""
        if name in self.lost or self.procs[name].poll() is not None:
            return False
        if name not in self.joining:
            return True
        return b"joined the run at round" in (self.logs / f"{name}.log").read_bytes()[
            self.joining[name]:]

    def _joining(self, name: str) -> bool:
        """Whether worker `name` is a process started to join that is still running."""
        return name in self.joining and name not in self.lost and \
            self.procs[name].poll() is None

    def may_rejoin(self, name: str) -> bool:
        """Whether the lost worker `name` has a rejoin left (`rejoins` each)."""
        return self.rejoined.get(name, 0) < self.rejoins

    def rejoin(self, name: str) -> bool:
        """Start the lost worker `name` again to join the running job (`--join`), if it
        `may_rejoin`; whether it was."""
        if not self.may_rejoin(name):
            return False
        self.rejoined[name] = self.rejoined.get(name, 0) + 1
        self.lost.discard(name)
        log = self.logs / f"{name}.log"
        self.joining[name] = log.stat().st_size if log.exists() else 0
        self._start_rank(int(name.removeprefix("rank-")), join=True)
        return True

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM every child still running, SIGKILL what is left after `grace` seconds."""
        for proc in self.procs.values():
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        end = time.monotonic() + grace
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()


def prepare_run_dir(cfg: Config) -> tuple[Config, Path]:
    name = cfg.run_name or default_run_name(cfg)
    run_dir = Path(cfg.log_dir) / name
    if run_dir.exists() and any(run_dir.iterdir()):
        raise ConfigError(f"--run-name {name}: {run_dir} already exists and is not empty; "
                          f"choose another name or remove it")
    run_dir.mkdir(parents=True, exist_ok=True)
    return dataclasses.replace(cfg, run_name=name), run_dir


def open_network(cfg: Config):
    """The emulated hosts of `--bandwidth` (None without it); LaunchError saying why they
    cannot be made."""
    if cfg.bandwidth is None:
        return None
    from hetsync.runtime.network import LimitedNetwork, NetworkUnavailable

    try:
        return LimitedNetwork(cfg.world_size, cfg.bandwidth).open()
    except NetworkUnavailable as err:
        raise LaunchError(f"--bandwidth {cfg.bandwidth}: {err}") from None


class _Overdue(Exception):
    """The run passed its time budget by more than its grace (`Config.finish_grace`)."""


class _Diverged(Exception):
    """A worker's training loss stopped being finite (`training.Diverged`): the run ends, as
    any process of it would diverge again from the model or checkpoint it would start from."""

    def __init__(self, name: str, said: str):
        super().__init__(said or f"{name}: its training loss is not finite")
        self.name = name


class _Stopped(Exception):
    """A process of the run failed where the run cannot go on without it."""

    def __init__(self, name: str, code: int):
        super().__init__(f"{name} exited with code {code}")
        self.name, self.code = name, code


def launch(cfg: Config, *, show_progress: bool = True, figures: bool = True,
           stream=sys.stdout, resume: str | Path | None = None, live: bool = True,
           max_restarts: int = 0, rejoin: bool = True) -> Path:
    """Run `cfg` as a local cluster; return its run directory. Raises LaunchError on failure.
    `resume`: a run directory to continue from its last checkpoint (`checkpoint.py`); `live`:
    serve the run's live page on loopback while it goes on (`telemetry/live.py`);
    `max_restarts`: how many times a run stopped by a failed process (a mode that cannot go
    on without a worker) is resumed from its last checkpoint here, as `--resume` would;
    `rejoin`: where the mode admits a worker, a lost one is started again (up to
    `max_restarts` times each) and joins the running job."""
    cfg.validate()
    forked.warm_up()  # (its imports overlap what follows; `hetsync launch` warmed it up sooner)
    if resume is not None:
        from hetsync.runtime import checkpoint

        if not checkpoint.indices(resume):
            raise ConfigError(f"--resume {resume}: no checkpoints there (written every "
                              f"--checkpoint-every evaluations and at the end)")
    network = open_network(cfg)
    if network is not None:  # the service listens on the bridge, which every host reaches
        cfg = dataclasses.replace(cfg, service_ip=network.bridge_address)
    try:
        cfg, run_dir = (cfg, Path(resume)) if resume is not None else prepare_run_dir(cfg)
    except BaseException:
        if network is not None:
            network.close()
        raise
    cfg.save(RunDir(run_dir).config)
    progress = ClusterProgress(run_dir, cfg, stream=stream, enabled=show_progress)
    interrupted = False
    on_main_thread = threading.current_thread() is threading.main_thread()
    # (Ctrl-C stops the run even if our parent left SIGINT ignored)
    previous = ({sig: signal.signal(sig, _on_stop_signal) for sig in (signal.SIGINT,
                                                                       signal.SIGTERM)}
                if on_main_thread else {})
    page = cluster = overdue = diverged = None
    restarts, fresh_start = 0, False
    try:
        if live:
            from hetsync.telemetry.live import LivePage

            page = LivePage(run_dir).start()
            print(f"live page: {page.url}", file=stream, flush=True)
        while True:
            cluster = Cluster(cfg, run_dir, network,
                              resume=resume is not None or (restarts > 0 and not fresh_start),
                              rejoins=max_restarts if rejoin else 0)
            try:
                _run_cluster(cluster, progress, stream)
                break
            except _Overdue as late:
                overdue = str(late)
                print(f"\nhetsync launch: {overdue}; stopping them (each rank's stacks are "
                      f"at the end of its log)", file=stream, flush=True)
                RunDir(run_dir).event("overdue", running=overdue)
                cluster.dump_stacks()
                cluster.stop()
                break
            except _Diverged as bad:
                diverged = str(bad)
                print(f"\nhetsync launch: {diverged}; stopping the others (the run is not "
                      f"restarted: it would diverge again)", file=stream, flush=True)
                RunDir(run_dir).event("diverged", process=bad.name)
                cluster.stop()
                break
            except _Stopped as stop:
                cluster.stop()
                from hetsync.runtime import checkpoint

                can_resume = checkpoint.resumable(run_dir, cfg.workers, not cfg.spec.asynchronous)
                # stopped before any checkpoint: nothing to resume from, so from the start
                afresh = not can_resume and resume is None and not checkpoint.indices(run_dir)
                log = cluster.logs / (stop.name + ".log")
                if (can_resume or afresh) and restarts < max_restarts:
                    restarts += 1
                    if afresh:
                        from hetsync.runtime.evaluation import drop_after

                        RunDir(run_dir).discard_attempt()
                        drop_after(run_dir, -1.0)  # (every snapshot: all are the attempt's)
                    print(f"\n{stop}; " + ("starting the run again from its start (no "
                                           "checkpoint yet)" if afresh else "resuming the run "
                                           "from its last checkpoint")
                          + f" ({restarts} of --max-restarts {max_restarts}); its log: {log}",
                          file=stream, flush=True)
                    RunDir(run_dir).event("restarted", what="run", attempt=restarts,
                                          process=stop.name, code=stop.code, afresh=afresh)
                    fresh_start = afresh
                    continue
                progress.close()
                again = (f"\nTo continue from its last checkpoint: hetsync launch --resume "
                         f"{run_dir}" if can_resume else "")
                raise LaunchError(f"{stop}; the others were stopped. Its log ({log}) ends "
                                  f"with:\n{_tail(log)}{again}") from None
        cluster.finish_evaluation(progress, stream)
        progress.update(final=True)
    except (KeyboardInterrupt, _Terminated):
        interrupted = True
        print("\ninterrupted: stopping every process of the run", file=stream)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        progress.close()
        if cluster is not None:
            cluster.stop()
        if page is not None:
            page.stop()
        if network is not None:
            network.close()
    if interrupted:
        raise KeyboardInterrupt
    if cfg.clock == "virtual" and cfg.spec.worker.control is ControlPath.STORE:
        from hetsync.telemetry.summarize import recount_samples_seen

        recount_samples_seen(run_dir)  # (the store's count is the real machine's order)
    finish_run(run_dir, figures=figures, stream=stream)
    if diverged is not None:  # (as an overdue run: summarised above, then a failure)
        raise LaunchError(f"{diverged}; the others were stopped, and the summary above is of "
                          f"what its records hold")
    if overdue is not None:  # (its records are summarised above; the run did not end well)
        raise LaunchError(f"{overdue}: stopped by the watchdog; the summary above is of "
                          f"what its records hold")
    return run_dir


def _run_cluster(cluster: Cluster, progress, stream) -> None:
    """Start `cluster`'s processes and watch them until its workers are done: restart the
    mode's service when it dies, go on without an evaluator or a worker the mode can lose; raises
    _Stopped naming a process the run cannot go on without, _Diverged naming a worker whose
    loss diverged."""
    cfg = cluster.cfg
    svc = cfg.spec.service
    if svc is not None:
        cluster.start_service()
    events = RunDir(cluster.run_dir)  # (where what happens is told)
    cluster.start_ranks(events.config)
    cluster.start_evaluator()
    while True:
        failure = cluster.failed()
        if failure is not None and svc is not None and failure[0] == svc.name and \
                cluster.restart_service():
            print(f"\nthe {svc.title} exited with code {failure[1]}; started it again "
                  f"on port {cluster.service_port} ({cluster.service_restarts} of "
                  f"{svc.restarts})", file=stream, flush=True)
            events.event("restarted", what=svc.name, attempt=cluster.service_restarts,
                         code=failure[1])
            continue
        if failure is not None and failure[0] == cluster.EVALUATOR:
            print(f"\nthe evaluator exited with code {failure[1]} (its log: "
                  f"{cluster.logs / 'evaluator.log'}); training goes on, and what it left "
                  f"is evaluated at the end", file=stream, flush=True)
            cluster.lost.add(cluster.EVALUATOR)
            events.event("exited", process=cluster.EVALUATOR, code=failure[1])
            continue
        if failure is not None and failure[1] == DIVERGED_EXIT_CODE and \
                failure[0].startswith("rank-"):
            raise _Diverged(failure[0], _tail(cluster.logs / f"{failure[0]}.log", 1)
                            .removeprefix("hetsync worker: error: "))
        if failure is not None and cluster.lose(failure[0]):
            again = ("; started it again to join the run" if cluster.rejoin(failure[0])
                     else "")
            print(f"\n{failure[0]} exited with code {failure[1]}; {cfg.effective_mode} goes "
                  f"on without it{again}", file=stream, flush=True)
            events.event("exited", process=failure[0], code=failure[1], rejoins=bool(again))
            continue
        if failure is not None:
            raise _Stopped(*failure)
        if cluster.done():
            return
        late = cluster.overdue()
        if late is not None:
            raise _Overdue(late)
        spares = cluster.start_spares()
        if spares:
            print(f"\nstarted spare rank(s) {', '.join(map(str, spares))} to join the run",
                  file=stream, flush=True)
            events.event("restarted", what="spares", ranks=list(spares))
        progress.update()
        time.sleep(0.1)  # (a regroup waits until a dead worker is marked lost: `lose`)


def finish_run(run_dir: Path, *, figures: bool = True, stream=sys.stdout) -> dict:
    """Summarise a finished run, draw its figures and print the table."""
    from hetsync.telemetry.report import print_summary
    from hetsync.telemetry.summarize import HELD, write_summary

    path = write_summary(run_dir)
    summary = json.loads(Path(path).read_text())
    events = RunDir(run_dir)
    told = {e.get("rank") for e in events.read_events("slow_device")}  # (a summary again: none)
    for worker in summary.get("per_worker", []):
        slow = worker.get("speed_of_nominal")
        if slow is not None and slow < HELD and worker["rank"] not in told:
            events.event("slow_device", rank=worker["rank"], speed_of_nominal=slow)
    if figures:
        from hetsync.telemetry.plots import plot_run

        plot_run(run_dir, RunDir(run_dir).figures)
    print_summary(summary, stream=stream)
    if figures:
        print(f"figures: {RunDir(run_dir).figures}", file=stream)
    return summary
