"""`hetsync.wrap`: adopt any mode in your own training loop by wrapping its optimizer.

    dist.init_process_group("gloo")                    # torchrun --nproc-per-node 3 ...
    opt = hetsync.wrap(torch.optim.SGD(model.parameters(), lr=0.05), model, mode="esync")
    for x, y in loader:                                # shards of any, even unequal, length
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()          # the local update and whatever communication the mode requires
    opt.finish()            # every worker ends here together, with the global model

1. Construction assembles the mode by the same code as `hetsync worker`
   (`runtime/assembly.py`); every worker of the group constructs it, in the same order, and
   starts from rank 0's model. A mode that declares a service (`ModeSpec.service`: ESync's
   state server) and was given none gets one: rank 0 serves it on a thread (on loopback when
   the group is on one machine, else on the master's address with a token made for the run) and
   tells the others through the process group's store. A mode with a parameter server needs one
   more process than workers: the last rank calls `serve_parameters` instead of training.
2. The wrapper is a `torch.optim.Optimizer` sharing the wrapped one's parameter groups and
   state: learning-rate schedulers and `GradScaler` work on it as on the optimizer itself.
   Under `GradScaler`, a worker whose gradients overflowed takes part in the step with zero
   gradients (every worker must take part in every round) and its scale is lowered as usual.
3. `step()`: the emulated slowdown (`slowdown=`: a slower device), then the training loop's
   own step driver (`runtime/rounds.py`: decide, perform, the round's record).
4. `finish()` is an agreed stop for uneven inputs, as torch's `Join` and horovod's `join`: a
   worker whose data has run out keeps taking part in the others' rounds, contributing nothing
   (each round's sum counts its contributors and averages over them), until every worker has
   finished; asynchronous modes count the finished workers in the store instead, watching
   the others' heartbeats. Then every worker applies what is in flight and ends with the
   global model (a parameter-server mode pulls the server's final weights).

hetsync departs from `Join` in one way: the mean of a round is over the workers that
contributed, not divided by all of them (`Join`'s `divide_by_initial_world_size`).
"""

from __future__ import annotations

import atexit
import datetime
import ipaddress
import json
import os
import secrets
import socket
import time
import warnings
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist

from hetsync.algorithms import registry
from hetsync.algorithms.base import Action, ControlPath, Step, goes_on
from hetsync.config import COLLECTIVES
from hetsync.clock.profile import sample_weights
from hetsync.runtime.assembly import Wiring, assemble
from hetsync.runtime.devices import build_info
from hetsync.runtime.heterogeneity import StepTimer
from hetsync.runtime.membership import Membership, Roster
from hetsync.comm.errors import CommError
from hetsync.comm.p2p import wait_released
from hetsync.runtime.control import Departures, StoreJoin
from hetsync.runtime.rounds import RoundAccount, decide, perform
from hetsync.runtime import shards
from hetsync.runtime.shard_batches import check_epoch
from hetsync.telemetry.recorder import JsonlWriter
from hetsync.telemetry.rundir import RunDir


#: what a collective raises when a peer has gone (hetsync's transfers; gloo's own)
PEER_FAILURES = (CommError, dist.DistBackendError)


