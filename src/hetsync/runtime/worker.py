"""One hetsync process: a worker, or the parameter server when the run needs one.

Reads torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), so the same command
serves `hetsync launch` on one machine and `torchrun` on many. With a parameter server the last
rank is the server and ranks 0..workers-1 are the workers.
"""

from __future__ import annotations

import dataclasses
import datetime
import faulthandler
import json
import math
import os
import signal
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hetsync.config import Config
from hetsync.options import ConfigError
from hetsync.runtime import checkpoint, evaluation
from hetsync.runtime.assembly import (Wiring, assemble, device_label, parameter_server,
                                      serve_and_record)
from hetsync.runtime.devices import build_info, pick_device
from hetsync.runtime.handshake import broadcast_text, gather_texts
from hetsync.runtime.membership import shared
from hetsync.runtime.plan import RankPlan
from hetsync.runtime.training import LoopData, LoopOutputs, TrainingLoop
from hetsync.telemetry.recorder import JsonlWriter
from hetsync.telemetry.rundir import RunDir, tell
from hetsync.telemetry.runlog import read_jsonl

#: how long the start's rendezvous waits for every rank of the group at least (`--timeout`
#: where it is longer): bounded, so a rank that never starts ends the others' wait
RENDEZVOUS_S = 120.0
#: a worker's own watchdog fires this much later than launch's (`Config.finish_grace`), so
#: under launch the run is ended whole, and under torchrun each worker still ends: it prints
#: every thread's stack (what it waited for) to its log and exits 1
WATCHDOG_LATER_S = 30.0


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"environment variable {name}={value!r} is not an integer") from None


def default_run_name(cfg: Config) -> str:
    return f"{cfg.effective_mode}-{cfg.network}-{time.strftime('%Y%m%d-%H%M%S')}"


