"""The `hetsync` command: launch, worker, state-server, summarize, plot, bench, models."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

import hetsync
from hetsync.command_line import (ArgumentParser, add_config_arguments, check_option_flags,
                                  chosen_mode, config_from_args, parse_listen_port, parse_restarts,
                                  parse_workers, with_text_defaults)
from hetsync.config import TEXT_DATASETS, Config, admitting_modes, check_host, unwritable_dir
from hetsync.options import ConfigError, parse_epsilon_fraction, parse_target
from hetsync.telemetry.rundir import RunDir

#: `hetsync launch` with no arguments: 4 emulated workers of relative speeds 1, 1/2, 1/4, 1/8
#: (1.9 cores of work, scaled to fit the machine: `runtime/emulation.py`), LeNet, real
#: Fashion-MNIST, a cosine rate over 90 s, evaluated by a process of its own while the run
#: goes on; the mode and its recipe are `LAUNCH_RECIPES`'
LAUNCH_DEFAULTS = Config(mode="diloco", workers=4, slowdowns=(1.0, 2.0, 4.0, 8.0),
                         epochs=None, time_budget=90.0, lr_schedule="cosine", evaluator=True)
#: what launch runs where -m is not given, by kind of data set (each entry where its flag is
#: not given): the recipe that reached the bench's targets soonest on launch's own cluster,
#: on the virtual clock and on this machine's wall clock (results/virtual-claims.md,
#: results/virtual-clock.md). Images: DiLoCo with 2 inner steps on balanced batches (every
#: device's step as long), which reached 0.88 and 0.90 sooner than esync-outer, the default
#: before it, in every seed on both clocks; on shards sized by those batches (every sample
#: drawn once an epoch), which reached 0.90 in 7 seeds of 10 where equal shards did in 4.
#: Text: sync on balanced batches, the only recipe that beat the fastest device on the
#: character transformer.
LAUNCH_RECIPES = {"image": {"mode": "diloco", "balanced_batches": True,
                            "partition": "by-batch", "options": {"inner_steps": 2}},
                  "text": {"mode": "sync", "balanced_batches": True}}
WORKER_DEFAULTS = Config(mode="local", workers=1)


def _progress_printer(stream=sys.stdout):
    def show(round_, train_time, samples_seen, result):
        rate = samples_seen / train_time if train_time > 0 else 0.0
        print(f"round {round_:7d} | train {train_time:7.1f} s | {samples_seen:9d} samples "
              f"({rate:6.0f}/s) | test acc {result.test_acc:.4f} loss {result.test_loss:.4f}",
              file=stream, flush=True)
    return show


def preflight(cfg: Config):
    """What launch checks before it starts a process, so that a mistake is one line here
    rather than a worker's error relayed: every flag, the address of the mode's service (it
    is started on it), the GPU, and the data (found, readable, one batch for every worker).
    Returns the data."""
    from hetsync.runtime.devices import pick_device

    cfg.validate()
    if cfg.spec.service is not None and cfg.bandwidth is None:  # --bandwidth: the bridge's
        check_host("-ip/--service-ip", cfg.service_ip, listen=True)
    pick_device(cfg, local_rank=cfg.world_size - 1)  # -g: the highest device a rank may use
    split = cfg.load_data()
    cfg.validate_data(split)
    return split


def cmd_launch(args) -> int:
    from hetsync.runtime import forked
    from hetsync.runtime.emulation import with_reference_step
    from hetsync.runtime.launcher import launch

    forked.warm_up()  # the processes' warm parent imports torch while this measures its step
    cfg, fitted = launch_config(args)
    split = preflight(cfg)
    if fitted is not None:
        print(fitted.describe(), flush=True)
    given = ({"given": f"the resumed run's ({RunDir(args.resume).config})"}
             if args.resume else
             {"given": f"the fastest device of --profile {cfg.profile}"} if cfg.profile
             else {})  # (where the reference step comes from, when it is not measured)
    cfg, step = with_reference_step(cfg, split, **given)
    if step is not None:
        print(step, flush=True)
    launch(cfg, show_progress=not args.quiet, figures=not args.no_figures,
           resume=args.resume, live=not args.no_live, max_restarts=args.max_restarts,
           rejoin=not args.no_rejoin)
    return 0


def launch_config(args):
    """What `hetsync launch` runs: its defaults (or the resumed run's config) with the flags
    given laid over them and its emulated devices fitted to the cores
    (`runtime/emulation.py`); and that fit (None: nothing was fitted)."""
    from hetsync.runtime.emulation import fit_config

    base = _resumed_config(args.resume) if args.resume else LAUNCH_DEFAULTS
    cfg = config_from_args(args, base)
    if args.resume:
        _check_resumable(base, cfg, args.resume)
        return cfg, None
    cfg = with_text_defaults(cfg, given=vars(args)).with_profile(vars(args))
    cfg = with_launch_recipe(cfg, given=vars(args))
    # the whole cluster is fitted, also when -m local then runs only its fastest device
    cfg, fitted = fit_config(cfg, given_scale="speed_scale" in vars(args))
    return _on_the_fastest_devices(cfg, given=vars(args)), fitted


def _recipes_shown() -> str:
    """`LAUNCH_RECIPES` as -m's default in launch's help."""
    def one(recipe: dict) -> str:
        flags = [f"--{k.replace('_', '-')} {int(v) if isinstance(v, bool) else v}"
                 for k, v in {**recipe.get("options", {}),
                              **{k: v for k, v in recipe.items() if k not in ("mode", "options")}
                              }.items()]
        return " ".join([recipe["mode"], *flags])
    return f"{one(LAUNCH_RECIPES['image'])}; for a text data set {one(LAUNCH_RECIPES['text'])}"


def with_launch_recipe(cfg: Config, given: dict) -> Config:
    """`cfg` with `LAUNCH_RECIPES`' entry for its data set where -m is not given (each of its
    fields and mode options where that flag is not given either)."""
    if "mode" in given:
        return cfg
    recipe = dict(LAUNCH_RECIPES["text" if cfg.dataset in TEXT_DATASETS else "image"])
    options = {**recipe.pop("options", {}), **cfg.options}
    return dataclasses.replace(cfg, **{k: v for k, v in recipe.items() if k not in given},
                               options=options)


def _on_the_fastest_devices(cfg: Config, given: dict) -> Config:
    """A mode of fewer workers than launch's demo cluster (sequential SGD, at most 1) without
    --workers: the cluster's fastest devices, as the bench runs it."""
    most = cfg.spec.max_workers
    if most is None or cfg.workers <= most or "workers" in given:
        return cfg
    if "slowdowns" in given:
        return dataclasses.replace(cfg, workers=most)
    return cfg.fastest_devices(most)