class DistributedOptimizer(torch.optim.Optimizer):
    """The wrapped optimizer (see the module docstring and `hetsync.wrap`'s arguments).

    - ``step(closure=None, *, loss=None)``, ``zero_grad()``, ``param_groups``,
      ``state_dict()`` (the optimizer's, with the mode's under ``"hetsync"``),
      ``load_state_dict()``: a torch optimizer's (``loss``: the step's, for the records);
    - ``workers``, ``rank``: how many workers train and this one's rank among them (for a
      sampler: ``DistributedSampler(data, opt.workers, opt.rank)``);
    - ``batch_size``: this worker's batch, for its loader (``DataLoader(data,
      opt.batch_size, sampler=...)``): ``batch_size`` as given, or with ``profile`` (a
      ``hetsync probe`` profile, device i = worker i) balanced to the devices' speeds —
      ``batch_size`` the fastest device's, each other's as many samples as fit in its
      step, and every sum counting samples (each worker's weight its share of a step's
      samples); None where neither was given;
    - ``batch_sampler(num_samples, batch_size=None, *, shuffle=True, seed=0)``: hetsync's
      sampler of this worker's batches (``DataLoader(data, batch_sampler=...)``), one pass
      an epoch; where the survivors of a lost worker go on, one of them draws the rest of
      its shard (`runtime/shard_batches.py`);
    - ``global_model()``: a context in which the model holds the global weights; evaluate
      inside it, on any worker, at any step; its time is not training time;
    - ``record_evaluation(test_acc, test_loss=None)``: the leader (``leads``: rank 0, or
      after its loss the lowest survivor) appends it to ``eval.jsonl``, stamped with the
      training time so far (call it on every worker: the one that leads then writes it);
    - ``set_epoch(epoch)``: the epoch of the next steps, for the records;
    - ``finish()``: the agreed stop; every worker ends with what ``global_model()`` shows;
    - ``lost_workers``: the workers the run went on without — in ESync's background rounds
      and eager-SGD the survivors of a dead worker regroup and train on; in the
      parameter-server modes one that died or fell silent for ``timeout`` is not waited for
      at the stop — each named in a warning and in run.json;
    - ``run_dir`` (where the records go, or None), ``round``, ``clock`` (seconds waiting
      and communicating), ``mode``.
    """

    #: GradScaler hands its scale and overflow flag to `step` instead of skipping it
    _step_supports_amp_scaling = True
    _made = 0  # wrappers made in this process: their store keys apart

    def __init__(self, optimizer: torch.optim.Optimizer, model: torch.nn.Module, mode: str, *,
                 collective: str = "native", group=None,
                 service: tuple[str, int] | None = None, ps_rank: int | None = None,
                 timeout: float = 120.0, slowdown: float = 1.0, run_dir=None, log_dir=None,
                 batch_size: int | None = None, profile=None, **options):
        if isinstance(optimizer, DistributedOptimizer):
            raise ValueError("this optimizer is already wrapped by hetsync.wrap")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"hetsync.wrap wraps a torch.optim.Optimizer, got "
                            f"{type(optimizer).__name__}")
        if collective not in COLLECTIVES:
            raise ValueError(f"unknown collective {collective!r}; expected one of "
                             f"{', '.join(COLLECTIVES)}")
        if not 0 < timeout < float("inf"):
            raise ValueError(f"timeout={timeout!r}: expected a finite number of seconds > 0")
        spec = registry.get(mode)
        if spec.baseline:
            raise ValueError(f"mode {mode!r} is PyTorch's own scheme, run by hetsync only as a "
                             f"baseline: use it directly in your loop (hetsync.wrap's modes: "
                             f"{', '.join(registry.names(baseline=False))})")
        opts = spec.make_options(options)
        self.optimizer = optimizer  # (before Optimizer's state: the properties read it)
        self.__setstate__({"defaults": optimizer.defaults})  # hooks, as Optimizer.__init__
        spec.worker.check_optimizer(optimizer)
        _warn_of_compounded_momentum(spec, opts, optimizer)
        server = spec.needs_parameter_server(collective)
        if server:
            ps_rank = parameter_server_rank() if ps_rank is None else ps_rank
        group, rank, workers = _workers_group(group, ps_rank if server else None)
        if spec.max_workers is not None and workers > spec.max_workers:
            raise ValueError(f"mode {mode!r} trains on at most {spec.max_workers} worker(s); "
                             f"this group has {workers}")
        #: this worker's batch (see the class docstring), and its share of a step's samples
        self._batch_sizes = _balanced(batch_size, profile, workers, spec)
        self.batch_size = self._batch_sizes[rank] if self._batch_sizes else None
        sample_weight = (sample_weights(self._batch_sizes)[rank] if profile is not None
                         else 1.0)
        DistributedOptimizer._made += 1
        prefix = f"hetsync/wrap/{DistributedOptimizer._made}"
        store = dist.distributed_c10d._get_default_store() if workers > 1 else None
        self._service, self._finished, token = None, False, None
        if spec.service is not None and service is None:
            self._service, service, token = _start_service(spec.service, rank, workers, store,
                                                           prefix)
        if log_dir is not None and run_dir is None:  # (named first: a parameter server
            # waits for the name before it serves the model the assembly pulls)
            run_dir = _new_run_dir(log_dir, f"{spec.name}-{type(model).__name__.lower()}",
                                   rank, store, prefix)
        self.assembly = None
        try:
            wiring = Wiring(rank=rank, workers=workers, group=group, collective=collective,
                            timeout=timeout, service=service or ("127.0.0.1", 10010),
                            service_token=token, ps_rank=ps_rank, run_workers=workers)
            self.assembly = assemble(spec, opts, model, optimizer, wiring,
                                     timer=StepTimer(slowdown, cpu_device=next(
                                         model.parameters()).device.type == "cpu"),
                                     sample_weight=sample_weight)
            self._connect(model, rank, workers, store, prefix, run_dir, group=group,
                          slowdown=slowdown, collective=collective, options=opts,
                          timeout=timeout)
        except BaseException:  # nothing left running behind a one-line error
            self._close(wait=False)
            raise

    def _connect(self, model, rank: int, workers: int, store, prefix: str, run_dir, group,
                 **record) -> None:
        """The stop's bookkeeping and the records, once the mode is assembled."""
        self.mode = self.assembly.mode
        common_round = workers > 1 and self.mode.control is not ControlPath.STORE
        # (the asynchronous modes' server goes on without a lost worker: so do the others)
        self._store_join = (StoreJoin(store, prefix, rank, workers, record["timeout"],
                                      can_lose=self.assembly.spec.parameter_server or
                                      goes_on(self.mode, self.mode.options))
                            if workers > 1 and not common_round else None)
        #: a mode whose sums do not count their contributors (a plugin's): the joined are
        #: counted by a one-float all-reduce after every round instead
        self._count_joined = common_round and not self.mode.counts_contributors
        #: where this run's records go (`run_dir`, or a new one under `log_dir`), or None
        self.run_dir = None if run_dir is None else Path(run_dir)
        self._recorder = (RunRecorder(run_dir, self.assembly, model, rank, workers, store, prefix,
                                      lr=self.optimizer.param_groups[0]["lr"],
                                      leads=lambda: self.leads, **record)
                          if run_dir is not None else None)
        self._departures = None
        if workers > 1:  # a worker that leaves early says why (`failure`)
            self._departures = Departures(store, prefix, rank, workers)
            atexit.register(self._exit_without_finish)
        self._membership = None
        #: where hetsync's batch sampler publishes its shards' positions
        #: (`runtime/shard_batches.py`), and the membership agrees on the survivors
        self._shard_store = dist.PrefixStore(f"{prefix}/", store) if workers > 1 else None
        self._batches = None
        if (workers > 1 and group is None and self.mode.comm.channel is not None
                and not self.assembly.spec.needs_parameter_server(record["collective"])
                and goes_on(self.mode, self.mode.options)):
            # the survivors of a lost worker regroup and go on, as under `launch` (ESync's
            # background rounds, eager-SGD; the whole world's workers: global ranks)
            self._membership = Membership(self._shard_store, rank,
                                          list(range(workers)), timeout=record["timeout"])
            self.mode.comm.hear(self._membership.alarm)
        #: who leads and who is lost: the membership's, and the workers a stop went on
        #: without (`StoreJoin`)
        self._roster = Roster(rank, range(workers), membership=self._membership,
                              departed=lambda: self._store_join.lost if self._store_join
                              else ())
        #: the step's account where nothing is recorded (one, not one per step)
        self._unrecorded = RoundAccount()
        self._step_started = self.mode.comm.timer.begin()

    def _exit_without_finish(self) -> None:
        if not self._finished:
            self._departures.leave("exited without calling finish() (every worker must: it "
                                   "is the agreed stop)")

    def _failure(self, err: BaseException) -> CommError:
        """A collective that failed: which workers left, and why, as far as they said."""
        return CommError(f"worker {self.rank}: round {self.mode.round} could not complete: "
                         f"{self._departures.explain()} ({type(err).__name__}: "
                         f"{str(err).strip().splitlines()[0][:200] if str(err) else ''})",
                         op="hetsync.wrap")

    # The wrapped optimizer's own groups, state and defaults: a scheduler that changes a
    # group's rate changes the rate the mode's local update uses.
    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, groups):
        self.optimizer.param_groups = groups

    @property
    def state(self):
        return self.optimizer.state

    @state.setter
    def state(self, state):
        self.optimizer.state = state

    @property
    def defaults(self):
        return self.optimizer.defaults

    @defaults.setter
    def defaults(self, defaults):
        self.optimizer.defaults = defaults

    @property
    def round(self) -> int:
        return self.mode.round

    @property
    def rank(self) -> int:
        """This worker's rank among the workers (a parameter server's rank is not one)."""
        return self.mode.comm.rank

    @property
    def workers(self) -> int:
        """How many workers train (e.g. a `DistributedSampler`'s `num_replicas`)."""
        return self.mode.comm.workers

    @property
    def clock(self):
        return self.mode.comm.clock

    def __repr__(self) -> str:
        return f"hetsync.wrap({self.optimizer!r}, mode={self.mode.name!r})"

    def step(self, closure=None, *, loss=None):
        """The mode's step: emulated slowdown, decide, then the local update and whatever
        communication the decision needs (the time since the last step is this step's).

        Args:
            closure: recomputes the loss and returns it, as for any torch optimizer.
            loss: this step's loss (a float or a tensor), for the records' ``loss``
                (``scaler.step(opt, loss=loss)`` passes it through GradScaler)."""
        if self._finished:
            raise RuntimeError("step() after finish(): this wrapped optimizer has ended "
                               "(wrap a new one to train on)")
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        overflowed = self._unscale()
        mode, timer = self.mode, self.mode.comm.timer
        # (a lost worker's batch, drawn by hetsync's sampler, is its own size: it takes that
        # many samples' time and weight, as under `launch`)
        mode.batch_share = self._batches.share if self._batches is not None else 1.0
        timer.emulate(mode.batch_share)
        ended = time.perf_counter()
        # An overflowed step sits its round out, as a joined worker does, where the mode's
        # sums count their contributors; elsewhere its zeroed gradient goes in.
        sits_out = overflowed and mode.counts_contributors and not mode.joined
        mode.joined = mode.joined or sits_out
        rnd = self._round_account()
        publishes_draws = (self._batches is not None
                           and shards.publishes_before_sum(mode, self._membership))
        try:  # the training loop's own step (`runtime/rounds.py`)
            action = decide(mode, Step(self._step_started, ended))
            if publishes_draws:
                self._batches.before_sum(self._shard_store, mode.round)
            finished_round = perform(mode, action, rnd)
        except PEER_FAILURES as err:
            if self._departures is None:
                raise
            self._regroup(err)  # (or raises): the round is dropped
            if self._batches is not None:  # its batches drawn again, and the shards this
                rnd.drawn.clear()            # worker holds now (with what their lost
                rnd.held.clear()             # holders trained but did not record)
                rnd.held.update(self._batches.regrouped(
                    self._shard_store, self._membership.members, mode.round))
            action, finished_round = Action.LOCAL, mode.round
        finally:
            mode.joined = mode.joined and not sits_out
        if action.ends_round and self._count_joined:
            mode.comm.barrier(torch.zeros(1))
        if self._recorder is not None:
            self._recorder.step(self._step_started, ended, loss,
                                finished_round if action.ends_round else None)
        if action.ends_round and self._batches is not None:
            if self._recorder is None:
                self._unrecorded = RoundAccount()
            # (published where the survivors of a lost worker take its shard on)
            self._batches.round_over(self._shard_store if self._takes_shards_on else None)
            if self._takes_shards_on and self._membership is None:
                self._batches.follow(self._shard_store, self._store_join.marked_lost)
        if self._store_join is not None:
            self._store_join.beat()
        self._step_started = timer.begin()
        return loss

    def _unscale(self) -> bool:
        """Under `GradScaler` (which sets `grad_scale` and `found_inf` on this optimizer
        before `step`): unscale the gradients, or, where they overflowed, zero them and say
        so — this worker takes part in the round without its gradient."""
        found_inf = getattr(self, "found_inf", None)
        scale = getattr(self, "grad_scale", None)
        if found_inf is None and scale is None:
            return False
        grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
        if found_inf is not None and float(found_inf) > 0:
            for g in grads:
                g.zero_()
            return True
        if scale is not None and grads:
            inverse = float(scale.double().reciprocal())
            torch._foreach_mul_(grads, inverse)
        return False

    @contextmanager
    def global_model(self):
        """A context in which the model holds the global weights: evaluate inside it (ESync
        applies its sums in the background and keeps its local steps apart meanwhile; in
        SelSync it is a round of the workers' lockstep, which the others take part in from
        their steps or from `finish()`). Its time is evaluation, not training."""
        if self._recorder is not None:
            self._recorder.evaluating()
        try:
            with self.mode.global_model():
                yield
        finally:
            if self._recorder is not None:
                self._recorder.evaluated()

    def batch_sampler(self, num_samples: int, batch_size: int | None = None, *,
                      shuffle: bool = True, seed: int = 0, partition: str = "iid"):
        """hetsync's sampler of this worker's batches, for ``DataLoader(data,
        batch_sampler=...)`` in place of a `DistributedSampler`: the `num_samples` samples
        cut into one shard per worker, one pass one epoch; where the survivors of a lost
        worker go on, one of them draws the rest of its shard, so that no sample of the
        epoch is lost (`runtime/shard_batches.py`, which says where it departs from
        `launch`). `batch_size`: every worker's (default: this wrapper's `batch_size`,
        balanced to a profile where one was given). `partition`: ``"iid"`` (equal shards) or
        ``"by-batch"`` (each shard sized by its worker's batch, as `launch`'s ``--partition
        by-batch``: under balanced batches every sample is drawn as often as any other). Make
        one per wrapper, on every worker; its `set_epoch(epoch)` is `DistributedSampler`'s,
        for a script resumed from its checkpoint (docs/own-loop.md)."""
        from hetsync.runtime.shard_batches import ShardBatchSampler

        _check_batch_size(batch_size)
        sizes = [batch_size] * self.workers if batch_size is not None else self._batch_sizes
        if sizes is None:
            raise ValueError("batch_sampler: give batch_size=, or batch_size= to hetsync.wrap")
        if self._batches is not None:
            raise ValueError("batch_sampler: this wrapped optimizer has one already (one per "
                             "wrapper: it draws this worker's shards)")
        if isinstance(num_samples, bool) or not isinstance(num_samples, int):
            raise ValueError(f"batch_sampler({num_samples!r}): expected the number of samples, "
                             f"an int")
        self._batches = ShardBatchSampler(self.rank, self.workers, num_samples, sizes,
                                          self._round_account, shuffle=shuffle, seed=seed,
                                          partition=partition)
        if self._takes_shards_on and self._membership is None:
            self._batches.claims(self._shard_store)
        if self._recorder is not None:
            self._recorder.ledger_fields = self._batches.held.record_fields
        return self._batches

    @property
    def _takes_shards_on(self) -> bool:
        """Whether a lost worker's shard is drawn on by a survivor: the survivors regroup
        (`_membership`), or the parameter server marks the lost in an asynchronous mode
        (`runtime/shard_batches.py`, step 5)."""
        return self._membership is not None or (
            self._store_join is not None and self._store_join.can_lose
            and self.mode.comm.ps_client is not None)

    def _round_account(self) -> RoundAccount:
        """The round under way's account (the sampler's draws go into it)."""
        return self._recorder.round if self._recorder is not None else self._unrecorded

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next steps belong to, for the records' ``epoch`` (call it where
        you call ``DistributedSampler.set_epoch``)."""
        check_epoch(epoch)
        if self._recorder is not None:
            self._recorder.epoch = epoch

    def record_evaluation(self, test_acc: float, test_loss: float | None = None) -> None:
        """The leader (with `run_dir`; `leads`): append an evaluation of the global model
        to eval.jsonl, stamped with the training time so far; elsewhere nothing."""
        if self._recorder is not None:
            self._recorder.evaluation(test_acc, test_loss)

    def finish(self) -> None:
        """The agreed stop (see the module docstring): take part in the others' rounds
        until every worker has finished, then end together with the global model in the
        model, saying goodbye to the servers and stopping the background channel."""
        if self._finished:
            return
        self._finished = True
        atexit.unregister(self._exit_without_finish)
        mode = self.mode
        try:
            joined_at = mode.round
            mode.join()
            if self._store_join is not None:
                self._store_join.wait_for_all(meanwhile=self._poll)
            elif mode.comm.workers > 1:
                while not self._last_joined_round():
                    pass
            try:
                mode.finish()
            except PEER_FAILURES as err:  # lost in the last round's sum: that round is dropped
                self._regroup(err)
                mode.finish()
            if mode.comm.workers > 1 and not self.assembly.spec.parameter_server:
                self._adopt_last_joiners_model(joined_at)
            if self._recorder is not None:
                self._recorder.finish(joined_at, self.lost_workers)
        except PEER_FAILURES as err:
            if self._departures is None or getattr(err, "op", None) == "hetsync.wrap":
                raise  # (no one to ask, or `_failure` said it already)
            raise self._failure(err) from err
        finally:
            self._close()

    @property
    def leads(self) -> bool:
        """Whether this worker writes the run's own files (run.json, eval.jsonl): rank 0,
        or once it was lost the lowest survivor (`membership.Roster`)."""
        return self._roster.leads

    @property
    def lost_workers(self) -> list[int]:
        """The workers the run went on or ended without (named in a warning then)."""
        return self._roster.lost()

    def _poll(self) -> None:
        """`Mode.poll` while a finished worker waits in the store for the others (eager-SGD
        applies the rounds its engine still takes part in); a peer lost there is regrouped
        around as in `step`."""
        try:
            self.mode.poll()
        except PEER_FAILURES as err:
            self._regroup(err)

    def _last_joined_round(self) -> bool:
        """A finished worker's part in the others' round (`Mode.join_step`): whether it was
        everyone's last. A peer lost there is regrouped around as in `step` (the round is
        dropped: not the last)."""
        try:
            return self._everyone_joined(self.mode.join_step())
        except PEER_FAILURES as err:
            self._regroup(err)
            return False

    def _regroup(self, err: BaseException) -> None:
        """A peer was lost in a mode whose workers go on without one (ESync's background
        rounds, eager-SGD): the survivors agree on who they are through the store and make
        new groups (`runtime/membership.py`, as `launch`'s workers do), and take the lowest
        survivor's global state (`Mode.rejoin`); the round in flight is dropped. Elsewhere,
        or when no peer was lost, the failure is raised, naming who left and why."""
        if self._membership is None:
            raise self._failure(err) from err
        cause = err if isinstance(err, CommError) else CommError(str(err), op="hetsync.wrap")
        try:
            members = self._membership.go_on(self.mode, cause)
        except CommError as failed:
            raise self._failure(failed) from err
        if self._store_join is not None:  # the stop waits for them no more (every survivor
            for r in self._membership.lost:  # took part in the regroup: each knows)
                self._store_join.lost.setdefault(r, "lost: the others regrouped without it")
        warnings.warn(f"hetsync: worker(s) {', '.join(map(str, self._membership.lost))} "
                      f"lost; the others go on from round {self.mode.round} (workers "
                      f"{', '.join(map(str, members))})", RuntimeWarning, stacklevel=4)

    def _close(self, wait: bool = True) -> None:
        """Stop the background channel, the service's connection and the service this worker
        started, if any."""
        if self.assembly is not None:
            self.assembly.close(wait=wait)
        if self._service is not None:
            self._service.stop()

    def _everyone_joined(self, action) -> bool:
        """After a joined worker's step: whether the round it ended was everyone's last (the
        sum had no contributor, or the count of the joined is P)."""
        if not action.ends_round:
            return False
        if not self._count_joined:
            self.mode.settle()
            return self.mode.contributors == 0
        return int(self.mode.comm.barrier(torch.ones(1))) == self.mode.comm.workers

    def _adopt_last_joiners_model(self, joined_at: int) -> None:
        """Every worker ends with the model of the last to finish (the highest rank of
        those): the others stopped updating on their own schedule (e.g. a learning-rate
        schedule stepped fewer times), as torch's `Join` does for DDP."""
        comm = self.mode.comm
        me = dist.get_rank(comm.group) if comm.group is not None else comm.rank
        key = torch.tensor([joined_at * comm.workers + comm.workers - 1 - me],
                           dtype=torch.int64, device=comm.wire_device)
        dist.all_reduce(key, op=dist.ReduceOp.MAX, group=comm.group)
        last = comm.workers - 1 - int(key) % comm.workers
        wait_released([key])  # (the process may exit right after: see `wait_released`)
        self.mode.broadcast_model(src=last)

    def __enter__(self) -> "DistributedOptimizer":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.finish()
        else:  # do not wait for the others: the exception says what went wrong
            if self._departures is not None and not self._finished:
                self._departures.leave(f"raised {exc_type.__name__}: {exc}")
            self._finished = True
            self._close(wait=False)

    def state_dict(self) -> dict:
        """The wrapped optimizer's state dict, with the mode's state under ``"hetsync"`` (what
        is in flight, e.g. ESync's sum, is applied first, so the state is whole)."""
        self.mode.settle()
        return {**self.optimizer.state_dict(), "hetsync": {"mode": self.mode.state_dict()}}

    def load_state_dict(self, state: dict) -> None:
        state = dict(state)
        ours = state.pop("hetsync", None)
        self.optimizer.load_state_dict(state)
        if ours is not None:
            self.mode.load_state_dict(ours["mode"])


class RunRecorder:
    """A wrapped run's directory, as `hetsync worker` writes it (docs/design.md), so that
    `hetsync summarize` and `plot` read it: every worker appends its rounds to
    `worker-R.jsonl` (compute, wait, communication, bytes, samples: the batches its model
    saw in training mode, counted by a forward pre-hook); rank 0 writes `run.json` (the
    workers' hosts, devices and slowdowns, gathered through the store), the leader (`leads`:
    rank 0 until it is lost) rewrites it with the end time at `finish` and writes the
    evaluations the user records (`eval.jsonl`). Time spent inside `global_model()` is
    evaluation, apart from training time."""

    def __init__(self, run_dir, assembly, model, rank: int, workers: int, store, prefix: str, *,
                 slowdown: float, collective: str, lr: float, options, timeout: float,
                 leads=lambda: True):
        self.dir = Path(run_dir)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise ValueError(f"run_dir={str(run_dir)!r}: cannot be made ({err.strerror})") \
                from None
        held = [p.name for p in (RunDir(self.dir).run, RunDir(self.dir).worker(rank))
                if p.exists()]
        if held:  # (checked before rank 0 writes run.json: the others check first)
            raise ValueError(f"run_dir={str(run_dir)!r} holds a run already ({held[0]}): "
                             f"give a new directory, or log_dir= to have one named per run")
        self.assembly, self.rank, self.leads = assembly, rank, leads
        self.mode = mode = assembly.mode
        me = {"rank": rank, "host": socket.gethostname(),
              "device": mode.comm.device_name, "slowdown": slowdown, "role": "worker"}
        self.ranks = [me]
        if store is not None:  # every worker learns every worker's, as any may come to
            # write run.json (no pickle: JSON in the store)
            store.set(f"{prefix}/rank-info/{rank}", json.dumps(me))
            keys = [f"{prefix}/rank-info/{r}" for r in range(workers)]
            try:
                store.wait(keys, datetime.timedelta(seconds=timeout))
            except RuntimeError:
                raise ValueError(f"run_dir: not every worker gave one within {timeout:g} s "
                                 f"(every worker must pass run_dir to hetsync.wrap)") from None
            self.ranks = [json.loads(store.get(key)) for key in keys]
        self.t0, self.start_time = time.perf_counter(), time.time()
        self.eval_total, self.epoch = 0.0, 0
        self._evaluating: float | None = None   # when the evaluation under way began
        self._eval_since_step = 0.0             # evaluation inside the next step's time
        self.round = RoundAccount()
        self.info = {
            "run_name": self.dir.name, "mode": mode.name, "mode_info": mode.record(),
            "config": {"mode": mode.name, "workers": workers, "lr": lr,
                       "network": type(model).__name__,
                       "collective": collective, "slowdowns": [r["slowdown"] for r in
                                                               self.ranks],
                       "options": {} if options is None else vars(options),
                       "source": "hetsync.wrap"},
            **build_info(), "start_time": self.start_time,
            "world_size": dist.get_world_size() if dist.is_initialized() else 1,
            "workers": workers, "ranks": self.ranks}
        self.records = JsonlWriter(RunDir(self.dir).worker(rank))
        #: a record's ledger fields beside its draws (`HeldShards.record_fields`: set where
        #: hetsync's batch sampler draws them)
        self.ledger_fields = lambda drawn, held: {}
        self.ended: float | None = None   # training time at `finish`
        if rank == 0:
            RunDir(self.dir).write_run(self.info)
        self._hook = model.register_forward_pre_hook(self._count, with_kwargs=True)

    def _count(self, module, args, kwargs) -> None:
        """Samples: the batch of every forward in training mode (its first tensor's)."""
        if module.training and torch.is_grad_enabled():
            first = next((a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)
                          and a.dim()), None)
            self.round.samples += int(first.shape[0]) if first is not None else 0

    def step(self, started: float, ended: float, loss, finished_round: int | None) -> None:
        """Account one step (times as the training loop takes them: from the last step's
        end, the user's forward and backward and the emulated slowdown; the local update
        was `perform`'s); record the round it ended. (Its samples: the forward hook's.)"""
        rnd = self.round
        user = ended - started - self._eval_since_step  # (an evaluation between steps)
        self._eval_since_step = 0.0
        rnd.add_step(user, float(loss) if loss is not None else float("nan"))
        if finished_round is not None:
            self._write(rnd, finished_round)
            self.round = RoundAccount(self.eval_total)

    def _write(self, rnd: RoundAccount, round_: int) -> None:
        self.records.write({**rnd.record(self.mode, self.rank, round_, self.t0,
                                         self.eval_total, self.epoch),
                            **self.ledger_fields(rnd.drawn, rnd.held)})

    def evaluating(self) -> None:
        """An evaluation (`global_model()`) begins: from now on, not training time."""
        self._evaluating = time.perf_counter()

    def evaluated(self) -> None:
        """It ended: its time is evaluation, neither training nor the next step's compute."""
        seconds = time.perf_counter() - self._evaluating
        self._evaluating = None
        self.eval_total += seconds
        self._eval_since_step += seconds

    def train_time(self) -> float:
        """Seconds since the start, less every evaluation (the one under way too)."""
        if self.ended is not None:
            return self.ended
        now = time.perf_counter()
        under_way = now - self._evaluating if self._evaluating is not None else 0.0
        return now - self.t0 - self.eval_total - under_way

    def evaluation(self, test_acc: float, test_loss: float | None) -> None:
        """The leader: one line of eval.jsonl (also after `finish`: the final model's)."""
        if self.leads():
            with JsonlWriter(RunDir(self.dir).eval) as out:
                out.write({"t": time.perf_counter() - self.t0, "train_time": self.train_time(),
                           "round": self.mode.round - 1, "test_acc": float(test_acc),
                           "test_loss": None if test_loss is None else float(test_loss)})

    def finish(self, joined_at: int, lost: list[int]) -> None:
        """The steps since the last round's end went out with the first round after this
        worker joined (`joined_at`): their record, with the wait for the others since; the
        workers the run ended without (`lost`) in run.json."""
        self._hook.remove()
        if self.round.steps or self.mode.comm.clock.total() > 0:  # steps, or the wait
            self._write(self.round, joined_at)
        self.records.close()
        self.ended = self.train_time()
        if self.leads():
            self.assembly.record_service(self.dir)
            wall = time.perf_counter() - self.t0
            RunDir(self.dir).write_run({
                **self.info, "end_time": self.start_time + wall, "wall_s": wall,
                "train_time": self.train_time(),
                # an evaluation pauses the others at the next common round
                "paused_s": self.eval_total if self.mode.control is not ControlPath.STORE
                else 0.0, **({"lost_workers": lost} if lost else {})})


