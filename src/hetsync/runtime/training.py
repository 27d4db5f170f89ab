"""The one training loop that every mode runs, hetsync's and PyTorch's baselines alike.

Per step (see `hetsync.algorithms.base` for the mode's side, and `rounds.py` for the step's
driver, which `hetsync.wrap` shares):

1. draw a batch of this worker's shard; forward (through `mode.module`) and backward;
2. emulate the device's slowness (`heterogeneity.py`), before any communication of the step;
3. `decide`: `mode.poll()`, then `mode.decide(step)`: what the step does, decided without I/O;
4. at the end of a round, the leader's proposal (samples, evaluate, stop, admit) goes out by the
   mode's control path: a blocking four-float all-reduce before the round's communication (it is
   that round's barrier), four floats at the end of the mode's own blocking sum of the round
   (one collective a round), a job on the background channel after it (acted on when it
   comes in, and before the next round starts, so every worker stops after the same round),
   or the key-value store (asynchronous modes);
5. `perform`: the local update and the mode's communication (`Mode.perform`), then the round
   counted if the action ended one;
6. at the end of a round, record it (compute / wait / comm / bytes) and act on the agreement:
   samples seen, evaluation (by the leader, of the global model; in collective modes every worker
   pauses for it), stop, lost workers let in (`_admit`); at every `--checkpoint-every`-th
   evaluation and at the stop, each worker writes its checkpoint after the round's record
   (`checkpoint.py`).

Steps 3-6 fail with a CommError when a peer is lost; where the run can go on without it
(`Config.regroups`), the survivors regroup (`membership.py`), take the leader's global state
(`mode.rejoin`) and go on, drawing the dropped round's batches again; elsewhere the error
ends the worker. A training loss that is NaN or infinite ends it too (`Diverged`), and with it
the run: the model it would go on from is the diverged one. The leader is rank 0, or once it
is lost the lowest survivor, which takes over its files (in the asynchronous modes, once
`launch` has marked the leader dead: `membership.StoreLead`). Where the mode admits a worker
(`algorithms.base.Admits`), a lost rank's new process (`hetsync worker --join`) enters at a
round's end: the leader offers it a place, the round's agreement admits it, and it takes the
leader's global state, counts and clock (`_admit`). In the asynchronous modes it links to the
parameter server instead and takes the server's model (`_enter_server`).

Timing follows docs/design.md: compute = data + forward + backward + emulated slowdown + the
local update (the part of `apply` not spent waiting or communicating); wait = barriers, queries
of the mode's service and time blocked on a sum still in flight; comm = the transfers on the
critical path; evaluation is kept apart, and the training time used for time-to-accuracy
excludes it.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass
from typing import Any

import torch

from hetsync.algorithms.base import ControlPath, Mode, Step, admits
from hetsync.comm.errors import CommError
from hetsync.config import Config
from hetsync.runtime import faults, replan, shards
from hetsync.runtime.control import (Agreement, CollectiveControl, LocalControl, Proposal,
                                     StoreControl)
from hetsync.runtime.evaluation import (Evaluation, SnapshotWriter, evaluate, evaluate_pending,
                                        remove_if_empty)
from hetsync.runtime.membership import Roster, known_lost, shared
from hetsync.runtime.plan import RankPlan
from hetsync.runtime.rounds import RoundAccount, decide, perform
from hetsync.runtime.schedule import lr_factor, run_progress, set_lr_factor
from hetsync.telemetry.recorder import JsonlWriter
from hetsync.telemetry.rundir import RunDir, tell

#: a worker's exit code when its training loss stopped being finite (`Diverged`): launch then
#: stops the run, where it would lose, restart or resume a worker that crashed -- a new
#: process would take the same model, and a resume the same checkpoint and seed, and diverge
#: again (as a 64-worker `async` run's did, restarted and resumed for half an hour)
DIVERGED_EXIT_CODE = 3


class Diverged(FloatingPointError):
    """The training loss is NaN or infinite: the rate is too high for this model and mode."""


@dataclass
class LoopState:
    """Rank 0's view of when to evaluate and stop, and every rank's accounting."""

    t0: float
    eval_total: float = 0.0           # seconds paused for evaluation
    last_eval_train_time: float = 0.0
    last_acc: float = float("nan")
    last_loss: float = float("nan")
    samples_seen: int = 0

    def train_time(self, now: float) -> float:
        return now - self.t0 - self.eval_total


@dataclass(frozen=True)
class LoopData:
    """What a worker trains and evaluates on: its own `batches` (`sampler_of(rank)`:
    another worker's sampler, for a lost worker's or a spare's shard it holds) and the
    train and test sets."""

    batches: Any
    train_set: Any
    test_set: Any
    sampler_of: Any = None


@dataclass(frozen=True)
class LoopOutputs:
    """Where a worker's loop writes: its round records (`recorder`), the run directory
    (`run_dir`: where the leader writes `eval.jsonl` and deferred evaluation's snapshots;
    None: nowhere, for a loop that evaluates nothing to disk), its progress and its
    checkpoints (None: none)."""

    recorder: Any
    run_dir: Any = None
    progress: Any = None
    checkpointer: Any = None


class TrainingLoop:
    """Drives `mode` over `data`'s batches until the workers agree to stop.

    `plan`: this worker's (`runtime/plan.py`); `store`: the process group's key-value store,
    for modes whose agreement goes through it (required when the mode's control path is
    STORE and there is more than one worker); `membership`: the workers, where the run goes
    on without a lost one (`runtime/membership.py`); `joining`: this process is a lost
    rank's, joining the running job.
    """

    def __init__(self, cfg: Config, mode: Mode, plan: RankPlan, data: LoopData,
                 outputs: LoopOutputs, *, store=None, membership=None, joining: bool = False):
        rank, batches, sampler_of = plan.rank, data.batches, data.sampler_of
        train_set, test_set = data.train_set, data.test_set
        recorder, run_dir, progress, checkpointer = (outputs.recorder, outputs.run_dir,
                                                     outputs.progress, outputs.checkpointer)
        self.cfg, self.mode, self.rank = cfg, mode, rank
        # tests' HETSYNC_FAULT: in the rank's first process (not one that joins), each once
        self._faults = [] if joining else faults.planned(rank, run_dir)
        #: the workers, where the run goes on without a lost one (`runtime/membership.py`)
        self.membership = membership
        #: this process is a lost rank's, joining the running job (`run` enters it first)
        self.joining = joining
        self.admits = membership is not None and admits(mode, mode.options)
        self.train_set, self.test_set = train_set, test_set
        #: the shards this worker draws: its own, and a lost worker's or a spare's it holds
        #: (`runtime/shards.py`; `sampler_of(rank)`: another worker's sampler)
        self.held = shards.HeldShards(rank, batches, sampler_of)
        #: the batch its device's step time is given for (`RankPlan.batch`)
        self._timed_batch = plan.batch
        #: the batches re-planned as the devices' speeds drift (`runtime/replan.py`; None:
        #: they stay as planned), drawn a sample at a time
        self.batch_plan = replan.BatchPlan.of(cfg)
        if self.batch_plan is not None:
            self.held.unit = "sample"
        self.device = mode.comm.device
        self.recorder, self.run_dir = recorder, run_dir
        #: the leader's `eval.jsonl` and `SnapshotWriter` (`_take_lead`)
        self.eval_recorder = self.snapshots = None
        self.progress = progress
        self.train_size = len(train_set)
        self.criterion = torch.nn.CrossEntropyLoss()
        workers = mode.comm.workers
        self.path = None if workers == 1 else mode.control
        if self.path is None:
            self.control = LocalControl()
        elif self.path is ControlPath.STORE:
            self.control = StoreControl(store, rank,
                                        virtual=mode.comm.clock.source.virtual)
        else:
            self.control = CollectiveControl()
        self._in_flight = None  # the background channel's future of the last proposal's sum
        #: evaluate snapshots off the critical path instead of pausing training
        self.deferred = cfg.deferred
        self.checkpointer = checkpointer
        self._evaluations = 0                  # agreed evaluations so far (all ranks alike)
        self._checkpoint_due = False
        self._global_state: dict | None = None  # the leader: the global model at the due point
        self._unrecorded = RoundAccount()       # (see `restore`)
        self._last_recorded = 0
        self._restored: dict | None = None
        self._next_checkpoint = self._checkpoint_after(0.0)
        self.store = store
        #: who leads, who is lost, who has not joined (`membership.Roster`)
        self.roster = Roster(rank, self.run_ranks, membership=membership, joining=joining,
                             store=store if self.path is ControlPath.STORE else None)
        # (an asynchronous mode's shards: `_follow_drawers`)
        self._drawer, self._next_drawer_check = shards.drawer_of(rank), 0.0
        #: the shards taken on in a regroup whose lost holder trained a round's draws it
        #: did not record: their ranges, for the next record (`shards.retake`)
        self._lost_draws: dict[int, list] = {}
        self._take_lead()

    @property
    def _own_batch(self) -> int:
        """This worker's batch now."""
        if self.batch_plan is None:
            return self._timed_batch
        return self.batch_plan.batches[self.rank]

    def _draws_of(self, shard: int) -> int:
        """The draws of `shard`'s sampler that make a step's batch: its worker's batch, a
        sample at a time (one batch where the batches are not re-planned)."""
        return 1 if self.batch_plan is None else self.batch_plan.batches[shard]

    def _now(self) -> float:
        """The worker's clock (`hetsync.clock`: the wall clock, or a virtual one): every time
        the loop reads — the training time, a step's start and end, the stamps."""
        return self.mode.comm.clock.now()

    def _follow_lead(self) -> None:
        """An asynchronous mode: take the lead where the leader was lost and this worker is
        its successor (`membership.StoreLead.follow`)."""
        lost = self.roster.follow()
        if lost is not None:
            self._take_lead()
            tell(self.run_dir, "lead", f"hetsync worker: rank {self.rank}: leads from here "
                                       f"(rank {lost} lost)", rank=self.rank, lost=lost)

    @property
    def run_ranks(self) -> range:
        """Every worker of the run, the spares not joined yet too."""
        return range(self.mode.comm.run_workers or self.mode.comm.workers)

    def _take_lead(self) -> None:
        """The leader's files: `eval.jsonl`, and the snapshots (numbered after the agreed
        evaluations, so a new leader's come after its predecessor's)."""
        if not self.roster.leads or self.run_dir is None or self.eval_recorder is not None:
            return
        self.eval_recorder = JsonlWriter(RunDir(self.run_dir).eval)
        if self.deferred:
            self.snapshots = SnapshotWriter(
                self.run_dir, after=self._evaluations,
                stamp_taken=not self.mode.comm.clock.source.virtual)

    def close(self) -> None:
        """Close the leader's files (the snapshots all on disk)."""
        if self.snapshots is not None:
            self.snapshots.close()
        if self.eval_recorder is not None:
            self.eval_recorder.close()

    @property
    def pauses_everyone(self) -> bool:
        """Whether an evaluation pauses every worker (a collective mode, or one worker)."""
        return self.path in (None, ControlPath.BLOCKING, ControlPath.WITH_SUM,
                             ControlPath.BACKGROUND)

    # ------------------------------------------------------------------ the leader's proposals
    def _propose(self, st: LoopState, samples: int, now: float) -> Proposal:
        cfg, train_time = self.cfg, st.train_time(now)
        if not self.roster.leads:  # (on a virtual clock, an asynchronous worker stops by its own)
            own = (self.path is ControlPath.STORE and self.mode.comm.clock.source.virtual
                   and cfg.time_budget is not None and train_time >= cfg.time_budget)
            return Proposal(samples, False, own)
        seen = st.samples_seen + samples  # this round's own samples are not counted yet
        stop = ((cfg.time_budget is not None and train_time >= cfg.time_budget)
                or (cfg.epochs is not None and seen >= cfg.epochs * self.train_size)
                or (cfg.target_acc is not None and st.last_acc >= cfg.target_acc)
                or (cfg.target_loss is not None and st.last_loss <= cfg.target_loss))
        if cfg.eval_every > 0:
            evaluate_now = self.mode.round % cfg.eval_every == 0
        else:
            evaluate_now = train_time - st.last_eval_train_time >= cfg.eval_interval
        # (not with an evaluation: a checkpoint may be due there, which the joiner, admitted
        # after the agreement, would not write)
        waiting = (self.membership.waiting() if self.admits and not (stop or evaluate_now)
                   else [])
        admit = bool(waiting) and self.membership.offer(waiting)
        if admit:
            tell(self.run_dir, "offered",
                 f"hetsync worker: rank {self.rank}: rank(s) {', '.join(map(str, waiting))} "
                 f"asked to join: offered a place at round {self.mode.round}",
                 ranks=list(waiting), round=self.mode.round)
        return Proposal(samples, evaluate_now or stop, stop, admit=admit)

    # ------------------------------------------------------------------ evaluation
    def _evaluate(self, st: LoopState) -> None:
        """The leader evaluates the global model — or, deferred, puts a snapshot of it on disk
        for the evaluator — and every worker takes part in making the global model where
        the mode needs them to. Evaluated at once in a collective mode, everyone waits for it
        (the barrier's time is evaluation, not waiting: the clock's `eval` phase is not
        recorded as wait)."""
        start = self._now()
        train_time = st.train_time(start)
        if self.pauses_everyone and self.mode.collective_global_model and not self.roster.leads:
            with self.mode.global_model():  # its collective needs every worker
                pass
        st.last_eval_train_time = train_time  # (every worker: any may come to lead)
        if self.roster.leads:
            stamp = {"t": start - st.t0, "train_time": train_time,
                     "round": self.mode.round - 1, "samples_seen": st.samples_seen}
            with self.mode.global_model():
                if self.deferred:
                    self.snapshots.put(stamp, _cpu_state(self.mode.model))
                else:
                    result = evaluate(self.mode.model, self.test_set, self.device)
                if self._checkpoint_due and self.mode.collective_global_model:
                    # only here can the leader see it (every worker takes part in making it)
                    self._global_state = _cpu_state(self.mode.model)
            if not self.deferred:
                st.last_acc, st.last_loss = result.test_acc, result.test_loss
                self._record_evaluation({**stamp, "test_acc": result.test_acc,
                                         "test_loss": result.test_loss})
        if self.pauses_everyone and not self.deferred:
            self.mode.comm.barrier(phase="eval")
        st.eval_total += self._now() - start

    def _record_evaluation(self, record: dict) -> None:
        """Write one evaluation (the snapshot's stamp and its result) and show it."""
        if self.eval_recorder is not None:
            self.eval_recorder.write(record)
        if self.progress is not None:
            self.progress(record["round"], record["train_time"], record["samples_seen"],
                          Evaluation(record["test_acc"], record["test_loss"]))

    def evaluate_snapshots(self, run_dir) -> int:
        """After training, without an evaluator process: evaluate the deferred snapshots in
        order (the leader); how many."""
        self.snapshots.flush()
        model = copy.deepcopy(self.mode.model)
        done = evaluate_pending(run_dir, model, self.test_set, self.device,
                                self._record_evaluation)
        remove_if_empty(run_dir)
        return done

    def evaluate_initial(self, t0: float) -> None:
        """Accuracy of the starting model (round 0, training time 0), before the clock runs:
        by the evaluator process where there is one (a snapshot, off the start's path: the
        other workers would wait for it at the start's barrier), else here."""
        if self.rank == 0 and self.eval_recorder is not None:
            stamp = {"t": 0.0, "train_time": 0.0, "round": 0, "samples_seen": 0}
            if self.snapshots is not None and self.cfg.evaluator:
                self.snapshots.put(stamp, _cpu_state(self.mode.model), first=True)
                return
            result = evaluate(self.mode.model, self.test_set, self.device)
            self.eval_recorder.write({**stamp, "test_acc": result.test_acc,
                                      "test_loss": result.test_loss})

    # ------------------------------------------------------------------ the agreement
    def _act(self, st: LoopState, agreement: Agreement | None, admit: bool = True) -> bool:
        """Count the samples, evaluate if agreed, admit the workers offered a place (unless
        the caller does, after the round's record), and say whether to stop."""
        if agreement is None:
            return False
        st.samples_seen = agreement.samples_seen
        self._evaluations += agreement.evaluate
        self._checkpoint_due = self._checkpoint_due or (
            self.checkpointer is not None and self._checkpoint_now(st, agreement))
        if agreement.evaluate:
            self._evaluate(st)
        if agreement.admit and admit:
            self._admit(st)
        return agreement.stop

    def _checkpoint_now(self, st: LoopState, agreement: Agreement) -> bool:
        """At the stop, and at every `--checkpoint-every`-th agreed evaluation — or, for the
        workers of an asynchronous mode, which take part in none, every as many
        `--eval-interval`s of their own training time."""
        every = self.cfg.checkpoint_every
        if agreement.stop:
            return True
        if self.path is ControlPath.STORE and not self.roster.leads:
            return every > 0 and st.train_time(self._now()) >= self._next_checkpoint
        return agreement.evaluate and every > 0 and self._evaluations % every == 0

    def _background_agreement(self, st: LoopState, wait: bool) -> bool:
        """Act on the last proposal's sum from the channel once it is in (`wait`: block for
        it, timed as `wait`); whether to stop."""
        if self._in_flight is None or not (wait or self._in_flight.done()):
            return False
        with self.mode.comm.clock.phase("wait"):
            summed, self._in_flight = self._in_flight.result(), None
        return self._act(st, self.control.agree(summed))

    def _before_apply(self, st: LoopState, rnd: RoundAccount) -> tuple[bool, Agreement | None]:
        """At a round's end, before the mode communicates: the previous round's background
        agreement must be in (stop: every worker stops after the same round); a blocking
        agreement is made now; one that rides on the round's sum is handed to the mode.
        Returns (stop now, this round's agreement)."""
        if self.path is ControlPath.BACKGROUND and self._background_agreement(st, wait=True):
            return True, None
        if self.path is ControlPath.BLOCKING:
            proposal = self._propose(st, rnd.samples, self._now())
            return False, self.control.agree(self.mode.comm.barrier(proposal.as_tensor()))
        if self.path is ControlPath.WITH_SUM:  # (summed with the round's own, `_after_apply`)
            self.mode.proposal = self._propose(st, rnd.samples, self._now()).as_tensor()
        return False, None

    def _after_apply(self, st: LoopState, rnd: RoundAccount,
                     agreement: Agreement | None) -> Agreement | None:
        """After the round's communication: the agreement that came with the round's sum, or
        the proposal that travels after it (the blocking agreement was made before; the
        background one is acted on when it comes in)."""
        if self.path is ControlPath.BLOCKING:
            return agreement
        if self.path is ControlPath.WITH_SUM:
            summed, self.mode.agreed = self.mode.agreed, None
            if summed is None:
                raise RuntimeError(f"{self.mode.name}: a round ended without its sum carrying "
                                   f"the loop's proposal (ControlPath.WITH_SUM)")
            return self.control.agree(summed)
        if self.path is ControlPath.STORE:
            self._follow_lead()
        proposal = self._propose(st, rnd.samples, self._now())
        if self.path is ControlPath.BACKGROUND:
            self._in_flight = self.mode.comm.start_all_reduce(
                proposal.as_tensor(), f"agreement of round {self.mode.round - 1}")
            return None
        with self.mode.comm.clock.phase("wait"):
            return self.control.exchange(proposal)

    # ------------------------------------------------------------------ checkpoints
    def restore(self, checkpoint: dict) -> None:
        """Continue from `checkpoint` (this rank's, loaded by `checkpoint.py`): the loop's
        counters and data position; the model, optimizer and mode were restored before."""
        self._restored = checkpoint
        self._evaluations = int(checkpoint["loop"]["evaluations"])
        self._next_checkpoint = self._checkpoint_after(checkpoint["loop"]["train_time"])
        self.control.resume(int(checkpoint["loop"]["samples_seen"]))
        self._last_recorded = int(checkpoint["recorded_round"])
        self.start_at(checkpoint["data"]["epoch"], checkpoint["data"]["batch"])
        # drawn in a round cut short by the stop: the resumed first round's record has them
        # (and those of the shards it held for others: the ledger keeps them too)
        data = checkpoint["data"]
        self._unrecorded = RoundAccount(
            drawn=[list(map(int, r)) for r in data.get("drawn", ())],
            held={int(h["shard"]): h["drawn"] for h in data.get("held", ())})

    def start_at(self, epoch: int, batch: int) -> None:
        """Draw from batch `batch` of epoch `epoch` on (the batches before it were trained
        on: a checkpoint's data position, or where a joining rank's recorded draws end)."""
        self.held.start_at(self.rank, epoch, batch)

    @property
    def position(self) -> tuple[int, int]:
        """This worker's own shard's data position: (epoch, batches of it taken)."""
        return self.held.shards[self.rank].position

    # ------------------------------------------------------------------ shards held
    # (`runtime/shards.py`: the lost workers' and absent spares' shards)
    @property
    def _claims_shards(self) -> bool:
        """An asynchronous parameter-server mode's worker: its shards are claimed in the
        store (`shards.py`, step 6), there being no membership to agree on them."""
        return (self.membership is None and self.path is ControlPath.STORE
                and self.store is not None and self.mode.comm.ps_client is not None)

    def _hold_shards(self, joined: bool) -> None:
        """At the start: the absent spares' shards this worker holds (from their start: a
        resumed run starts every rank; an asynchronous mode claims them, `_follow_drawers`),
        then where every shard it holds stands."""
        if self._claims_shards:
            if not joined:  # (a joiner claimed its own as it entered)
                shared(self.store).set(f"{shards.DRAWER}/{self.rank}", self._drawer)
            self._publish_positions()
            self._follow_drawers()
            return
        if self.membership is None:
            return
        if not joined:
            for shard in self._mine():
                if shard != self.rank:
                    self.held.hold(shard, (0, 0))
        self._publish_positions()

    def _mine(self) -> list[int]:
        return shards.held_by(self.rank, self.membership.members, self.run_ranks)

    @property
    def _publishes_draws(self) -> bool:
        """Where its shards stand goes to the store as they are drawn, before the round's
        sum, not after its record (`runtime/shards.py`, step 2)."""
        return shards.publishes_before_sum(self.mode, self.membership)

    def _publish_positions(self, drawing: bool = False) -> None:
        if self.membership is not None or self._claims_shards:
            shards.publish(shared(self.store), self.held.positions(),
                           (self.mode.round, self.held.round_starts()) if drawing else None)

    def _follow_drawers(self) -> None:
        """An asynchronous mode, after a record (at most twice a second): let go of the
        shards another worker holds now, claim those this one does (`shards.py`, step 6)."""
        now = time.monotonic()
        if not self._claims_shards or now < self._next_drawer_check:
            return
        self._next_drawer_check = now + 0.5
        shards.follow(self.held, shared(self.store), self._drawer, self.run_ranks,
                      set(known_lost(self.store, self.run_ranks)))

    def _claim_own_shard(self) -> bool:
        """An asynchronous mode's joiner: its own shard, from where the member that held it
        while it was away got to (or its own records, if nobody published it). False if the
        run stopped first."""
        store = shared(self.store)
        if not shards.claim_own(store, self._drawer, self.run_ranks, self.cfg.timeout,
                                lambda r: bool(known_lost(self.store, [r])),
                                self.control.stopped):
            return False
        position = shards.published(store, self.rank, never=None)
        if position is not None:
            self.start_at(*position)
        return True

    def _retake_shards(self) -> None:
        """After a regroup (`shards.py`, step 3): let go of the shards another member holds
        now, keep those this worker held already (the caller draws the dropped round again
        from its own count: `HeldShards.redraw`), and hold the new ones from where their
        last holder published. Its own count, not the store's, for those it kept: a worker
        the regroup left out (paused past the grace) may still publish its last position
        over the holder's (`results/chaos.md`, 2026-11-30: 8 batches drawn twice). A new
        shard's round its lost holder trained but did not record goes into this worker's
        next record (`_after_regroup`)."""
        self._lost_draws.update(shards.retake(self.held, self._mine(), shared(self.store),
                                              self.mode.round))

    def _hand_over_shards(self, joined: bool) -> None:
        """An admission (nothing dropped): hand on, as they stand now, the shards another
        member holds from this generation on, then take those this one does (`joined`:
        this worker is one that joins)."""
        store, generation = shared(self.store), self.membership.generation
        mine = self._mine()
        for shard in self.held.others():
            if shard not in mine:
                shards.hand_over(store, generation, shard, self.held.shards[shard].position)
        self.held.take(mine, lambda shard: shards.taken_over(
            store, generation, shard, self.cfg.timeout, alarm=self.membership.alarm),
            keep=True, own=joined)

    def _checkpoint_after(self, train_time: float) -> float:
        """When an asynchronous mode's worker > 0 writes its next checkpoint."""
        return train_time + self.cfg.checkpoint_every * self.cfg.eval_interval

    def _write_checkpoint(self, st: LoopState, cut: RoundAccount | None = None) -> None:
        """`cut`: the round the stop cut short, whose draws the ledger keeps."""
        if self.snapshots is not None:  # the snapshots before the checkpoint are on disk
            self.snapshots.flush()
        self.mode.settle()  # e.g. ESync's sum in flight (timed as its wait): it is included
        start = self._now()
        if self.roster.leads and not self.mode.collective_global_model:
            with self.mode.global_model():  # as settled: the same global as the mode's state
                self._global_state = _cpu_state(self.mode.model)
        now = self._now()
        # a resume restarts these from the leader's file (checkpoint.py): the ranks lost, the
        # spares not joined yet, and those below an asynchronous mode's leader (lost, or
        # joined again since: the leader is the lowest of the others)
        restart = set(self.roster.lost()) | set(self.roster.absent()) | set(range(
            self.roster.leader if self.path is ControlPath.STORE else 0))
        state = {"round": self.mode.round, "recorded_round": self._last_recorded,
                 "mode_name": self.cfg.effective_mode, "lost": sorted(restart),
                 "optimizer": self.mode.optimizer.state_dict(), "mode": self.mode.state_dict(),
                 "data": {"epoch": self.position[0], "batch": self.position[1],
                          "drawn": [list(r) for r in cut.drawn] if cut else [],
                          "held": [{"shard": shard, "drawn": drawn} for shard, drawn
                                   in sorted(cut.held.items())] if cut else []},
                 "loop": {"t": now - st.t0, "eval_total": st.eval_total,
                          "train_time": st.train_time(now), "samples_seen": st.samples_seen,
                          "last_eval_train_time": st.last_eval_train_time,
                          "last_acc": st.last_acc, "last_loss": st.last_loss,
                          "evaluations": self._evaluations}}
        if self.roster.leads:
            if self._global_state is None:  # (every due point of the leader is an evaluation)
                raise RuntimeError(f"the leader's (rank {self.rank}) checkpoint has no global "
                                   f"model")
            state["global"] = self._global_state
        self.checkpointer.write(state)
        self._checkpoint_due, self._global_state = False, None
        st.eval_total += self._now() - start  # writing it is not training
        self._next_checkpoint = self._checkpoint_after(state["loop"]["train_time"])

    def _loop_state(self, t0: float) -> LoopState:
        if self._restored is None:
            return LoopState(t0=t0)
        loop = self._restored["loop"]  # the clock goes on from the checkpoint's
        return LoopState(t0=t0 - loop["t"], eval_total=loop["eval_total"],
                         last_eval_train_time=loop["last_eval_train_time"],
                         last_acc=loop["last_acc"], last_loss=loop["last_loss"],
                         samples_seen=loop["samples_seen"])

    # ------------------------------------------------------------------ the loop
    def run(self, t0: float) -> LoopState:
        mode, comm = self.mode, self.mode.comm
        timer = comm.timer
        st = self._loop_state(t0)
        if self.joining and not self._enter(st):
            return st  # the run ended before this process was let in
        mode.module.train()
        rnd = RoundAccount(st.eval_total, start=self._now(), drawn=self._unrecorded.drawn,
                           held=self._unrecorded.held)
        if rnd.drawn:
            self.held.shards[self.rank].round_start = tuple(rnd.drawn[0][:2])
        self._hold_shards(joined=self.joining)
        comm.clock.take()
        while True:
            shard, draws, idx = self.held.draw_batch(self._draws_of)
            for epoch, number in draws:
                rnd.draw(epoch, number, shard=None if shard == self.rank else shard)
            if self._publishes_draws:  # (before the sum: `Mode.rounds_all_or_none`)
                self._publish_positions(drawing=True)
            started, waited = timer.begin(), comm.clock.total()
            self._schedule_lr(st, started)
            # (a lost worker's batch is its own size: it takes that many samples' time and
            # weight, `Mode.batch_share`)
            mode.batch_share = 1.0 if shard == self.rank else len(idx) / self._own_batch
            x, y = self.train_set.batch(idx)
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            mode.optimizer.zero_grad(set_to_none=True)
            loss = self.criterion(mode.module(x), y)
            loss.backward()
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            # a slower device (runtime/heterogeneity.py; DDP did in backward), for the step's
            timer.emulate(len(idx) / self._timed_batch)  # samples
            ended = self._now()
            loss_value = float(loss.detach())
            if not math.isfinite(loss_value):
                raise Diverged(
                    f"rank {self.rank}: training loss is {loss_value} at round {mode.round}; "
                    f"lower the learning rate (-l/-ll, now {mode.lr})")
            rnd.add_step((ended - started) - (comm.clock.total() - waited), loss_value,
                         len(idx))
            try:
                stop, rnd = self._communicate(st, rnd, Step(started, ended, self.position[0]))
            except CommError as err:
                self._regroup(st, err)  # (or raises)
                self.held.redraw()  # the dropped round's batches again (the ledger skips none)
                stop, rnd = False, self._after_regroup(st)
            if stop:
                break
            fault = faults.due(self._faults, mode.round)
            if fault is not None:
                self._faults.remove(fault)
                faults.inject(fault, self.run_dir, timer)
        if self.roster.leads and self.membership is not None:
            self.membership.close()  # nobody is let in after the stop
        try:
            mode.finish()
        except CommError as err:  # lost in the last round's sum: that round is dropped
            self._regroup(st, err)
            mode.finish()
        if self._checkpoint_due:  # a stop agreed mid-round (background, store)
            self._write_checkpoint(st, cut=rnd)
        return st

    def _communicate(self, st: LoopState, rnd: RoundAccount,
                     step: Step) -> tuple[bool, RoundAccount]:
        """The step's second half: take in what arrived, decide, apply, and at a round's
        end agree, record and checkpoint. Returns (stop, the round's account)."""
        action = decide(self.mode, step)
        agreement = None
        if action.ends_round:
            stop, agreement = self._before_apply(st, rnd)
            if stop:
                return True, rnd
        finished_round = perform(self.mode, action, rnd)
        if not action.ends_round:
            return self._background_agreement(st, wait=False), rnd

        # ---- the round ends: the agreement's other half, the record, acting on it
        agreement = self._after_apply(st, rnd, agreement)
        stop = (self._act(st, agreement, admit=False)
                or self._background_agreement(st, wait=False))
        self._record(finished_round, rnd, st, step.epoch)
        if self.batch_plan is not None:
            self.batch_plan.meter(rnd.samples, rnd.compute)
            if replan.due(finished_round) and not stop:
                self._replan(finished_round)
        rnd = RoundAccount(st.eval_total, start=self._now())
        if agreement is not None and agreement.admit:  # (after the record: where a member
            self._admit(st)  # is lost as they admit, the regroup must not draw again a
            # round that was applied: `results/chaos.md`, 2026-11-30, a batch counted skipped)
        if self._checkpoint_due:  # its time: the next round's eval_s, not training
            self._write_checkpoint(st)
        return stop, rnd

    def _after_regroup(self, st: LoopState) -> RoundAccount:
        """The next round's account: with the draws of the shards this worker took on that
        their lost holder trained in a completed round but did not record."""
        rnd = RoundAccount(st.eval_total, start=self._now(), held=self._lost_draws)
        self._lost_draws = {}
        return rnd

    def _replan(self, round_: int) -> None:
        """Every member: compare the speeds measured since the last check with those the
        batches follow, and re-plan them past the drift (`runtime/replan.py`, steps 2-3)."""
        plan = self.batch_plan
        speeds = plan.replanned(self.mode.comm.barrier(plan.measured(self.rank),
                                                       phase="comm").tolist())
        if speeds is None:
            return
        before = list(plan.batches)
        self._follow_plan(speeds)
        if plan.batches == before:  # (rounded to whole samples, the same batches)
            return
        tell(self.run_dir if self.roster.leads else None, "replan",
             f"hetsync worker: rank {self.rank}: the devices' speeds drifted past "
             f"{plan.drift:.0%}: batches {', '.join(map(str, before))} -> "
             f"{', '.join(map(str, plan.batches))} from round {round_ + 1} (speeds "
             f"{', '.join(f'{s:.2f}' for s in speeds)})",
             round=round_ + 1, speeds=speeds, batches=list(plan.batches), before=before)

    def _follow_plan(self, speeds: list[float]) -> None:
        """Draw and weigh this worker's steps by the batches `speeds` make."""
        self.batch_plan.adopt(speeds)
        self.mode.comm.sample_weight = self.batch_plan.sample_weight_of(self.rank)

    def _regroup(self, st: LoopState, err: CommError) -> None:
        """A peer was lost: go on with the survivors where the run can
        (`runtime/membership.py`): new groups, the leader's global state (`mode.rejoin`) and
        its counts of samples and evaluations. The round in progress is dropped. Raises
        `err` where the run cannot go on."""
        if self.membership is None:
            raise err
        members = self.membership.go_on(
            self.mode, err, then=lambda: self._take_leaders_counts(st, joined=False))
        self._in_flight, self._checkpoint_due, self._global_state = None, False, None
        self._retake_shards()
        self._take_lead()  # (rank 0 was lost: the lowest survivor leads from here)
        lost = list(self.membership.lost)
        tell(self.run_dir if self.roster.leads else None, "lost",
             f"hetsync worker: rank {self.rank}: going on without rank(s) "
             f"{', '.join(map(str, lost))} from round {self.mode.round} "
             f"(workers {', '.join(map(str, members))})",
             ranks=lost, round=self.mode.round, workers=list(members))

    def _admit(self, st: LoopState) -> None:
        """The round's agreement lets the ranks the leader offered a place join
        (`runtime/membership.py`): settle what is in flight, make the groups with them, and
        give them the leader's global state (`mode.admit`), counts and clock. Each member
        keeps its own local steps since its last sum. (A joiner lost while the groups are
        made fails them at the timeout: the members then regroup without it.)"""
        self.mode.settle()
        joining = self.membership.admit()
        self._hand_over_shards(joined=False)
        self._share_with_joiners(st, joined=False)
        tell(self.run_dir if self.roster.leads else None, "admitted",
             f"hetsync worker: rank {self.rank}: rank(s) {', '.join(map(str, joining))} "
             f"joined at round {self.mode.round} (workers "
             f"{', '.join(map(str, self.membership.members))})",
             ranks=list(joining), round=self.mode.round,
             workers=list(self.membership.members))

    def _enter(self, st: LoopState) -> bool:
        """This process joins the running job (`joining`): ask, wait to be admitted, then
        take the members' groups, the leader's global state, counts and clock. False if the
        run ended first."""
        asked = self._now()
        if self.membership is None:
            return self._enter_server(st, asked)
        if not self.membership.enter(wait=2 * self.cfg.timeout):  # (it asks only now: ready)
            return False
        self._hand_over_shards(joined=True)
        self._share_with_joiners(st, joined=True)
        tell(self.run_dir, "joined",
             f"hetsync worker: rank {self.rank}: joined the run at round {self.mode.round}, "
             f"{self._now() - asked:.2f} s after asking (workers "
             f"{', '.join(map(str, self.membership.members))})",
             rank=self.rank, round=self.mode.round, waited_s=self._now() - asked)
        return True

    def _enter_server(self, st: LoopState, asked: float) -> bool:
        """An asynchronous mode's joiner: a link of its own to the parameter server
        (`runtime/server_link.py`), then the server's model (the mode's `setup`: a pull). It
        goes on with its own round count (`go_on_from`), on the run's clock and sample
        count, its shard from where the member that drew it meanwhile got to
        (`_claim_own_shard`). Where the store still names its rank the leader (its old
        process led, and nobody has taken over), it leads on, unless another worker takes
        the lead first (the same compare-and-set). False if the run stopped first."""
        from hetsync.runtime import server_link

        client = self.mode.comm.ps_client
        link = server_link.ask(self.store, self.rank, client.server_rank,
                               wait=2 * self.cfg.timeout, stopped=self.control.stopped)
        if link is None:
            return False
        client.use_link(link)
        if self._claims_shards and not self._claim_own_shard():
            return False
        if self.roster.reclaim():
            self._take_lead()
            tell(self.run_dir, "lead", f"hetsync worker: rank {self.rank}: leads on (no other "
                                       f"worker took the lead while it was lost)",
                 rank=self.rank, lost=self.rank)
        self.mode.setup()
        st.samples_seen = self.control.seen()
        self._next_checkpoint = self._checkpoint_after(st.train_time(self._now()))
        tell(self.run_dir, "joined",
             f"hetsync worker: rank {self.rank}: joined the run at round {self.mode.round}, "
             f"{self._now() - asked:.2f} s after asking (on a link of its own to the "
             f"parameter server, rank {client.server_rank})",
             rank=self.rank, round=self.mode.round, waited_s=self._now() - asked)
        return True

    def go_on_from(self, records: list[dict]) -> None:
        """A joining rank's own records (its work until its loss, in the global model): it
        draws on where they end and, in an asynchronous mode (each worker counts its own
        rounds), counts on from the last (a regrouping mode's admission gives the leader's
        count instead)."""
        from hetsync.telemetry import ledger

        reached = ledger.reached(records)
        if reached is not None:
            self.start_at(reached["epoch"], reached["batch"])
        if records and self.path is ControlPath.STORE:
            self._last_recorded = int(records[-1]["round"])
            self.mode.round = self._last_recorded + 1

    def _share_with_joiners(self, st: LoopState, joined: bool) -> None:
        """Every member and joiner alike: the new groups, then the leader's global state
        (`mode.admit`), counts and clock (`joined`: this worker is one that joins)."""
        try:
            self.membership.use(self.mode.comm, self.membership.groups())
            self.mode.admit(joined)
            self._take_leaders_counts(st, joined)
        except RuntimeError as lost:  # (gloo's) a member or joiner lost: the members regroup
            raise CommError(f"join of generation {self.membership.generation}: {lost}",
                            op="join") from lost

    def _take_leaders_counts(self, st: LoopState, joined: bool) -> None:
        """The leader's counts of samples and evaluations, and its batch plan
        (`runtime/replan.py`, step 5), on every member; `joined`: also its clock (training
        time, evaluation time, the last evaluation's) and its count of checkpoints, which
        the worker that joins goes on from."""
        now = self._now()
        plan = self.batch_plan
        counts = self.mode.comm.broadcast(torch.tensor(
            [st.samples_seen, self._evaluations, now - st.t0, st.eval_total,
             st.last_eval_train_time, self.checkpointer.index if self.checkpointer else 0,
             *(plan.speeds if plan is not None else ())], dtype=torch.float64)).tolist()
        if plan is not None:  # (`runtime/replan.py`, step 5)
            self._follow_plan(counts[6:])
        st.samples_seen, self._evaluations = int(counts[0]), int(counts[1])
        self.control.rejoin(st.samples_seen)
        if joined:
            st.t0, st.eval_total, st.last_eval_train_time = now - counts[2], *counts[3:5]
            if self.checkpointer is not None:
                self.checkpointer.index = int(counts[5])
            self._next_checkpoint = self._checkpoint_after(st.train_time(now))

    def _schedule_lr(self, st: LoopState, now: float) -> None:
        cfg = self.cfg
        if cfg.lr_schedule == "constant":
            return
        progress = run_progress(st.train_time(now), st.samples_seen, time_budget=cfg.time_budget,
                                epochs=cfg.epochs, train_size=self.train_size)
        set_lr_factor(self.mode.optimizer, lr_factor(cfg.lr_schedule, progress, cfg.lr_final))

    def _record(self, round_: int, rnd: RoundAccount, st: LoopState, epoch: int) -> None:
        self._last_recorded = round_
        self.held.round_over()  # (the next round's draws begin here)
        record = rnd.record(self.mode, self.rank, round_, st.t0, st.eval_total, epoch)
        self.recorder.write({**record, **self.held.record_fields(rnd.drawn, rnd.held),
                             **({"batch": self._own_batch} if self.batch_plan else {})})
        self._publish_positions()  # (after a publish before the sum: the round is recorded)
        self._follow_drawers()


def _cpu_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A copy of `model`'s state on the CPU (a snapshot, or a checkpoint's global model)."""
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
