"""PyTorch's own data-parallel schemes, run as baselines beside hetsync's modes.

Two baselines, each built only on PyTorch's public API:

``ddp``
    Synchronous data-parallel SGD with :class:`torch.nn.parallel.DistributedDataParallel`
    (gloo). Every step:

    1. forward and backward on the local batch through the DDP model;
    2. when DDP hands the gradient bucket to its communication hook, the hook first sleeps as
       :mod:`hetsync.runtime.heterogeneity` says (the step so far, data, forward and backward,
       topped up to F × its work), as hetsync's own training loop does: the emulated
       slow device enters the all-reduce late and every peer waits for it, as in reality;
    3. a 3-float control tensor (samples, evaluate, stop: rank 0 proposes) is all-reduced: the
       first collective of the step, so it absorbs the wait for the slowest peer (``wait_s``);
    4. PyTorch's default gradient all-reduce
       (:func:`torch.distributed.algorithms.ddp_comm_hooks.default_hooks.allreduce_hook`:
       divide by P, all-reduce) runs and is waited for inside the hook (``comm_s``);
    5. ``optimizer.step()`` (plain :class:`torch.optim.SGD`).

``localsgd``
    PyTorch's post-local SGD recipe: a DDP model with
    :func:`~torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook.post_localSGD_hook`
    (:class:`PostLocalSGDState` with ``start_localSGD_iter = warmup_steps``) and
    :class:`torch.distributed.optim.PostLocalSGDOptimizer` around SGD with
    :class:`~torch.distributed.algorithms.model_averaging.averagers.PeriodicModelAverager`
    (``period = K``, the same ``warmup_steps``). For the first ``warmup_steps`` steps DDP
    averages gradients every step (as ``ddp``); after that every worker takes local SGD steps
    and the optimizer all-reduces the parameters (mean) every K steps. The hook's
    ``post_local_gradient_allreduce`` is off: each emulated worker is its own device, so the
    "intra-node" group after warm-up would be the worker alone. The slowdown is emulated by
    the same hook wrapper as ``ddp``; K steps of every worker end in one average, so a round
    lasts K steps of the slowest worker.

How they are made comparable with hetsync's modes
    Same processes (one per worker, torch.distributed environment on loopback, started by
    :mod:`hetsync.bench.peer_launch`), same data partition and per-worker batch order
    (:func:`hetsync.data.partition`, :class:`~hetsync.data.ShardSampler` with seed
    ``seed·1000 + rank``), same initial model (``torch.manual_seed(seed)`` before
    :func:`hetsync.models.build_model`), same slowdown rule, same evaluation
    (:func:`hetsync.runtime.training.evaluate` on rank 0 with the other ranks paused at a
    barrier, the pause excluded from ``train_time``), same stopping rules (rank 0 proposes, the
    control tensor tells everyone in the same step), and the same run-directory records
    (run.json with ``mode`` = the baseline, ``worker-{rank}.jsonl`` per round, eval.jsonl), so
    :func:`hetsync.telemetry.summarize.summarize` and ``plot_runs`` read them unchanged.

Attribution in the records
    A round is one aggregation: one step for ``ddp`` (and for ``localsgd`` during warm-up), K
    steps for ``localsgd``. ``wait_s`` = the control all-reduce (the wait for the slowest peer);
    ``comm_s`` = the gradient all-reduce inside the hook (``ddp``, warm-up), or
    ``PostLocalSGDOptimizer.step()`` on an averaging step (the parameter all-reduce plus the
    local SGD update, well under a millisecond for these models); ``compute_s`` = the rest of
    the round's steps (data, forward, backward, emulated slowdown, optimizer step);
    ``eval_s`` = evaluation and the barrier around it. DDP does not expose its traffic:
    ``bytes_sent`` = ``bytes_recv`` = the theoretical ring-all-reduce volume
    2(P − 1)/P · n · 4 bytes per all-reduce of n float32 values (gradients, parameters and the
    control tensor), not a measurement.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from hetsync.runtime.heterogeneity import StepTimer

BASELINES = ("ddp", "localsgd")
#: PyTorch API each baseline is built on (written into run.json).
APIS = {
    "ddp": "torch.nn.parallel.DistributedDataParallel + ddp_comm_hooks.default_hooks."
           "allreduce_hook",
    "localsgd": "DistributedDataParallel + post_localSGD_hook + torch.distributed.optim."
                "PostLocalSGDOptimizer(PeriodicModelAverager)",
}


@dataclass(frozen=True)
class PeerOptions:
    """Which baseline, and local SGD's averaging period K and warm-up steps."""

    baseline: str
    period: int = 8
    warmup_steps: int = 0

    def validate(self) -> "PeerOptions":
        if self.baseline not in BASELINES:
            raise ValueError(f"baseline {self.baseline!r} is unknown; expected one of "
                             f"{', '.join(BASELINES)}")
        if self.period < 1:
            raise ValueError(f"period must be an integer >= 1, got {self.period}")
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be an integer >= 0, got {self.warmup_steps}")
        return self


