"""ESync's readiness rule, as pure functions over the state server's records.

ESync (Li et al., "ESync: An Efficient Synchronous Parallel Algorithm for Distributed ML in
Heterogeneous Clusters", IEEE TSC 2020) lets every worker run as many local steps as fit in the
slowest worker's step. The state server keeps, per rank, the local steps `k` of this round and the
duration `c` of its last step, and answers "may I stop?":

1. `k = 0`: not ready (every worker does at least one local step per round).
2. slowest = the rank with the largest `c` (lowest rank on a tie).
3. The caller is the slowest, or the slowest has already stopped this round: ready.
4. rest = c_slowest − (now − start of the slowest's current step): the time until it finishes
   (with `auto`, below, the round's planned length L in place of c_slowest).
5. Ready when one more step of the caller would overrun it: `c_caller + ε > rest`.

Where hetsync departs from the original:

- No synchronised clocks. Workers send only durations measured on their own clocks. A round
  begins for every worker as the previous round's sum is sent, so a report at a round's start
  (`k = 0`) counts the slowest's whole step from the caller's own start; the server's clock
  would add its queueing to that common start (measured: the slowest's report handled ~10 ms
  before a peer's sent at the same moment). A report after `k ≥ 1` steps (ESync's own way of
  asking) is timed on the server's clock: a step's end is the arrival of its report.
- One query per round, answered while the worker computes. Instead of asking before every
  batch, a worker reports once per round, with its smoothed step time, and takes the round's
  first step while the answer travels (the paper's "non-blocking mode with delayed ACK"). The
  answer carries `rest` (`time_left`) and the number of steps `j` after which rule 5 fires if
  step times stay as they are: after `j` steps rest_j = rest − j·c_caller, so `j` is the least
  j ≥ 0 with `c + ε > rest − j·c`, and at least 1 at the round's start (rule 1). The worker
  then applies rule 5 itself after each step, with its own latest step duration and the time
  elapsed since its round began, both on its own clock — so a step that slows down mid-round
  (a busy machine) does not make it overrun.
- The margin scales with the step times. ε = `epsilon` × c_caller (the original's
  fixed 0.5 s is far too coarse for a 10 ms step). ε > 0 is ESync's safety margin (stop early);
  ε < 0 lets the last step overrun the slowest's by up to |ε|·c_caller.
- hetsync's default, `auto`, sizes the round to keep every worker busy rather than to the
  slowest's step alone: the round lasts `round_length` L ≥ c_slowest, the length with the
  largest mean computing time ratio. ESync's round (L = c_slowest) is that length when the
  faster workers' steps divide it; when one of them would end its last step just after the
  slowest (speeds of exactly 1 : 2 : 4 : 8 put every worker at that edge), it stretches the
  round a little instead of idling that worker for almost a whole step. A worker plans
  ⌊rest/c⌋ steps and stops sooner if its own clock says the next would overrun L by more than
  c/P (`auto_epsilon`: a step that slowed down, such as the round's first, which every worker
  takes at once on shared cores, is still worth finishing by that much).

While any step time is unknown (the first rounds), every worker aggregates after one step (a
synchronous warm-up that measures `c`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable

import numpy as np

#: ε: None = `auto` (`round_length`, `auto_epsilon`); else a fraction of the caller's step time
#: (sign: module docstring).
DEFAULT_EPSILON: float | None = None


@dataclass
class WorkerRecord:
    """What the state server knows of one rank. Times are on the server's clock."""

    rank: int
    step_time: float | None = None  # c: duration of its last local step (its own clock)
    steps: int = 0                  # k: local steps this round
    planned: int = 0                # k + steps_left of its last answer: its steps this round
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