def run_process(cfg: Config, run_dir: str | Path | None = None, progress=None,
                resume: bool | str = False, join: bool = False) -> Path:
    """Run this process's part of the run (worker or parameter server); returns the run dir.
    `resume`: continue `run_dir` from its last checkpoint (`checkpoint.py`); `IF_ANY`: if
    there is one. `join`: this rank was lost and joins the running job in `run_dir`
    (`runtime/membership.py`)."""
    cfg.validate()
    if cfg.balanced_batches and cfg.slowdowns and cfg.step_work is None and cfg.workers > 1:
        raise ConfigError("--balanced-batches: expected --step-work with it (launch and bench "
                          "measure it): a device's step is topped up to F x the reference's "
                          "work for its batch, which a device cannot measure on its own")
    if cfg.clock == "virtual" and cfg.step_work is None:
        raise ConfigError("--clock virtual: expected --step-work with it (launch and bench "
                          "measure it): a step's virtual time is its device's slowdown x the "
                          "reference's work, which must not depend on this machine's load")
    rank, world = _env_int("RANK", 0), _world(cfg, _env_int("WORLD_SIZE", 1), resume, join)
    spares = _spares(cfg, rank, resume, join)
    torch.set_num_threads(cfg.threads)
    device = pick_device(cfg, _env_int("LOCAL_RANK", 0))
    timeout = datetime.timedelta(seconds=cfg.timeout)
    if world > 1:
        backend = "nccl" if device.type == "cuda" and os.environ.get(
            "HETSYNC_BACKEND", "gloo") == "nccl" else "gloo"
        # its default group never connects: the members' has no place for it (a joiner's),
        # or a spare has not started (theirs, the run's groups made without the spares)
        if join or spares:
            os.environ["TORCH_GLOO_LAZY_INIT"] = "1"
        # The rendezvous waits for every rank to start (importing torch: seconds each, many
        # more on a busy machine) -- `--timeout` is how long a live peer may take to answer
        # once they have, and what the group and the store keep after it.
        start = max(timeout, datetime.timedelta(seconds=RENDEZVOUS_S))
        dist.init_process_group(backend, rank=rank, world_size=world, timeout=start,
                                store=_elastic_store(world, start))
        dist.distributed_c10d._set_pg_timeout(timeout)
        dist.distributed_c10d._get_default_store().set_timeout(timeout)
        os.environ.pop("TORCH_GLOO_LAZY_INIT", None)  # (the groups it joins connect at once)
        if cfg.balanced_batches and not cfg.slowdowns and not (join or spares):
            cfg = measured_speeds(cfg, rank, world, device, run_dir if resume else None)
    try:
        return _run(cfg, rank, world, device, run_dir, progress, resume, join, spares)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def measured_speeds(cfg: Config, rank: int, world: int, device: torch.device,
                    resumed: str | Path | None = None) -> Config:
    """`cfg` with `device_speeds`: each worker's device's speed relative to the fastest's,
    for --balanced-batches on real devices (no --slowdowns), as LB-BSP plans its batches.

    1. each worker times its own steps at -b (`emulation.measure_step_work`: the median CPU
       time of a step on a CPU, its wall time after `cuda.synchronize` on a GPU), alone on
       its device, for at most 3 s;
    2. one all-reduce (SUM) of a vector with each worker's time in its own slot (a
       parameter-server rank adds nothing) gives every rank every time;
    3. speed_i = min_j t_j / t_i, and the batches follow (`Config.batch_of`).

    A resumed run keeps the speeds it started with (its run.json's config, which rank 0
    wrote): a sampler's position counts batches. Where hetsync departs from LB-BSP:
    the speeds are measured once, not re-planned as they drift."""
    from hetsync.runtime.emulation import measure_step_work

    if resumed is not None:
        try:
            saved = json.loads(RunDir(resumed).run.read_text())["config"]
        except (OSError, ValueError, KeyError):
            saved = {}
        if saved.get("device_speeds"):
            return cfg.with_resolved("device_speeds", tuple(saved["device_speeds"]),
                                     "the resumed run's, as its workers measured them")
    times = torch.zeros(world, dtype=torch.float64)
    if rank < cfg.workers:
        times[rank] = measure_step_work(cfg, cfg.load_data(), steps=20, warmup=3, seconds=3.0)
    dist.all_reduce(times)
    work = times[:cfg.workers].tolist()
    return cfg.with_resolved("device_speeds", tuple(min(work) / t for t in work),
                             "each worker's median step at -b, measured on its device at "
                             "the start: the fastest's over its own")


def _elastic_store(world: int, timeout: datetime.timedelta):
    """Under torchrun's agent store, a restarted group's keys apart from the attempts before
    it (gloo would otherwise find the dead attempt's addresses there); None: torch's own."""
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if restart in ("", "0") or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          is_master=False, timeout=timeout)
    return dist.PrefixStore(f"hetsync/attempt-{restart}", store)


def _world(cfg: Config, started: int, resume, join: bool) -> int:
    """The run's world size: `started` (WORLD_SIZE), or, where torchrun started the first
    workers of a run with spares (`--spare-workers`), theirs and the spares', which join it
    later with `hetsync worker --join`. ConfigError where it is neither."""
    spares_under_torchrun = ("TORCHELASTIC_RUN_ID" in os.environ and cfg.spare_workers
                             and not (resume or join))
    if spares_under_torchrun:
        if cfg.needs_ps:
            raise ConfigError("--spare-workers: under torchrun, only in a mode without a "
                              "parameter server (its rank is the world's last, which torchrun "
                              "would give a first worker); start the run with hetsync launch")
        first = cfg.world_size - cfg.spare_workers
        if started == first:
            return cfg.world_size
        if started == cfg.world_size:
            raise ConfigError(f"--spare-workers {cfg.spare_workers}: torchrun started "
                              f"{started} processes, the spares' too; start {first} (the "
                              f"first workers) and each spare later with hetsync worker "
                              f"--join")
    if started != cfg.world_size:
        need = (f"{cfg.workers} workers + 1 parameter server" if cfg.needs_ps
                else f"{cfg.workers} workers")
        first = (f", or under torchrun {cfg.world_size - cfg.spare_workers} (all but the "
                 f"--spare-workers {cfg.spare_workers})"
                 if spares_under_torchrun else "")
        raise ConfigError(f"WORLD_SIZE={started} but this run needs {cfg.world_size} "
                          f"processes ({need}){first}; set --workers or the number of "
                          f"processes to match")
    return started