def _new_run_dir(log_dir, name: str | None, rank: int, store, prefix: str) -> Path:
    """`log_dir`/NAME-TIME, named by the workers' rank 0 and told to the others (and the
    parameter server: `name` None) through the store."""
    if rank == 0 and name is not None:
        run = f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
        if store is not None:
            store.set(f"{prefix}/run-name", run)
    else:
        run = store.get(f"{prefix}/run-name").decode()
    return Path(log_dir) / run


def _balanced(batch_size: int | None, profile, workers: int, spec) -> list[int] | None:
    """Every worker's batch (`DistributedOptimizer.batch_size`): the batch as given, or with
    a profile each device's balanced to its speed (`clock.profile.balanced_batches`; each
    worker's sample weight is then P × its batch ÷ all the batches); None where neither was
    given."""
    _check_batch_size(batch_size)
    if profile is None:
        return None if batch_size is None else [batch_size] * workers
    from hetsync.clock.profile import load

    if batch_size is None:
        raise ValueError(f"profile={str(profile)!r}: give batch_size= too, the fastest "
                         f"device's batch, which the others' follow")
    cluster = load(profile)  # (ProfileError, a ValueError, names the file and what is wrong)
    if len(cluster.devices) != workers:
        raise ValueError(f"profile={str(profile)!r}: it has {len(cluster.devices)} "
                         f"device(s), one per worker; this run has {workers} workers")
    batches = cluster.batches(batch_size)
    if len(set(batches)) > 1 and not spec.counts_samples:
        raise ValueError(f"mode {spec.name!r}'s sums count workers, not samples: it cannot "
                         f"take batches balanced to a profile (balanced batches: "
                         f"{', '.join(registry.names(baseline=False, counts_samples=True))})")
    return batches


def _check_batch_size(batch_size) -> None:
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(
            batch_size, int) or batch_size < 1):
        raise ValueError(f"batch_size={batch_size!r}: expected an integer >= 1")


def parameter_server_rank() -> int:
    """The parameter server's rank when none is named: the last of the world."""
    return dist.get_world_size() - 1 if dist.is_initialized() else 0


def _workers_group(group, ps_rank: int | None):
    """(group, rank in it, size) of the workers: `group`, or the whole world less the
    parameter server's rank."""
    if not dist.is_initialized():
        world = os.environ.get("WORLD_SIZE", "1")
        if world not in ("", "1"):  # torchrun started several: they would train apart
            raise ValueError(f"WORLD_SIZE={world} but no process group: call "
                             f"torch.distributed.init_process_group(...) before hetsync.wrap, "
                             f"or every process trains its own model")
        if ps_rank is not None:
            raise ValueError("this mode needs a parameter server, a process of its own: start "
                             "2 or more processes (torchrun --nproc-per-node N) and call "
                             "hetsync.serve_parameters on the last rank")
        if "WORLD_SIZE" not in os.environ:  # plain `python script.py`: say so, once
            warnings.warn("hetsync.wrap: no process group and no WORLD_SIZE: this process "
                          "trains alone, one worker (start the script with torchrun for a "
                          "cluster)", stacklevel=3)
        return None, 0, 1
    if ps_rank is not None:
        world = dist.get_world_size()
        if not 0 <= ps_rank < world or world < 2:
            raise ValueError(f"ps_rank={ps_rank}: expected a rank in 0..{world - 1} of a "
                             f"world of 2 or more processes (the server and a worker)")
        if dist.get_rank() == ps_rank:
            raise ValueError(f"rank {ps_rank} is the parameter server: call "
                             f"hetsync.serve_parameters there, not hetsync.wrap")
        if dist.get_rank() == 0:  # (a surprise under --nproc-per-node N: say it once)
            warnings.warn(f"hetsync.wrap: rank {ps_rank} serves the parameters; "
                          f"{world - 1} of the {world} processes train", stacklevel=3)
        if group is None:
            from hetsync.comm.channel import local_group

            group = local_group([r for r in range(world) if r != ps_rank])
    return group, dist.get_rank(group), dist.get_world_size(group)


