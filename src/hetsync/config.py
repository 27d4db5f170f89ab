"""Every option of a hetsync run, in one validated dataclass.

ESync's short flags keep their names and meaning (`-l -ll -gl -b -dd -g -c -n -ld -e -m -dcasgd
-s -ip -port`); the rest are long flags. `Config.validate()` turns a bad value into a
`ConfigError` that names the flag, the value and what would be valid, so the command line never
shows a traceback for a user's mistake.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MODES = ("local", "sync", "esync", "async", "dcasgd")
COLLECTIVES = ("native", "ring", "butterfly", "binary-blocks", "ps")
PARTITIONS = ("iid", "shared", "class", "dirichlet")
DATASETS = ("fashion-mnist", "cifar10", "synthetic")
#: Modes whose aggregation goes through the parameter server whatever `--collective` says.
PS_MODES = ("async", "dcasgd")


class ConfigError(ValueError):
    """A user-facing configuration mistake: the message names the flag, value and valid range."""


@dataclass
class Config:
    """One hetsync run. Field metadata holds the command-line flags and help text."""

    mode: str = field(default="esync", metadata={"flags": ("-m", "--mode"),
                      "help": f"synchronisation scheme: {', '.join(MODES)}"})
    network: str = field(default="lenet", metadata={"flags": ("-n", "--network"),
                         "help": "model name (see `hetsync models`)"})
    dataset: str = field(default="fashion-mnist", metadata={"flags": ("--dataset",),
                         "help": f"data set: {', '.join(DATASETS)}"})
    data_dir: str | None = field(default=None, metadata={"flags": ("-dd", "--data-dir"),
                                 "help": "data directory (ESync layout DIR/fashion-mnist/*.gz)"})
    batch_size: int = field(default=64, metadata={"flags": ("-b", "--batch-size"),
                            "help": "mini-batch size per worker"})
    lr: float = field(default=0.05, metadata={"flags": ("-l", "--learning-rate"),
                      "help": "learning rate (of the mean gradient; sync, async, local)"})
    local_lr: float | None = field(default=None, metadata={"flags": ("-ll", "--local-lr"),
                                   "help": "ESync local learning rate (default: -l)"})
    global_lr: float = field(default=1.0, metadata={"flags": ("-gl", "--global-lr"),
                             "help": "ESync global learning rate on the mean weight delta"})
    momentum: float = field(default=0.0, metadata={"flags": ("--momentum",),
                            "help": "SGD momentum of the local optimizer (ESync uses 0)"})
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
    eval_interval: float = field(default=5.0, metadata={"flags": ("--eval-interval",),
                                 "help": "evaluate every S seconds of training time"})
    dcasgd: bool = field(default=False, metadata={"flags": ("-dcasgd", "--dcasgd"),
                         "help": "with -m async: delay-compensated ASGD (0/1)"})
    dcasgd_lambda: float = field(default=0.04, metadata={"flags": ("--dcasgd-lambda",),
                                 "help": "DC-ASGD variance-control lambda"})
    split_by_class: bool = field(default=False, metadata={"flags": ("-s", "--split-by-class"),
                                 "help": "non-iid: contiguous class blocks per worker (0/1)"})
    partition: str = field(default="iid", metadata={"flags": ("--partition",),
                           "help": f"data partition: {', '.join(PARTITIONS)}"})
    dirichlet_alpha: float = field(default=0.5, metadata={"flags": ("--dirichlet-alpha",),
                                   "help": "label skew of --partition dirichlet"})
    state_ip: str = field(default="127.0.0.1", metadata={"flags": ("-ip", "--state-server-ip"),
                          "help": "ESync state server address"})
    state_port: int = field(default=10010, metadata={"flags": ("-port", "--state-server-port"),
                            "help": "ESync state server port"})
    epsilon: float | None = field(default=None, metadata={"flags": ("--epsilon",),
                                  "parser": "epsilon",
                                  "help": "ESync readiness margin ε, a fraction of the caller's "
                                          "step time c: stop when c(1+ε) > the slowest's time "
                                          "left; auto: the round length that keeps the "
                                          "workers busiest, a planned step may overrun it "
                                          "by c/P"})
    overlap: bool = field(default=True, metadata={"flags": ("--overlap",),
                          "help": "ESync: sum the weight deltas in the background while the "
                                  "next round's first steps run (0/1; 0: ESync as published)"})
    workers: int = field(default=4, metadata={"flags": ("--workers",),
                         "help": "number of workers"})
    slowdowns: tuple[float, ...] = field(default=(), metadata={"flags": ("--slowdowns",),
                                         "help": "F1,F2,...: worker i sleeps (Fi-1)x its compute"})
    collective: str = field(default="native", metadata={"flags": ("--collective",),
                            "help": f"aggregation: {', '.join(COLLECTIVES)}"})
    time_budget: float | None = field(default=None, metadata={"flags": ("--time-budget",),
                                      "help": "stop after S seconds of training time"})
    target_acc: float | None = field(default=None, metadata={"flags": ("--target-acc",),
                                     "help": "stop at this test accuracy"})
    epochs: float | None = field(default=3.0, metadata={"flags": ("--epochs",),
                                 "help": "stop after this many epochs of data (all workers)"})
    seed: int = field(default=0, metadata={"flags": ("--seed",), "help": "random seed"})
    threads: int = field(default=1, metadata={"flags": ("--threads",),
                         "help": "torch intra-op threads per worker"})
    timeout: float = field(default=120.0, metadata={"flags": ("--timeout",),
                           "help": "seconds before a silent peer is declared dead"})

    # ------------------------------------------------------------------ derived values
    @property
    def effective_local_lr(self) -> float:
        return self.lr if self.local_lr is None else self.local_lr

    @property
    def effective_partition(self) -> str:
        return "class" if self.split_by_class else self.partition

    @property
    def effective_mode(self) -> str:
        """ESync's `-m async -dcasgd 1` is the same run as `-m dcasgd`."""
        return "dcasgd" if (self.mode == "async" and self.dcasgd) else self.mode

    @property
    def needs_ps(self) -> bool:
        """Whether the run has a parameter-server rank (the last rank)."""
        return self.effective_mode in PS_MODES or (
            self.effective_mode in ("sync", "esync") and self.collective == "ps")

    @property
    def world_size(self) -> int:
        return self.workers + (1 if self.needs_ps else 0)

    def slowdown_of(self, rank: int) -> float:
        return self.slowdowns[rank] if rank < len(self.slowdowns) else 1.0

    # ------------------------------------------------------------------ validation
    def validate(self) -> "Config":
        """Check every field; raise ConfigError naming the flag, the value and what is valid."""
        from hetsync.models import MODEL_NAMES  # local import: models import torch

        def bad(name: str, valid: str) -> ConfigError:
            flag = "/".join(_field(name).metadata["flags"])
            return ConfigError(f"{flag}: invalid value {getattr(self, name)!r}; expected {valid}")

        if self.mode not in MODES:
            raise bad("mode", f"one of {', '.join(MODES)}")
        if self.network not in MODEL_NAMES:
            raise bad("network", f"one of {', '.join(MODEL_NAMES)}")
        if self.dataset not in DATASETS:
            raise bad("dataset", f"one of {', '.join(DATASETS)}")
        if self.collective not in COLLECTIVES:
            raise bad("collective", f"one of {', '.join(COLLECTIVES)}")
        if self.partition not in PARTITIONS:
            raise bad("partition", f"one of {', '.join(PARTITIONS)}")
        if self.data_dir is not None and not Path(self.data_dir).is_dir():
            raise bad("data_dir", "an existing directory")
        if self.batch_size < 1:
            raise bad("batch_size", "an integer >= 1")
        for name in ("lr", "global_lr"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) > 0):
                raise bad(name, "a finite number > 0")
        if self.local_lr is not None and not (math.isfinite(self.local_lr) and self.local_lr > 0):
            raise bad("local_lr", "a finite number > 0")
        if not 0 <= self.momentum < 1:
            raise bad("momentum", "a number in [0, 1)")
        if self.dcasgd_lambda < 0:
            raise bad("dcasgd_lambda", "a number >= 0")
        if self.dirichlet_alpha <= 0:
            raise bad("dirichlet_alpha", "a number > 0")
        if self.eval_every < 0:
            raise bad("eval_every", "an integer >= 0 (0: use --eval-interval)")
        if self.eval_interval <= 0:
            raise bad("eval_interval", "a number of seconds > 0")
        if self.epsilon is not None and not -1 < self.epsilon < 1:
            raise bad("epsilon", "auto or a fraction in (-1, 1)")
        if self.workers < 1:
            raise bad("workers", "an integer >= 1")
        if self.mode == "local" and self.workers != 1:
            raise bad("workers", "1 with -m local (sequential SGD runs on one device)")
        if self.slowdowns and len(self.slowdowns) != self.workers:
            raise bad("slowdowns", f"{self.workers} comma-separated factors (one per worker)")
        if any(not (math.isfinite(f) and f >= 1) for f in self.slowdowns):
            raise bad("slowdowns", "factors >= 1 (1 = full speed, 2 = half speed)")
        if self.time_budget is not None and not self.time_budget > 0:
            raise bad("time_budget", "a number of seconds > 0")
        if self.target_acc is not None and not 0 < self.target_acc <= 1:
            raise bad("target_acc", "an accuracy in (0, 1]")
        if self.epochs is not None and not self.epochs > 0:
            raise bad("epochs", "a number > 0")
        if self.threads < 1:
            raise bad("threads", "an integer >= 1")
        if self.timeout <= 0:
            raise bad("timeout", "a number of seconds > 0")
        if not 0 < self.state_port < 65536:
            raise bad("state_port", "a TCP port in 1..65535")
        if self.gpu < -1:
            raise bad("gpu", "-1 (CPU) or a GPU index >= 0")
        if self.time_budget is None and self.target_acc is None and self.epochs is None:
            raise ConfigError("no stopping rule: give --epochs, --time-budget or --target-acc")
        return self

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["slowdowns"] = list(self.slowdowns)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Config":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown config keys {unknown}; known: {sorted(known)}")
        data = dict(data)
        if "slowdowns" in data:
            data["slowdowns"] = tuple(float(x) for x in data["slowdowns"])
        return cls(**data)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "Config":
        return cls.from_dict(json.loads(Path(path).read_text()))


