"""`hetsync bench`: every mode side by side on one emulated cluster, PyTorch's own beside them.

For each of `--modes` and each of `--baselines` (PyTorch's DDP and post-local SGD,
:mod:`hetsync.algorithms.baselines`), one after another, through
:func:`hetsync.runtime.launcher.launch` and the same training loop:

1. the same cluster (`--workers`, `--slowdowns`), model, data set, partition, seed and
   stopping rule (`--time-budget` seconds of training time, or `--epochs` of data) for every
   run — or with `--horizons`, each row once per budget of time (`at_horizons`); a mode's
   own options (e.g. `--localsgd-period`) reach its runs;
2. the emulated devices fitted into this machine's cores once, for every run
   (:mod:`hetsync.runtime.emulation`: one speed scale, one measured reference step, the
   fastest devices on cores of their own), so every run sees the same absolute speeds;
3. **the fastest device at its best**: each recipe of `--reference` (plain SGD, SGD with
   Nesterov momentum, lookahead) trains alone on the cluster's fastest emulated device, at
   the same absolute speed, as `fastest-RECIPE`; so does a one-device mode given in `--modes`.
   The table reads every run against the best of them at each target
   (:func:`hetsync.bench.results.compare_with_fastest`): the capacity ratio, the speed-up and
   the efficiency;
4. a fair learning rate (:mod:`hetsync.bench.lr`): linear scaling by default, or the best of a
   short sweep per run with `--lr-sweep` (a momentum recipe's listed rates are its effective
   rates, lr/(1 - momentum));
5. `--repeats N`: each run N times, seeds `--seed` to `--seed`+N-1, the table holding medians
   and ranges (:func:`hetsync.bench.results.combine`); the learning rate is chosen once;
6. a progress line per run (k of n, how far, last accuracy);
7. at the end, every run directory is summarised, the figures are drawn together
   (:func:`hetsync.telemetry.plots.plot_runs`; the best recipe of the fastest device dashed,
   and its curve with time divided by the capacity ratio dotted as the ideal) into
   `RESULTS_DIR/bench-NAME/`, and the comparison table is printed and written to
   `RESULTS_DIR/bench-NAME.md` with the command and the machine, and to `bench-NAME.json`.

Run directories go to `LOG_DIR/bench-NAME/LABEL` (`LABEL-seedS` with repeats; sweeps under
`.../sweep/`).
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import math
import os
import shlex
import shutil
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from hetsync.bench import results as res
from hetsync.algorithms import registry
from hetsync.bench.lr import LrChoice, best_of_sweep, linear_scaling
from hetsync.bench.progress import RunProgress
from hetsync.telemetry.metric import metric_of
from hetsync.telemetry.summarize import SPEEDUP_BASELINE
from hetsync.command_line import (OPTION_PREFIX, ArgumentParser, add_config_arguments,
                                  given_fields, given_options, with_text_defaults)
from hetsync.config import MAX_SEED, MAX_WORKERS, Config, unwritable_dir
from hetsync.options import ConfigError, float_list
from hetsync.telemetry.rundir import CONFIG, RunDir

DEFAULT_MODES = ("sync", "esync", "esync-outer", "async", "dcasgd")
DEFAULT_BASELINES = ("ddp", "post-local-sgd")
#: late enough to separate the modes on LeNet/Fashion-MNIST (0.85 falls in seconds)
DEFAULT_TARGETS = (0.85, 0.88, 0.9)
#: validation losses (nats per character) late enough to separate them on Shakespeare
DEFAULT_LOSS_TARGETS = (2.2, 2.0, 1.9)
#: what a user with one device would train with: recipe -> (mode, changes to its config)
#: (a recipe sets its momentum: a bench's --momentum is for the cluster's runs)
RECIPES = {"sgd": ("local", {"optimizer": "sgd", "momentum": 0.0, "nesterov": False}),
           "nesterov": ("local", {"optimizer": "sgd", "momentum": 0.9, "nesterov": True}),
           "adamw": ("local", {"optimizer": "adamw", "momentum": 0.0, "nesterov": False}),
           "lookahead": ("lookahead", {"momentum": 0.0, "nesterov": False})}
REFERENCE_PREFIX = "fastest-"
#: every run's configuration before its mode, rate, seed and name (launch's flags laid over
#: it): 4 workers (slowdowns 1, 2, 4, ... unless --slowdowns), 60 s of training time each, a
#: cosine rate, evaluated every 2 s by a process of its own
BENCH_DEFAULTS = Config(workers=4, epochs=None, time_budget=60.0, lr_schedule="cosine",
                        eval_interval=2.0, evaluator=True)
#: Config's fields the bench sets for each run (it stops at its budget, not at a target)
PER_RUN = ("mode", "run_name", "target_acc", "target_loss", "live_report")


# ---------------------------------------------------------------------- flags
def _names(valid: tuple[str, ...], allow_empty: bool):
    def parse(text: str) -> tuple[str, ...]:
        names = tuple(n.strip() for n in text.split(",") if n.strip())
        bad = [n for n in names if n not in valid]
        if bad:
            raise argparse.ArgumentTypeError(
                f"unknown {', '.join(map(repr, bad))}; expected a comma-separated list of "
                f"{', '.join(valid)}")
        if not names and not allow_empty:
            raise argparse.ArgumentTypeError("expected at least one name")
        if len(set(names)) != len(names):
            raise argparse.ArgumentTypeError(f"{text!r} names a run twice")
        return names
    return parse


def _dirs(text: str) -> tuple[Path, ...]:
    dirs = tuple(Path(d) for d in text.split(",") if d)
    missing = [str(d) for d in dirs if not d.is_dir()]
    if missing:
        raise argparse.ArgumentTypeError(f"{', '.join(missing)}: not a directory; expected "
                                         f"run directories of an earlier bench")
    return dirs


def _positive(kind):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not (math.isfinite(value) and value > 0):
            raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
        return value
    return parse


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="hetsync bench",
        description="Run every mode, and PyTorch's DDP and local SGD, on the same emulated "
        "cluster one after another; compare time-to-accuracy, speedup over sync, accuracy, "
        "throughput, utilisation and traffic.")
    a = p.add_argument
    a("--modes", type=_names(registry.names(baseline=False), allow_empty=True),
      default=DEFAULT_MODES, help=f"hetsync modes to run (default: {','.join(DEFAULT_MODES)})")
    a("--baselines", type=_names(registry.names(baseline=True), allow_empty=True),
      default=DEFAULT_BASELINES,
      help=f"PyTorch baselines to run; '' for none (default: {','.join(DEFAULT_BASELINES)})")
    a("--reference", type=_names(tuple(RECIPES), allow_empty=True), default=tuple(RECIPES),
      help="single-device recipes trained on the cluster's fastest device, each a run "
      f"'{REFERENCE_PREFIX}RECIPE' that every run is read against; '' for none (default: "
      f"{','.join(RECIPES)})")
    a("--targets", type=float_list(0.0, what="targets"), default=None,
      help="targets for time-to-target: accuracies in (0, 1] (default: "
      f"{','.join(map(str, DEFAULT_TARGETS))}), validation losses for language modelling "
      f"(default: {','.join(map(str, DEFAULT_LOSS_TARGETS))})")
    a("--speedup-at", type=_positive(float), default=None,
      help="target at which speedup over sync is shown and plotted (default: the last)")
    a("--lr-sweep", type=float_list(0.0, what="learning rates"), default=None,
      help="rates to try per mode for --sweep-budget s each; the best is used")
    a("--sweep-budget", type=_positive(float), default=20.0,
      help="seconds of training time per sweep run, evaluated at its end (default: 20)")
    a("--horizons", type=float_list(0.0, what="seconds"), default=None,
      help="run every row once per listed budget of training time, over which its rate "
      "schedule falls (a time to target depends on it): rows 'LABEL@Ts', and the fastest "
      "device's best recipe at each target is the best of its recipes at every horizon "
      "(default: --time-budget alone)")
    a("--repeats", type=_positive(int), default=1,
      help="runs per mode, seeds SEED..SEED+N-1; the table shows medians and ranges "
      "(default: 1)")
    a("--reuse", type=_dirs, default=(),
      help="DIR,...: earlier runs (e.g. another bench's runs/bench-NAME) whose complete "
      "virtual-clock runs of the same configuration are taken instead of run again (a "
      "virtual run's records depend on nothing else; a one-device run crosses no link)")
    a("--name", default=None, help="name of this bench (default: the date and time)")
    a("--results-dir", default=None,
      help="where the table, JSON and figures go, e.g. results to keep them (default: "
      "beside the runs, in -ld/--log-dir: LOG_DIR/bench-NAME.md, .json and bench-NAME/)")
    a("--quiet", action="store_true", help="no progress lines")
    a("--report", metavar="NAME", default=None,
      help="run nothing: write the table, JSON and figures of the earlier bench NAME again "
      "from its --results-dir JSON and run directories, at --targets/--speedup-at")
    add_config_arguments(p, BENCH_DEFAULTS, exclude=PER_RUN)
    return p


# ---------------------------------------------------------------------- the plan
@dataclass
class Run:
    label: str
    kind: str                  # "mode", "baseline" or "reference"
    choice: LrChoice
    cfg: Config


@dataclass(frozen=True)
class Entry:
    """One row of the bench: its label, the mode it runs and what it changes of the base
    config; `lr_factor` turns a rate of the sweep into its own (momentum μ: 1 - μ, the
    listed rates being effective rates)."""

    label: str
    mode: str
    changes: dict = dataclasses.field(default_factory=dict)
    lr_factor: float = 1.0
    #: the row whose rate it takes (`at_horizons`: the row it is at one horizon)
    rate_of: str | None = None

    def rate(self, choice: LrChoice) -> LrChoice:
        if self.lr_factor == 1:
            return choice
        return LrChoice(choice.lr * self.lr_factor,
                        f"{choice.how}; effective {choice.lr:g} x {self.lr_factor:g}")


def entries(args) -> list[Entry]:
    """The bench's rows: `--modes`, `--baselines`, then the fastest device's recipes."""
    out = [Entry(label, label) for label in list(args.modes) + list(args.baselines)]
    for recipe in args.reference:
        mode, changes = RECIPES[recipe]
        out.append(Entry(REFERENCE_PREFIX + recipe, mode, changes,
                         1 - changes.get("momentum", 0.0)))
    return out


def row_of(label: str) -> str:
    """The row a run's label names, less its horizon ('esync-outer@30s': 'esync-outer')."""
    return label.partition("@")[0]


