"""What every synchronisation mode shares: the interface the training loop drives, phase timing
and flat views of a model's parameters, gradients and BatchNorm statistics.

A mode is a state object (its subclass of :class:`Mode`) plus the calls the loop makes on it.
It never opens files or prints. The training loop (and ``hetsync.wrap``) drives it, per step:

1. forward (through ``mode.module``) and backward: gradients in ``p.grad``;
2. the emulated slowdown of a slower device (``runtime/heterogeneity.py``), before any
   communication of the step, so a slow worker delays its peers at every collective as a slow
   device would (a mode that communicates inside backward, DDP, emulates it there);
3. ``mode.poll()``: take in what arrived in the background (a sum, a server's answer);
4. ``action = mode.decide(step)``: *what* this step does (:class:`Action`), decided without
   I/O from what the step measured (:class:`Step`) and the mode's state; the rules behind it
   are pure functions (``state/policy.py``);
5. ``mode.perform(action)``: do it (``apply``) — the local update and whatever communication it
   needs — then count the round if the action ended one (``round``: the base class's, not the
   mode's);
6. at the end of training ``mode.finish()``; evaluation runs inside ``mode.global_model()``.

The loop's own agreement (samples seen, evaluate, stop) travels by the path the mode names in
:attr:`Mode.control`: a small blocking all-reduce before the round's ``apply`` (it is also the
round's barrier), a few floats at the end of the mode's own blocking sum of the round
(``Mode.sum_with_proposal``: one collective a round, not two), a job on the worker's
background channel (:mod:`hetsync.comm.channel`) behind the mode's own, or the key-value
store (asynchronous modes). Every mode has ``state_dict()`` / ``load_state_dict()``
holding tensors and numbers only — never a process group — so that it can be checkpointed.
"""

from __future__ import annotations

import abc
import enum
import time
import zlib
from collections import defaultdict
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterator

import torch
import torch.distributed as dist

from hetsync.clock import VirtualClock, WallClock, broadcast_seconds
from hetsync.comm.p2p import wait_released

#: the floats of the loop's proposal (`runtime/control.py`'s `Proposal`) that ride at the end
#: of a mode's sum (`Mode.sum_with_proposal`), which a parameter server's sum must have room for
PROPOSAL_LENGTH = 4


class PhaseClock:
    """Seconds spent per phase (`wait`, `comm`, `query`, `eval`) since the last `take()`, on
    the worker's clock (`source`: the wall clock, or a virtual one, `hetsync.clock`), which
    `now()` reads for the loop too."""

    def __init__(self, source: WallClock | VirtualClock | None = None) -> None:
        self.source = source if source is not None else WallClock()
        self._spent: dict[str, float] = defaultdict(float)

    def now(self) -> float:
        return self.source.now()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = self.source.now()
        try:
            yield
        finally:
            self._spent[name] += self.source.now() - start

    def add(self, name: str, seconds: float) -> None:
        self._spent[name] += seconds

    def total(self) -> float:
        """Seconds spent in every phase since the last `take()` (without resetting)."""
        return sum(self._spent.values())

    def take(self) -> dict[str, float]:
        spent, self._spent = dict(self._spent), defaultdict(float)
        return spent


class Action(enum.Enum):
    """What one step does, as a mode's `decide` says."""

    LOCAL = "local"                          # a local update; the round goes on
    LOCAL_ROUND = "local-round"              # a local update that is a whole round (one device)
    AVERAGE_GRADIENTS = "average-gradients"  # the mean gradient of all workers, then the update
    AVERAGE_MODELS = "average-models"        # a local update, then aggregate the models
    PUSH = "push"                            # push to the parameter server, take its reply
    VOTE = "vote"                            # vote; all aggregate if any voted, else local
    CONTRIBUTE = "contribute"                # hand the gradient to background rounds, apply theirs

    @property
    def ends_round(self) -> bool:
        return self is not Action.LOCAL


class ControlPath(enum.Enum):
    """How the training loop's agreement (samples, evaluate, stop) travels for a mode."""

    BLOCKING = "blocking"      # a 4-float all-reduce before the round's apply (also its barrier)
    WITH_SUM = "with-sum"      # the 4 floats at the end of the mode's blocking sum of the round
    BACKGROUND = "background"  # a job on the worker's channel, behind the mode's own
    STORE = "store"            # the process group's key-value store (no common round)