def _spares(cfg: Config, rank: int, resume, join: bool) -> list[int]:
    """The spares (`--spare-workers`) the run starts without; none for a resumed run, which
    starts every rank. ConfigError for a spare's own process started without `--join`."""
    if not cfg.spare_workers or join:
        return []
    if resume:
        return []
    spares = cfg.spare_ranks
    if rank in spares:
        raise ConfigError(f"rank {rank} is a spare (--spare-workers {cfg.spare_workers}): "
                          f"start it with --join --run-dir RUN_DIR once the run has started")
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        raise ConfigError("--spare-workers: the run's store must live outside the workers "
                          "(torch's own, in rank 0, waits for every rank at the start): "
                          "host a TCPStore and set TORCHELASTIC_USE_AGENT_STORE=True, as "
                          "hetsync launch does")
    return spares


def _run(cfg: Config, rank: int, world: int, device: torch.device, run_dir, progress,
         resume: bool | str, join: bool = False, spares: list[int] | None = None) -> Path:
    from hetsync.comm import set_default_timeout

    set_default_timeout(cfg.timeout)
    if join:  # it takes part in none of the start's collectives: the others are past them
        run = _joined_run(run_dir)
        return _train(cfg, rank, world, device, Path(run_dir), progress,
                      Start(run["run_name"], run.get("ranks", []),
                            start_time=run.get("start_time"), join=True))
    membership = start = group = channel_group = None
    if spares:
        membership, start, group, channel_group = _start_without(cfg, rank, world, spares)
    name = broadcast_text(cfg.run_name or default_run_name(cfg), group=start)
    run_dir = Path(run_dir) if run_dir is not None else Path(cfg.log_dir) / name
    is_server = cfg.needs_ps and rank == world - 1
    me = {**_rank_entry(cfg, rank, is_server), **_where(device, is_server)}
    ranks = [json.loads(t) for t in gather_texts(json.dumps(me), group=start)]
    ranks += [{**_rank_entry(cfg, r, False), "spare": True} for r in spares or ()]
    # Every rank makes the workers' groups, the server too (new_group is collective): one for
    # the main thread, one for the background channel.
    if world > 1 and not spares:
        group, channel_group = (dist.new_group(list(range(cfg.workers))),
                                dist.new_group(list(range(cfg.workers))))

    own, index, leader = (_find_checkpoint(cfg, rank, run_dir, is_server, resume) if resume
                          else (None, None, 0))
    return _train(cfg, rank, world, device, run_dir, progress,
                  Start(name, ranks, group=group, channel_group=channel_group, own=own,
                        index=index, leader=leader, is_server=is_server,
                        membership=membership, spares=list(spares or ())))


def _start_without(cfg: Config, rank: int, world: int, spares: list[int]) -> tuple:
    """The groups of a run that starts without its spares, made by those that start alone
    (`use_local_synchronization`): (a regrouping mode's membership, the group of the start's
    handshake, the workers' two groups).

    ESync's first workers start as after a regroup without the spares. In an asynchronous
    mode the handshake takes the parameter server too, and the spares are marked lost in
    the store as `launch` marks a dead worker (the lead rule and the checkpoints pass them
    over), until each links to the server and withdraws its mark."""
    from hetsync.runtime.membership import LOST, SPARE, Membership, local_groups

    store, first = dist.distributed_c10d._get_default_store(), cfg.first_workers
    if not cfg.needs_ps:
        membership = Membership(store, rank, first, timeout=cfg.timeout,
                                grace=cfg.regroup_grace, absent=spares)
        group, channel_group = membership.groups(making=cfg.timeout)  # (they start apart)
        return membership, group, group, channel_group
    if rank == 0:
        for spare in spares:
            shared(store).set(f"{LOST}/{spare}", SPARE)
    start = dist.new_group(first + [world - 1], timeout=datetime.timedelta(seconds=cfg.timeout),
                           use_local_synchronization=True)
    if rank == world - 1:
        return None, start, None, None
    return (None, start, *local_groups(first, cfg.timeout, cfg.timeout))