def _resumed_config(run_dir: str) -> Config:
    """The config a run directory was started with (`--resume`); flags given override it."""

    path = RunDir(run_dir).config
    if not path.is_file():
        raise ConfigError(f"--resume {run_dir}: no config.json there; expected the run "
                          f"directory of an earlier `hetsync launch` or `worker`")
    cfg = Config.load(path)
    if "replan_drift" not in json.loads(path.read_text()):
        # a run from before balanced batches were re-planned: its positions count batches
        cfg = dataclasses.replace(cfg, replan_drift=0.0)
    return cfg


#: What a checkpoint's state depends on: a resumed run must keep them.
RUN_DEFINING = ("mode", "network", "dataset", "workers", "batch_size", "balanced_batches",
                "partition", "split_by_class", "dirichlet_alpha", "seed", "collective")


def _check_resumable(saved: Config, cfg: Config, run_dir: str) -> None:
    # (balanced batches follow the relative speeds: each sampler's position is in batches,
    # or in samples where they are re-planned)
    for name in RUN_DEFINING + (("slowdowns", "replan_drift") if saved.balanced_batches
                                else ()):
        if getattr(cfg, name) != getattr(saved, name):
            raise ConfigError(f"--resume {run_dir}: {name.replace('_', '-')} "
                              f"{getattr(cfg, name)!r} differs from the run's "
                              f"{getattr(saved, name)!r}; a resumed run keeps it (the time "
                              f"budget, epochs and evaluation may change)")
    # The mode's options made the state its checkpoint holds (an outer optimizer's rate and
    # momentum are in its state dict): changed, they would be recorded but not applied.
    now, then = cfg.mode_options(), saved.mode_options()
    for f in cfg.spec.option_fields():
        if getattr(now, f.name) != getattr(then, f.name):
            flag = f.metadata.get("flags", (f"--{f.name.replace('_', '-')}",))[-1]
            raise ConfigError(f"--resume {run_dir}: {flag} {getattr(now, f.name)!r} differs "
                              f"from the run's {getattr(then, f.name)!r}; a resumed run keeps "
                              f"its mode's options (its checkpoint holds the state they made)")