def ring_bytes(numel: int, world: int, element_size: int = 4) -> int:
    """Bytes each rank sends (and receives) in a ring all-reduce of `numel` values."""
    if world <= 1:
        return 0
    return int(round(2 * (world - 1) / world * numel * element_size))


# ---------------------------------------------------------------------- the DDP hook wrapper
class HookState:
    """State of :func:`slowdown_hook`: the wrapped PyTorch hook and this step's accounting.

    The training loop calls :meth:`begin_step` before each forward pass; the hook emulates the
    slowdown on the step's first bucket, runs `before_comm` (the control all-reduce) when this
    step communicates gradients, then runs the wrapped hook and waits for it.
    """

    def __init__(self, inner, inner_state, slowdown: float, clock, world: int,
                 communicates=lambda: True):
        self.inner, self.inner_state = inner, inner_state
        self.timer, self.clock, self.world = StepTimer(slowdown), clock, world
        self.communicates = communicates
        self.first_bucket = True
        self.before_comm = None
        self.bytes = 0

    def begin_step(self, before_comm=None) -> float:
        """Start the step's clocks; returns its start (perf_counter)."""
        self.before_comm, self.first_bucket = before_comm, True
        return self.timer.begin()

    def emulate_slowdown(self) -> None:
        """The emulated slowdown of the compute since the step began (once per step)."""
        self.timer.emulate()


def slowdown_hook(state: HookState, bucket):
    """DDP communication hook: slowdown, control agreement, then PyTorch's own hook."""
    communicating = state.communicates()  # read before the inner hook advances its counter
    if state.first_bucket:
        state.first_bucket = False
        state.emulate_slowdown()
        if communicating and state.before_comm is not None:
            state.before_comm()
    fut = state.inner(state.inner_state, bucket)
    if communicating:
        with state.clock.phase("comm"):
            fut.wait()
        buffer = bucket.buffer()
        state.bytes += ring_bytes(buffer.numel(), state.world, buffer.element_size())
    return fut


# ---------------------------------------------------------------------- one baseline, built
class Baseline:
    """The DDP model, optimizer and hook state of one baseline, and its round structure."""

    def __init__(self, opts: PeerOptions, module: torch.nn.Module, lr: float, momentum: float,
                 slowdown: float, clock, world: int):
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        from torch.nn.parallel import DistributedDataParallel as DDP

        self.opts, self.world = opts, world
        self.step = 0  # steps taken so far
        sgd_params = dict(lr=lr, momentum=momentum)
        if opts.baseline == "ddp":
            self.ddp = DDP(module)
            self.optimizer = torch.optim.SGD(self.ddp.parameters(), **sgd_params)
            self.hook = HookState(default_hooks.allreduce_hook, None, slowdown, clock, world)
        else:
            from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import (
                PostLocalSGDState, post_localSGD_hook)
            from torch.distributed.algorithms.model_averaging.averagers import (
                PeriodicModelAverager)
            from torch.distributed.optim import PostLocalSGDOptimizer

            # Buffers (BatchNorm statistics) are synced once at construction, then stay local:
            # syncing them every forward would be a collective per step, which local SGD
            # exists to avoid.
            self.ddp = DDP(module, forward_sync_buffers=False)
            local_state = PostLocalSGDState(process_group=None, subgroup=None,
                                            start_localSGD_iter=opts.warmup_steps,
                                            post_local_gradient_allreduce=False)
            self.averager = PeriodicModelAverager(period=opts.period,
                                                  warmup_steps=opts.warmup_steps)
            self.optimizer = PostLocalSGDOptimizer(
                optim=torch.optim.SGD(self.ddp.parameters(), **sgd_params),
                averager=self.averager)
            self.hook = HookState(post_localSGD_hook, local_state, slowdown, clock, world,
                                  communicates=lambda: self.in_warmup)
        self.ddp.register_comm_hook(self.hook, slowdown_hook)
        self.n_params = sum(p.numel() for p in self.ddp.parameters() if p.requires_grad)

    @property
    def in_warmup(self) -> bool:
        """This step averages gradients in backward (ddp: always; localsgd: read off
        PostLocalSGDState, whose `iter` counts the steps its hook has seen)."""
        if self.opts.baseline == "ddp":
            return True
        state = self.hook.inner_state
        return state.iter < state.start_localSGD_iter

    @property
    def averages(self) -> bool:
        """This step ends with PeriodicModelAverager's parameter all-reduce (its own rule,
        read off its own step counter)."""
        if self.opts.baseline == "ddp":
            return False
        a = self.averager
        return a.step >= a.warmup_steps and (a.step - a.warmup_steps) % a.period == 0

    @property
    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])


