"""PyTorch's own data-parallel schemes as modes, run by the same training loop as hetsync's.

Two baselines, each built only on PyTorch's public API, so that the bench compares hetsync's
modes with what a PyTorch user would run, under the same loop (data, slowdown, evaluation,
stopping rule, records):

``ddp`` (:class:`DistributedDataParallelSGD`)
    Synchronous data-parallel SGD with :class:`torch.nn.parallel.DistributedDataParallel`.
    Every step:

    1. forward and backward through the DDP model;
    2. when DDP hands its first gradient bucket to the communication hook, the hook emulates
       the device's slowdown (the loop's step timer: the step so far topped up to F × its
       work), so the emulated slow device enters the all-reduce late, as in reality; then it
       waits for every worker at a barrier (timed as ``wait``);
    3. PyTorch's default gradient all-reduce
       (:func:`~torch.distributed.algorithms.ddp_comm_hooks.default_hooks.allreduce_hook`:
       divide by P, all-reduce) runs and is waited for inside the hook (``comm``);
    4. (the loop's agreement, a small blocking all-reduce) and ``optimizer.step()``.

``post-local-sgd`` (:class:`PostLocalSGD`)
    PyTorch's post-local SGD recipe: a DDP model with
    :func:`~torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook.post_localSGD_hook`
    (:class:`PostLocalSGDState` with ``start_localSGD_iter = warmup_steps``) and
    :class:`torch.distributed.optim.PostLocalSGDOptimizer` around the worker's optimizer with
    :class:`~torch.distributed.algorithms.model_averaging.averagers.PeriodicModelAverager`
    (``period = K``, the same ``warmup_steps``). For the first ``warmup_steps`` steps DDP
    averages gradients every step (as ``ddp``); after that every worker takes local SGD steps
    and the optimizer all-reduces the parameters (mean) every K steps (timed as ``comm``; the
    loop's agreement before it absorbs the wait). The hook's ``post_local_gradient_allreduce``
    is off: each emulated worker is its own device, so the "intra-node" group after warm-up
    would be the worker alone. Buffers (BatchNorm statistics) are synced once at construction,
    then stay local.

On the virtual clock (:mod:`hetsync.clock`) the hook's barrier is the meeting of the
workers' clocks, and each bucket's all-reduce then costs every worker the same modelled time
(the ``native`` collective's formula for the bucket's bytes); post-local SGD's parameter
average is a meeting priced likewise. PyTorch's own code runs unchanged.

Traffic: DDP does not expose what it moves, so both count the theoretical ring all-reduce
volume 2(P − 1)/P · n · 4 bytes per all-reduce of n float32 values in the byte meter (under
``ddp/all_reduce``), as hetsync's ``native`` collective does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from hetsync.algorithms.base import Action, Mode, Step
from hetsync.algorithms.registry import ModeSpec, register

_DDP_API = "torch.nn.parallel.DistributedDataParallel"


def _meter_ring(numel: int, workers: int, element_size: int = 4) -> None:
    """Add the bytes of one ring all-reduce of `numel` values to the meter."""
    from hetsync.comm import meter

    sent, recv = meter.ring_bytes(numel, workers, 0, element_size)
    meter.add("ddp/all_reduce", sent, recv)


class _SlowdownHook:
    """DDP communication hook state: the slowdown and a barrier on the step's first bucket,
    then the wrapped PyTorch hook, waited for and timed as `comm`."""

    def __init__(self, mode: Mode, inner, inner_state, communicates=lambda: True):
        self.mode, self.inner, self.inner_state = mode, inner, inner_state
        self.communicates = communicates
        self.first_bucket = True

    def run(self, bucket):
        comm = self.mode.comm
        communicating = self.communicates()  # read before the inner hook advances its counter
        if self.first_bucket:
            self.first_bucket = False
            if comm.timer is not None:
                comm.timer.emulate()
            if communicating:
                comm.barrier()
        fut = self.inner(self.inner_state, bucket)
        if communicating:
            buffer = bucket.buffer()
            nbytes = buffer.numel() * buffer.element_size()
            with comm.clock.phase("comm"):
                fut.wait()
                source = comm.clock.source
                if source.virtual:  # (the clocks met at the barrier: the same cost for all)
                    source.spend(source.all_reduce_seconds("native", comm.workers, nbytes))
            _meter_ring(buffer.numel(), comm.workers, buffer.element_size())
        return fut


def _slowdown_hook(state, bucket):
    """The function DDP calls for each gradient bucket (`state`: a `_SlowdownHook`)."""
    return state.run(bucket)


class DistributedDataParallelSGD(Mode):
    """`ddp`: PyTorch's DistributedDataParallel with its default all-reduce hook."""

    name = "ddp"

    def __init__(self, model, optimizer, comm, options=None):
        super().__init__(model, optimizer, comm, options)
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        self.ddp = self._wrap(default_hooks.allreduce_hook, comm.group)  # its state: the group

    def _wrap(self, hook, hook_state, communicates=lambda: True, **ddp_kwargs):
        from torch.nn.parallel import DistributedDataParallel as DDP

        ddp = DDP(self.model, process_group=self.comm.group, **ddp_kwargs)
        self.hook = _SlowdownHook(self, hook, hook_state, communicates)
        ddp.register_comm_hook(self.hook, _slowdown_hook)
        return ddp

    @property
    def module(self) -> torch.nn.Module:
        return self.ddp

    def decide(self, step: Step) -> Action:
        self.hook.first_bucket = True  # the next backward is a new step
        return Action.AVERAGE_GRADIENTS

    def apply(self, action: Action) -> None:
        self.optimizer.step()

    def describe(self) -> dict[str, Any]:
        return {"api": f"{_DDP_API} + ddp_comm_hooks.default_hooks.allreduce_hook",
                "bytes": "theoretical ring all-reduce volume"}


