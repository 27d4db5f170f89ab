"""ESync's readiness rule, as pure functions over the state server's records.

ESync (Li et al., "ESync: An Efficient Synchronous Parallel Algorithm for Distributed ML in
Heterogeneous Clusters", IEEE TSC 2020) lets every worker run as many local steps as fit in the
slowest worker's step. The state server keeps, per rank, the local steps `k` of this round and the
duration `c` of its last step, and answers "may I stop?":

1. `k = 0`: not ready (every worker does at least one local step per round).
2. slowest = the rank with the largest `c` (lowest rank on a tie).
3. The caller is the slowest, or the slowest has already stopped this round: ready.
4. rest = c_slowest − (now − start of the slowest's current step): the time until it finishes.
5. Ready when one more step of the caller would overrun it: `c_caller + ε > rest`.

Two departures from the original, both required by DESIGN.md:

- No synchronised clocks. Every time here is the *server's* clock: a step's end is the arrival
  of its report, a round's start is estimated from the first report of the round. Workers send
  only durations measured on their own clocks.
- One query per round, answered while the worker computes. Instead of asking before every
  batch, a worker reports once, when its round begins (`k = 0`, with its smoothed step time
  from the rounds before), and takes its first step while the answer travels (the paper's
  "non-blocking mode with delayed ACK"). The answer carries `rest` (`time_left`) and the number
  of steps `j` after which rule 5 fires if step times stay as they are: after `j` steps
  rest_j = rest − j·c_caller, so `j` is the least j ≥ 0 with `c + ε > rest − j·c`, and at
  least 1 at the round's start (rule 1). The worker then applies rule 5 itself after each step,
  with its own latest step duration and the time elapsed since it asked, both measured on its
  own clock — so a step that slows down mid-round (a busy machine) does not make it overrun.
  A report after `k ≥ 1` steps (ESync's own way of asking) is answered by the same rules.
- The margin scales with the step times. ε = `epsilon` × c_caller (the original's
  fixed 0.5 s is far too coarse for a 10 ms step). ε > 0 is ESync's safety margin (stop early);
  ε < 0 lets the last step overrun the slowest's by up to |ε|·c_caller. hetsync's default,
  `auto`, lets it overrun by `auto_margin` = 1 / Σ_i 1/c_i, the cluster's time per step: the
  most that one more step may lengthen a round without lowering the cluster's throughput.

While any step time is unknown (the first rounds), every worker aggregates after one step (a
synchronous warm-up that measures `c`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

#: ε: None = `auto_margin`; else a fraction of the caller's step time (sign: module docstring).
DEFAULT_EPSILON: float | None = None


@dataclass
class WorkerRecord:
    """What the state server knows of one rank. Times are on the server's clock."""

    rank: int
    step_time: float | None = None  # c: duration of its last local step (its own clock)
    steps: int = 0                  # k: local steps this round
    step_started: float | None = None  # server time its current step began (estimate)
    stopped: bool = False           # it was told to aggregate now (this round)
    round: int = 0
    device: str = ""
    last_seen: float | None = None
    queries: int = 0


@dataclass(frozen=True)
class Decision:
    """The answer to a worker: aggregate after `steps_left` more local steps (0 = now);
    `time_left` is the slowest's remaining time, from which the worker re-applies rule 5."""

    steps_left: int
    reason: str
    time_left: float | None = None
    epsilon: float = 0.0

    @property
    def ready(self) -> bool:
        return self.steps_left == 0


def auto_margin(records: dict[int, WorkerRecord]) -> float:
    """The overrun worth allowing, in seconds: 1 / Σ_i 1/c_i, the cluster's time per step.

    A round of length T in which the workers take S steps in all trains S/T steps a second;
    one more step that lengthens the round by d keeps that rate while (S + 1)/(T + d) >= S/T,
    i.e. d <= T/S. With every worker busy the whole round, T/S = 1 / Σ_i 1/c_i, so a worker
    takes one more step when it would end at most that long after the slowest (ε = −margin/c).
    At exact speed ratios (1, 2, 4, 8) a fixed fraction either idles a fast worker for a whole
    step or lets the slow ones wait; this margin trades the two for throughput."""
    times = [r.step_time for r in records.values() if r.step_time]
    return 1.0 / sum(1.0 / c for c in times) if times else 0.0


