"""Emulated devices on this machine's cores: how fast each one is, and whether they all fit.

An emulated device of slowdown F tops every step up to F × the reference device's work per
step (`heterogeneity.StepTimer`): it runs at its nominal speed as long as its real work fits
in that time. `launch` and `bench` plan the devices before any worker starts:

1. **the reference step**, `step_work`: the median CPU time of one step (data, forward,
   backward) of the run's model and batch, measured here, alone and warm, on `--threads`
   threads (`measure_step_work`). Every device's step is a multiple of it, so every run of a
   bench sees the same absolute speeds, and a device that sleeps between steps (whose own
   work runs slower, on a cold cache and a lower clock) still keeps its speed. `--step-work`
   gives it instead (the time of a step on -b samples), for benches compared across runs;
2. **the demand**, Σ threads/Fᵢ cores: a device of slowdown F computes 1/F of its time
   (`demand`);
3. **the budget**: `HEADROOM` of the cores the run may use (`--cores`, by default this
   process's) less one, which is left to the servers, the evaluator, the transfers and the
   system (half of one core alone): a device's own work runs up to 1.4x the reference's (one
   that sleeps most of its time computes on a cold cache), and its rounds have work beyond
   their steps — on two cores the three slower devices of 1, 2, 4, 8, scaled to 1.875, kept
   their core 78 % busy where their demand said 47 %, and the slowdown-3.75 one ran at 87 %
   of its nominal speed; scaled to 2.5 (the budget's), every device ran at 95-97 %;
4. **the fit**: a demand above the budget multiplies every slowdown by one factor, the scale =
   demand ÷ budget, so the devices keep their relative speeds and fit (`fit`; `--slowdowns`
   stay relative, `Config.speed_scale` records the factor); `--oversubscribe 1` keeps them as
   given, and the summary then says by how much each device fell below its nominal speed.
   A scale that would make a device slower than `MAX_SLOWDOWN` is refused;
5. **the placement** (`placement`): the fastest devices, in order, get cores of their own
   while their slowdown is below `SHARE_AT` and a core is left for the rest; the other
   devices, the servers and the evaluator share the remaining cores (CPU affinity, set by
   the launcher on each process it starts).

Why both: a scale alone left the fastest device of 1, 2, 4, 8 (scaled to 1.875) sharing two
cores with everything else, and 8-16 % of its steps overran their time waiting for a core —
also for the evaluator, whose lowest priority (SCHED_IDLE) does not keep it off a core the
instant a device wakes — so it ran at 83-90 % of its nominal speed; alone on its core, 0.1 %
of its steps overran. A device of slowdown F waits (F − 1)/F of its time: from F = 3 on, its
wait is twice its work, room for a neighbour's step (a device that sleeps most of its time
computes up to 1.4x the reference's work, on a cold cache), so slower devices may share.

With `--balanced-batches` a device's batch follows its speed and its step is topped up to F ×
the reference's work for that batch (`Config.step_work_of`), so its nominal speed is the same.
The nominal speed of a device is samples per step ÷ (F · step_work) per second of computing;
the local update after the step (a small fraction of it) is outside that time, so a device
that keeps its speed measures a few per cent below it.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from dataclasses import dataclass

from hetsync.config import MAX_SLOWDOWN, MAX_THREADS, Config
from hetsync.options import ConfigError

#: a device this much slower than the reference (or more) may share a core (the docstring)
SHARE_AT = 3.0
#: the fraction of the cores less one that emulated devices' demand may take (the docstring)
HEADROOM = 0.75


def demand(slowdowns: tuple[float, ...], threads: int = 1) -> float:
    """Cores the emulated devices compute on: Σ threads/Fᵢ."""
    return sum(threads / f for f in slowdowns)


def budget(cores: int) -> float:
    """Cores of demand left to emulated devices (the module docstring, 3)."""
    return HEADROOM * max(cores - 1.0, cores / 2)


def usable_cores(count: int | None = None) -> list[int]:
    """The CPUs this process may run on (the first `count` of them)."""
    try:
        cores = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = list(range(os.cpu_count() or 1))
    return cores[:count] if count else cores


def available_cores() -> int:
    return len(usable_cores())


def affinities(cfg: Config) -> dict[str, list[int]]:
    """The cores of each process `launch` starts (`placement`), by its name (`rank-R`, `ps`,
    the mode's service, `evaluator`); empty where nothing is placed (no emulated devices,
    GPUs, one core, or the virtual clock: a device's speed is its modelled time there, and
    the simulation runs fastest where every process may use every core)."""
    cores = usable_cores(cfg.cores)
    if (not cfg.slowdowns or (cfg.gpu >= 0 and not cfg.cpu) or len(cores) < 2
            or cfg.clock == "virtual"):
        return {}
    devices, shared = placement(tuple(cfg.slowdown_of(r) for r in range(cfg.workers)),
                                cfg.threads, cores)
    return {**{f"rank-{r}": c for r, c in enumerate(devices)},
            **{name: shared for name in ("ps", "evaluator") +
               ((cfg.spec.service.name,) if cfg.spec.service is not None else ())}}


@dataclass(frozen=True)
class DeviceFit:
    """How `launch`/`bench` fit emulated devices into the cores: `scale` multiplies every
    slowdown (1: as given)."""

    slowdowns: tuple[float, ...]
    threads: int
    cores: int
    scale: float
    oversubscribed: bool = False

    @property
    def demand(self) -> float:
        return demand(self.slowdowns, self.threads)

    @property
    def budget(self) -> float:
        return budget(self.cores)

    @property
    def scaled(self) -> tuple[float, ...]:
        return tuple(f * self.scale for f in self.slowdowns)

    def describe(self) -> str:
        """One line: what the devices need, what they got, and what was done."""
        given = ",".join(f"{f:g}" for f in self.slowdowns)
        need = (f"slowdowns {given} need {self.demand:.2f} core(s) of the {self.budget:g} "
                f"left to emulated devices of {self.cores} ({HEADROOM:g} of all but one, "
                f"which is for the servers, the evaluator and the transfers)")
        if self.oversubscribed:
            return (f"emulated devices: {need}; kept as given (--oversubscribe 1): their "
                    f"speeds will not hold, and the summary says by how much")
        if self.scale == 1:
            return f"emulated devices: {need}: they fit"
        scaled = ",".join(f"{f:.4g}" for f in self.scaled)
        return (f"emulated devices: {need}: every device runs {self.scale:.4g}x slower "
                f"(slowdowns {scaled}; --oversubscribe 1 keeps them as given)")


def fit(slowdowns: tuple[float, ...], threads: int = 1, cores: int | None = None,
        oversubscribe: bool = False) -> DeviceFit:
    """The fit of devices of `slowdowns` on `cores` (see the module docstring); ConfigError
    naming the flags when the scale would make a device slower than MAX_SLOWDOWN."""
    cores = available_cores() if cores is None else cores
    need = demand(slowdowns, threads)
    scale = 1.0 if oversubscribe else max(1.0, need / budget(cores))
    result = DeviceFit(tuple(slowdowns), threads, cores, scale,
                       oversubscribed=oversubscribe and need > budget(cores))
    if max(result.scaled, default=1.0) > MAX_SLOWDOWN:
        raise ConfigError(
            f"--slowdowns/--cores: {len(slowdowns)} devices of slowdowns "
            f"{','.join(f'{f:g}' for f in slowdowns)} on {threads} thread(s) each need "
            f"{need:.2f} cores; fitting them into the {budget(cores):g} left of {cores} "
            f"would make the slowest {max(result.scaled):.4g}x slower, beyond "
            f"{MAX_SLOWDOWN:g}: use fewer workers or --threads, more --cores, or "
            f"--oversubscribe 1")
    return result


def fit_config(cfg: Config, given_scale: bool) -> tuple[Config, DeviceFit | None]:
    """`cfg` with its devices fitted into the cores (`Config.speed_scale`), and the fit; None
    where there is nothing to fit: no emulated devices (no `--slowdowns`: real devices, at
    whatever speed the machine gives them), GPU devices, or a scale the user gave
    (`given_scale`; refused when it does not fit, unless `--oversubscribe 1`)."""
    if (not cfg.slowdowns or (cfg.gpu >= 0 and not cfg.cpu) or not _fittable(cfg)
            or cfg.clock == "virtual"):  # (nothing sleeps: the devices share no cores)
        return cfg, None
    if given_scale:
        mine = DeviceFit(cfg.slowdowns, cfg.threads, cfg.cores or available_cores(),
                         cfg.speed_scale)
        if demand(mine.scaled, cfg.threads) > mine.budget * (1 + 1e-9) and not cfg.oversubscribe:
            raise ConfigError(
                f"--speed-scale: invalid value {cfg.speed_scale:g}; the devices then need "
                f"{demand(mine.scaled, cfg.threads):.2f} cores of the {mine.budget:g} left to "
                f"them of {mine.cores}: expected at least {mine.demand / mine.budget:.4g} "
                f"(or --oversubscribe 1)")
        return cfg, None
    result = fit(cfg.slowdowns, cfg.threads, cfg.cores, cfg.oversubscribe)
    return cfg.with_resolved("speed_scale", result.scale, result.describe()), result


def _fittable(cfg: Config) -> bool:
    """Whether the fields a fit reads are valid; where not, `Config.validate` names the bad
    flag (a fit would name it as a device that does not fit)."""
    return (all(1 <= f <= MAX_SLOWDOWN for f in cfg.slowdowns)
            and 1 <= cfg.threads <= MAX_THREADS
            and (cfg.cores is None or 1 <= cfg.cores <= MAX_THREADS)
            and 1 <= cfg.speed_scale <= MAX_SLOWDOWN)


def placement(slowdowns: tuple[float, ...], threads: int,
              cores: list[int]) -> tuple[list[list[int]], list[int]]:
    """(the cores of each device, the cores shared by the others and the servers): the
    fastest devices first (ties by rank), each taking `threads` cores of its own while its
    slowdown is below SHARE_AT and at least one core is left for the rest."""
    cores = sorted(cores)
    own: dict[int, list[int]] = {}
    for rank in sorted(range(len(slowdowns)), key=lambda r: (slowdowns[r], r)):
        if slowdowns[rank] >= SHARE_AT or len(cores) - threads < 1:
            break
        own[rank], cores = cores[:threads], cores[threads:]
    return [own.get(r, cores) for r in range(len(slowdowns))], cores


def nominal_speed(samples_per_step: int, factor: float, step_work: float | None) -> float | None:
    """Samples per second of computing of a device of slowdown `factor` (None: the reference
    step is not known)."""
    if step_work is None or not step_work > 0:
        return None
    return samples_per_step / (factor * step_work)


def nominal_speed_of(cfg: Config, rank: int) -> float | None:
    """Worker `rank`'s nominal speed (its batch, slowdown and share of the reference step)."""
    return nominal_speed(cfg.batch_of(rank), cfg.slowdown_of(rank), cfg.step_work_of(rank))


