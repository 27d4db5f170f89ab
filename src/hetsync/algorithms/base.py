"""What every synchronisation mode shares: the interface the training loop drives, phase timing
and flat views of a model's parameters, gradients and BatchNorm statistics.

A mode decides, step by step, between a local update and communication; it never opens files or
prints. The training loop (and `hetsync.wrap`) drives it as:

1. forward and backward (gradients in `p.grad`);
2. `algo.local_step()` — the local update, if the mode makes one;
3. (emulated slowdown)
4. `algo.wants_sync(step_time)` — does this step end a round?
5. if so, `algo.settle()` (a mode that aggregates in the background, ESync with `overlap`,
   waits for the previous round's sum) and `algo.synchronize(control)` — communicate and
   apply the global update. `control` is a small float tensor summed across workers along
   with the model traffic (the loop's cluster-wide decisions: samples, evaluate, stop);
6. after `synchronize` and after every step, `algo.agreed_control()`: the sum of a round's
   control vectors once it is in (at once, or some steps later in the background), else None.
   Modes without a collective have none. The model is evaluated inside `algo.global_model()`.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from concurrent.futures import Future
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Iterator

import torch
import torch.distributed as dist


class PhaseClock:
    """Seconds spent per phase (`wait`, `comm`, `query`, `eval`) since the last `take()`."""

    def __init__(self) -> None:
        self._spent: dict[str, float] = defaultdict(float)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self._spent[name] += time.perf_counter() - start

    def add(self, name: str, seconds: float) -> None:
        self._spent[name] += seconds

    def take(self) -> dict[str, float]:
        spent, self._spent = dict(self._spent), defaultdict(float)
        return spent


@dataclass
class CommContext:
    """How a worker reaches its peers: its rank among the workers, their process group, the
    collective used for aggregation, the parameter-server client (if any) and the clock."""

    rank: int = 0
    workers: int = 1
    group: dist.ProcessGroup | None = None
    collective: str = "native"
    ps_client: object | None = None
    timeout: float = 120.0
    clock: PhaseClock = field(default_factory=PhaseClock)
    comm_device: torch.device | None = None  # where buffers live while on the wire

    def all_reduce(self, buffer: torch.Tensor) -> torch.Tensor:
        """Sum `buffer` over the workers with the chosen collective; time it as `comm`."""
        if self.workers == 1:
            return buffer
        with self.clock.phase("comm"):
            return self._reduce(buffer)

    def wait_for_peers(self, phase: str = "wait") -> None:
        """A barrier over the workers, timed as `phase`: the time a fast worker idles for a slow
        one, kept apart from the transfer that follows. One float by recursive doubling:
        ⌈log2 P⌉ hops, where gloo's ring takes 2(P − 1) (a third of the time at P = 4)."""
        if self.workers == 1:
            return
        from hetsync.comm import all_reduce

        flag = torch.zeros(1, device=self.comm_device or "cpu")
        with self.clock.phase(phase):
            all_reduce(flag, algorithm="butterfly", group=self.group, timeout=self.timeout)

    def start_all_reduce(self, buffer: torch.Tensor) -> Future:
        """Begin summing `buffer` over the workers on a background thread and return a future
        of the sum; the caller times its own wait for it (the transfer overlaps its work).
        Collectives must be issued in the same order on every rank: keep one in flight at a
        time. The thread is a daemon, so a worker that fails exits at once instead of waiting
        for its peers' timeout."""
        future: Future = Future()
        if self.workers == 1:
            future.set_result(buffer)
            return future

        def run() -> None:
            try:
                future.set_result(self._reduce(buffer))
            except BaseException as exc:  # noqa: BLE001 - raised again by future.result()
                future.set_exception(exc)

        threading.Thread(target=run, name="hetsync-all-reduce", daemon=True).start()
        return future

    def _reduce(self, buffer: torch.Tensor) -> torch.Tensor:
        from hetsync.comm import all_reduce

        on_wire = buffer if self.comm_device is None else buffer.to(self.comm_device)
        all_reduce(on_wire, algorithm=self.collective, group=self.group, timeout=self.timeout)
        return on_wire.to(buffer.device) if on_wire is not buffer else buffer


class Algorithm:
    """Base of every mode. Subclasses override the hooks they need."""

    name = "base"
    #: True when the mode's rounds go through a collective that carries the control vector.
    collective_control = True

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 comm: CommContext):
        self.model, self.optimizer, self.comm = model, optimizer, comm
        self.round = 1
        self._control: torch.Tensor | None = None  # see `agreed_control`

    # ----------------------------------------------------------------- hooks
    def setup(self) -> None:
        """Make every worker start from the same model."""

    def local_step(self) -> None:
        """The local update from the gradients in `p.grad`, if the mode makes one."""

    def wants_sync(self, step_time: float) -> bool:
        return True

    def synchronize(self, control: torch.Tensor | None = None) -> None:
        raise NotImplementedError

    def settle(self) -> None:
        """Wait for, and apply, an aggregation still in flight (none unless in background)."""

    def agreed_control(self) -> torch.Tensor | None:
        """The sum of the control vectors of the last round whose sum came in, once."""
        control, self._control = self._control, None
        return control if control is not None and control.numel() else None

    def global_model(self):
        """A context in which the model holds the global weights (it does already, unless
        the mode keeps local progress apart from them)."""
        return nullcontext()

    def finish(self) -> None:
        """Called once after the last round: settle, say goodbye to the parameter server, if
        any."""
        self.settle()
        if self.comm.ps_client is not None:
            self.comm.ps_client.close()

    @property
    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    # ----------------------------------------------------------------- helpers
    def parameters(self) -> list[torch.Tensor]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def broadcast_model(self, src: int = 0) -> None:
        """Copy worker `src`'s parameters and buffers to every worker (setup only)."""
        if self.comm.workers == 1:
            return
        src_global = src if self.comm.group is None else dist.get_global_rank(self.comm.group, src)
        for t in list(self.model.parameters()) + list(self.model.buffers()):
            buf = t.data if self.comm.comm_device is None else t.data.to(self.comm.comm_device)
            dist.broadcast(buf, src=src_global, group=self.comm.group)
            if buf is not t.data:
                t.data.copy_(buf)


def bn_statistics(model: torch.nn.Module) -> list[torch.Tensor]:
    """BatchNorm running means and variances (the floating-point buffers ESync averages)."""
    stats = []
    for module in model.modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and module.track_running_stats:
            stats += [module.running_mean, module.running_var]
    return [s for s in stats if s is not None]


def flatten(tensors: list[torch.Tensor]) -> torch.Tensor:
    if not tensors:
        return torch.zeros(0)
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def unflatten_into(flat: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    """Copy consecutive slices of `flat` into `tensors` (in place)."""
    offset = 0
    for t in tensors:
        n = t.numel()
        t.data.copy_(flat[offset:offset + n].view_as(t))
        offset += n
    if offset != flat.numel():
        raise ValueError(f"flat buffer has {flat.numel()} elements, tensors need {offset}")


def gradients(params: list[torch.Tensor]) -> list[torch.Tensor]:
    return [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]


def pack(parts: list[torch.Tensor], control: torch.Tensor | None = None) -> torch.Tensor:
    """One contiguous buffer: the model traffic, then the control vector (one collective)."""
    tail = [] if control is None else [control.to(parts[0].dtype if parts else torch.float32)]
    return torch.cat([p.reshape(-1) for p in parts] + tail)