@dataclass
class PostLocalOptions:
    """Post-local SGD's averaging period and warm-up."""

    period: int = field(default=8, metadata={
        "flags": ("--localsgd-period",), "help": "post-local SGD: steps between model "
                                                 "averages, K"})
    warmup_steps: int = field(default=0, metadata={
        "flags": ("--localsgd-warmup",), "help": "post-local SGD: steps of DDP gradient "
                                                 "averaging first"})

    def validate(self) -> "PostLocalOptions":
        from hetsync.options import invalid_option

        if self.period < 1:
            raise invalid_option(self, "period", "an integer >= 1")
        if self.warmup_steps < 0:
            raise invalid_option(self, "warmup_steps", "an integer >= 0")
        return self


class PostLocalSGD(DistributedDataParallelSGD):
    """`post-local-sgd`: PostLocalSGDOptimizer + PeriodicModelAverager over a DDP model."""

    name = "post-local-sgd"
    Options = PostLocalOptions

    def __init__(self, model, optimizer, comm, options: PostLocalOptions | None = None):
        Mode.__init__(self, model, optimizer, comm, options)
        from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import (
            PostLocalSGDState, post_localSGD_hook)
        from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
        from torch.distributed.optim import PostLocalSGDOptimizer

        opts = self.options.validate()
        self.hook_state = PostLocalSGDState(process_group=comm.group, subgroup=None,
                                            start_localSGD_iter=opts.warmup_steps,
                                            post_local_gradient_allreduce=False)
        self.ddp = self._wrap(post_localSGD_hook, self.hook_state,
                              communicates=lambda: self.in_warmup, forward_sync_buffers=False)
        self.averager = PeriodicModelAverager(period=opts.period, warmup_steps=opts.warmup_steps,
                                              process_group=comm.group)
        self.local_optimizer = optimizer
        self.optimizer = PostLocalSGDOptimizer(optim=optimizer, averager=self.averager)
        self.n_params = sum(p.numel() for p in model.parameters() if p.requires_grad)

    @property
    def in_warmup(self) -> bool:
        """This step averages gradients in backward (read off PostLocalSGDState, whose `iter`
        counts the steps its hook has seen)."""
        return self.hook_state.iter < self.hook_state.start_localSGD_iter

    def decide(self, step: Step) -> Action:
        self.hook.first_bucket = True
        a = self.averager  # its own rule, read off its own step counter (before this step)
        if a.step < a.warmup_steps:
            return Action.AVERAGE_GRADIENTS
        if (a.step - a.warmup_steps) % a.period == 0:
            return Action.AVERAGE_MODELS
        return Action.LOCAL

    def apply(self, action: Action) -> None:
        if action is Action.AVERAGE_MODELS:  # the optimizer averages the parameters
            with self.comm.clock.phase("comm"):
                self.optimizer.step()
                self.comm._meet(torch.empty(self.n_params, dtype=torch.float32, device="meta"),
                                "native")
            _meter_ring(self.n_params, self.comm.workers)
        else:
            self.optimizer.step()

    def describe(self) -> dict[str, Any]:
        return {"api": f"{_DDP_API} + post_localSGD_hook + torch.distributed.optim."
                       "PostLocalSGDOptimizer(PeriodicModelAverager)",
                "bytes": "theoretical ring all-reduce volume"}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "averager_step": self.averager.step,
                "hook_iter": self.hook_state.iter}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.averager.step = int(state["averager_step"])
        self.hook_state.iter = int(state["hook_iter"])


register(ModeSpec("ddp", DistributedDataParallelSGD, "PyTorch's DistributedDataParallel "
                  "(gradient all-reduce in backward)", collective=False, baseline=True, min_workers=2,
                  lr_scaling="workers", lr_note="x workers"))
register(ModeSpec("post-local-sgd", PostLocalSGD, "PyTorch's post-local SGD: local steps, "
                  "parameters averaged every K steps (PostLocalSGDOptimizer)",
                  options=PostLocalOptions, collective=False, baseline=True, min_workers=2,
                  lr_note="local rate"))