def _warn_of_compounded_momentum(spec, options, optimizer: torch.optim.Optimizer) -> None:
    """Say once when the user's SGD momentum sits under an outer Nesterov step (esync-outer,
    DiLoCo, lookahead): the two compound, so that a round of one or two steps -- ESync's on
    devices of like speed -- moves the model up to global_lr / ((1 − μ_outer)(1 − μ)) times
    the inner rate. Measured: a 2-worker esync-outer run of a small CNN with SGD(lr=0.05,
    momentum=0.9) stayed at chance (0.49); without the momentum, or at global_lr 0.1, 0.88."""
    outer = getattr(options, "outer_momentum", None)
    outer = spec.defaults.get("outer_momentum", 0.0) if outer is None else outer
    rate = getattr(options, "global_lr", None)
    rate = spec.defaults.get("global_lr", 1.0) if rate is None else rate
    inner = (optimizer.param_groups[0].get("momentum") or 0.0
             if isinstance(optimizer, torch.optim.SGD) else 0.0)
    if outer and inner >= 0.5:
        warnings.warn(
            f"hetsync.wrap: mode {spec.name!r}: your SGD's momentum {inner:g} compounds with "
            f"its outer Nesterov momentum {outer:g} at global_lr {rate:g} (a short round's "
            f"step up to {rate / ((1 - outer) * (1 - inner)):.0f}x your rate): training may "
            f"diverge. Use SGD without momentum (as hetsync launch does), "
            f"global_lr={rate * (1 - outer):.2g}, or mode='esync'", stacklevel=5)