# ---------------------------------------------------------------------- the process
def _propose(cfg, st, samples: int, round_: int, train_size: int, rank: int):
    """Rank 0's proposal, by the rules of hetsync's training loop (`TrainingLoop._propose`)."""
    from hetsync.runtime.control import Proposal

    if rank != 0:
        return Proposal(samples, False, False)
    train_time = st.train_time(time.perf_counter())
    seen = st.samples_seen + samples
    stop = ((cfg.time_budget is not None and train_time >= cfg.time_budget)
            or (cfg.epochs is not None and seen >= cfg.epochs * train_size)
            or (cfg.target_acc is not None and st.last_acc >= cfg.target_acc))
    if cfg.eval_every > 0:
        evaluate_now = round_ % cfg.eval_every == 0
    else:
        evaluate_now = train_time - st.last_eval_train_time >= cfg.eval_interval
    return Proposal(samples, evaluate_now or stop, stop)


def run_peer_process(cfg, opts: PeerOptions, run_dir: str | Path) -> Path:
    """This process's part of a baseline run (reads RANK, WORLD_SIZE, MASTER_ADDR/PORT)."""
    cfg.validate()
    opts.validate()
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    if world != cfg.workers:
        raise ValueError(f"WORLD_SIZE={world} but the run has {cfg.workers} workers")
    if cfg.gpu >= 0 and not cfg.cpu:
        raise ValueError("-g/--gpu: the PyTorch baselines run on the CPU only (gloo)")
    torch.set_num_threads(cfg.threads)
    # DDP needs a process group even for one worker.
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=cfg.timeout))
    try:
        return _run(cfg, opts, rank, world, Path(run_dir))
    finally:
        dist.destroy_process_group()