def at_horizons(rows: list[Entry], horizons: tuple[float, ...] | None) -> list[Entry]:
    """Each row once per horizon of `--horizons` ('LABEL@Ts', its --time-budget T), the rate
    chosen for the row kept; `rows` as they are without it."""
    if not horizons:
        return rows
    return [dataclasses.replace(e, label=f"{e.label}@{t:g}s", rate_of=e.label,
                                changes={**e.changes, "time_budget": t})
            for e in rows for t in horizons]


def _check(args, base: Config) -> None:
    """The bench's own checks (every run's Config is validated as launch's when the plan is
    made); ConfigError names the flag."""
    if not args.modes and not args.baselines and not args.reference:
        raise ConfigError("--modes/--baselines/--reference: nothing to run (all are empty)")
    base.check_cluster()  # (also where only one-device runs would use it: their fastest)
    if base.spare_workers:  # (the capacity, the fastest device and the rates count every one)
        raise ConfigError("--spare-workers: the bench compares clusters whose devices all "
                          "train from the start; benchmarks/spare_bench.py measures spares")
    if base.balanced_batches and base.workers > 1:
        from hetsync.algorithms import registry

        alike = [m for m in list(args.modes) + list(args.baselines)  # (one device: no sums)
                 if not registry.get(m).counts_samples and registry.get(m).max_workers != 1]
        if alike:
            raise ConfigError(f"--modes/--baselines: {', '.join(alike)} weigh each worker's "
                              f"update alike, not by its samples; with --balanced-batches 1 "
                              f"give only modes that count samples: "
                              f"{', '.join(registry.names(counts_samples=True))}")
    if args.horizons and "epochs" in vars(args):
        raise ConfigError("--horizons/--epochs: a horizon is a budget of training time; give "
                          "--horizons without --epochs")
    if args.horizons and "time_budget" in vars(args):
        raise ConfigError("--horizons/--time-budget: each horizon is a run's budget of "
                          "training time; give one of them")
    named = [f"{t:g}" for t in args.horizons or ()]
    if len(set(named)) != len(named):
        raise ConfigError(f"--horizons: {','.join(named)} names a horizon twice")
    if "epochs" in vars(args) and "time_budget" in vars(args):
        raise ConfigError("--epochs/--time-budget: give one of them (the same budget of data "
                          "or of time for every run)")
    if args.name is not None and (not args.name or "/" in args.name or args.name in (".", "..")):
        raise ConfigError(f"--name: invalid value {args.name!r}; expected a plain file name")
    if base.seed + args.repeats - 1 > MAX_SEED:
        raise ConfigError(f"--seed/--repeats: seeds {base.seed}..{base.seed + args.repeats - 1}"
                          f"; expected seeds in 0..{MAX_SEED}")
    for flag, path in (("-ld/--log-dir", base.log_dir),
                       ("--results-dir", str(results_dir(args)))):
        reason = unwritable_dir(path)
        if reason is not None:  # found before the runs, not after them
            raise ConfigError(f"{flag}: invalid value {path!r}; expected a directory this "
                              f"process can create or write into ({reason})")
    if base.bandwidth is not None:
        from hetsync.runtime.network import NetworkUnavailable, check_available, parse_rate

        try:
            parse_rate(base.bandwidth)
            check_available()
        except (ValueError, NetworkUnavailable) as err:
            raise ConfigError(f"--bandwidth: {err}") from None


