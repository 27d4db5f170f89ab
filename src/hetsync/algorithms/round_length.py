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

import statistics
from collections import deque
from typing import Any, Iterable, Protocol

from hetsync.algorithms.base import Step


class RoundLength(Protocol):
    def ends_round(self, step: Step, steps: int) -> bool:
        """Whether `step`, the round's `steps`-th local step, ends the round."""

    def round_over(self, next_round: int) -> None:
        """The round has been sent; round `next_round` begins with the next step."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class StepTimes:
    """A worker's step time c: the median of its last WINDOW steps (the round's first step,
    which every worker takes at once on shared cores, is not the typical one)."""

    WINDOW = 9

    def __init__(self, times: Iterable[float] = ()) -> None:
        self._recent: deque[float] = deque((float(t) for t in times), maxlen=self.WINDOW)

    def add(self, seconds: float) -> float:
        """Record a step; the step time now."""
        self._recent.append(seconds)
        return self.median

    @property
    def median(self) -> float | None:
        return statistics.median(self._recent) if self._recent else None

    def as_list(self) -> list[float]:
        return list(self._recent)


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