def _rank_entry(cfg: Config, rank: int, is_server: bool) -> dict:
    """What run.json says of `rank` that its config decides (its emulated device)."""
    if is_server:
        return {"rank": rank, "slowdown": 1.0, "batch": None, "sample_weight": None,
                "nominal_speed": None, "role": "parameter-server"}
    return RankPlan.of(cfg, rank).entry()


def _where(device: torch.device, is_server: bool = False) -> dict:
    """What run.json says of a rank that its process finds: its host, device and cores."""
    return {"host": socket.gethostname(), "device": "ps" if is_server else device_label(device),
            "cores": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None}


#: a joiner's `_where` in the run's store, for the leader's run.json (it was not in the start's)
WHERE = "hetsync/where"


def _with_joiners(ranks: list[dict], store, absent: list[int]) -> list[dict]:
    """run.json's `ranks`, each one that joined (a spare, or a lost rank started again) as
    its last process said where it ran (not a spare still `absent`: it never took part)."""
    if store is None:
        return ranks
    try:
        store = shared(store)
        where = {r["rank"]: json.loads(store.get(f"{WHERE}/{r['rank']}")) for r in ranks
                 if r["rank"] not in absent and store.check([f"{WHERE}/{r['rank']}"])}
    except Exception:  # noqa: BLE001 - a store out of reach: the start's entries
        return ranks
    return [{**r, **where.get(r["rank"], {})} for r in ranks]


#: what a worker that joins from another machine needs of run.json (`_publish_run`)
RUN = "hetsync/run"


def _publish_run(store, name: str, ranks: list[dict], start_time: float) -> None:
    """Rank 0 puts the run's name, ranks and start in the store, for a worker that joins
    from a machine that cannot read its run.json (a spare under torchrun)."""
    if store is None:  # (one worker: nobody joins)
        return
    try:
        shared(store).set(RUN, json.dumps({"run_name": name, "ranks": ranks,
                                           "start_time": start_time}))
    except Exception:  # noqa: BLE001 - a store out of reach: a joiner finds run.json or stops
        pass


def _joined_run(run_dir) -> dict:
    """What `--join` needs of the running job it enters: its run.json in `run_dir`, or
    where this machine has none (another machine's run), what rank 0 put in the store."""
    try:
        run = json.loads(RunDir(run_dir).run.read_text())
        run["run_name"]
        return run
    except (OSError, ValueError, KeyError, TypeError):
        pass
    try:
        store = shared(dist.distributed_c10d._get_default_store())
        if store.check([RUN]):
            return json.loads(store.get(RUN))
    except Exception:  # noqa: BLE001 - a store out of reach: the error below
        pass
    raise ConfigError(f"--join: {run_dir} has no readable run.json, and the run's store "
                      f"names no running job: give --run-dir the directory of the running "
                      f"job to join, once it has started training")


@dataclass
class Start:
    """How this process enters the run, as `_run` found it."""

    #: the run's name, and what run.json says of each rank so far
    name: str
    ranks: list[dict]
    #: the workers' groups: the main thread's and the background channel's (None: a joiner
    #: has none yet, or the default group)
    group: Any = None
    channel_group: Any = None
    #: this worker's checkpoint, the index whose global model every process starts from and
    #: the rank whose file holds it (`_find_checkpoint`)
    own: dict | None = None
    index: int | None = None
    leader: int = 0
    is_server: bool = False
    #: the run's start (a joiner's), else now or the checkpoint's
    start_time: float | None = None
    #: a lost rank's or a spare's new process, joining the running job
    join: bool = False
    #: the first workers' membership where spares join later, and the spares
    membership: Any = None
    spares: list[int] = field(default_factory=list)


