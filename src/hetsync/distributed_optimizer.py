"""`hetsync.wrap`: adopt any mode in your own training loop by wrapping its optimizer.

    opt = hetsync.wrap(torch.optim.SGD(model.parameters(), lr=0.05), model, mode="esync",
                       state_server=("10.0.0.1", 10010))
    for x, y in loader:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()      # the local update and whatever communication the mode requires

The mode is assembled by the same code as `hetsync worker` (`runtime/assembly.py`). The
process group must be initialised first (`torch.distributed.init_process_group`). Every worker
of `group` must construct the wrapper, since construction makes all of them start from rank
0's model. With a parameter server (`async`, `dcasgd`, `--collective ps`), `ps_rank` names the
rank that runs it (`hetsync.comm.ParameterServer` with
`hetsync.algorithms.registry.build_server_rule`); the workers are then every other rank. A
mode's own options are keyword arguments (e.g. `global_lr=1.0, overlap=False` for esync).
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from hetsync.algorithms import registry
from hetsync.algorithms.base import Step
from hetsync.config import COLLECTIVES
from hetsync.runtime.assembly import assemble


class DistributedOptimizer:
    """An optimizer-shaped front over one mode: `step()`, `zero_grad()`, `param_groups`,
    `state_dict()` (the optimizer's and the mode's); plus `round` and `clock` (the seconds
    spent waiting and communicating)."""

    def __init__(self, optimizer: torch.optim.Optimizer, model: torch.nn.Module, mode: str, *,
                 collective: str = "native", group=None,
                 state_server: tuple[str, int] | None = None, ps_rank: int | None = None,
                 timeout: float = 120.0, slowdown: float = 1.0, **options):
        if collective not in COLLECTIVES:
            raise ValueError(f"unknown collective {collective!r}; expected one of "
                             f"{', '.join(COLLECTIVES)}")
        spec = registry.get(mode)
        if spec.baseline:
            raise ValueError(f"mode {mode!r} is PyTorch's own scheme, run by hetsync only as a "
                             f"baseline: use it directly in your loop")
        opts = spec.make_options(options)
        if opts is not None and hasattr(opts, "validate"):
            opts.validate()
        if spec.state_server and state_server is None:
            raise ValueError(f"mode {mode!r} needs state_server=(host, port) of a running "
                             f"`hetsync state-server`")
        if spec.needs_parameter_server(collective) and ps_rank is None:
            raise ValueError(f"mode {mode!r} with collective {collective!r} needs ps_rank, the "
                             f"rank that runs the parameter server")
        group, rank, workers = _workers_group(group, ps_rank)
        self.assembly = assemble(spec, opts, model, optimizer, rank=rank, workers=workers,
                                 group=group, collective=collective, timeout=timeout,
                                 state_server=state_server or ("127.0.0.1", 10010),
                                 ps_rank=ps_rank, slowdown=slowdown)
        self.mode = self.assembly.mode
        self.optimizer = optimizer
        self._step_started = self.mode.comm.timer.begin()

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @property
    def round(self) -> int:
        return self.mode.round

    @property
    def clock(self):
        return self.mode.comm.clock

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, closure=None):
        """The mode's step: emulated slowdown, decide, then the local update and whatever
        communication the decision needs (the time since the last step is this step's)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        mode, timer = self.mode, self.mode.comm.timer
        timer.emulate()
        mode.poll()
        mode.apply(mode.decide(Step(self._step_started, time.perf_counter())))
        self._step_started = timer.begin()
        return loss

    def global_model(self):
        """A context in which the model holds the global weights: evaluate inside it (ESync
        applies its sums in the background and keeps its local steps apart meanwhile)."""
        return self.mode.global_model()

    def finish(self) -> None:
        """Apply what is in flight, keep the global model, say goodbye to the servers and stop
        the background channel, at the end of training."""
        self.mode.finish()
        self.assembly.close()

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "mode": self.mode.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.mode.load_state_dict(state["mode"])


def _workers_group(group, ps_rank: int | None):
    """(group, rank in it, size) of the workers: `group`, or the whole world less the
    parameter server's rank."""
    if not dist.is_initialized():
        world = os.environ.get("WORLD_SIZE", "1")
        if world not in ("", "1"):  # torchrun started several: they would train apart
            raise ValueError(f"WORLD_SIZE={world} but no process group: call "
                             f"torch.distributed.init_process_group(...) before hetsync.wrap, "
                             f"or every process trains its own model")
        return None, 0, 1
    if group is None and ps_rank is not None:
        from hetsync.comm.channel import local_group

        group = local_group([r for r in range(dist.get_world_size()) if r != ps_rank])
    return group, dist.get_rank(group), dist.get_world_size(group)


def wrap(optimizer: torch.optim.Optimizer, model: torch.nn.Module, mode: str = "esync",
         **kwargs) -> DistributedOptimizer:
    """Wrap `optimizer` so that `step()` runs `mode` (see `DistributedOptimizer`)."""
    return DistributedOptimizer(optimizer, model, mode, **kwargs)
