"""`eager-solo`, `eager-majority`: eager-SGD (Li et al., "Taming Unbalanced Training Workloads
in Deep Learning with Partial Collective Operations", PPoPP'20).

Per step, on every worker:

1. forward and backward on the local batch;
2. hand the whole model's gradient (one flat buffer, as the published code's single initiator
   per step makes it) to this worker's partial all-reduce (`hetsync.comm.partial`), whose
   progress engine runs on the worker's background channel: a round starts when the first
   worker arrives (solo) or when the round's drawn initiator does (majority), and every worker
   contributes what it has (a late gradient joins a later round: never lost);
3. wait until a round has carried this gradient;
4. feed the mean gradient of every round completed since the last step, in round order, to
   the worker's own optimizer (momentum and all), one step each, so every replica applies the
   same updates.

Every (K+1)-th round is synchronous (`--eager-sync-every`; solo: K = 32 by default, the
published limiter; majority: off by default, as in its published code, where the line is
commented out). The mean divides by P (`--eager-divide workers`, as the code) or by the fresh
contributions (`fresh`). Each step's record holds the staleness of its gradient (rounds
between the model it was computed on and the round that carried it) and the rounds it
applied. The loop's agreement goes through the store: there is no common round. On a
virtual clock the rounds start in the order of the workers' clocks (`hetsync.comm.partial`).

A lost worker: the survivors regroup (`runtime/membership.py`) and `rejoin` starts a new
engine on their new channel, from rank 0's model and optimizer state (a round in flight may
have been applied by some survivors and not by others); the gradients the old engine still
carried are dropped, and the old engine's thread ends with its timeout.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from hetsync.algorithms.base import (Action, ControlPath, GoesOn, Mode, Step, flatten, gradients,
                                     set_gradients)
from hetsync.algorithms.leader_state import take_leaders_state
from hetsync.algorithms.registry import ModeSpec, register


@dataclass
class EagerOptions:
    """eager-SGD's synchronous-round period and divisor."""

    sync_every: int | None = field(default=None, metadata={
        "flags": ("--eager-sync-every",),
        "help": "eager-SGD: every (K+1)-th round is synchronous; 0: never (default: 32 for "
                "solo, 0 for majority)"})
    divide: str = field(default="workers", metadata={
        "flags": ("--eager-divide",),
        "help": "eager-SGD: divide a round's sum by the workers (as published) or by its "
                "fresh contributions (fresh)"})

    def validate(self) -> "EagerOptions":
        from hetsync.comm.partial import DIVISORS
        from hetsync.options import invalid_option

        if self.sync_every is not None and self.sync_every < 0:
            raise invalid_option(self, "sync_every", "an integer >= 0 (0: never)")
        if self.divide not in DIVISORS:
            raise invalid_option(self, "divide", " or ".join(DIVISORS))
        return self


