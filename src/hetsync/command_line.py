"""The command line above the modes: one flag per `Config` field and per registered mode
option (their parsers from `hetsync.options`), laid over a base config (`config_from_args`);
the one-line parser errors (their reference page: `hetsync.reference`)."""

from __future__ import annotations

import argparse
import dataclasses
import typing
from typing import Any

from hetsync.config import MAX_WORKERS, PORTS, TEXT_DATASETS, Config
from hetsync.options import ConfigError, bounded_int, parser_for


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, but a bad flag is one line: `PROG: error: MESSAGE`, without the
    usage (tens of lines for launch and bench, hiding the one that matters); exit code 2."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


#: the services' flags (Config's own -port and --workers are checked by validate() against
#: the same bounds).
parse_port = bounded_int(PORTS.start, PORTS.stop - 1, "a TCP port")
#: a port to listen on: 0 asks the system for any free one
parse_listen_port = bounded_int(0, PORTS.stop - 1, "a TCP port (0: any free one)")
parse_workers = bounded_int(1, MAX_WORKERS, "a number of workers")
parse_restarts = bounded_int(0, 100, "a number of restarts")


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


def check_option_flags() -> None:
    """ValueError naming the first registered mode whose option takes a flag every run has
    (one of `Config`'s): the command line could not tell the two apart."""
    from hetsync.algorithms import registry

    common = {flag for f in dataclasses.fields(Config) for flag in f.metadata["flags"]}
    for spec in registry.specs():
        for f in spec.option_fields():
            for flag in f.metadata["flags"]:
                if flag in common:
                    raise ValueError(f"mode {spec.name!r}: option flag {flag} is one of every "
                                     f"run's (hetsync.config.Config)")


OPTION_PREFIX = "option."


#: `--help`'s sections, the common flags first: every flagged `Config` field in one of them
#: (tests/test_config.py)
SECTIONS = {
    "the run": ("mode", "workers", "slowdowns", "clock", "profile", "time_budget", "epochs",
                "target_acc", "target_loss", "seed", "log_dir", "run_name"),
    "the cluster: devices and links": (
        "step_work", "speed_scale", "cores", "oversubscribe", "gpu", "cpu", "threads",
        "straggle_prob", "straggle_delay", "step_jitter", "jitter_distribution", "collective",
        "bandwidth", "link_bandwidth", "link_latency", "server_work", "spare_workers",
        "spare_start"),
    "training: model, data and optimizer": (
        "network", "dataset", "data_dir", "context", "n_layer", "n_head", "n_embd",
        "batch_size", "balanced_batches", "replan_drift", "lr", "lr_schedule", "lr_final", "momentum",
        "nesterov", "optimizer", "weight_decay", "partition", "split_by_class",
        "dirichlet_alpha", "inject", "inject_alpha", "inject_beta", "plugins"),
    "evaluation and checkpoints": ("eval_every", "deferred_eval", "eval_interval", "evaluator",
                                   "checkpoint_every"),
    "faults and servers": ("timeout", "regroup_grace", "grace", "service_ip", "service_port",
                           "live_report"),
}


def add_config_arguments(parser: argparse.ArgumentParser, defaults: Config | None = None,
                         exclude: tuple[str, ...] = (), mode: str | None = None,
                         shown: dict[str, str] | None = None) -> None:
    """One flag per Config field (but the fields in `exclude`) and per registered mode option,
    in `SECTIONS`; `mode`: the one the command line names (`chosen_mode`), whose own defaults
    the mode options' help shows; `shown`: the default to show for a field whose command's
    default is more than a value (launch's mode and its recipe).

    Flags not given on the command line are left out of the namespace (argparse.SUPPRESS), so
    `config_from_args` can lay the given ones over any base (launch's defaults, a config file).
    """
    from hetsync.algorithms import registry

    defaults = defaults or Config()
    hints = typing.get_type_hints(Config)
    fields = {f.name: f for f in dataclasses.fields(Config)}
    unplaced = {n for n, f in fields.items() if f.metadata["flags"]} - {
        n for names in SECTIONS.values() for n in names}
    if unplaced:  # (a new field's flag would otherwise be missing from the command line)
        raise RuntimeError(f"Config fields {sorted(unplaced)} are in no section of "
                           f"command_line.SECTIONS")
    for title, names in SECTIONS.items():
        group = parser.add_argument_group(title)
        for f in (fields[name] for name in names if name not in exclude):
            help_text = f.metadata["help"].replace("{modes}", ", ".join(registry.names()))
            switch = {"nargs": "?", "const": True} if hints[f.name] is bool else {}  # bare: 1
            group.add_argument(*f.metadata["flags"], dest=f.name, type=parser_for(f, hints),
                               default=argparse.SUPPRESS, metavar=f.name.upper(),
                               help=_with_default(help_text, (shown or {}).get(
                                   f.name, getattr(defaults, f.name))),
                               **switch)
    add_option_arguments(parser, mode)