def base_config(args) -> Config:
    """Every run's configuration before its mode, rate, seed and name: `BENCH_DEFAULTS` with
    the flags given laid over them, as launch lays them over its own."""
    given = given_fields(args)
    if "epochs" in vars(args):  # a budget of data instead of time
        given["time_budget"] = None
    cfg = with_text_defaults(dataclasses.replace(BENCH_DEFAULTS, **given),
                             vars(args)).with_profile(given)
    if cfg.slowdowns or not 1 <= cfg.workers <= MAX_WORKERS:  # (refused by `_check`)
        return cfg
    return dataclasses.replace(cfg, slowdowns=tuple(float(2 ** i) for i in range(cfg.workers)))


def mode_options(args, spec) -> dict:
    """The mode options given on the bench's command line that `spec`'s mode has."""
    flags = {flag for f in spec.option_fields() for flag in f.metadata["flags"]}
    mine = argparse.Namespace(**{k: v for k, v in vars(args).items()
                                 if k.startswith(OPTION_PREFIX) and k[len(OPTION_PREFIX):] in flags})
    return given_options(mine, spec, spec.name)


def make_run(args, base: Config, label: str, choice: LrChoice, mode: str | None = None,
             **changes) -> Run:
    """The run of `label` (mode `mode`, by default the label) at `choice`'s rate."""
    spec = registry.get(mode or label)
    fields = {"run_name": label, "mode": spec.name, "lr": choice.lr,
              "options": mode_options(args, spec), **changes}
    if spec.max_workers == 1:  # alone on the cluster's fastest device, at its speed
        base = base.fastest_devices(1)
    if not spec.collective:  # it aggregates with its own transport
        fields["collective"] = "native"
    cfg = dataclasses.replace(base, **fields).validate()
    kind = ("baseline" if spec.baseline else
            "reference" if spec.max_workers == 1 else "mode")
    return Run(label, kind, choice, cfg)