def would_overrun(step_time: float, rest: float, epsilon: float) -> bool:
    """Rule 5: one more step of `step_time` plus the margin ε·step_time ends after `rest`."""
    return step_time * (1 + epsilon) > rest


def steps_until_overrun(step_time: float, rest: float, margin: float) -> int:
    """Least j >= 0 with `step_time + margin > rest - j * step_time` (rule 5 run forward)."""
    if step_time <= 0:
        raise ValueError(f"step_time must be > 0, got {step_time}")
    fits = (rest - margin - step_time) / step_time
    if fits < -1e-9:  # 1e-9 absorbs float noise at exact fits
        return 0
    return math.floor(fits + 1e-9) + 1


def slowest_rank(records: dict[int, WorkerRecord]) -> int | None:
    """The rank with the largest known step time (lowest rank on a tie), or None if any is unknown."""
    if not records or any(r.step_time is None for r in records.values()):
        return None
    return max(records.values(), key=lambda r: (r.step_time, -r.rank)).rank


def decide(records: dict[int, WorkerRecord], caller: int, now: float,
           epsilon: float | None) -> Decision:
    """ESync's readiness rule for `caller`, whose record is already updated with its report.

    A caller that has taken no step this round (`k = 0`) gets `steps_left >= 1` (rule 1), with
    no `time_left` when it is to stop after that one step."""
    me = records[caller]
    must = 1 if me.steps < 1 else 0  # rule 1: at least one local step per round
    slow = slowest_rank(records)
    if slow is None:
        return Decision(must, "warm-up round: step times not yet known")
    if slow == caller:
        return Decision(must, "caller is the slowest")
    slowest = records[slow]
    if slowest.stopped:
        return Decision(must, "the slowest has already stopped")
    if slowest.round == me.round or me.steps >= 1 or slowest.step_started is None:
        # It reported this round (its step began then), or the caller is well into its round
        # (ESync's own way of asking): the server's estimate of when its step began.
        started = slowest.step_started if slowest.step_started is not None else now
    else:
        # The caller's round begins now, and the slowest, which has not reported yet, began
        # its own after the same aggregation: no earlier than the caller, as far as is known.
        started = now
    rest = slowest.step_time - (now - started)
    if epsilon is None:
        epsilon = -auto_margin(records) / me.step_time
    j = max(must, steps_until_overrun(me.step_time, rest, epsilon * me.step_time))
    if j == 0:
        return Decision(0, f"one more step ({me.step_time:.4f}s) would overrun the slowest "
                           f"(rank {slow}, {rest:.4f}s left)")
    return Decision(j, f"{j} more step(s) fit before the slowest (rank {slow}) finishes", rest, epsilon)


@dataclass
class ReadinessTracker:
    """The state server's records and round bookkeeping; the clock is passed in (testable)."""

    workers: int
    epsilon: float | None = DEFAULT_EPSILON
    round: int = 0
    round_started: float | None = None
    records: dict[int, WorkerRecord] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        if self.epsilon is not None and not -1 < self.epsilon < 1:
            raise ValueError(f"epsilon must be a fraction in (-1, 1), got {self.epsilon}")
        self.records = {r: WorkerRecord(rank=r) for r in range(self.workers)}

    def report(self, rank: int, round: int, steps: int, step_time: float, now: float,
               device: str = "") -> Decision:
        """A worker finished `steps` local steps of `round`, the last taking `step_time` s."""
        if not 0 <= rank < self.workers:
            raise ValueError(f"rank {rank} out of range 0..{self.workers - 1}")
        if round > self.round:
            self._start_round(round, now - steps * step_time)
        me = self.records[rank]
        me.step_time, me.steps, me.round = step_time, steps, round
        me.step_started, me.last_seen = now, now
        me.device = device or me.device
        me.queries += 1
        if round < self.round:  # a late report of a finished round: let it catch up at once
            return Decision(0, f"round {round} already ended (now {self.round})")
        decision = decide(self.records, rank, now, self.epsilon)
        me.stopped = me.stopped or decision.ready
        return decision

    def _start_round(self, round: int, started: float) -> None:
        self.round, self.round_started = round, started
        for r in self.records.values():
            r.steps, r.stopped = 0, False
            r.step_started = started  # everyone began its first step when the round began

    def status(self) -> dict:
        return {"workers": self.workers, "epsilon": self.epsilon, "round": self.round,
                "records": [vars(r).copy() for r in self.records.values()]}