def _one_host() -> bool:
    """Whether every process of the group runs on this machine (torchrun's local world is
    the whole world, or the rendezvous address is loopback)."""
    local, world = os.environ.get("LOCAL_WORLD_SIZE"), os.environ.get("WORLD_SIZE")
    if local is not None and local == world:
        return True
    try:
        return ipaddress.ip_address(os.environ.get("MASTER_ADDR", "127.0.0.1")).is_loopback
    except ValueError:
        return os.environ.get("MASTER_ADDR") == "localhost"


def _start_service(service, rank: int, workers: int, store, prefix: str):
    """Rank 0 starts the mode's `service` (a `RunService`) on a thread on a free port and
    publishes where in the store; every worker returns (server or None, (host, port),
    token)."""
    server = None
    if rank == 0:
        host = "127.0.0.1" if workers == 1 or _one_host() else os.environ["MASTER_ADDR"]
        token = None if host == "127.0.0.1" else secrets.token_hex(16)
        server = service.serve(workers, host, token)
        where = f"{host} {server.port} {token or ''}"
        if store is not None:
            store.set(f"{prefix}/{service.name}", where)
    else:
        where = store.get(f"{prefix}/{service.name}").decode()
    host, port, token = (where.split(" ") + [""])[:3]
    return server, (host, int(port)), token or None