class EagerSGD(GoesOn, Mode):  # (its main thread waits on its engine, which hears the alarm)
    """The worker side of eager-SGD; `initiator` says who starts a round."""

    name = "eager"
    Options = EagerOptions
    control = ControlPath.STORE
    initiator: ClassVar[str] = "solo"
    default_sync_every: ClassVar[int] = 32

    def __init__(self, model, optimizer, comm, options: EagerOptions | None = None):
        super().__init__(model, optimizer, comm, options)
        self.options.validate()
        self.applied = 0      # rounds applied to this replica
        self._first = 0       # rounds applied before the current engine's first
        self.engine = None
        self._engine_job = None
        self._last = {"staleness": 0, "rounds_applied": 0}

    @property
    def sync_every(self) -> int:
        """K: every (K+1)-th round is synchronous (the option, else the mode's default)."""
        k = self.options.sync_every
        return self.default_sync_every if k is None else k

    def setup(self) -> None:
        self.broadcast_model()
        self._start_engine()

    def _start_engine(self) -> None:
        from hetsync.comm.partial import PartialAllReduce

        self._first = self.applied
        self.engine = PartialAllReduce(
            sum(p.numel() for p in self.parameters()), initiator=self.initiator,
            sync_every=self.sync_every, divide=self.options.divide, seed=6545343,
            collective=self.comm.collective, timeout=self.comm.timeout,
            device=self.comm.wire_device,
            clock=self.comm.clock.source if self.comm.clock.source.virtual else None)
        self._engine_job = (None if self.comm.channel is None else  # one worker (left)
                            self.comm.channel.submit(self.engine.run, "eager-SGD rounds",
                                                     long_running=True))

    def decide(self, step: Step) -> Action:
        return Action.CONTRIBUTE

    def apply(self, action: Action) -> None:
        if self._engine_job is None:  # one worker: a round is its own step
            self.optimizer.step()
            self.applied += 1
            return
        grad = flatten(gradients(self.parameters()))
        ticket = self.engine.post(grad, self.applied - self._first)
        with self.comm.clock.phase("wait"):
            self.engine.wait_for(ticket, alarm=self.comm.channel.alarm)
        applied = self._apply_rounds()
        self._last = {"staleness": self.engine.staleness[-1] if self.engine.staleness else 0,
                      "rounds_applied": applied}

    def _apply_rounds(self) -> int:
        """One optimizer step per completed round, in round order."""
        params = self.parameters()
        results = self.engine.take_results()
        for _, mean in results:
            if mean is not None:
                set_gradients(mean, params)
                self.optimizer.step()
        self.applied += len(results)
        return len(results)

    def rejoin(self) -> None:
        """After a regroup: a new engine on the new channel, from the leader's parameters,
        optimizer state and round counts (`leader_state.py`; BatchNorm statistics are each
        worker's own here)."""
        self.applied, self.round = map(int, take_leaders_state(
            self.comm, self.parameters(), self.optimizer, [self.applied, self.round]))
        self._start_engine()

    def join(self) -> None:
        """No data left (hetsync.wrap): the engine takes part in the others' rounds with
        zeros; their means are applied as they come (`poll`)."""
        super().join()
        if self.engine is not None:
            self.engine.join()

    def poll(self) -> None:
        if self.joined and self._engine_job is not None:
            self._apply_rounds()

    def finish(self) -> None:
        """Run the final round with every worker, apply what is left, stop the engine."""
        if self._engine_job is not None:
            self.engine.finish()
            with self.comm.clock.phase("wait"):  # two rounds at most: the stop's, the final
                self._engine_job.result(within=2 * self.comm.timeout)
                if self.comm.clock.source.virtual:  # (the final round's end)
                    self.comm.clock.source.arrive(self.engine.finished_at())
            self._apply_rounds()
        super().finish()

    def round_record(self) -> dict[str, Any]:
        return dict(self._last)

    def describe(self) -> dict[str, Any]:
        return {"initiator": self.initiator, "sync_every": self.sync_every}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "rounds_applied": self.applied}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        # the engine (started in setup) has run no round yet: versions count from here (a
        # resumed run's staleness came out as minus the rounds before the checkpoint)
        self.applied = self._first = int(state["rounds_applied"])


class EagerSolo(EagerSGD):
    name = "eager-solo"


class EagerMajority(EagerSGD):
    name = "eager-majority"
    initiator = "majority"
    default_sync_every = 0


register(ModeSpec("eager-solo", EagerSolo, "partial all-reduce of gradients started by the "
                  "first worker to arrive; late gradients join a later round; every 33rd "
                  "round synchronous (eager-SGD solo)", options=EagerOptions,
                  lr_scaling="workers", lr_note="x workers"))
register(ModeSpec("eager-majority", EagerMajority, "partial all-reduce started by a drawn "
                  "initiator (in expectation half the workers have arrived) (eager-SGD "
                  "majority)", options=EagerOptions, lr_scaling="workers", lr_note="x workers"))