def _train(cfg: Config, rank: int, world: int, device: torch.device, run_dir: Path, progress,
           start: Start) -> Path:
    """The process's run once it has its groups (`start.join`: none yet) and checkpoint."""
    from hetsync.data import ShardSampler

    name, ranks, group, own, join = start.name, start.ranks, start.group, start.own, start.join
    start_time, membership, spares = start.start_time, start.membership, start.spares

    spec, options = cfg.spec, cfg.mode_options()
    data = cfg.load_data()
    # every rank, the server too, so that all stop alike: ConfigError if a worker's share of
    # the data is not one batch; nothing is written before the data is known to be good
    shards = cfg.validate_data(data)
    run_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)  # the same initial model in every process
    model = cfg.build_model(data).to(device)
    if start.index is not None:  # every process starts from the checkpoint's global model
        _load_global(model, run_dir, start.index, start.leader, rank, world)

    if start.is_server:
        _serve_parameters(cfg, model, run_dir, spares)
        return run_dir

    def sampler_of(r: int):
        """Worker `r`'s batches (this worker's own, or a shard it holds for `r`); a sample
        at a time where the batches are re-planned (`runtime/replan.py`)."""
        batches = ShardSampler(shards[r], 1 if cfg.replans else cfg.batch_of(r),
                               seed=cfg.seed * 1000 + r)
        if cfg.inject:  # foreign classes from this worker's own copy of the data (SelSync)
            from hetsync.data.injection import InjectingSampler

            batches = InjectingSampler(batches, data.train.labels.numpy(), shards[r],
                                       batch_size=cfg.batch_of(r), workers=cfg.workers,
                                       alpha=cfg.inject_alpha, beta=cfg.inject_beta,
                                       seed=cfg.seed * 1000 + r)
        return batches

    plan = RankPlan.of(cfg, rank)
    optimizer = cfg.local_optimizer(model.parameters(), spec.worker.optimizer_lr(cfg.lr, options))
    wiring = Wiring(rank=rank, workers=cfg.workers - len(spares), group=group,
                    channel_group=start.channel_group, collective=cfg.collective,
                    timeout=cfg.timeout, service=(cfg.service_ip, cfg.service_port),
                    ps_rank=world - 1 if cfg.needs_ps else None, run_workers=cfg.workers)
    assembly = assemble(spec, options, model, optimizer, wiring,
                        timer=plan.timer(cfg.make_clock(), cpu_device=device.type == "cpu"),
                        sample_weight=plan.sample_weight, joining=join)
    mode = assembly.mode
    if own is not None:
        if own["optimizer"] is not None:  # (None: restarted in place of a lost rank)
            optimizer.load_state_dict(own["optimizer"])
        mode.load_state_dict(mode.restart_state(own["mode"]) if own.get("restarted")
                             else own["mode"])
        _cut_logs(run_dir, rank, own)
    store = dist.distributed_c10d._get_default_store() if world > 1 else None
    if membership is None and cfg.regroups and cfg.workers > 1:
        from hetsync.runtime.membership import Membership

        membership = Membership(store, rank, list(range(cfg.workers)), timeout=cfg.timeout,
                                grace=cfg.regroup_grace)
    if membership is not None:
        if not join:  # (a joiner's channel comes with its admission)
            mode.comm.hear(membership.alarm)
    # (a joiner numbers on after its lost process's: the asynchronous modes' ranks number
    # apart; a regrouping mode's admission gives the leader's count)
    checkpointer = (checkpoint.Checkpointer(run_dir, rank, start=own["index"] if own else (
        checkpoint.newest(run_dir, rank) if join else 0)) if cfg.checkpoint_every > 0 else None)
    if own is not None and rank == 0:
        evaluation.drop_after(run_dir, own["loop"]["train_time"])
    records = RunDir(run_dir).worker(rank)
    if join:
        checkpoint.cut_jsonl(records, lambda r: True)  # (a line cut short by its death)
        try:  # (for the leader's run.json; it asks the store to join just after)
            shared(store).set(f"{WHERE}/{rank}", json.dumps(_where(device)))
        except Exception:  # noqa: BLE001 - where it runs is not worth its run
            pass
    poster = loop = None
    try:
        with JsonlWriter(records) as recorder:
            loop = TrainingLoop(cfg, mode, plan,
                                LoopData(sampler_of(rank), data.train, data.test, sampler_of),
                                LoopOutputs(recorder, run_dir, progress, checkpointer),
                                store=store, membership=membership, joining=join)
            if own is not None:
                loop.restore(own)
            elif join:  # on where its records end (their work is in the global model)
                loop.go_on_from(read_jsonl(records) if records.is_file() else [])
            else:
                loop.evaluate_initial(0.0)
            if world > 1 and not join:  # the workers start their clocks together
                dist.barrier(group=group)
            t0, real_t0 = mode.comm.clock.now(), time.perf_counter()
            # a joiner goes on on the run's clock: a regrouping mode's admission gives it the
            # leader's; a parameter server's joiner takes the real time since the start, or
            # on the virtual clock the server's: its first reply reaches it at the server's
            # time (`comm/ps.py`, `_virtual_reply`), not the seconds it took to start
            if join and start_time is not None and cfg.clock != "virtual":
                t0 -= time.time() - start_time
            # a resumed run keeps its start: its records' times go on from the checkpoint's
            if start_time is None:
                start_time = time.time() - (own["loop"]["t"] if own is not None else 0.0)
            info = dict(cfg=cfg, name=name, world=world, ranks=ranks, start_time=start_time)
            if own is not None:
                info["resumed_from"] = {"checkpoint": start.index, "round": own["round"],
                                        "train_time": own["loop"]["train_time"],
                                        "restarted": own.get("lost", [])}
            if rank == 0 and not join:
                RunDir(run_dir).write_run(_run_info(**info, mode_info=mode.record()))
                _publish_run(store, name, ranks, start_time)
            poster = _live_poster(cfg, run_dir, plan, name)
            if cfg.finish_grace is not None:  # a wedged run ends, saying where (torchrun too)
                faulthandler.register(signal.SIGUSR1, all_threads=True)  # (launch's asks)
                faulthandler.dump_traceback_later(
                    cfg.time_budget + cfg.finish_grace + WATCHDOG_LATER_S, exit=True)
            state = loop.run(t0)
            faulthandler.cancel_dump_traceback_later()  # (what follows is bounded work)
            # the leader: rank 0, or the lowest survivor once it was lost
            if loop.roster.leads:
                assembly.record_service(run_dir)  # (launch or torchrun alike)
                now = mode.comm.clock.now()
                wall = now - state.t0  # (a resumed run: since its start)
                train_time = state.train_time(now)
                if loop.snapshots is not None:  # deferred: by the evaluator, or now
                    loop.snapshots.flush()
                    if not cfg.evaluator:
                        loop.evaluate_snapshots(run_dir)
                # paused_s: evaluation time during which every worker waited (collective modes,
                # and a single worker, which its own evaluation stops)
                info["ranks"] = _with_joiners(ranks, store, loop.roster.absent())
                RunDir(run_dir).write_run(_run_info(
                    **info, mode_info=mode.record(), wall_s=wall,
                    end_time=time.time(),
                    clock=_clock_info(cfg, mode, time.perf_counter() - real_t0),
                    train_time=train_time,
                    paused_s=state.eval_total if loop.pauses_everyone else 0.0,
                    **({"lost_workers": loop.roster.lost()} if loop.roster.lost() else {}),
                    **({"joined_workers": membership.joined} if membership and membership.joined
                       else {}),
                    **({"absent_workers": loop.roster.absent()} if loop.roster.absent()
                       else {})))
            if poster is not None:
                if loop.snapshots is not None and cfg.evaluator:  # its last evaluations go too
                    evaluation.wait_evaluated(run_dir, cfg.timeout)
                poster.close()  # after the deferred evaluations: their accuracy goes too
    except BaseException:
        if poster is not None:
            poster.close(final=False)
        assembly.close(wait=False)  # a failed worker exits at once, not after its peers
        raise
    else:
        assembly.close()
    finally:
        if loop is not None:
            loop.close()
        if join and records.is_file() and records.stat().st_size == 0:
            records.unlink()  # a spare the run ended before it was let in: no worker file
    return run_dir


