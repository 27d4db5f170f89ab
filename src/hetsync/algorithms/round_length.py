"""When a worker's round of local steps ends: the round-length part of the local-step modes
(`hetsync.algorithms.local_rounds`).

A round-length policy answers one question after each local step — does this step end the
round? — from what the step measured and how many steps the round has taken, and is told when
a round is over (`round_over`, with the next round's number). The policies:

- :class:`FixedSteps`: H steps a round, the same for every worker (DiLoCo);
- ESync's plan (`hetsync.algorithms.esync.StatePlan`): as many steps as fit in the slowest
  worker's one step, as the state server planned.
"""

from __future__ import annotations

from typing import Any, Protocol

from hetsync.algorithms.base import Step


class RoundLength(Protocol):
    def ends_round(self, step: Step, steps: int) -> bool:
        """Whether `step`, the round's `steps`-th local step, ends the round."""

    def round_over(self, next_round: int) -> None:
        """The round has been sent; round `next_round` begins with the next step."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def reached(steps: int, limit: int) -> bool:
    """Whether a round of `steps` local steps has reached a limit of `limit` (0: none)."""
    return 0 < limit <= steps


class FixedSteps:
    """H local steps a round."""

    def __init__(self, steps: int):
        if steps < 1:
            raise ValueError(f"a round takes at least 1 local step, got {steps}")
        self.steps = steps

    def ends_round(self, step: Step, steps: int) -> bool:
        return reached(steps, self.steps)

    def round_over(self, next_round: int) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass
