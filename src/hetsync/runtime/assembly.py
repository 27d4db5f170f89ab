"""One assembly of a mode, for `hetsync worker` and `hetsync.wrap` alike.

Given the mode's spec (`hetsync.algorithms.registry`), its options, the model and the
optimizer, `assemble` connects what the mode needs and returns it ready to train:

1. the workers' process group, and where tensors travel (CPU staging of a CUDA model under
   gloo);
2. the parameter-server client when the mode or `--collective ps` needs one (the server is the
   last global rank);
3. the client of the service the mode declares (`ModeSpec.service`), checked to be up;
4. the worker's persistent background channel (`hetsync.comm.channel`, its own group);
5. the step timer that emulates the device's speed (`runtime/heterogeneity.py`), and the
   clock it keeps (`hetsync.clock`: the wall clock, or a virtual one);
6. the mode itself, whose `setup()` makes every worker start from the same model.
"""

from __future__ import annotations

import functools
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hetsync.algorithms.base import CommContext, Mode, PhaseClock
from hetsync.algorithms.registry import ModeSpec
from hetsync.comm.channel import Channel
from hetsync.runtime.heterogeneity import StepTimer
from hetsync.telemetry.rundir import RunDir


@dataclass
class Assembly:
    """A mode ready to train, and what it was connected to (closed by `close`)."""

    spec: ModeSpec
    mode: Mode
    comm: CommContext

    def close(self, wait: bool = True) -> None:
        """Stop the background channel (`wait`: for its jobs; not after a failure, when its
        daemon thread dies with the process) and the collectives' thread, if any, and close
        the service's connection."""
        if self.comm.channel is not None:
            self.comm.channel.close(wait=wait)
        self.comm.hear(None)
        if self.comm.service is not None:
            self.comm.service.close()

    def record_service(self, run_dir: Path) -> None:
        """The declared service's counts as the run's `service.json` (by the worker that
        leads, at the end), if it can tell them."""
        traffic = getattr(self.comm.service, "traffic", lambda: None)()
        if traffic is not None:
            from hetsync.telemetry.recorder import write_json_atomic

            write_json_atomic(RunDir(run_dir).service,
                              {"service": self.spec.service.name, **traffic})


def device_label(device: torch.device) -> str:
    return "cpu" if device.type == "cpu" else f"gpu{device.index}"


@dataclass(frozen=True)
class Wiring:
    """Where a worker's mode connects: its place among the workers, their groups, and the
    servers.

    `group` is the workers' process group (None: the default group, which must then hold the
    workers only); `channel_group`, a second group of the same ranks for the background
    channel (None: made by `assemble`, by the workers only); `run_workers`: the run's
    workers, where some of them (`--spare-workers`) are not among `group`'s yet (0: all are);
    `service` and `service_token`: where the mode's service listens; `ps_rank`: the
    parameter server's global rank (the modes and collectives that need one).
    """

    rank: int
    workers: int
    group: dist.ProcessGroup | None = None
    channel_group: dist.ProcessGroup | None = None
    collective: str = "native"
    timeout: float = 120.0
    service: tuple[str, int] = ("127.0.0.1", 10010)
    service_token: str | None = None
    ps_rank: int | None = None
    run_workers: int = 0


def assemble(spec: ModeSpec, options: Any, model: torch.nn.Module,
             optimizer: torch.optim.Optimizer, wiring: Wiring, *,
             timer: StepTimer | None = None, sample_weight: float = 1.0,
             joining: bool = False) -> Assembly:
    """Connect `spec`'s mode on this worker (see the module docstring) as `wiring` says, and
    set it up.

    Every worker calls this, in the same order as its other collectives. `joining`: a lost
    rank's new process joining the running job (`runtime/membership.py`) makes neither its
    channel nor the mode's setup, which its admission brings. `sample_weight`: this worker's
    share of a step's samples × P (`RankPlan.sample_weight`). `timer`: the device's step
    timer (`RankPlan.timer`; None: the device itself, on the wall clock), whose clock times
    the whole worker (`hetsync.clock`).
    """
    rank, workers, group, collective = (wiring.rank, wiring.workers, wiring.group,
                                        wiring.collective)
    timeout = wiring.timeout
    device = next(model.parameters()).device
    if timer is None:
        timer = StepTimer(cpu_device=device.type == "cpu")
    gloo_on_cuda = device.type == "cuda" and workers > 1 and dist.get_backend(group) != "nccl"
    comm = CommContext(rank=rank, workers=workers, group=group, collective=collective,
                       timeout=timeout, comm_device=torch.device("cpu") if gloo_on_cuda else None,
                       timer=timer, clock=PhaseClock(timer.clock),
                       device_name=device_label(device), device=device,
                       sample_weight=sample_weight, run_workers=wiring.run_workers)
    if spec.needs_parameter_server(collective):
        from hetsync.comm import PSClient, connect

        if wiring.ps_rank is None:
            raise ValueError(f"mode {spec.name!r} with --collective {collective} needs a "
                             f"parameter server: give its rank")
        # `connect` also makes it the client that all_reduce(..., "ps") uses.
        comm.ps_client = (connect(wiring.ps_rank) if collective == "ps"
                          else PSClient(wiring.ps_rank))
        if timer.clock is not None:  # (its requests carry the worker's virtual time)
            comm.ps_client.clock = timer.clock
    if spec.service is not None:  # (`service`: where it listens)
        comm.service = spec.service.connect(*wiring.service, timeout, wiring.service_token)
        comm.service.wait_until_up(deadline_s=min(timeout, 60.0))
    if workers > 1 and not joining:
        ranks = [dist.get_global_rank(group, r) if group is not None else r
                 for r in range(workers)]
        comm.channel = (Channel(wiring.channel_group, timeout=timeout)
                        if wiring.channel_group is not None
                        else Channel.for_ranks(ranks, timeout=timeout))
    mode = spec.worker(model, optimizer, comm, options)
    if not joining:
        mode.setup()
    return Assembly(spec, mode, comm)