def chosen_mode(argv: list[str]) -> str | None:
    """The mode `-m`/`--mode` names in `argv` (the last one given), if any."""
    mode = None
    for i, arg in enumerate(argv):
        if arg in ("-m", "--mode") and i + 1 < len(argv):
            mode = argv[i + 1]
        elif arg.startswith("--mode="):
            mode = arg.split("=", 1)[1]
    return mode


def _mode_defaults(name: str, modes: tuple[str, ...], mode: str | None) -> str | None:
    """A shared option's defaults as its modes declare them (`ModeSpec.defaults`): `mode`'s
    where it is one of them, else each one's; None where none declares one."""
    from hetsync.algorithms import registry

    values = {m: registry.get(m).defaults[name] for m in modes
              if name in registry.get(m).defaults}
    values = {m: f"{v:g}" if isinstance(v, float) else v for m, v in values.items()}
    if mode in values:
        return f"{_shown(values[mode])} for {mode}"
    by_value: dict[str, list[str]] = {}
    for m, value in values.items():
        by_value.setdefault(_shown(value), []).append(m)
    return "; ".join(f"{v} for {', '.join(ms)}" for v, ms in by_value.items()) or None


def add_option_arguments(parser: argparse.ArgumentParser, mode: str | None = None) -> None:
    """One flag per registered mode option, in a group of their own; given values land in
    the namespace as `option.--LONG-FLAG` (two modes' options may share a field name, never a
    flag: see `given_options`)."""
    from hetsync.algorithms import registry

    group = parser.add_argument_group("mode options (each applies to the modes named)")
    for f, default, modes in option_flags():
        owner = registry.get(modes[0]).options
        shown = "auto" if default is None and f.metadata.get("parser") == "epsilon" else default
        if default is None:
            shown = _mode_defaults(f.name, modes, mode) or shown
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


def given_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The Config fields given on the command line (`add_config_arguments`'s flags)."""
    names = {f.name for f in dataclasses.fields(Config)}
    given = {k: v for k, v in vars(args).items() if k in names}
    if given.get("time_budget") is not None and "epochs" not in given:
        given["epochs"] = None  # a time budget given alone is the stopping rule
    return given


#: on a text data set, where these flags are not given: its model and optimizer
TEXT_DEFAULTS = {"network": "gpt-char", "optimizer": "adamw", "lr": 0.003}


def with_text_defaults(cfg: Config, given: dict) -> Config:
    """`--dataset shakespeare` alone trains the character transformer with AdamW (nanoGPT's
    rate), not LeNet and SGD (launch's and the bench's)."""
    if cfg.dataset not in TEXT_DATASETS:
        return cfg
    return dataclasses.replace(cfg, **{k: v for k, v in TEXT_DEFAULTS.items() if k not in given})


def config_from_args(args: argparse.Namespace, base: Config | None = None) -> Config:
    """`base` (default: Config()) with every flag given on the command line laid over it."""
    cfg = dataclasses.replace(base or Config(), **given_fields(args))
    options = given_options(args, cfg.spec, cfg.mode)
    return dataclasses.replace(cfg, options={**cfg.options, **options}) if options else cfg