def fitted_base(base: Config, split, given_scale: bool) -> tuple[Config, list[str]]:
    """`base` with its devices fitted into the cores (unless `given_scale`: --speed-scale's)
    and its reference step measured (:mod:`hetsync.runtime.emulation`), and the lines that
    say so."""
    from hetsync.runtime.emulation import fit_config, with_reference_step

    base, fitted = fit_config(base, given_scale)
    base, step = with_reference_step(base, split)
    return base, [line for line in (fitted and fitted.describe(), step) if line]


#: what a virtual run's records do not depend on: where it is written, the servers' ports,
#: how long a process waits for a dead peer; and, for one device, the links it never crosses
_NOT_THE_RUN = ("log_dir", "run_name", "service_ip", "service_port", "timeout", "cores",
                "live_report", "resolved")
# (one device crosses no link, and its batch is -b with --balanced-batches or without)
_ONE_DEVICE = ("link_bandwidth", "link_latency", "collective", "balanced_batches")


def _what_it_computes(cfg: dict) -> dict:
    ignored = _NOT_THE_RUN + (_ONE_DEVICE if cfg.get("workers") == 1 else ())
    return {k: v for k, v in cfg.items() if k not in ignored}


def same_virtual_run(cfg: Config, sources: tuple[Path, ...]) -> Path | None:
    """A complete run under `sources` of the same configuration as `cfg` on the virtual
    clock (whose records are a function of it: tests/test_virtual_clock.py), or None."""
    if cfg.clock != "virtual" or not sources:
        return None
    from hetsync.telemetry.summarize import summarize

    mine = _what_it_computes(json.loads(json.dumps(cfg.to_dict())))
    for source in sources:
        for saved in sorted(source.rglob(CONFIG)):
            try:
                theirs = _what_it_computes(json.loads(saved.read_text()))
            except (OSError, ValueError):
                continue
            if theirs == mine and RunDir(saved.parent).summary.is_file() and \
                    summarize(saved.parent)["complete"]:
                return saved.parent
    return None


def execute(run: Run, k: int, n: int, *, train_size: int | None, quiet: bool,
            stream=None, label: str | None = None, reuse: tuple[Path, ...] = ()
            ) -> res.RunResult:
    """Run one plan entry (or take the same virtual run from `reuse`); a failed run is
    returned with its error (the bench goes on)."""
    stream = stream or sys.stdout
    from hetsync.runtime.launcher import LaunchError, launch
    from hetsync.telemetry.summarize import summarize

    result = res.RunResult(run.label, run.kind, run.choice.lr, run.choice.how)
    run_dir = Path(run.cfg.log_dir) / run.cfg.run_name
    earlier = same_virtual_run(run.cfg, reuse)
    if earlier is not None:
        shutil.copytree(earlier, run_dir)
        print(f"[{k}/{n}] {label or run.label}: the same virtual run as {earlier}, taken",
              file=stream, flush=True)
        result.run_dir, result.summary = run_dir, summarize(run_dir)
        return result
    progress = RunProgress(run_dir, label or run.label, k, n, run.cfg.workers,
                           time_budget=run.cfg.time_budget, epochs=run.cfg.epochs,
                           train_size=train_size, stream=stream, enabled=not quiet,
                           metric=metric_of(run.cfg.dataset),
                           virtual=run.cfg.clock == "virtual")
    try:
        with progress:
            launch(run.cfg, show_progress=False, figures=False, stream=io.StringIO(), live=False)
    except LaunchError as err:
        result.error = str(err)
        print(f"[{k}/{n}] {label or run.label}: FAILED: {str(err).splitlines()[0]}",
              file=stream, flush=True)
        return result
    result.run_dir = run_dir
    result.summary = summarize(run_dir)
    return result