def cmd_worker(args) -> int:
    from hetsync.runtime.worker import run_process

    if args.join and args.resume:
        raise ConfigError(f"--join and --resume {args.resume}: give one (--join enters a "
                          f"running job; --resume continues a stopped one)")
    if args.resume:
        if args.run_dir is not None and args.run_dir != args.resume:
            raise ConfigError(f"--run-dir {args.run_dir} and --resume {args.resume}: give one "
                              f"(--resume continues that run directory)")
        args.run_dir = args.resume
    cfg = worker_config(args)
    if args.join:
        _check_joinable(cfg, args)
    if cfg.spec.service is not None:
        check_host("-ip/--service-ip", cfg.service_ip)
    reason = None if args.run_dir is None else unwritable_dir(args.run_dir)
    if reason is not None:
        raise ConfigError(f"--run-dir: invalid value {args.run_dir!r}; expected a directory "
                          f"this process can create or write into ({reason})")
    if cfg.bandwidth is not None and args.run_dir is None:
        print(f"hetsync worker: note: --bandwidth {cfg.bandwidth} is ignored here: launch and "
              f"bench make the emulated hosts; this worker uses the network it runs on",
              file=sys.stderr)
    resume = True if args.resume else _restarted_by_torchrun(args, cfg)
    standalone = (args.run_dir is None or resume) and cfg.workers == 1
    run_dir = run_process(cfg, run_dir=args.run_dir, progress=_progress_printer(),
                          resume=resume, join=args.join)
    if standalone:  # a standalone run: summarise it too
        from hetsync.runtime.launcher import finish_run

        finish_run(run_dir, figures=not args.no_figures)
    return 0


def worker_config(args) -> Config:
    """What `hetsync worker` runs: launch's config file (`--config`), the resumed run's, or
    the worker's defaults (with a text data set's model and optimizer), flags laid over it."""
    base = (Config.load(args.config) if args.config else
            _resumed_config(args.resume) if args.resume else WORKER_DEFAULTS)
    cfg = config_from_args(args, base)
    if base is WORKER_DEFAULTS:  # (a config file already has launch's defaults)
        cfg = with_text_defaults(cfg, given=vars(args))
    cfg = cfg.with_profile(vars(args)).validate()
    if args.resume:
        _check_resumable(_resumed_config(args.resume), cfg, args.resume)
    return cfg


def _check_joinable(cfg: Config, args) -> None:
    """`--join` enters a running job of a mode that admits a worker, in its run directory."""
    if args.run_dir is None:
        raise ConfigError("--join: give --run-dir, the directory of the running job to join")
    if cfg.workers < 2 or not cfg.admits_workers:
        raise ConfigError(f"--join: mode {cfg.effective_mode} cannot take in a worker while "
                          f"it runs; these can, with more than one worker: "
                          f"{admitting_modes()}, the latter with deferred evaluation and no "
                          f"parameter server")