def parameter_server(spec: ModeSpec, options: Any, model: torch.nn.Module, lr: float,
                     worker_ranks: list[int], timeout: float, gone=None,
                     joins: bool = False, absent: list[int] = (), link=None,
                     work_s_per_byte: float = 0.0):
    """The parameter server of `spec`'s mode (for `hetsync worker`'s server rank and
    `hetsync.serve_parameters` alike): it starts from `model`'s weights, which the workers
    pull, and applies the mode's rule at rate `lr`; it sums BatchNorm statistics too (sync,
    ESync and SelSync over `--collective ps`). A worker that died never says goodbye: once
    the others have, it is given up after `linger` (the asynchronous modes go on without
    it), or at once where the launcher has marked it dead in the store. `joins`: in an
    asynchronous mode, its new process may link to the server and be served again
    (`runtime/server_link.py`; `hetsync worker --join`), and so may the `absent` ones (the
    spares a run starts without) once they link. `gone`, `link` (a virtual clock's: the
    order of service is the workers' virtual one), `work_s_per_byte` (the virtual clock's
    server work): see `ParameterServer`."""
    from hetsync.algorithms.base import bn_statistics, flatten
    from hetsync.algorithms.registry import build_server_rule
    from hetsync.comm import ParameterServer
    from hetsync.compression import Layout

    params = [p for p in model.parameters() if p.requires_grad]
    weights = flatten(params).float().cpu()
    rule = (build_server_rule(spec.name, weights, lr, options, Layout.of(params),
                              len(worker_ranks)) if spec.server_rule is not None else None)
    stats_numel = sum(t.numel() for t in bn_statistics(model))
    lost = linked = None
    if dist.is_initialized() and dist.get_world_size() > 1:  # (launch marks the dead there)
        from hetsync.runtime.membership import known_lost
        from hetsync.runtime.server_link import Joins

        store = dist.distributed_c10d._get_default_store()
        lost = functools.partial(known_lost, store, worker_ranks)
        if joins and spec.asynchronous:  # (a sum cannot take a worker back: common rounds)
            linked = Joins(store, dist.get_rank())
    return ParameterServer(worker_ranks, rule, timeout=timeout,
                           numel=weights.numel() + spec.push_extra,
                           sum_numel=spec.longest_sum(weights.numel(), stats_numel, options),
                           linger=min(timeout, 30.0), known_lost=lost, gone=gone, joins=linked,
                           absent=absent, link=link, work_s_per_byte=work_s_per_byte)


def serve_and_record(server, run_dir: Path | None):
    """Serve until every worker has finished; say on stderr whom the server refused or
    lost (and served again), and write its traffic, refusals, losses and rejoins as
    `ps.jsonl` into `run_dir` (if any). Returns the server's stats."""
    from hetsync.comm import meter
    from hetsync.telemetry.recorder import JsonlWriter

    start = time.perf_counter()
    stats = server.serve()
    sent, recv = meter.totals()
    for refusal in stats.refused:
        print(f"parameter server: {refusal['error']}; rank {refusal['rank']} is served no "
              f"more", file=sys.stderr, flush=True)
    if stats.lost:
        again = f"; served again: {stats.rejoined}" if stats.rejoined else ""
        print(f"parameter server: lost rank(s) {stats.lost}{again}", file=sys.stderr,
              flush=True)
    if run_dir is not None:
        with JsonlWriter(RunDir(run_dir).ps) as out:
            out.write({"t": time.perf_counter() - start, "bytes_sent": sent,
                       "bytes_recv": recv, "refused": stats.refused, "lost": stats.lost,
                       "rejoined": stats.rejoined, "busy_s": stats.busy_s,
                       "requests": sum(stats.requests.values()),
                       "absent": sorted(server.absent)})  # (spares that never linked)
    return stats