def sweep_config(base: Config, budget: float, root: Path) -> Config:
    """A sweep run's configuration: `budget` s of training, under `root`/sweep, evaluated at
    its end only (it is chosen by its final accuracy or loss; a 60 s trial evaluated every second
    spends about as long evaluating as training)."""
    return dataclasses.replace(base, log_dir=str(root / "sweep"), time_budget=budget,
                               epochs=None, eval_every=0, eval_interval=budget)


def run_sweep(args, base: Config, rows: list[Entry], root: Path, train_size, stream) -> dict:
    """{label: LrChoice}: each row trained `--sweep-budget` s at each rate of `--lr-sweep`."""
    rates = args.lr_sweep
    total = len(rows) * len(rates)
    sweep_base = sweep_config(base, args.sweep_budget, root)
    choices, k = {}, 0
    metric = metric_of(base.dataset)
    for e in rows:
        accuracies = {}
        for lr in rates:
            k += 1
            run = make_run(args, sweep_base, e.label, e.rate(LrChoice(lr, "sweep")),
                           mode=e.mode, run_name=f"{e.label}-lr{lr:g}", **e.changes)
            out = execute(run, k, total, train_size=train_size, quiet=args.quiet,
                          stream=stream, label=f"sweep {e.label} lr {run.cfg.lr:g}",
                          reuse=args.reuse)
            accuracies[lr] = out.summary[f"final_{metric.short}"] if out.summary else None
        try:
            choices[e.label] = e.rate(best_of_sweep(accuracies, metric.higher_is_better))
        except ValueError:
            raise ConfigError(f"--lr-sweep: every rate failed for {e.label} "
                              f"({', '.join(map(str, rates))}); see {root / 'sweep'}") from None
        print(f"sweep {e.label}: lr {choices[e.label]}", file=stream, flush=True)
    return choices


# ---------------------------------------------------------------------- the bench
def _targets(args, dataset: str) -> tuple[list[float], float]:
    """The bench's targets (the speed-up one among them), ordered from the first reached to
    the last, and the speed-up's; ConfigError for a target `dataset`'s figure cannot have."""
    metric = metric_of(dataset)
    given = args.targets or (DEFAULT_TARGETS if metric.higher_is_better else DEFAULT_LOSS_TARGETS)
    speedup_at = args.speedup_at or given[-1]
    try:
        targets = sorted({metric.check_target(t) for t in (*given, speedup_at)},
                         reverse=not metric.higher_is_better)
    except ValueError as err:
        raise ConfigError(f"--targets/--speedup-at: {err} ({dataset} is judged by its "
                          f"{metric.label})") from None
    return targets, speedup_at