def _live_poster(cfg: Config, run_dir: Path, plan: RankPlan, name: str):
    """`--live-report`: this worker's figures to the live board at -ip/-port."""
    if not cfg.live_report:
        return None
    from hetsync.services import JsonClient
    from hetsync.telemetry.live import LivePoster

    client = JsonClient(cfg.service_ip, cfg.service_port, timeout=5.0, retry_s=1.0,
                        what="live board")
    return LivePoster(run_dir, plan.rank, client, run=name,
                      nominal_speed=plan.nominal_speed).start()


#: `resume` value of a group restarted by torchrun: resume if any worker has a checkpoint,
#: else start afresh (the dead attempt's records removed).
IF_ANY = "if-any"


def _find_checkpoint(cfg: Config, rank: int, run_dir: Path, is_server: bool,
                     resume: bool | str) -> tuple[dict | None, int | None, int]:
    """(this worker's checkpoint, the index whose global model every process starts from,
    the rank whose file holds it); the choice is agreed through one all-gather of what each
    worker can load (`checkpoint.reference`), and every rank takes rank 0's clock (the
    records' common time origin; a restarted rank 0 has the leader's)."""
    mine = {} if is_server else checkpoint.survey(run_dir, rank)
    surveys = [{int(i): entry for i, entry in json.loads(t).items()}
               for t in gather_texts(json.dumps(mine))][:cfg.workers]
    lists, lost = [list(s) for s in surveys], checkpoint.lost_at(surveys)
    holders = checkpoint.holders_at(surveys)
    if resume == IF_ANY and not any(lists):
        if not is_server:
            _cut_logs(run_dir, rank, None)
        return None, None, 0
    collective = not cfg.spec.asynchronous
    chosen = [checkpoint.choose(lists, r, collective, lost, holders)
              for r in range(cfg.workers)]
    if any(c is None for c in chosen):
        who = ("that every worker not lost by then can load" if collective else
               f"of rank {chosen.index(None)} that loads")
        raise checkpoint.CheckpointError(
            f"--resume {run_dir}: no checkpoint {who} in {Path(run_dir) / checkpoint.DIR}")
    index = checkpoint.reference(lists, collective, lost, holders)
    # written without these (eager-SGD's too, which has no common checkpoint but a common
    # round): they restart from its leader's file
    restarted = sorted(set(lost.get(index, ())) | (
        set() if collective else {r for r in range(cfg.workers) if not lists[r]}))
    leader = checkpoint.leader(index, holders)
    if is_server:
        own = None
    elif rank in restarted:
        path = RunDir(run_dir).worker(rank)
        own = checkpoint.for_restarted_rank(
            run_dir, index, rank, leader, lists[rank][0] if lists[rank] else None,
            records=read_jsonl(path) if path.is_file() else [], own_rounds=not collective,
            held=_kept_of_others(run_dir, chosen, restarted))
    else:
        own = checkpoint.load(checkpoint.file_of(run_dir, chosen[rank], rank))
        if not collective:  # (a member drew its shard on after that checkpoint)
            path = RunDir(run_dir).worker(rank)
            own = checkpoint.drawn_on_since(
                own, read_jsonl(path) if path.is_file() else [],
                _kept_of_others(run_dir, chosen, restarted + [rank]))
    clock = float(broadcast_text(json.dumps(own["loop"]["t"] if rank == 0 else 0.0)))
    if own is not None:
        own["loop"]["t"] = clock
    if rank == 0:
        lead = (f"; rank(s) {', '.join(map(str, restarted))}, lost before it, restart from "
                f"rank {leader}'s round and global state" if restarted else "")
        tell(run_dir, "resumed", f"resuming from checkpoint {index}: round {own['round']}, "
                                 f"training time {own['loop']['train_time']:.1f} s{lead}",
             index=index, round=own["round"], train_time=own["loop"]["train_time"],
             restarted=list(restarted))
    return own, index, leader


