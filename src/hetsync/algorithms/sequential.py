"""`local`: sequential SGD — plain SGD on one device, the reference every mode is measured
against ("standalone" in ESync). Every step is a local update and a round; nothing is
communicated."""

from __future__ import annotations

from hetsync.algorithms.base import Action, Mode, Step
from hetsync.algorithms.registry import ModeSpec, register


class SequentialSGD(Mode):
    name = "local"

    def decide(self, step: Step) -> Action:
        return Action.LOCAL_ROUND

    def apply(self, action: Action) -> None:
        self.optimizer.step()


register(ModeSpec("local", SequentialSGD, "plain SGD on one device (sequential SGD, the "
                  "reference)", collective=False, max_workers=1))