def bench(args, argv: list[str], stream=None) -> int:
    """Run the bench that `args` describes (`argv`: the command line, for the record)."""
    stream = stream or sys.stdout
    if args.report is not None:
        return report_again(args, stream)
    base = base_config(args)
    _check(args, base)
    name = args.name or time.strftime("%Y%m%d-%H%M%S")
    root = Path(base.log_dir) / f"bench-{name}"
    if root.exists() and any(root.iterdir()):
        raise ConfigError(f"--name {name}: {root} already exists and is not empty; "
                          f"choose another name")
    base = dataclasses.replace(base, log_dir=str(root))
    _targets(args, base.dataset)  # (refused before anything runs)
    rows = entries(args)
    # every run's config is valid, then has a batch for every worker, before anything runs
    planned = [make_run(args, base, e.label, LrChoice(base.lr, "base"), mode=e.mode,
                        **e.changes).cfg for e in rows]
    split = base.load_data()
    for cfg in planned:
        cfg.validate_data(split)
    # one fit and one reference step for all runs
    base, emulation = fitted_base(base, split, given_scale="speed_scale" in vars(args))
    train_size = len(split.train)
    del split
    load_before = os.getloadavg()
    command = "hetsync bench " + shlex.join(argv)
    print(f"{command}\nload average {res.load_text(load_before)} on {os.cpu_count()} CPUs; "
          f"runs in {root}", file=stream, flush=True)
    for line in emulation:
        print(line, file=stream, flush=True)

    if args.lr_sweep:
        choices = run_sweep(args, base, rows, root, train_size, stream)
    else:
        choices = {e.label: e.rate(linear_scaling(e.mode, base.lr, base.batches_per_step(),
                                                  e.changes.get("optimizer", base.optimizer),
                                                  mode_options(args, registry.get(e.mode))
                                                  .get("global_lr")))
                   for e in rows}
    results = []
    seeds = [base.seed + i for i in range(args.repeats)]
    rows = at_horizons(rows, args.horizons)
    plan = [(e, seed) for e in rows for seed in seeds]
    for k, (e, seed) in enumerate(plan, 1):
        run_name = e.label if args.repeats == 1 else f"{e.label}-seed{seed}"
        run = make_run(args, base, e.label, choices[e.rate_of or e.label], mode=e.mode,
                       seed=seed, run_name=run_name, **e.changes)
        out = execute(run, k, len(plan), train_size=train_size, quiet=args.quiet,
                      stream=stream, label=run_name, reuse=args.reuse)
        out.seed = seed
        results.append(out)
    machine = {**res.machine_info(), "load average before": res.load_text(load_before),
               "load average after": res.load_text(os.getloadavg())}
    return report(args, base, name, command, [e.label for e in rows], results,
                  _setup(args, base), machine, emulation, train_size, stream)


def results_dir(args) -> Path:
    """Where the bench's table, JSON and figures go: --results-dir, else beside its runs."""
    return Path(args.results_dir or base_config(args).log_dir)


def report_again(args, stream) -> int:
    """`--report NAME`: the table, JSON and figures of the earlier bench NAME (its
    `--results-dir` JSON and its run directories), at this command's `--targets` and
    `--speedup-at` — targets chosen after seeing the curves, without running again."""
    path = results_dir(args) / f"bench-{args.report}.json"
    try:
        doc = json.loads(path.read_text())
        old = build_parser().parse_args(shlex.split(doc["command"])[2:])
        runs = doc["runs"]
    except (OSError, ValueError, KeyError, SystemExit) as err:
        raise ConfigError(f"--report {args.report}: {path} is not a bench's JSON ({err})") from None
    old.targets, old.speedup_at = args.targets, args.speedup_at
    results = []
    for row in runs:
        for x in row.get("repeats") or [row]:
            run_dir = Path(x["run_dir"]) if x.get("run_dir") else None
            if run_dir is not None and not RunDir(run_dir).run.exists():
                raise ConfigError(f"--report {args.report}: run directory {run_dir} is gone")
            results.append(res.RunResult(row["label"], row["kind"], row["lr"], row["lr_how"],
                                         run_dir=run_dir, error=x.get("error"),
                                         seed=x.get("seed")))
    done = next((r.run_dir for r in results if r.run_dir is not None), None)
    train_size = (len(Config.load(RunDir(done).config).load_data().train)
                  if done is not None else None)
    again = f"hetsync bench --report {args.report}" + (
        f" --targets {','.join(map(str, args.targets))}" if args.targets else "") + (
        f" --speedup-at {args.speedup_at}" if args.speedup_at else "")
    first = [n for n in doc.get("notes", [])
             if n.startswith(("emulated devices", "reference step"))]
    first.append(f"the table written again from the runs at other targets: `{again}`.")
    return report(old, base_config(old), args.report, doc["command"],
                  list(dict.fromkeys(r["label"] for r in runs)), results, doc["setup"],
                  doc["machine"], first, train_size, stream, results_dir(args))