def _restarted_by_torchrun(args, cfg: Config) -> bool | str:
    """Under `torchrun --max-restarts`, a restarted worker group resumes its run directory
    (`--run-dir`, or `-ld`/`--run-name`) from the last checkpoint if any worker has one (the
    workers decide together: `worker.IF_ANY`); sets args.run_dir."""

    from hetsync.runtime.worker import IF_ANY

    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if restart in ("", "0"):
        return False
    target = (Path(args.run_dir) if args.run_dir is not None else
              Path(cfg.log_dir) / cfg.run_name if cfg.run_name else None)
    if target is None:
        print(f"hetsync worker: torchrun restart {restart}: give --run-name so that a "
              f"restart finds its run; starting afresh", file=sys.stderr, flush=True)
        return False
    print(f"hetsync worker: torchrun restart {restart}: resuming {target} if it has a "
          f"checkpoint", file=sys.stderr, flush=True)
    args.run_dir = str(target)
    return IF_ANY


def parse_instance(text: str) -> str:
    """`state-server --instance`: 1 to 64 letters, digits, '-' or '_'."""
    if not (0 < len(text) <= 64 and all(c.isascii() and (c.isalnum() or c in "-_")
                                        for c in text)):
        raise argparse.ArgumentTypeError(f"invalid value {text[:70]!r}; expected 1 to 64 "
                                         f"letters, digits, '-' or '_'")
    return text