def auto_epsilon(workers: int) -> float:
    """ε of `auto`: the last step may overrun the round by up to 1/P of the caller's step c.

    A worker whose next step would end d after the round stops and idles about c − d; taking
    that step makes the other P − 1 workers wait d more. The cluster's computing time is the
    greater when (P − 1)·d < c − d, i.e. d < c/P."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    return -1.0 / workers


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


#: At most this many candidate round lengths are weighed (`round_length`).
MAX_CANDIDATES = 4096


def round_length(step_times: Iterable[float]) -> float:
    """The round length L in [c_s, 2·c_s) that keeps the workers busiest: the largest mean
    computing time ratio (1/P) Σ_i ⌊L/c_i⌋·c_i / L (c_s: the slowest's step, which stays one
    step a round).

    The ratios only jump where L crosses a multiple k·c_i (between those they fall), so those
    are the candidates; of equally good lengths the shortest is taken, ESync's L = c_s when
    stretching gains nothing. Each worker's time counts alike: a stretch that fills a faster
    worker's last step idles the slowest meanwhile, and is taken only when it fills more than
    it idles. (The cluster's steps per second, Σ_i ⌊L/c_i⌋ / L, would not do: the slowest adds
    a single step, so rounds twice its step cost almost nothing by that measure.)"""
    times = np.asarray(sorted(step_times), dtype=np.float64)
    if times.size == 0 or times[0] <= 0:
        raise ValueError(f"step times must be > 0, got {times.tolist()}")
    slowest = times[-1]
    candidates = [np.array([slowest])]
    # A worker whose step divides the slowest's more than `most` times fills any round to
    # within 1/most anyway: its multiples are not candidates, which bounds the work (and the
    # memory) at MAX_CANDIDATES lengths however unequal the reported step times are.
    most = max(1, MAX_CANDIDATES // times.size)
    for c in times[:-1]:
        if slowest / c > most:
            continue
        k = np.arange(math.floor(slowest / c) + 1, math.ceil(2 * slowest / c))
        candidates.append(k * c)
    lengths = np.unique(np.concatenate(candidates))  # sorted: argmax takes the shortest
    lengths = lengths[lengths < 2 * slowest]
    busy = (np.floor(lengths[:, None] / times[None, :] + 1e-9) * times[None, :]).sum(axis=1)
    ratio = busy / lengths
    return float(lengths[np.flatnonzero(ratio >= ratio.max() - 1e-12)[0]])


def slowest_rank(records: dict[int, WorkerRecord]) -> int | None:
    """The rank with the largest known step time (lowest rank on a tie), or None if any is unknown."""
    if not records or any(r.step_time is None for r in records.values()):
        return None
    return max(records.values(), key=lambda r: (r.step_time, -r.rank)).rank


def decide(records: dict[int, WorkerRecord], caller: int, now: float,
           epsilon: float | None, length: float | None = None) -> Decision:
    """ESync's readiness rule for `caller`, whose record is already updated with its report.

    `length`: the round's planned length with `epsilon` None (`auto`; default: `round_length`
    of the known step times); with a numeric ε the round is the slowest's step. A caller that
    has taken no step this round (`k = 0`) gets `steps_left >= 1` (rule 1), with no
    `time_left` when it is to stop after that one step."""
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
    if me.steps < 1 or slowest.step_started is None:
        # The caller's round begins now, as the slowest's did: every round begins as the same
        # collective ends. The server's clock would add its own queueing to that common start
        # (measured: the slowest's report is handled ~10 ms before a peer's sent at the same
        # moment), so at a round's start the slowest has its whole step left.
        started = now
    else:
        # The caller is well into its round (ESync's own way of asking): the server's
        # estimate of when the slowest's step began.
        started = slowest.step_started
    if epsilon is None:  # auto: the planned length, and a tolerance for a slower step
        if length is None:
            length = round_length(r.step_time for r in records.values())
        rest, margin = length - (now - started), 0.0
        epsilon = auto_epsilon(len(records))
    else:
        rest = slowest.step_time - (now - started)
        margin = epsilon * me.step_time
    j = max(must, steps_until_overrun(me.step_time, rest, margin))
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
    length: float | None = None  # auto: this round's planned length, fixed at its first report
    records: dict[int, WorkerRecord] = field(default_factory=dict)
    #: ranks the run goes on without (lost workers): no record, so never the slowest
    lost: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        if self.epsilon is not None and not -1 < self.epsilon < 1:
            raise ValueError(f"epsilon must be a fraction in (-1, 1), got {self.epsilon}")
        self.lost = frozenset(self.lost)
        if not self.lost < set(range(self.workers)):
            raise ValueError(f"lost ranks {sorted(self.lost)} must be some, not all, of "
                             f"0..{self.workers - 1}")
        self.records = {r: WorkerRecord(rank=r) for r in range(self.workers)
                        if r not in self.lost}

    def report(self, rank: int, round: int, steps: int, step_time: float, now: float,
               device: str = "") -> Decision:
        """A worker finished `steps` local steps of `round`, the last taking `step_time` s."""
        if not 0 <= rank < self.workers:
            raise ValueError(f"rank {rank} out of range 0..{self.workers - 1}")
        if rank in self.lost:
            raise ValueError(f"rank {rank} was lost: the run went on without it")
        if round > self.round:
            self._start_round(round, now - steps * step_time)
        me = self.records[rank]
        me.step_time, me.steps, me.round = step_time, steps, round
        me.step_started, me.last_seen = now, now
        me.device = device or me.device
        me.queries += 1
        if round < self.round:  # a late report of a finished round: let it catch up at once
            return Decision(0, f"round {round} already ended (now {self.round})")
        if (self.epsilon is None and self.length is None
                and slowest_rank(self.records) is not None):
            self.length = round_length(r.step_time for r in self.records.values())
        decision = decide(self.records, rank, now, self.epsilon, self.length)
        me.stopped = me.stopped or decision.ready
        me.planned = steps + decision.steps_left
        return decision

    def _start_round(self, round: int, started: float) -> None:
        self.round, self.round_started, self.length = round, started, None
        for r in self.records.values():
            r.steps, r.stopped = 0, False
            r.step_started = started  # everyone began its first step when the round began

    def status(self) -> dict:
        return {"workers": self.workers, "lost": sorted(self.lost), "epsilon": self.epsilon,
                "round": self.round,
                "round_length": self.length,
                "records": [vars(r).copy() for r in self.records.values()]}