def report(args, base: Config, name: str, command: str, labels: list[str],
           results: list[res.RunResult], setup: dict, machine: dict, first_notes: list[str],
           train_size: int | None, stream, out_dir: Path | None = None) -> int:
    """The bench's table (printed and in Markdown), JSON and figures from its runs'
    results (`args`: the bench's flags, its targets read here; `base`: every run's config);
    `first_notes` lead the notes (the emulation's lines)."""
    from hetsync.telemetry.plots import plot_runs
    from hetsync.telemetry.summarize import summarize

    metric = metric_of(base.dataset)
    targets, speedup_at = _targets(args, base.dataset)

    def combined(targets):
        for r in results:  # again, with every target (and the speedup one)
            if r.run_dir is not None:
                r.summary = summarize(r.run_dir, targets)
        return [res.combine([r for r in results if r.label == label]) for label in labels]

    table_rows = combined(targets)
    # the fastest device's best final figure is a target too: the speed-up "at the end"
    end = res.reference_end(table_rows, metric)
    if end is not None:
        table_rows = combined(sorted(set(targets) | {end[1]}))
    fastest = res.compare_with_fastest(table_rows, targets, end)
    has_sync = False  # (each horizon's rows read against its own sync)
    for suffix in [f"@{t:g}s" for t in args.horizons] if args.horizons else [""]:
        has_sync |= res.compute_speedups([r for r in table_rows if r.label.endswith(suffix)],
                                         targets, baseline=SPEEDUP_BASELINE + suffix)

    out_dir = out_dir or results_dir(args)
    fig_dir = out_dir / f"bench-{name}"
    notes = first_notes + _notes(args, base, table_rows, fastest, has_sync, speedup_at,
                               machine["load average before"], machine["load average after"],
                               metric)
    figures = []
    done = [r for r in table_rows if r.summary is not None]
    reference = next((r for r in done if fastest and r.label == fastest.end_label), None)
    drawn = [r for r in done if r is not reference]
    if not drawn:  # only the reference: draw it as a run of its own
        drawn, reference = done, None
    if drawn:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            figures = plot_runs([r.run_dir for r in drawn], fig_dir,
                                labels=[r.label for r in drawn],
                                sequential=reference and reference.run_dir,
                                sequential_label=reference and reference.label,
                                ideal=fastest and reference and fastest.capacity,
                                target=speedup_at, speedup=not args.horizons)
        notes += [f"figure skipped: {w.message}" for w in caught
                  if "skip" in str(w.message).lower()]

    headers, cells = res.rows(table_rows, targets, speedup_at, train_size, has_sync, metric)
    md = res.write_markdown(out_dir / f"bench-{name}.md", name=name, command=command,
                            machine=machine, setup=setup, headers=headers, cells=cells,
                            notes=notes, figures=figures)
    js = res.write_json(out_dir / f"bench-{name}.json", {
        "name": name, "command": command, "machine": machine, "setup": setup,
        "targets": targets, "speedup_at": speedup_at, "speedup_baseline": SPEEDUP_BASELINE,
        "fastest_device": dataclasses.asdict(fastest) if fastest else None,
        "runs": [res.result_doc(r) for r in table_rows], "notes": notes,
        "figures": [str(p) for p in figures]})
    print("\n" + res.text_table(headers, cells), file=stream)
    for note in notes:
        print(f"  {note}", file=stream)
    print(f"\ntable: {md}\njson:  {js}\nfigures: {fig_dir}", file=stream, flush=True)
    return 1 if any(r.error for r in table_rows) else 0


def _setup(args, base: Config) -> dict:
    scale_how = "given" if "speed_scale" in vars(args) else "the fit's"
    step_how = "given" if "step_work" in vars(args) else "measured"
    budget = (f"{base.epochs:g} epochs of data" if base.epochs is not None
              else f"{base.time_budget:g} s of training time" if not args.horizons
              else " or ".join(f"{t:g}" for t in args.horizons)
              + " s of training time (--horizons: each row at each)")
    return {"workers": base.workers,
            "slowdowns": ",".join(f"{f:g}" for f in base.slowdowns),
            "network": base.network, "dataset": base.dataset,
            "partition": (f"dirichlet (alpha {base.dirichlet_alpha:g})"
                          if base.partition == "dirichlet" else base.partition),
            "lr schedule": ("constant" if base.lr_schedule == "constant" else
                            f"{base.lr_schedule} to {base.lr_final:g} x"),
            "batch per worker": (", ".join(str(base.batch_of(r)) for r in range(base.workers))
                                 + " (--balanced-batches: in proportion to speed)"
                                 if base.balanced_batches else base.batch_size),
            "budget per run": budget,
            "evaluation every": f"{base.eval_interval:g} s", "collective": base.collective,
            "seed": (base.seed if args.repeats == 1 else
                     f"{base.seed}-{base.seed + args.repeats - 1} (median of {args.repeats} "
                     "runs, range in parentheses; figures from the first seed)"),
            "threads per worker": base.threads,
            "speed scale": f"{base.speed_scale:.4g} (every slowdown x this; {scale_how})",
            "reference step": (f"{1000 * base.step_work:.2f} ms per batch of "
                               f"{base.batch_size} ({step_how})"
                               if base.step_work else "each device's own"),
            "random stragglers": (f"p {base.straggle_prob:g}, delay {base.straggle_delay}"
                                  if base.straggle_prob else "none"),
            "data injection": "on" if base.inject else "off",
            "clock": (f"virtual: every time in this table is modelled (links "
                      f"{base.make_clock().link.describe()}, step jitter "
                      f"{base.step_jitter:g} {base.jitter_distribution}"
                      + (f"; devices of --profile {base.profile}" if base.profile else "")
                      + "), the gradients real"
                      if base.clock == "virtual" else "wall (emulated devices sleep to their "
                                                      "speed)"),
            "bandwidth per host": base.bandwidth or "unlimited (loopback)",
            "mode options": ", ".join(f"{k[len(OPTION_PREFIX):]}={v}"
                                      for k, v in sorted(vars(args).items())
                                      if k.startswith(OPTION_PREFIX)) or "defaults"}