def cmd_state_server(args) -> int:
    from hetsync.state import StateServer

    check_host("--host", args.host, listen=True)
    # (a port that is taken or needs privileges: StateServer's one-line ServerConfigError)
    server = StateServer(args.workers, args.epsilon, host=args.host, port=args.port,
                         token=args.token, instance=args.instance)
    eps = "auto" if args.epsilon is None else args.epsilon
    print(f"hetsync state server on http://{server.host}:{server.port}/ "
          f"({args.workers} workers, epsilon {eps})", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


def cmd_summarize(args) -> int:
    from hetsync.telemetry.report import print_summary
    from hetsync.telemetry.summarize import summarize, write_summary

    from hetsync.telemetry.metric import metric_of
    from hetsync.telemetry.runlog import read_run

    for run_dir in args.run_dirs:
        if args.targets is not None:
            metric = metric_of(read_run(run_dir).config.get("dataset"))
            try:
                [metric.check_target(t) for t in args.targets]
            except ValueError as err:
                raise ConfigError(f"--targets: {err} ({run_dir} is judged by its "
                                  f"{metric.label})") from None
        path = write_summary(run_dir, targets=args.targets, esync_json=args.esync_json)
        summary = summarize(run_dir, targets=args.targets)
        print_summary(summary)
        if summary["missing_workers"]:
            print(f"warning: {run_dir}: run.json lists worker rank(s) "
                  f"{summary['missing_workers']} with no records here, so every figure above "
                  f"leaves them out; gather every machine's records first (hetsync gather "
                  f"{run_dir} OTHER_DIR...)", file=sys.stderr)
        print(f"wrote {path}")
    return 0


def cmd_gather(args) -> int:
    from hetsync.telemetry.gather import GatherError, gather

    try:
        copied = gather(args.dest, args.sources)
    except GatherError as err:
        raise ConfigError(str(err)) from None
    print(f"gathered into {args.dest}: {', '.join(copied) or 'nothing new'}")
    return cmd_summarize(argparse.Namespace(run_dirs=[args.dest], targets=None, esync_json=False))


def cmd_plot(args) -> int:
    from hetsync.telemetry.plots import plot_runs

    reason = unwritable_dir(args.output)
    if reason is not None:
        raise ConfigError(f"-o/--output: invalid value {args.output!r}; expected a directory "
                          f"this process can create or write into ({reason})")
    try:
        paths = plot_runs(args.run_dirs, args.output, sequential=args.sequential,
                          target=args.target)
    except ValueError as err:
        raise ConfigError(f"hetsync plot: {err}") from None
    for p in paths:
        print(p)
    return 0


def cmd_bench(args) -> int:
    if args.what == "comm":
        from hetsync.bench.comm import main as comm_main

        return comm_main(args.rest) or 0
    if args.what == "state":
        from hetsync.bench.state_load import main as state_main

        return state_main(args.rest)
    from hetsync.bench.modes import main as modes_main

    return modes_main(args.rest) or 0


def cmd_probe(args) -> int:
    from hetsync.bench.probe import options_from_args, run

    run(options_from_args(args), args.workers)
    return 0


def cmd_advise(args) -> int:
    from hetsync.bench.advise import advise, options

    return advise(options(args))


def cmd_evaluate(args) -> int:

    from hetsync.runtime.evaluation import follow, lower_priority

    priority = lower_priority()  # before torch starts a thread: they inherit it
    run_dir = Path(args.run_dir)
    if not RunDir(run_dir).config.is_file():
        raise ConfigError(f"RUN_DIR: {run_dir} has no config.json; expected the run directory "
                          f"of a `hetsync launch` or `worker`")
    print(f"hetsync evaluate: {run_dir} at {priority}"
          f"{', until the run ends' if args.follow else ''}", file=sys.stderr, flush=True)
    count = follow(run_dir, until_end=args.follow, start_after=args.start_after)
    print(f"hetsync evaluate: {count} snapshot(s) evaluated into {RunDir(run_dir).eval}",
          file=sys.stderr, flush=True)
    return 0


def cmd_models(args) -> int:
    import torch

    from hetsync.models import MODEL_NAMES, build_model, count_parameters, get_spec

    print(f"{'model':<14} {'params (1x28x28)':>17} {'params (3x32x32)':>17}")
    for name in MODEL_NAMES:
        if get_spec(name).inputs == "tokens":
            torch.manual_seed(0)
            n = count_parameters(build_model(name, (64,), 85))
            print(f"{name:<14} {'text':>17} {'text':>17}  {n:,} (Shakespeare: 85 symbols, "
                  f"context 64)")
            continue
        counts = []
        for shape in ((1, 28, 28), (3, 32, 32)):
            torch.manual_seed(0)
            counts.append(count_parameters(build_model(name, shape, 10)))
        print(f"{name:<14} {counts[0]:>17,} {counts[1]:>17,}")
    return 0


def build_parser(mode: str | None = None) -> argparse.ArgumentParser:
    """The command line; `mode`: the one it names (`chosen_mode`), whose own defaults the
    mode options' help shows (`hetsync launch -m diloco --help`)."""
    parser = ArgumentParser(
        prog="hetsync", description="Data-parallel training on heterogeneous clusters: "
        "ESync and the schemes it is measured against.")
    parser.add_argument("--version", action="version", version=f"hetsync {hetsync.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("launch", help="run a whole cluster on this machine (the main job)",
                       usage="hetsync launch [-m MODE] [--workers N] [--slowdowns F1,F2,...] "
                       "[--clock {wall,virtual}] [--time-budget S] [FLAG ...]",
                       description="Start the mode's service and the parameter server if it "
                       "needs them, and N workers on this machine; show progress; summarise.")
    add_config_arguments(p, LAUNCH_DEFAULTS, mode=mode, shown={"mode": _recipes_shown()})
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.add_argument("--no-figures", action="store_true", help="do not draw the figures")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue that run from its last "
                   "checkpoint (its config; flags given override it, e.g. --time-budget)")
    p.add_argument("--no-live", action="store_true",
                   help="do not serve the run's live page (on loopback, a free port)")
    p.add_argument("--max-restarts", type=parse_restarts, default=3,
                   help="a run stopped by a lost worker (a mode that cannot go on without "
                   "it) is resumed from its last checkpoint, or started again from its start "
                   "before its first, up to N times (0: it stops and says how to resume); where the mode goes on without it, a lost worker is "
                   "started again up to N times and joins the running job (default: 3)")
    p.add_argument("--no-rejoin", action="store_true",
                   help=f"a lost worker is not started again to join the running job "
                   f"({admitting_modes()}): the run goes on without it")
    p.set_defaults(func=cmd_launch)

    p = sub.add_parser("worker", help="one worker (what launch and torchrun start)",
                       usage="hetsync worker [-m MODE] [--workers N] [FLAG ...] (under torchrun "
                       "for a cluster)",
                       description="One process of a run. Reads RANK, WORLD_SIZE, MASTER_ADDR "
                       "and MASTER_PORT (torchrun's environment); alone it trains -m local.")
    add_config_arguments(p, WORKER_DEFAULTS, mode=mode)
    p.add_argument("--config", help="a config.json to start from (flags given override it)")
    p.add_argument("--run-dir", help="write into this run directory (default: LOG_DIR/RUN_NAME)")
    p.add_argument("--no-figures", action="store_true", help="do not draw the figures")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue that run directory from its "
                   "last checkpoint (config: its config.json unless --config)")
    p.add_argument("--join", action="store_true",
                   help="this rank was lost, or is a spare (--spare-workers): join the job "
                   f"running in --run-dir at a round's end, from the global model "
                   f"({admitting_modes()})")
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser("state-server", help="ESync's state server (HTTP/JSON)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback)")
    p.add_argument("--port", "-port", type=parse_listen_port, default=10010,
                   help="TCP port, 1..65535, or 0 for any free one (default: 10010)")
    p.add_argument("--workers", type=parse_workers, default=4,
                   help="number of workers (default: 4)")
    p.add_argument("--token", default=None,
                   help="shared secret every request must carry (default: $HETSYNC_TOKEN); "
                        "required when --host is not a loopback address")
    p.add_argument("--epsilon", type=parse_epsilon_fraction, default=None,
                   help="readiness margin as a fraction in (-1, 1) of the caller's step time, "
                        "or auto (default; the first worker's /init overrides it)")
    p.add_argument("--instance", type=parse_instance, default=None,
                   help="an id /healthz answers with, by which a launcher knows its own server")
    p.set_defaults(func=cmd_state_server)

    p = sub.add_parser("summarize", help="compute a run's figures into summary.json")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    p.add_argument("--targets", type=parse_target, nargs="+", default=None,
                   help="targets of the run's figure of merit for time-to-target: accuracies "
                        "in (0, 1], or validation losses for language modelling (default: "
                        "0.7 0.8 0.85 0.9; losses 2.2 2.0 1.9 1.8)")
    p.add_argument("--esync-json", action="store_true",
                   help="also write ESync's original summary schema")
    p.set_defaults(func=cmd_summarize)

    p = sub.add_parser("gather", help="one run's records from several machines into one "
                       "directory, then its summary",
                       description="Copy the records of one run, written by several machines "
                       "under torchrun (each its own workers'), into DEST; refuses records of "
                       "different runs or a file that differs between sources.")
    p.add_argument("dest", metavar="DEST")
    p.add_argument("sources", nargs="+", metavar="SOURCE_DIR")
    p.set_defaults(func=cmd_gather)

    p = sub.add_parser("plot", help="draw the figures comparing runs")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    p.add_argument("-o", "--output", required=True, help="directory for the PNGs")
    p.add_argument("--sequential", help="a -m local run, drawn dashed as sequential SGD")
    p.add_argument("--target", type=parse_target, default=None,
                   help="target of the runs' figure of merit for the speedup figure: an "
                        "accuracy in (0, 1] (default 0.8) or a validation loss (default 2.0)")
    p.set_defaults(func=cmd_plot)

    p = sub.add_parser("bench", help="compare modes side by side (or `bench comm`)",
                       add_help=False)
    p.add_argument("what", nargs="?", choices=("modes", "comm", "state"), default="modes")
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("probe", help="measure the devices and links of a cluster (under "
                       "torchrun, or --workers N here) into a profile for --profile",
                       description="Time each rank's device at a few batch sizes and the "
                       "links between the ranks, for the model given; write a profile "
                       "(JSON) that --clock virtual runs on, and print it.")
    from hetsync.bench.probe import add_arguments as add_probe_arguments

    add_probe_arguments(p)
    p.set_defaults(func=cmd_probe)

    p = sub.add_parser("advise", help="which devices of a profile, which scheme: candidates "
                       "ranked on the virtual clock",
                       description="On the devices and links of PROFILE (hetsync probe's), "
                       "train the candidate schemes on subsets of the devices and the fastest "
                       "device alone for a short virtual budget each, rank them by predicted "
                       "time to the target, draw their curves and write the winner's settings.")
    from hetsync.bench.advise import add_arguments as add_advise_arguments

    add_advise_arguments(p)
    p.set_defaults(func=cmd_advise)

    p = sub.add_parser("evaluate", help="evaluate a run's deferred snapshots into its "
                       "eval.jsonl (launch runs this beside the workers)",
                       description="Evaluate the snapshots of the global model that a run "
                       "with deferred evaluation wrote (RUN_DIR/snapshots/), in order, into "
                       "RUN_DIR/eval.jsonl, at the lowest CPU priority. With --follow, as "
                       "they are written, until the run has ended (a run started with "
                       "--evaluator 1 leaves them to it).")
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--follow", action="store_true",
                   help="keep evaluating new snapshots until the run has ended")
    p.add_argument("--start-after", type=float, default=None, metavar="EPOCH_S",
                   help="with --follow (launch's): first wait, at most --timeout, until the "
                        "run's rank 0 has written run.json after this time (seconds since the "
                        "epoch): a resumed run's first cuts eval.jsonl back to its checkpoint")
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("models", help="list the model zoo")
    p.set_defaults(func=cmd_models)
    return parser