def _run(cfg, opts: PeerOptions, rank: int, world: int, run_dir: Path) -> Path:
    import hetsync
    from hetsync.algorithms.base import PhaseClock
    from hetsync.data import ShardSampler, load_dataset, partition
    from hetsync.models import build_model
    from hetsync.runtime.control import CollectiveControl
    from hetsync.runtime.handshake import gather_texts
    from hetsync.runtime.training import LoopState, evaluate
    from hetsync.telemetry.recorder import JsonlWriter, write_json_atomic

    run_dir.mkdir(parents=True, exist_ok=True)
    slowdown = cfg.slowdown_of(rank)
    me = {"rank": rank, "host": socket.gethostname(), "device": "cpu", "slowdown": slowdown,
          "role": "worker"}
    ranks = [json.loads(t) for t in gather_texts(json.dumps(me))]

    # Exactly as hetsync's worker: data, seed, model, shard, batch order.
    data = load_dataset(cfg.dataset, cfg.data_dir, seed=cfg.seed)
    torch.manual_seed(cfg.seed)
    module = build_model(cfg.network, data.input_shape, data.num_classes)
    shards = partition(cfg.effective_partition, data.train.labels.numpy(), cfg.workers,
                       cfg.seed, alpha=cfg.dirichlet_alpha)
    batches = ShardSampler(shards[rank], cfg.batch_size, seed=cfg.seed * 1000 + rank)
    clock = PhaseClock()
    base = Baseline(opts, module, cfg.lr, cfg.momentum, slowdown, clock, world)
    model, optimizer, hook = base.ddp, base.optimizer, base.hook
    criterion = torch.nn.CrossEntropyLoss()
    control = CollectiveControl()
    train_size = len(data.train)
    control_bytes = ring_bytes(3, world)

    def run_info(**extra) -> dict:
        config = {**cfg.to_dict(), "mode": opts.baseline, "collective": "native"}
        return {"run_name": cfg.run_name or run_dir.name, "mode": opts.baseline,
                "config": config, "peer": {"baseline": opts.baseline, "api": APIS[opts.baseline],
                                           "period": opts.period,
                                           "warmup_steps": opts.warmup_steps,
                                           "bytes": "theoretical ring all-reduce volume"},
                "hetsync_version": hetsync.__version__, "torch_version": torch.__version__,
                "python": sys.version.split()[0], "start_time": start_time,
                "world_size": world, "workers": cfg.workers, "ranks": ranks, **extra}

    eval_out = JsonlWriter(run_dir / "eval.jsonl") if rank == 0 else None
    if eval_out is not None:  # the starting model, before the clock runs
        result = evaluate(module, data.test, torch.device("cpu"))
        eval_out.write({"t": 0.0, "train_time": 0.0, "round": 0, "samples_seen": 0,
                        "test_acc": result.test_acc, "test_loss": result.test_loss})
    dist.barrier()  # the workers start their clocks together
    t0, start_time = time.perf_counter(), time.time()
    if rank == 0:
        write_json_atomic(run_dir / "run.json", run_info())

    st = LoopState(t0=t0)
    round_ = 1
    agreement = None
    extra_bytes = 0

    def exchange(samples: int) -> None:
        """The control all-reduce: everyone learns rank 0's decision in the same step."""
        nonlocal agreement, extra_bytes
        proposal = _propose(cfg, st, samples, round_, train_size, rank)
        vec = proposal.as_tensor()
        with clock.phase("wait"):
            dist.all_reduce(vec)
        agreement = control.agree(vec)
        extra_bytes += control_bytes

    model.train()
    out = JsonlWriter(run_dir / f"worker-{rank}.jsonl")
    round_start = time.perf_counter()
    busy = loss_sum = 0.0
    steps = samples = 0
    clock.take()
    try:
        for epoch, idx in batches:
            ends_round = base.in_warmup or base.averages
            n = len(idx)
            # Gradient-averaging steps agree inside the hook, before the gradient all-reduce.
            step_start = hook.begin_step((lambda: exchange(samples + n)) if base.in_warmup
                                         else None)
            x, y = data.train.batch(idx)
            optimizer.zero_grad(set_to_none=True)
            loss = criterion(model(x), y)
            loss.backward()
            hook.emulate_slowdown()  # a no-op unless the hook did not run
            if base.averages:  # local SGD: agree, then PyTorch averages in optimizer.step()
                exchange(samples + n)
                with clock.phase("comm"):
                    optimizer.step()
                extra_bytes += ring_bytes(base.n_params, world)
            else:
                optimizer.step()
            base.step += 1
            busy += time.perf_counter() - step_start
            steps += 1
            samples += n
            loss_value = float(loss.detach())
            if not math.isfinite(loss_value):
                raise FloatingPointError(
                    f"rank {rank}: training loss is {loss_value} at step {base.step} of "
                    f"{opts.baseline}; lower the learning rate (-l, now {base.lr})")
            loss_sum += loss_value
            if not ends_round:
                continue

            # ---- the round ends: evaluate if agreed, record
            st.samples_seen = agreement.samples_seen
            eval_s = 0.0
            if agreement.evaluate:
                eval_start = time.perf_counter()
                train_time = st.train_time(eval_start)
                if rank == 0:
                    result = evaluate(module, data.test, torch.device("cpu"))
                    st.last_acc, st.last_eval_train_time = result.test_acc, train_time
                    eval_out.write({"t": time.perf_counter() - t0, "train_time": train_time,
                                    "round": round_, "samples_seen": st.samples_seen,
                                    "test_acc": result.test_acc, "test_loss": result.test_loss})
                dist.barrier()
                eval_s = time.perf_counter() - eval_start
                st.eval_total += eval_s
            spent = clock.take()
            wait_s, comm_s = spent.get("wait", 0.0), spent.get("comm", 0.0)
            sent = hook.bytes + extra_bytes
            out.write({"rank": rank, "device": "cpu", "round": round_, "local_steps": steps,
                       "samples": samples, "t_start": round_start - t0,
                       "t_end": time.perf_counter() - t0,
                       "compute_s": max(0.0, busy - wait_s - comm_s), "wait_s": wait_s,
                       "comm_s": comm_s, "query_s": 0.0, "eval_s": eval_s,
                       "bytes_sent": sent, "bytes_recv": sent,
                       "loss": loss_sum / max(steps, 1), "lr": base.lr, "epoch": epoch})
            hook.bytes = extra_bytes = 0
            round_ += 1
            if agreement.stop:
                break
            round_start = time.perf_counter()
            busy = loss_sum = 0.0
            steps = samples = 0
    finally:
        out.close()
    if rank == 0:
        wall = time.perf_counter() - t0
        write_json_atomic(run_dir / "run.json", run_info(
            end_time=start_time + wall, wall_s=wall,
            train_time=st.train_time(time.perf_counter()), paused_s=st.eval_total))
        eval_out.close()
    return run_dir
