"""The one training loop that every mode runs.

Per step: draw a batch of this worker's shard, forward, backward, the mode's local update, the
emulated slowdown, then ask the mode whether the step ends a round. At the end of a round the
mode communicates and the loop records the round (compute / wait / comm / bytes). When a
round's sum is in (at once, or some steps later for a mode that aggregates in the background),
the workers act on what it agreed (`control.py`): samples seen, evaluation (on rank 0, of the
global model), stop.

Timing follows DESIGN.md: compute = data + forward + backward + local update + emulated slowdown
(`heterogeneity.py`);
wait = barrier, state-server queries and time blocked on a sum still in flight; comm = the
transfers on the critical path; evaluation is kept apart, and the training time used for
time-to-accuracy excludes it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

import torch

from hetsync.algorithms.base import Algorithm
from hetsync.config import Config
from hetsync.runtime.control import Agreement, CollectiveControl, Proposal
from hetsync.runtime.heterogeneity import StepTimer


@dataclass
class Evaluation:
    test_acc: float
    test_loss: float


def evaluate(model: torch.nn.Module, dataset, device: torch.device,
             batch_size: int = 1000) -> Evaluation:
    """Accuracy and mean loss on the whole test set (exact counts, not a mean of batch means)."""
    was_training = model.training
    model.eval()
    correct, loss_sum, n = 0, 0.0, len(dataset)
    with torch.no_grad():
        for start in range(0, n, batch_size):
            idx = torch.arange(start, min(start + batch_size, n))
            x, y = dataset.batch(idx)
            x, y = x.to(device), y.to(device)
            out = model(x)
            loss_sum += float(torch.nn.functional.cross_entropy(out, y, reduction="sum"))
            correct += int((out.argmax(1) == y).sum())
    model.train(was_training)
    return Evaluation(correct / n, loss_sum / n)


@dataclass
class LoopState:
    """Rank 0's view of when to evaluate and stop, and every rank's accounting."""

    t0: float
    eval_total: float = 0.0           # seconds paused for evaluation
    last_eval_train_time: float = 0.0
    last_acc: float = float("nan")
    samples_seen: int = 0

    def train_time(self, now: float) -> float:
        return now - self.t0 - self.eval_total


class TrainingLoop:
    """Drives `algo` over `batches` until the workers agree to stop."""

    def __init__(self, cfg: Config, algo: Algorithm, *, rank: int, batches, train_set, test_set,
                 device: torch.device, recorder, eval_recorder=None, control=None,
                 barrier: Callable[[], None] | None = None, progress=None,
                 device_name: str = "cpu"):
        self.cfg, self.algo, self.rank = cfg, algo, rank
        self.batches, self.train_set, self.test_set = batches, train_set, test_set
        self.device, self.device_name = device, device_name
        self.recorder, self.eval_recorder = recorder, eval_recorder
        self.control = control
        self.barrier = barrier or (lambda: None)
        self.progress = progress
        self.slowdown = cfg.slowdown_of(rank)
        self.train_size = len(train_set)
        self.criterion = torch.nn.CrossEntropyLoss()
        self._exchanged: Agreement | None = None  # asynchronous modes' agreement

    # ------------------------------------------------------------------ rank 0's proposals
    def _propose(self, st: LoopState, samples: int, now: float) -> Proposal:
        if self.rank != 0:
            return Proposal(samples, False, False)
        cfg, train_time = self.cfg, st.train_time(now)
        seen = st.samples_seen + samples  # this round's own samples are not counted yet
        stop = ((cfg.time_budget is not None and train_time >= cfg.time_budget)
                or (cfg.epochs is not None and seen >= cfg.epochs * self.train_size)
                or (cfg.target_acc is not None and st.last_acc >= cfg.target_acc))
        if cfg.eval_every > 0:
            evaluate_now = self.algo.round % cfg.eval_every == 0
        else:
            evaluate_now = train_time - st.last_eval_train_time >= cfg.eval_interval
        return Proposal(samples, evaluate_now or stop, stop)

    # ------------------------------------------------------------------ evaluation
    def _evaluate(self, st: LoopState, pause_everyone: bool) -> float:
        """Rank 0 evaluates; in collective modes everyone waits for it. Returns seconds paused
        (the barrier's time is evaluation, not waiting: the clock's `eval` phase is dropped)."""
        start = time.perf_counter()
        train_time = st.train_time(start)
        if self.rank == 0:
            with self.algo.global_model():
                result = evaluate(self.algo.model, self.test_set, self.device)
            st.last_acc = result.test_acc
            st.last_eval_train_time = train_time
            if self.eval_recorder is not None:
                self.eval_recorder.write({
                    "t": time.perf_counter() - st.t0, "train_time": train_time,
                    "round": self.algo.round - 1, "samples_seen": st.samples_seen,
                    "test_acc": result.test_acc, "test_loss": result.test_loss})
            if self.progress is not None:
                self.progress(self.algo.round - 1, train_time, st.samples_seen, result)
        if pause_everyone:
            self.barrier()
        paused = time.perf_counter() - start
        st.eval_total += paused
        return paused

    def evaluate_initial(self, t0: float) -> None:
        """Accuracy of the starting model (round 0, training time 0), before the clock runs."""
        if self.rank == 0 and self.eval_recorder is not None:
            result = evaluate(self.algo.model, self.test_set, self.device)
            self.eval_recorder.write({"t": 0.0, "train_time": 0.0, "round": 0, "samples_seen": 0,
                                      "test_acc": result.test_acc,
                                      "test_loss": result.test_loss})

    # ------------------------------------------------------------------ the loop
    def run(self, t0: float) -> LoopState:
        algo, clock, model = self.algo, self.algo.comm.clock, self.algo.model
        st = LoopState(t0=t0)
        collective = algo.collective_control and self.control is None
        agreement_of = CollectiveControl() if collective else None
        model.train()
        round_start = time.perf_counter()
        compute = loss_sum = 0.0
        steps = samples = 0
        meter_before = _meter_totals()
        eval_recorded = 0.0  # evaluation seconds already in a record
        timer = StepTimer(self.slowdown, cpu_device=self.device.type == "cpu")
        clock.take()
        for epoch, idx in self.batches:
            step_start = timer.begin()
            x, y = self.train_set.batch(idx)
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            algo.optimizer.zero_grad(set_to_none=True)
            loss = self.criterion(model(x), y)
            loss.backward()
            algo.local_step()
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            timer.emulate()  # a slower device (runtime/heterogeneity.py)
            step_time = time.perf_counter() - step_start
            compute += step_time
            steps += 1
            samples += len(idx)
            loss_value = float(loss.detach())
            if not math.isfinite(loss_value):
                raise FloatingPointError(
                    f"rank {self.rank}: training loss is {loss_value} at round {algo.round}; "
                    f"lower the learning rate (-l/-ll, now {algo.lr})")
            loss_sum += loss_value
            ends_round = algo.wants_sync(step_time)
            if ends_round:
                algo.settle()  # a sum still in flight, and its agreement, come first
            if self._agree(st, agreement_of, collective):
                break
            if not ends_round:
                continue

            # ---- the round ends: communicate, record
            proposal = self._propose(st, samples, time.perf_counter())
            finished_round = algo.round
            algo.synchronize(proposal.as_tensor() if collective else None)
            if not collective:
                with clock.phase("wait"):
                    self._exchanged = self.control.exchange(proposal)
            self._record(finished_round, steps, samples, round_start, compute, loss_sum,
                         st.eval_total - eval_recorded, meter_before, st, epoch)
            eval_recorded = st.eval_total
            round_start = time.perf_counter()
            compute = loss_sum = 0.0
            steps = samples = 0
            meter_before = _meter_totals()
            if self._agree(st, agreement_of, collective):
                break
        algo.finish()
        return st

    def _agree(self, st: LoopState, agreement_of: CollectiveControl | None,
               collective: bool) -> bool:
        """Act on a round's agreement if one came in: count samples, evaluate (everyone pauses
        in collective modes), and say whether to stop."""
        if collective:
            summed = self.algo.agreed_control()
            agreement = None if summed is None else agreement_of.agree(summed)
        else:
            agreement, self._exchanged = self._exchanged, None
        if agreement is None:
            return False
        st.samples_seen = agreement.samples_seen
        if agreement.evaluate:
            self._evaluate(st, pause_everyone=collective)
        return agreement.stop

    def _record(self, round_, steps, samples, round_start, compute, loss_sum, eval_s,
                meter_before, st: LoopState, epoch: int) -> None:
        spent = self.algo.comm.clock.take()
        sent, recv = _meter_totals()
        now = time.perf_counter()
        self.recorder.write({
            "rank": self.rank, "device": self.device_name, "round": round_,
            "local_steps": steps, "samples": samples,
            "t_start": round_start - st.t0, "t_end": now - st.t0,
            "compute_s": compute, "wait_s": spent.get("wait", 0.0) + spent.get("query", 0.0),
            "comm_s": spent.get("comm", 0.0), "query_s": spent.get("query", 0.0),
            "eval_s": eval_s, "bytes_sent": sent - meter_before[0],
            "bytes_recv": recv - meter_before[1], "loss": loss_sum / max(steps, 1),
            "lr": self.algo.lr, "epoch": epoch})


def _meter_totals() -> tuple[int, int]:
    from hetsync.comm import meter

    return meter.totals()