def with_reference_step(cfg: Config, split, given: str = "given (--step-work)"
                        ) -> tuple[Config, str | None]:
    """`cfg` with the reference step measured here (`measure_step_work`) where its devices are
    emulated and no `--step-work` was given, and a line saying what it was, measured or
    `given`, and the devices' nominal speeds (None: no `--slowdowns`)."""
    if not cfg.slowdowns and cfg.clock == "wall":
        return cfg, None
    how = given
    if cfg.step_work is None:
        from hetsync.runtime import forked

        how = f"on {cfg.threads} thread(s), measured here"
        with forked.quiet_core(cfg.threads):  # (not beside the warm parent's imports)
            work = measure_step_work(cfg, split)
        cfg = cfg.with_resolved("step_work", work, f"the median step of {cfg.network} at "
                                f"batch {cfg.batch_size} {how}")
    # a given step is per -b samples: the same value at another -b is another speed
    speeds = " / ".join(f"{nominal_speed_of(cfg, r):,.0f}" for r in range(cfg.workers))
    return cfg, (f"reference step: {1000 * cfg.step_work:.2f} ms of {cfg.network} at batch "
                 f"{cfg.batch_size}, {how}; nominal speeds {speeds} samples per second of "
                 "computing")


def measure_step_work(cfg: Config, split, steps: int = 40, warmup: int = 5,
                      seconds: float = 10.0) -> float:
    """The reference device's work per step: the median CPU time (wall time on a GPU) of a
    step of `cfg`'s model on batches of `split`'s training set — data, forward, backward,
    as `StepTimer` measures a worker's — after `warmup` steps, over at most `steps` steps or
    `seconds` (at least 3 steps)."""
    import torch

    from hetsync.runtime.devices import pick_device

    device = pick_device(cfg)
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        torch.manual_seed(cfg.seed)
        model = cfg.build_model(split).to(device)
        model.train()
        criterion = torch.nn.CrossEntropyLoss()
        cpu_clock = time.thread_time if cfg.threads == 1 else time.process_time
        rng = torch.Generator().manual_seed(cfg.seed)
        n = len(split.train)
        work: list[float] = []
        deadline = math.inf
        for i in range(warmup + steps):
            if i == warmup:
                deadline = time.perf_counter() + seconds
            elif i > warmup + 2 and time.perf_counter() > deadline:
                break
            wall, cpu = time.perf_counter(), cpu_clock()
            idx = torch.randint(n, (cfg.batch_size,), generator=rng)
            x, y = split.train.batch(idx)
            x, y = x.to(device), y.to(device)
            model.zero_grad(set_to_none=True)
            criterion(model(x), y).backward()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
                work.append(time.perf_counter() - wall)
            else:
                work.append(min(cpu_clock() - cpu, time.perf_counter() - wall))
        return statistics.median(work[warmup:])
    finally:
        torch.set_num_threads(threads)