def _import_plugins(argv: list[str]) -> None:
    from hetsync.algorithms import registry
    from hetsync.options import NAMED_PARSERS

    for i, arg in enumerate(argv):
        if arg == "--plugin" and i + 1 < len(argv):
            registry.import_plugins(NAMED_PARSERS["names"](argv[i + 1]))
        elif arg.startswith("--plugin="):
            registry.import_plugins(NAMED_PARSERS["names"](arg.split("=", 1)[1]))
    check_option_flags()


def main(argv: list[str] | None = None) -> int:
    from hetsync.data import DataFormatError, DataNotFoundError

    argv = sys.argv[1:] if argv is None else argv
    try:  # modes registered by a plugin have option flags of their own: import it first
        _import_plugins(argv)
    except ValueError as err:
        print(f"hetsync: error: --plugin: {err}", file=sys.stderr)
        return 2
    if argv[:1] == ["bench"] and argv[1:2] not in (["modes"], ["comm"], ["state"]):
        argv = ["bench", "modes", *argv[1:]]  # `hetsync bench --modes ...` means the modes bench
    args = build_parser(chosen_mode(argv)).parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, DataNotFoundError, DataFormatError) as err:
        print(f"hetsync {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except FloatingPointError as err:
        from hetsync.runtime.training import DIVERGED_EXIT_CODE, Diverged

        if not isinstance(err, Diverged):
            raise
        print(f"hetsync {args.command}: error: {err}", file=sys.stderr)
        return DIVERGED_EXIT_CODE
    except Exception as err:  # known failures of a run: say what, not where
        from hetsync.runtime.launcher import LaunchError
        from hetsync.services import ServiceError
        from hetsync.serving import ServerConfigError
        from hetsync.telemetry.runlog import RunLogError

        from hetsync.runtime.checkpoint import CheckpointError

        if isinstance(err, (LaunchError, ServiceError, ServerConfigError, RunLogError,
                            CheckpointError, OSError)):
            print(f"hetsync {args.command}: error: {err}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    raise SystemExit(main())