def _notes(args, base: Config, results, fastest, has_sync, speedup_at, load_before: str,
           load_after: str, metric) -> list[str]:
    notes = [f"tta = training time until the first evaluation with {metric.label} "
             f"{'>=' if metric.higher_is_better else '<='} target (evaluation time excluded); "
             "— = not reached."]
    if fastest is None:
        notes.append("no fastest-device run completed (--reference): capacity, 'x fastest' "
                     "and efficiency not computed.")
    else:
        won = "; ".join(f"{k if k == 'end' else format(float(k), 'g')} {label} ({tta:.1f} s)"
                        for k, (label, tta) in fastest.best.items())
        notes += [
            f"fastest device = the cluster's fastest emulated device trained alone, at the "
            f"same absolute speed ({fastest.speed:,.0f} samples per second of computing, "
            f"measured); its best recipe at each target: {won or 'none reached one'}.",
            "capacity = Σ the run's devices' samples per second of computing ÷ the fastest "
            "device's, both measured in this bench"
            + (f" (the cluster's: {fastest.capacity:.2f})." if fastest.capacity else "."),
            "x fastest @T = tta(the fastest device's best recipe at T) / tta(run); @end: at "
            + (f"{fastest.end_value:.4f}, the best final {metric.short} of the fastest device "
               f"({fastest.end_label})" if fastest.end_value else f"its best final {metric.short}")
            + "; efficiency = x fastest ÷ capacity (1: every sample worth one of the fastest "
            "device's).",
        ]
    if args.horizons:
        notes.append("LABEL@Ts = the row trained T s, its rate's schedule falling over those "
                     "T s (--horizons): a time to target depends on the horizon, so each "
                     "row is shown at each, and the fastest device's best recipe at a target "
                     "is the best of its recipes at every horizon (@end: its best final "
                     f"{metric.short} at any; speedup.png is not drawn).")
    notes += [(f"speedup vs sync = tta(sync) / tta(run) at {speedup_at:g}, same bench"
               + (", same horizon." if args.horizons else ".")
               if has_sync else "no successful sync run: speedup vs sync not shown."),
              (f"lr: best final {metric.short} of a {args.sweep_budget:g} s run at each of "
               + ",".join(f"{x:g}" for x in args.lr_sweep) + " per run."
               if args.lr_sweep else
               f"lr: linear scaling of base {base.lr:g}: " + "; ".join(
                   f"{r.label} {r.lr_how}" for r in results) + "."),
              f"load average (1/5/15 min) {load_before} before, {load_after} after, on "
              f"{os.cpu_count()} CPUs."]
    for r in results:
        if r.kind == "baseline":
            summary = registry.get(row_of(r.label)).summary
            notes.append(f"{r.label} = {summary}, run by hetsync's training loop "
                         "(hetsync.algorithms.baselines); traffic: the "
                         "theoretical ring all-reduce volume.")
    for r in results:
        if r.summary and r.summary.get("synced_fraction") is not None:
            notes.append(f"{r.label}: {r.summary['synced_fraction']:.1%} of steps synchronised.")
        first = r.repeats[0].summary if r.repeats else r.summary
        stale = [w["mean_staleness"] for w in (first or {}).get("per_worker", [])
                 if w.get("mean_staleness") is not None]
        if stale:
            notes.append(f"{r.label}: mean staleness of each worker's gradients (rounds) "
                         + " ".join(f"{x:.2f}" for x in stale) + ".")
        for x in r.repeats or [r]:  # an emulated device that did not keep its speed
            for line in (x.summary or {}).get("warnings", []):
                notes.append(f"warning: {x.run_dir.name if x.run_dir else r.label}: {line}")
    notes += [f"{r.label} failed: {in_one_line(r.error)}" for r in results if r.error]
    return notes


def in_one_line(error: str) -> str:
    """A failed run's error for a note: its first line, and where that announces the log's
    end, the log's last line (the exception)."""
    lines = [line.strip() for line in error.splitlines() if line.strip()
             and not line.startswith("To continue from its last checkpoint")]
    if lines[0].endswith("ends with:") and len(lines) > 1:
        return f"{lines[0]} {lines[-1]}"
    return lines[0]


def main(argv: list[str] | None = None) -> int:
    from hetsync.data import DataFormatError, DataNotFoundError

    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    try:
        return bench(args, argv)
    except (ConfigError, DataNotFoundError, DataFormatError) as err:
        print(f"hetsync bench: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # a file it cannot write, ...: say what, not where
        print(f"hetsync bench: error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