@dataclass(frozen=True)
class Step:
    """What the loop measured of the step just computed (times on this worker's clock)."""

    started: float   # time.perf_counter() when the step began (its data)
    ended: float     # ... when its computation ended (emulated slowdown included)
    epoch: int = 0   # this worker's epoch over its data (0 first)

    @property
    def duration(self) -> float:
        return self.ended - self.started


@dataclass
class CommContext:
    """How a worker reaches its peers and servers: its rank among the workers, their process
    group, the collective used for aggregation, the parameter server's client and that of the
    service the mode declares (`ModeSpec.service`), if any, the background channel, the phase
    clock, and the step timer that emulates its device's speed (shared with the loop)."""

    rank: int = 0
    workers: int = 1
    group: dist.ProcessGroup | None = None
    collective: str = "native"
    ps_client: object | None = None
    service: object | None = None   # the declared service's client (`RunService.connect`)
    channel: object | None = None   # hetsync.comm.channel.Channel
    timeout: float = 120.0
    clock: PhaseClock = field(default_factory=PhaseClock)
    comm_device: torch.device | None = None  # where buffers live while on the wire
    timer: object | None = None     # hetsync.runtime.heterogeneity.StepTimer
    device_name: str = "cpu"
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))  # the model's
    generation: int = 0  # the members' groups made so far: 0, then one per regroup or join
    #: this worker's share of a step's samples × P: 1 unless batches differ (--balanced-batches)
    sample_weight: float = 1.0
    #: whether a member raised the alarm for a regroup (`hear`; None: nobody listens)
    alarm: Callable[[], bool] | None = None
    #: the thread the main thread's collectives run on while `alarm` is heard (`hear`)
    runner: object | None = None
    #: the run's workers, the spares that have not joined yet too (0: `workers`)
    run_workers: int = 0

    @property
    def wire_device(self) -> torch.device:
        """Where a small control tensor travels: CPU under gloo, the model's device under
        NCCL."""
        return self.comm_device or self.device

    def hear(self, alarm: Callable[[], bool] | None) -> None:
        """Where the workers go on without a lost one (`runtime/membership.py`): `alarm`
        says whether a member has raised the alarm for a regroup. The background channel's
        waits look at it, and from now on so do the main thread's collectives', which run on
        a thread of their own (`runner`, on the main group). Why: gloo fails a wait only on
        the connection that closed, so a member waiting on a live peer that has gone to
        regroup would sit there until --timeout (with four or more workers a native sum's
        non-neighbours of the dead rank do; so does a butterfly's folded rank with three)
        and register after the others' grace; hearing the alarm, it gives up within half a
        second (`ChannelFuture.ALARM_EVERY`) and regroups with them."""
        from hetsync.comm.channel import Channel

        self.alarm = alarm
        if self.channel is not None:
            self.channel.alarm = alarm
        self._close_runner()
        if alarm is not None and self.workers > 1:
            self.runner = Channel(self.group, timeout=self.timeout, name="hetsync-collectives")
            self.runner.alarm = alarm

    def _close_runner(self) -> None:
        old, self.runner = self.runner, None
        if old is not None:  # (a job stuck on a lost peer ends with its own timeout)
            old.close(wait=False)

    def _blocking(self, job: Callable[[], Any], what: str) -> Any:
        """Run `job` (collectives on the main group) where its wait hears the alarm: on
        `runner` where there is one, else here."""
        if self.runner is None:
            return job()
        return self.runner.submit(lambda _group: job(), what).result()

    def all_reduce(self, buffer: torch.Tensor) -> torch.Tensor:
        """Sum `buffer` over the workers with the chosen collective; time it as `comm`."""
        if self.workers == 1:
            return buffer
        with self.clock.phase("comm"):
            return self.sum_on_group(buffer)

    def sum_on_group(self, buffer: torch.Tensor) -> torch.Tensor:
        """Sum `buffer` over the workers' main group with the chosen collective (untimed:
        the caller times its phase), hearing the alarm (`hear`)."""
        def job() -> torch.Tensor:
            summed = self.reduce(buffer, self.group)
            self._meet(buffer, self.collective)
            return summed

        return self._blocking(job, f"a sum of {buffer.numel()} elements")

    def _meet(self, buffer: torch.Tensor, algorithm: str | None) -> None:
        """On a virtual clock: a blocking collective of `buffer` over the group is also a
        meeting of the members' clocks (`hetsync.clock`), priced as a sum by `algorithm`, or
        as a broadcast (None)."""
        source = self.clock.source
        if source.virtual:
            nbytes = buffer.numel() * buffer.element_size()
            seconds = (broadcast_seconds(self.workers, nbytes, source.link) if algorithm is None
                       else source.all_reduce_seconds(algorithm, self.workers, nbytes))
            source.meet(self.group, seconds, self.wire_device)

    def barrier(self, buffer: torch.Tensor | None = None, phase: str = "wait") -> torch.Tensor:
        """Sum a few floats over the workers by recursive doubling, timed as `phase`: a barrier
        (the time a fast worker idles for a slow one) that may carry a small vector.
        ⌈log2 P⌉ hops, where gloo's ring takes 2(P − 1); under `--collective star`, through
        the first worker (two messages each: the cheaper where processes share cores)."""
        flag = buffer if buffer is not None else torch.zeros(1)
        if self.workers == 1:
            return flag
        from hetsync.comm import all_reduce

        on_wire = flag.to(self.wire_device)
        algorithm = "star" if self.collective == "star" else "butterfly"

        def job() -> None:
            all_reduce(on_wire, algorithm=algorithm, group=self.group, timeout=self.timeout)
            self._meet(on_wire, algorithm)

        with self.clock.phase(phase):
            self._blocking(job, f"a barrier of {on_wire.numel()} elements")
        return on_wire.cpu()

    def start_all_reduce(self, buffer: torch.Tensor, what: str):
        """Sum `buffer` over the workers on the background channel (after the jobs already
        submitted); returns the channel's future of the sum (the caller times its own wait)."""
        if self.workers == 1 or self.channel is None:
            from hetsync.comm.channel import ChannelFuture

            if self.workers > 1:
                raise RuntimeError(f"{what}: this worker has no background channel")
            done = ChannelFuture(what, float("inf"), self.timeout)
            done._future.set_result(buffer)
            return done
        source = self.clock.source
        if not source.virtual:
            return self.channel.submit(lambda group: self.reduce(buffer, group), what)
        sent = source.now()
        seconds = source.all_reduce_seconds(self.collective, self.workers,
                                            buffer.numel() * buffer.element_size())
        return source.background(self.channel.submit(
            lambda group: (self.reduce(buffer, group),
                           source.job_end(group, sent, seconds, self.wire_device)), what))

    def members(self) -> list[int]:
        """The global ranks of the workers taking part (all of them, until one is lost)."""
        if self.group is None:
            return list(range(self.workers)) if self.workers > 1 else [self.rank]
        return [dist.get_global_rank(self.group, r) for r in range(self.workers)]

    @property
    def leads(self) -> bool:
        """Whether this worker is the group's first (rank 0, or the lowest survivor after
        it was lost): the one `broadcast` copies from."""
        return self.rank == self.members()[0]

    def broadcast(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` as the group's first worker (rank 0, or the lowest survivor after a
        regroup) holds it, on every worker."""
        if self.workers == 1:
            return tensor
        on_wire = tensor.to(self.wire_device)
        src = 0 if self.group is None else dist.get_global_rank(self.group, 0)

        def job() -> None:
            dist.broadcast(on_wire, src=src, group=self.group)
            self._meet(on_wire, None)

        self._blocking(job, f"a broadcast of {on_wire.numel()} elements")
        return on_wire.to(tensor.device)

    #: the most elements one broadcast of `broadcast_state` carries (16 MB of float32)
    STATE_CHUNK = 1 << 22

    def broadcast_state(self, tensor: torch.Tensor) -> torch.Tensor:
        """`broadcast` of a state workers go on from (a joiner's, the survivors' after a
        regroup): in chunks of at most `STATE_CHUNK` elements, then the first worker's CRC-32
        of its bytes, checked on every worker; the verdict is summed over the workers, so
        that every one raises the CommError (naming the sums where they differ), not one."""
        if self.workers == 1:
            return tensor
        flat = tensor.contiguous().view(-1)
        for part in flat.split(self.STATE_CHUNK):
            part.copy_(self.broadcast(part))
        mine = zlib.crc32(flat.detach().cpu().view(torch.uint8).numpy().tobytes())
        first = int(self.broadcast(torch.tensor([mine], dtype=torch.float64)).item())
        if self.barrier(torch.tensor([float(mine != first)])).item() > 0:
            from hetsync.comm.errors import CommError

            raise CommError(f"the state broadcast arrived altered on a worker (CRC-32 here "
                            f"{mine:08x}, sent {first:08x})", op="broadcast")
        return flat.view(tensor.shape)

    def regroup(self, members: list[int], group: dist.ProcessGroup | None,
                channel_group: dist.ProcessGroup | None, generation: int) -> None:
        """Go on with `members` (global ranks; this worker keeps its rank) on their new
        groups of `generation` (`runtime/membership.py`: after a loss or a join): the old
        channel is left to its thread (a broken one's ends with its job's timeout), and a new
        one runs on `channel_group`."""
        from hetsync.comm.channel import Channel

        old, self.channel = self.channel, None
        self._close_runner()  # (`hear` makes the new group's)
        self.group, self.workers, self.generation = group, len(members), generation
        if len(members) > 1:
            self.channel = Channel(channel_group, timeout=self.timeout)
        if old is not None:
            old.close(wait=False)

    def reduce(self, buffer: torch.Tensor, group) -> torch.Tensor:
        """Sum `buffer` over `group` with the chosen collective, staged through `comm_device`
        (CPU tensors under gloo for a CUDA model)."""
        from hetsync.comm import all_reduce

        on_wire = buffer if self.comm_device is None else buffer.to(self.comm_device)
        all_reduce(on_wire, algorithm=self.collective, group=group, timeout=self.timeout)
        return on_wire.to(buffer.device) if on_wire is not buffer else buffer


class Mode:
    """Base of every mode: the state a worker keeps for it, and the loop's calls on it.

    Subclasses set `name`, `Options` (their options dataclass, or None) and `control`, and
    override `decide` and `apply` (and the other hooks they need).
    """

    name: ClassVar[str] = "base"
    Options: ClassVar[type | None] = None
    control: ControlPath = ControlPath.BLOCKING
    #: a round ends with an aggregation pass that ESync's own logs count as one more iteration
    aggregation_pass: ClassVar[bool] = False
    #: `global_model()` is a collective (the workers hold different models): every worker
    #: enters it at an evaluation
    collective_global_model: ClassVar[bool] = False
    #: each round's sum counts its contributors (`with_count`) and sets `contributors`, so a
    #: worker that has joined is left out of the mean and all learn when everyone has
    counts_contributors: ClassVar[bool] = False
    #: a round's draws are in the global model of every member or of none: its one blocking
    #: sum completes for all or fails (sync's step). The training loop then says where a
    #: lost worker's draws reached before the sum, not after its record (`runtime/shards.py`,
    #: step 2): one stopped in between has trained batches its records do not show yet
    rounds_all_or_none: ClassVar[bool] = False
    #: what of this mode's communication the virtual clock (`hetsync.clock`) does not time
    #: (None: it communicates only through `CommContext`'s collectives, which it times)
    untimed_by_virtual_clock: ClassVar[str | None] = None

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 comm: CommContext, options: Any = None):
        self.model, self.optimizer, self.comm = model, optimizer, comm
        if options is None and self.Options is not None:
            options = self.Options()
        self.options = options
        self.round = 1
        #: this worker's data has run out (`join`): it takes part contributing nothing
        self.joined = False
        #: how many workers put data into the last round's sum (collective modes; None until
        #: a round has been summed): 0 means every worker has joined
        self.contributors: int | None = None
        #: this step's samples ÷ a batch of this worker's own: 1, but for a step on another's
        #: shard whose batches differ (`runtime/shards.py`; the loop sets it before `decide`)
        self.batch_share = 1.0
        #: under `ControlPath.WITH_SUM`, the loop's proposal for the round that this step
        #: ends (set before `perform`), and its sum over the workers once the round's sum is
        #: in (`sum_with_proposal`)
        self.proposal: torch.Tensor | None = None
        self.agreed: torch.Tensor | None = None

    @classmethod
    def check_optimizer(cls, optimizer: torch.optim.Optimizer) -> None:
        """Refuse (ValueError, one line) a user's optimizer this mode would not apply as
        given (`hetsync.wrap`); every optimizer is fine for most modes."""

    @classmethod
    def optimizer_lr(cls, base_lr: float, options: Any) -> float:
        """The learning rate of the worker's local optimizer for base rate `-l`."""
        return base_lr

    # ----------------------------------------------------------------- hooks
    @property
    def module(self) -> torch.nn.Module:
        """What the loop calls for the forward pass (DDP's wrapper for the DDP baseline)."""
        return self.model

    def setup(self) -> None:
        """Make every worker start from the same model (may communicate)."""

    def poll(self) -> None:
        """Take in what arrived in the background since the last step (default: nothing)."""

    def decide(self, step: Step) -> Action:
        """What this step does; no I/O (see the module docstring)."""
        raise NotImplementedError

    def apply(self, action: Action) -> None:
        """Do what `decide` said: the local update and the communication it needs (the
        round counter is not the mode's: `perform` counts the round an action ends)."""
        raise NotImplementedError

    def perform(self, action: Action) -> None:
        """What the loop and `hetsync.wrap` call: `apply`, then count the round `action`
        ended, if it ended one."""
        self.apply(action)
        if action.ends_round:
            self.round += 1

    def sum_with_proposal(self, buffer: torch.Tensor) -> torch.Tensor:
        """All-reduce `buffer` (`CommContext.all_reduce`) with the loop's proposal, if one is
        set, at its end: the proposal's sum goes to `agreed`, the buffer's is returned. A
        buffer of less than float32 precision (a count of samples would round) leaves the
        proposal to a blocking all-reduce of its own."""
        proposal, self.proposal = self.proposal, None
        if proposal is None:
            return self.comm.all_reduce(buffer)
        if buffer.dtype not in (torch.float32, torch.float64):
            self.agreed = self.comm.barrier(proposal)
            return self.comm.all_reduce(buffer)
        summed = self.comm.all_reduce(torch.cat([buffer, proposal.to(buffer)]))
        self.agreed = summed[buffer.numel():].cpu()
        return summed[:buffer.numel()]

    def settle(self) -> None:
        """Complete what is in flight (a background aggregation), so that `state_dict` is
        whole; the loop calls it before a checkpoint. Nothing, for most modes."""

    def finish(self) -> None:
        """Called once after the last step: apply what is in flight, say goodbye to the
        parameter server, if any."""
        if self.comm.ps_client is not None:
            self.comm.ps_client.close()

    def join(self) -> None:
        """This worker's data has run out (`hetsync.wrap`'s agreed stop, as torch's `Join`):
        from now on it takes part in the others' rounds contributing nothing (`join_step`)
        until all have joined."""
        self.joined = True

    def join_step(self) -> Action:
        """One step of a joined worker: settle what is in flight, then the mode's step with
        zero gradients (a mode that `counts_contributors` leaves it out of the mean; its
        `decide` ends the round at once). Returns what the step did."""
        self.settle()
        for p in self.parameters():
            p.grad = torch.zeros_like(p)
        now = time.perf_counter()
        self.poll()
        action = self.decide(Step(now, now))
        self.perform(action)
        return action

    def global_model(self):
        """A context in which the model holds the global weights (it does already, unless
        the mode keeps local progress apart from them). Where `collective_global_model` is
        set, making them takes the others' part (SelSync: a round of its lockstep, which
        the others' steps take part in); the training loop has every worker enter it at the
        same round."""
        return nullcontext()

    def describe(self) -> dict[str, Any]:
        """What run.json records of the mode beyond its options (e.g. the API it runs on)."""
        return {}

    def record(self) -> dict[str, Any]:
        """run.json's `mode_info`: `describe()`, and whether its rounds end with an aggregation
        pass (for ESync's summary schema, which telemetry reads from the records alone)."""
        return {**self.describe(), **({"aggregation_pass": True} if self.aggregation_pass
                                      else {})}

    def round_record(self) -> dict[str, Any]:
        """Fields the mode adds to the round's record (e.g. whether it synchronised)."""
        return {}

    @property
    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    # ----------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The mode's own state (not the model's nor the optimizer's): tensors and numbers."""
        return {"round": self.round}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.round = int(state["round"])

    def restart_state(self, peer: dict[str, Any]) -> dict[str, Any]:
        """What a worker restarted in place of a lost one loads of a peer's `state_dict`
        (`runtime/checkpoint.py`, resuming after a loss): what every worker holds alike —
        here the round; a mode keeps its own where the peer's would be another worker's."""
        return peer

    # ----------------------------------------------------------------- helpers
    def parameters(self) -> list[torch.Tensor]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def broadcast_model(self, src: int = 0) -> None:
        """Copy worker `src`'s parameters and buffers to every worker (at setup, and a
        wrapped run's last step: the process may exit right after, so the sent tensors are
        held until torch's threads let go of them, `comm.p2p.wait_released`)."""
        if self.comm.workers == 1:
            return
        src_global = src if self.comm.group is None else dist.get_global_rank(self.comm.group, src)
        device = self.comm.comm_device
        sent = []
        for t in list(self.model.parameters()) + list(self.model.buffers()):
            buf = t.data if device is None else t.data.to(device)
            dist.broadcast(buf, src=src_global, group=self.comm.group)
            if device is not None:
                t.data.copy_(buf)
            sent.append(buf)
        wait_released(sent)


def optimizer_settings(optimizer: torch.optim.Optimizer) -> str:
    """`SGD(lr=0.1, momentum=0.9)`: an optimizer and its non-zero numeric settings."""
    group = optimizer.param_groups[0]
    shown = [f"{k}={v:g}" for k, v in group.items() if k != "params" and v
             and isinstance(v, (int, float)) and not isinstance(v, bool)]
    return f"{type(optimizer).__name__}({', '.join(shown)})"


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


@contextmanager
def holding(tensors: list[torch.Tensor], flat: torch.Tensor) -> Iterator[None]:
    """`tensors` hold the consecutive slices of `flat` meanwhile, then their own values again
    (a mode's `global_model` where the model's weights are its local ones)."""
    own = flatten(tensors)
    unflatten_into(flat, tensors)
    try:
        yield
    finally:
        unflatten_into(own, tensors)


def gradients(params: list[torch.Tensor]) -> list[torch.Tensor]:
    return [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]


def set_gradients(flat: torch.Tensor, params: list[torch.Tensor],
                  also: list[torch.Tensor] = ()) -> None:
    """Write `flat` into the parameters' gradients (made where missing), then into `also`
    (e.g. BatchNorm statistics)."""
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    unflatten_into(flat.to(params[0].device) if params else flat,
                   [p.grad for p in params] + list(also))


def pack(parts: list[torch.Tensor]) -> torch.Tensor:
    """One contiguous buffer of `parts` (one collective for all of them)."""
    return torch.cat([p.reshape(-1) for p in parts])


def with_count(buffer: torch.Tensor, contributes: bool) -> torch.Tensor:
    """`buffer` (zeros if this worker contributes nothing: it has joined), then 1 or 0: the
    sum's last entry counts its contributors."""
    flag = torch.ones(1, dtype=buffer.dtype, device=buffer.device)
    if contributes:
        return torch.cat([buffer, flag])
    return torch.cat([torch.zeros_like(buffer), flag * 0])


# ---------------------------------------------------------------------- opt-in capabilities
class GoesOn(abc.ABC):
    """A capability a mode opts into (as a module opts into torch's `Join` by being
    `Joinable`): its workers go on after one is lost. `runtime/membership.py` regroups the
    survivors; then, on the new `comm.group`, every survivor calls `rejoin`. The
    parameter-server modes need not: they go on by the server's rule."""

    @classmethod
    def goes_on_without_a_worker(cls, options: Any) -> bool:
        """Whether these options let it (ESync's blocking rounds do not, say)."""
        return True

    @abc.abstractmethod
    def rejoin(self) -> None:
        """After a regroup, on the new `comm.group`: drop what was in flight and take the
        leader's global state, so that every survivor holds the same."""


class Admits(GoesOn):
    """A further capability: a lost worker, or a spare, joins the running job at a round's
    end (`runtime/membership.py`), and every member and the joiner call `admit`."""

    @classmethod
    def admits_a_worker(cls, options: Any) -> bool:
        """Whether these options let it (by default: wherever it goes on)."""
        return cls.goes_on_without_a_worker(options)

    @abc.abstractmethod
    def admit(self, joined: bool) -> None:
        """A worker joins at this round's end, on the new `comm.group`, with nothing in
        flight (`settle` came first): the leader's global state goes to every member;
        `joined`: this is the worker that joins, and starts from it."""


def goes_on(mode: "type[Mode] | Mode", options: Any) -> bool:
    """Whether `mode` (a class or an instance) goes on without a lost worker under
    `options`: it opted in (`GoesOn`) and its options let it."""
    cls = mode if isinstance(mode, type) else type(mode)
    return issubclass(cls, GoesOn) and cls.goes_on_without_a_worker(options)


def admits(mode: "type[Mode] | Mode", options: Any) -> bool:
    """Whether `mode` takes a worker in while it runs under `options` (`Admits`)."""
    cls = mode if isinstance(mode, type) else type(mode)
    return issubclass(cls, Admits) and cls.admits_a_worker(options)
