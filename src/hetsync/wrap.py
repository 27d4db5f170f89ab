"""`hetsync.wrap`: adopt any mode in your own training loop by wrapping its optimizer.

    opt = hetsync.wrap(torch.optim.SGD(model.parameters(), lr=0.05), model, mode="esync",
                       state_server=("10.0.0.1", 10010))
    for x, y in loader:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()      # the local update and whatever communication the mode requires

The process group must be initialised first (`torch.distributed.init_process_group`). Every rank
of `group` (default: the whole world) must construct the wrapper, since construction makes all
of them start from rank 0's model. For `async` and `dcasgd`, `ps_rank` names the rank that runs
the parameter server (`hetsync.comm.ParameterServer` with `hetsync.algorithms.build_server_rule`).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from hetsync.algorithms import CommContext, build_algorithm
from hetsync.config import COLLECTIVES


class DistributedOptimizer:
    """An optimizer-shaped front over one mode: `step()`, `zero_grad()`, `param_groups`,
    `state_dict()`; plus `round` and `clock` (the seconds spent waiting and communicating)."""

    def __init__(self, optimizer: torch.optim.Optimizer, model: torch.nn.Module, mode: str, *,
                 collective: str = "native", group=None, state_server: tuple[str, int] | None = None,
                 global_lr: float = 1.0, ps_rank: int | None = None, timeout: float = 120.0):
        if collective not in COLLECTIVES:
            raise ValueError(f"unknown collective {collective!r}; expected one of "
                             f"{', '.join(COLLECTIVES)}")
        workers = dist.get_world_size(group) if dist.is_initialized() else 1
        rank = dist.get_rank(group) if dist.is_initialized() else 0
        comm = CommContext(rank=rank, workers=workers, group=group, collective=collective,
                           timeout=timeout)
        if ps_rank is not None:
            from hetsync.comm import PSClient, connect

            comm.ps_client = connect(ps_rank) if collective == "ps" else PSClient(ps_rank)
        state_client = None
        if mode == "esync":
            if state_server is None:
                raise ValueError("mode 'esync' needs state_server=(host, port) of a running "
                                 "`hetsync state-server`")
            from hetsync.state import StateClient

            state_client = StateClient(*state_server, timeout=timeout)
        self.algo = build_algorithm(mode, model, optimizer, comm, state_client=state_client,
                                    global_lr=global_lr)
        self.optimizer = optimizer
        self.algo.setup()
        self._last_step = time.perf_counter()

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @property
    def round(self) -> int:
        return self.algo.round

    @property
    def clock(self):
        return self.algo.comm.clock

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, closure=None):
        """Local update, then the mode's communication when this step ends a round."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.algo.local_step()
        now = time.perf_counter()
        step_time, self._last_step = now - self._last_step, now  # time since the last step
        if self.algo.wants_sync(step_time):
            self.algo.synchronize()
        self._last_step = time.perf_counter()
        return loss

    def global_model(self):
        """A context in which the model holds the global weights: evaluate inside it (ESync
        applies its sums in the background and keeps its local steps apart meanwhile)."""
        return self.algo.global_model()

    def finish(self) -> None:
        """Apply what is in flight, keep the global model, and say goodbye to the servers
        (asynchronous modes) at the end of training."""
        self.algo.finish()

    def state_dict(self):
        return self.optimizer.state_dict()

    def load_state_dict(self, state):
        self.optimizer.load_state_dict(state)


def wrap(optimizer: torch.optim.Optimizer, model: torch.nn.Module, mode: str = "esync",
         **kwargs) -> DistributedOptimizer:
    """Wrap `optimizer` so that `step()` runs `mode` (see `DistributedOptimizer`)."""
    return DistributedOptimizer(optimizer, model, mode, **kwargs)