def serve_parameters(optimizer: torch.optim.Optimizer, model: torch.nn.Module,
                     mode: str = "async", *, collective: str = "native",
                     ps_rank: int | None = None, timeout: float = 120.0, run_dir=None,
                     log_dir=None, **options) -> bool:
    """Run the parameter server of `mode`, if this process is its rank and the mode needs
    one: serve the workers until every one has finished and return True. Otherwise return
    False at once. Call it on every rank with the arguments you give `hetsync.wrap`, before
    it:

        if hetsync.serve_parameters(optimizer, model, mode="async", log_dir="runs"):
            return   # this process was the server
        opt = hetsync.wrap(optimizer, model, mode="async", log_dir="runs")

    The server starts from this process's model (the workers pull it) and applies the
    mode's rule at the optimizer's learning rate.

    Args:
        optimizer, model: as for `hetsync.wrap` (the rate is the optimizer's first group's).
        mode: a mode with a parameter server (async, dcasgd, async-local-sgd, fedbuff, gd,
            dgc, dgs), or any mode with ``collective="ps"``; otherwise this returns False.
        collective: as for `hetsync.wrap`.
        ps_rank: the server's rank (default: the last of the world).
        timeout: seconds to wait for any one request (a silent worker is lost after it).
        run_dir, log_dir: as for `hetsync.wrap`: the server writes its traffic, refusals
            and losses as ``ps.jsonl`` into the run's directory (with ``log_dir``, the one
            rank 0 names).
    """
    from hetsync.runtime.assembly import parameter_server, serve_and_record

    spec = registry.get(mode)
    if not spec.needs_parameter_server(collective) or not dist.is_initialized():
        return False
    ps_rank = parameter_server_rank() if ps_rank is None else ps_rank
    if dist.get_rank() != ps_rank:
        return False
    spec.worker.check_optimizer(optimizer)
    DistributedOptimizer._made += 1  # (the workers count their `wrap`: the same prefix)
    prefix = f"hetsync/wrap/{DistributedOptimizer._made}"
    store = dist.distributed_c10d._get_default_store()
    if log_dir is not None and run_dir is None:  # the name rank 0 gives the run
        run_dir = _new_run_dir(log_dir, None, ps_rank, store, prefix)
    if run_dir is not None:
        Path(run_dir).mkdir(parents=True, exist_ok=True)
    workers = [r for r in range(dist.get_world_size()) if r != ps_rank]

    def gone(rank: int, why: str) -> None:  # the workers' stop goes on without it
        StoreJoin.mark_lost(store, prefix, workers.index(rank), why)

    serve_and_record(parameter_server(spec, spec.make_options(options), model,
                                      optimizer.param_groups[0]["lr"], workers, timeout,
                                      gone=gone), run_dir)
    return True


def wrap(optimizer: torch.optim.Optimizer, model: torch.nn.Module, mode: str = "esync",
         **kwargs) -> DistributedOptimizer:
    """Wrap `optimizer` so that `step()` runs `mode` (see `hetsync.wrap`)."""
    return DistributedOptimizer(optimizer, model, mode, **kwargs)


DistributedOptimizer.__doc__ += "\n    Modes and their options (name = default: meaning):\n\n" + \
    registry.options_doc(indent=" " * 4)