def _field(name: str) -> dataclasses.Field:
    return next(f for f in dataclasses.fields(Config) if f.name == name)


# ---------------------------------------------------------------------- command line
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


def parse_epsilon(text: str) -> float | None:
    """`auto` (None) or a number."""
    if text.strip().lower() == "auto":
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected auto or a number, got {text!r}") from None


def _optional(kind):
    def parse(text: str):
        return None if text.lower() in ("", "none") else kind(text)
    return parse


_PARSERS = {"int": int, "float": float, "str": str, "bool": _parse_bool,
            "tuple[float, ...]": _parse_floats, "str | None": _optional(str),
            "float | None": _optional(float), "epsilon": parse_epsilon}


def add_config_arguments(parser: argparse.ArgumentParser, defaults: Config | None = None) -> None:
    """One flag per Config field, with the field's short and long flags.

    Flags not given on the command line are left out of the namespace (argparse.SUPPRESS), so
    `config_from_args` can lay the given ones over any base (launch's defaults, a config file).
    """
    defaults = defaults or Config()
    for f in dataclasses.fields(Config):
        default = getattr(defaults, f.name)
        shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
        if f.name == "epsilon" and default is None:
            shown = "auto"
        kind = f.metadata.get("parser", str(f.type))
        parser.add_argument(*f.metadata["flags"], dest=f.name, type=_PARSERS[kind],
                            default=argparse.SUPPRESS, metavar=f.name.upper(),
                            help=f"{f.metadata['help']} (default: {shown})")


def config_from_args(args: argparse.Namespace, base: Config | None = None) -> Config:
    """`base` (default: Config()) with every flag given on the command line laid over it."""
    names = {f.name for f in dataclasses.fields(Config)}
    given = {k: v for k, v in vars(args).items() if k in names}
    return dataclasses.replace(base or Config(), **given)


def flag_table() -> list[tuple[str, str, str, str]]:
    """(short, long, default, help) for every option: the README's flag table."""
    rows = []
    for f in dataclasses.fields(Config):
        flags = f.metadata["flags"]
        short = flags[0] if len(flags) == 2 else ""
        default = getattr(Config(), f.name)
        rows.append((short, flags[-1], str(default), f.metadata["help"]))
    return rows