def _load_global(model: torch.nn.Module, run_dir: Path, index: int, leader: int, rank: int,
                 world: int) -> None:
    """The `leader` reads the global model of checkpoint `index` and sends it to every
    process (the server too): across machines only its host has that file."""
    if rank == leader:
        model.load_state_dict(
            checkpoint.load(checkpoint.file_of(run_dir, index, leader))["global"])
    if world > 1:
        with torch.no_grad():
            for tensor in model.state_dict().values():
                dist.broadcast(tensor, src=leader)


def _kept_of_others(run_dir: Path, chosen: list[int], restarted: list[int]) -> list[dict]:
    """The records the resume keeps of the workers it does not restart (up to each one's
    checkpoint, as `_cut_logs` cuts them): where they drew a restarted rank's shard for it
    (`runtime/shards.py`)."""
    kept = []
    for rank, index in enumerate(chosen):
        path = RunDir(run_dir).worker(rank)
        if rank in restarted or not path.is_file():
            continue
        state = checkpoint.load(checkpoint.file_of(run_dir, index, rank))
        kept += [r for r in read_jsonl(path) if r.get("round", 0) <= state["recorded_round"]]
        kept.append({"rank": rank, "held": state["data"].get("held", [])})  # (a cut round's)
    return kept


def _cut_logs(run_dir: Path, rank: int, own: dict | None) -> None:
    """Drop the records written after this rank's checkpoint (that work is being redone; no
    checkpoint: all of them; an asynchronous rank whose shard a member drew on: those after
    the round `checkpoint.drawn_on_since` kept). A rank restarted in place of a lost one
    keeps those that ended before the checkpoint it restarts from
    (`checkpoint.for_restarted_rank`)."""
    restarted = own is not None and "records_until" in own
    last = -1 if own is None else own["recorded_round"]

    def keep(record: dict) -> bool:
        return (record.get("t_end", math.inf) <= own["records_until"] if restarted
                else record.get("round", 0) <= last)

    checkpoint.cut_jsonl(RunDir(run_dir).worker(rank), keep)
    if rank == 0:
        until = -1.0 if own is None else own["loop"]["train_time"] + 1e-6
        checkpoint.cut_jsonl(RunDir(run_dir).eval,
                             lambda r: (r.get("train_time") or 0.0) <= until)


