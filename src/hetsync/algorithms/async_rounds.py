"""Asynchronous rounds of local steps over the parameter server: the worker side that
`async-local-sgd` and `fedbuff` share (their server rules make the difference).

Per round, on every worker (no worker ever waits for another):

1. local steps of the worker's own optimizer (its state kept across rounds) from the weights
   it last received: H at first, then as many as the server's last answer said;
2. push [g, τ_i, c_i]: the pseudo-gradient g = w_received − w_local, the round's local steps
   and the worker's step time (the median of its recent steps);
3. the server's rule applies it and answers [w_global, H_i]; the worker continues from
   w_global and takes H_i local steps next round.

BatchNorm running statistics stay local, as in `async`. Evaluation and checkpoints see the
weights last received; at the end the worker takes the server's final weights.
"""

from __future__ import annotations

from typing import Any

import torch

from hetsync.algorithms.base import (Action, ControlPath, Mode, Step, flatten, holding,
                                     unflatten_into)
from hetsync.algorithms.round_length import FixedSteps, StepTimes

#: the numbers a push carries after the pseudo-gradient: τ_i, c_i
PUSH_EXTRA = 2


def reply(weights: torch.Tensor, steps: int) -> torch.Tensor:
    """The server's answer to a push: the weights, then the worker's next round length."""
    return torch.cat([weights, weights.new_tensor([float(steps)])])


def dynamic_steps(steps: int, step_times: dict[int, float], worker: int) -> int:
    """Dynamic local updates (DyLU, Liu et al. 2024): the fastest worker takes `steps` local
    steps a round, worker i steps·c_fastest/c_i (rounded, at least 1), so that every worker's
    round takes about as long; `steps` until the worker's step time is known."""
    mine = step_times.get(worker)
    if not mine:
        return steps
    return max(1, round(steps * min(step_times.values()) / mine))


class AsyncLocalRounds(Mode):
    """The worker side (see the module docstring)."""

    control = ControlPath.STORE

    def __init__(self, model, optimizer, comm, options=None):
        super().__init__(model, optimizer, comm, options)
        self.options.validate()
        self.length = FixedSteps(self.options.inner_steps)
        self.local_steps = 0
        self._times = StepTimes()  # c_i
        self._received: torch.Tensor | None = None

    def setup(self) -> None:
        if self.comm.ps_client is None:
            raise ValueError(f"mode {self.name!r} needs a parameter server")
        with self.comm.clock.phase("comm"):
            self._take(self.comm.ps_client.pull())

    def _take(self, weights: torch.Tensor) -> None:
        self._received = weights.to(self.parameters()[0].device).clone()
        unflatten_into(self._received, self.parameters())

    def decide(self, step: Step) -> Action:
        self._times.add(step.duration)
        return Action.PUSH if self.length.ends_round(step, self.local_steps + 1) else Action.LOCAL

    def apply(self, action: Action) -> None:
        self.optimizer.step()
        self.local_steps += 1
        if action is Action.PUSH:
            self._push()

    def _push(self) -> None:
        local = flatten(self.parameters())
        payload = torch.cat([self._received - local, local.new_tensor(
            [float(self.local_steps), self._times.median])]).float().cpu()
        with self.comm.clock.phase("comm"):
            answer = self.comm.ps_client.push_pull(payload)
        self._take(answer[:-1])
        self.length = FixedSteps(int(answer[-1]))
        self.local_steps = 0

    def global_model(self):
        """Hold the weights last received meanwhile."""
        return holding(self.parameters(), self._received)

    def join(self) -> None:
        """No data left (hetsync.wrap): push the round's steps, so none is lost; the worker
        then waits for the others without pushing."""
        if self.local_steps:
            self._push()
            self.round += 1  # (a round ended outside `perform`)
        super().join()

    def finish(self) -> None:
        """Take the server's weights (every worker's last push applied, under hetsync.wrap's
        agreed stop), then say goodbye."""
        with self.comm.clock.phase("comm"):
            self._take(self.comm.ps_client.pull())
        super().finish()

    def describe(self) -> dict[str, Any]:
        return {"inner_steps": self.options.inner_steps}

    def state_dict(self) -> dict[str, Any]:
        return {"round": self.round, "received": self._received.clone(),
                "next_steps": self.length.steps, "recent_step_times": self._times.as_list()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.round = int(state["round"])
        self._received = state["received"].clone().to(self.parameters()[0].device)
        self.length = FixedSteps(int(state["next_steps"]))
        self._times = StepTimes(state["recent_step_times"])
        self.local_steps = 0