def _serve_parameters(cfg: Config, model: torch.nn.Module, run_dir: Path,
                      spares: list[int] | None = None) -> None:
    """The parameter-server rank: hold the model, apply pushes, answer pulls, sum for `ps`
    (`spares`: workers it serves once they link)."""
    serve_and_record(parameter_server(cfg.spec, cfg.mode_options(), model, cfg.lr,
                                      list(range(cfg.workers)), cfg.timeout,
                                      joins=cfg.admits_workers, absent=spares or (),
                                      link=getattr(cfg.make_clock(), "link", None),
                                      work_s_per_byte=cfg.server_work / 1e6), run_dir)


def _clock_info(cfg: Config, mode, real_s: float) -> dict:
    """run.json's `clock`: what timed the run; on a virtual clock, what it modelled and the
    real seconds its training took (this worker's)."""
    info = mode.comm.clock.source.describe()
    if cfg.clock == "virtual":
        info.update(step_jitter=cfg.step_jitter, jitter_distribution=cfg.jitter_distribution,
                    profile=cfg.profile, step_overheads=list(cfg.step_overheads),
                    step_work=cfg.step_work, server_work=cfg.server_work,
                    slowdowns=[cfg.slowdown_of(r) for r in range(cfg.workers)],
                    real_s=real_s)
    return info


def _run_info(cfg: Config, name: str, world: int, ranks: list[dict], start_time: float,
              mode_info: dict, **extra) -> dict:
    return {"run_name": name, "mode": cfg.effective_mode, "config": cfg.to_dict(),
            "mode_info": mode_info,
            **build_info(), "start_time": start_time, "world_size": world,
            "workers": cfg.workers, "ranks": ranks, **extra}
