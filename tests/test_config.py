"""The run's options: common fields, each mode's own, flags built from their types."""

import argparse
import dataclasses
import re
import typing
from dataclasses import dataclass, field

import pytest

from hetsync.cli import build_parser, launch_config
from hetsync.command_line import config_from_args
from hetsync.reference import reference
from hetsync.config import Config
from hetsync.options import ConfigError, parser_for


def _launch(*argv) -> Config:
    return launch_config(build_parser().parse_args(["launch", *argv]))[0]


def test_a_modes_options_come_from_its_own_flags():
    cfg = _launch("-m", "esync", "-ll", "0.1", "-gl", "0.5", "--overlap", "0",
                  "--epsilon", "auto").validate()
    opts = cfg.mode_options()
    assert (opts.local_lr, opts.global_lr, opts.overlap, opts.epsilon) == (0.1, 0.5, False, None)
    cfg = _launch("-m", "async", "-dcasgd", "1", "--dcasgd-lambda", "0.1").validate()
    assert cfg.effective_mode == "dcasgd" and cfg.needs_ps and cfg.world_size == 5
    assert Config.from_dict(cfg.to_dict()) == cfg  # config.json keeps them


def test_a_modes_options_are_parsed_once_and_held_until_what_they_come_from_changes():
    cfg = _launch("-m", "esync-outer", "-gl", "0.5")
    opts = cfg.mode_options()
    assert cfg.validate().mode_options() is opts and cfg.effective_mode == "esync-outer"
    cfg.options["global_lr"] = 0.25
    assert cfg.mode_options() is not opts and cfg.mode_options().global_lr == 0.25
    assert cfg.mode_options().overlap
    cfg.partition = "class"  # esync-outer's defaults on non-IID data: blocking rounds
    assert not cfg.mode_options().overlap and cfg.mode_options() is cfg.mode_options()
    cfg.options["global_lr"] = "fast"  # a config file or the Python API can hold anything
    with pytest.raises(ConfigError, match="-gl/--global-lr"):
        cfg.mode_options()


def test_a_modes_options_take_numpy_numbers_as_pythons_own():
    import numpy as np

    from hetsync.algorithms import registry

    opts = registry.get("esync-outer").make_options(
        {"global_lr": np.float32(0.5), "max_local_steps": np.int64(3),
         "outer_momentum": np.float32(0.75)})
    assert (opts.global_lr, opts.max_local_steps, opts.outer_momentum) == (0.5, 3, 0.75)
    assert type(opts.global_lr) is float and type(opts.max_local_steps) is int
    with pytest.raises(ConfigError, match=r"--inner-steps: .*8\.5\)?; expected an integer"):
        registry.get("diloco").make_options({"inner_steps": np.float64(8.5)})


def test_esync_outer_runs_blocking_capped_rounds_on_non_iid_data_unless_told_otherwise():
    rounds = lambda *argv: (lambda o: (o.overlap, o.max_local_steps))(  # noqa: E731
        _launch("-m", "esync-outer", *argv).validate().mode_options())
    assert rounds() == (True, 0)  # i.i.d.: background sums, no limit
    assert rounds("--partition", "class") == (False, 4)
    assert rounds("-s", "1") == rounds("--partition", "dirichlet") == (False, 4)
    assert rounds("--partition", "shared") == (True, 0)
    assert rounds("--partition", "class", "--overlap", "1") == (True, 4)  # a flag wins
    assert rounds("--partition", "class", "--max-local-steps", "0") == (False, 0)
    assert rounds("-m", "esync", "--partition", "class") == (True, 0)  # as published
    cfg = _launch("-m", "esync-outer", "--partition", "class").validate()
    assert Config.from_dict(cfg.to_dict()).mode_options() == cfg.mode_options()


def test_balanced_batches_give_each_device_a_batch_in_proportion_to_its_speed():
    from hetsync.runtime.emulation import nominal_speed

    cfg = _launch("-m", "esync-outer", "--balanced-batches", "1", "--speed-scale", "2.5", "--cores", "8",
                  "--step-work", "0.004").validate()
    ranks = range(cfg.workers)
    assert [cfg.batch_of(r) for r in ranks] == [64, 32, 16, 8]  # slowdowns 1, 2, 4, 8
    # every device keeps its speed: each step takes as long as the fastest's
    for r in ranks:
        assert cfg.slowdown_of(r) * cfg.step_work_of(r) == pytest.approx(2.5 * 0.004)
        assert nominal_speed(cfg.batch_of(r), cfg.slowdown_of(r), cfg.step_work_of(r)) == \
            pytest.approx(nominal_speed(64, cfg.slowdown_of(r), 0.004))
    assert cfg.batches_per_step() == pytest.approx(1.875)  # (the bench's rate scaling)
    weights = [cfg.sample_weight_of(r) for r in ranks]
    assert sum(weights) == pytest.approx(cfg.workers)
    assert weights[0] / weights[3] == pytest.approx(8)
    assert cfg.mode_options().weighting == "samples"  # esync-outer counts samples too
    plain = _launch("-m", "esync-outer", "--speed-scale", "2.5", "--cores", "8", "--step-work", "0.004").validate()
    assert {(plain.batch_of(r), plain.sample_weight_of(r), plain.step_work_of(r))
            for r in ranks} == {(64, 1.0, 0.004)}
    assert plain.mode_options().weighting is None  # (esync-outer's own default: uniform)
    assert plain.batches_per_step() == 4
    odd = _launch("--balanced-batches", "1", "--slowdowns", "1,3", "--workers", "2",
                  "-b", "11").validate()
    assert [odd.batch_of(0), odd.batch_of(1)] == [11, 3]  # (3.67 rounded down: not slower)


def test_a_balanced_run_resumes_only_as_it_was_and_a_worker_needs_the_reference_step():
    from hetsync.cli import _check_resumable
    from hetsync.runtime.worker import run_process

    saved = _launch("--balanced-batches", "1").validate()
    _check_resumable(saved, _launch("--balanced-batches", "1", "--time-budget", "9"), "RUN")
    for argv, what in ((["--balanced-batches", "0"], "balanced-batches False differs"),
                       (["--balanced-batches", "1", "--slowdowns", "1,2,2,8"],
                        "slowdowns (1.0, 2.0, 2.0, 8.0) differs")):
        with pytest.raises(ConfigError, match=rf"--resume RUN: {re.escape(what)}"):
            _check_resumable(saved, _launch(*argv), "RUN")
    with pytest.raises(ConfigError, match="--balanced-batches: expected --step-work with it"):
        run_process(dataclasses.replace(saved, step_work=None))


def test_a_run_from_before_re_planned_batches_resumes_with_batches_planned_once(tmp_path):
    """Its checkpoints' data positions count batches: resumed, it does not re-plan (which
    draws and counts samples); a run that says its --replan-drift keeps it."""
    import json

    from hetsync.cli import _check_resumable, _resumed_config

    cfg = _launch("-m", "sync", "--balanced-batches", "1").validate()
    assert cfg.replans
    run = tmp_path / "run"
    run.mkdir()
    cfg.save(run / "config.json")
    assert _resumed_config(str(run)).replan_drift == cfg.replan_drift
    old = json.loads((run / "config.json").read_text())
    del old["replan_drift"]
    (run / "config.json").write_text(json.dumps(old))
    resumed = _resumed_config(str(run))
    assert resumed.replan_drift == 0 and not resumed.replans
    with pytest.raises(ConfigError, match="--resume RUN: replan-drift 0.5 differs"):
        _check_resumable(resumed, dataclasses.replace(resumed, replan_drift=0.5), "RUN")


def test_a_balanced_batch_larger_than_its_workers_share_names_the_largest_that_fits():
    from types import SimpleNamespace

    import torch

    cfg = _launch("--balanced-batches", "1", "--slowdowns", "1,2", "--workers", "2",
                  "-b", "40", "--partition", "iid").validate()
    split = SimpleNamespace(name="tiny", train=SimpleNamespace(labels=torch.zeros(60).long()))
    with pytest.raises(ConfigError, match=r"-b/--batch-size: invalid value 40; expected at "
                       r"most 30 with --balanced-batches 1: worker 0's batch of 40 is more "
                       r"than its share of tiny's training samples \(30\)"):
        cfg.validate_data(split)
    assert [len(s) for s in dataclasses.replace(cfg, batch_size=30).validate_data(split)] == \
        [30, 30]
    # shards sized by the batches: the fast worker's batch of 40 fits its share of 40
    by_batch = dataclasses.replace(cfg, partition="by-batch")
    assert [len(s) for s in by_batch.validate_data(split)] == [40, 20]


def test_sequential_sgd_on_the_demo_cluster_runs_on_its_fastest_device():
    cfg = _launch("-m", "local").validate()
    assert (cfg.workers, cfg.slowdowns) == (1, (1.0,))
    cfg = _launch("-m", "local", "--slowdowns", "4").validate()  # a flag wins
    assert (cfg.workers, cfg.slowdowns) == (1, (4.0,))


@pytest.mark.parametrize("argv, message", [
    (["-m", "sync", "-ll", "0.1"],
     "-ll/--local-lr: is an option of modes esync, esync-outer, not of -m sync"),
    (["-m", "esync", "-gl", "0"], "-gl/--global-lr: invalid value 0.0; expected a finite"),
    (["-m", "esync", "--epsilon", "3"], "--epsilon: invalid value 3.0; expected auto or a"),
    (["-m", "esync-outer", "--max-local-steps", "-1"], "--max-local-steps: invalid value -1; expected an integer"),
    (["-m", "dcasgd", "--dcasgd-lambda", "-1"], "--dcasgd-lambda: invalid value -1.0"),
    (["-m", "post-local-sgd", "--localsgd-period", "0"], "--localsgd-period: invalid value 0"),
    (["-m", "ddp", "--collective", "ring"], "--collective: invalid value 'ring'; expected "
                                            "native with -m ddp"),
    (["-m", "local", "--workers", "4"], "--workers: invalid value 4; expected at most 1 "
                                        "with -m local"),
    (["--plugin", "no_such_module_here"], "--plugin: plugin module 'no_such_module_here'"),
    (["-m", "ddp", "--workers", "1", "--slowdowns", "1"], "--workers: invalid value 1; "
                                                          "expected at least 2 with -m ddp"),
    (["--timeout", "inf"], "--timeout: invalid value inf; expected a finite number"),
    (["--eval-interval", "nan"], "--eval-interval: invalid value nan; expected a finite"),
    (["--straggle-prob", "1.5"], "--straggle-prob: invalid value 1.5; expected a probability"),
    (["--inject", "1"], "--inject: invalid value True; expected 0 unless --partition is class"),
    (["-m", "async", "--balanced-batches", "1"], "--balanced-batches: invalid value True; "
                                                 "expected 0 with -m async: it weighs each"),
    (["-m", "diloco", "--balanced-batches", "1", "--weighting", "uniform"],
     "--weighting: invalid value 'uniform'; expected samples with --balanced-batches 1"),
    (["--balanced-batches", "1", "--slowdowns", "", "--clock", "virtual"],
     "--balanced-batches: invalid value True; expected 0 without --slowdowns or --profile on "
     "the virtual clock"),
    (["--balanced-batches", "1", "--partition", "dirichlet"],
     "--balanced-batches: invalid value True; expected 0 on --partition dirichlet"),
    (["--balanced-batches", "1", "-b", "7"], "-b/--batch-size: invalid value 7; expected at "
                                             "least 8 with --balanced-batches 1"),
    (["-m", "ddp", "--spare-workers", "1"], "--spare-workers: invalid value 1; expected 0 "
                                            "with -m ddp: spares join the running job in"),
    (["--spare-workers", "3"], "--spare-workers: invalid value 3; expected an integer in 0..2 "
                               "(the run starts with at least two workers of --workers 4)"),
    (["-m", "esync-outer", "--spare-workers", "1", "--spare-start", "-1"], "--spare-start: invalid value -1.0"),
    (["-m", "selsync", "--selsync-aggregate", "models"], "--selsync-aggregate: invalid value "
                                                         "'models'; expected parameters or"),
    (["-m", "eager-solo", "--eager-divide", "all"], "--eager-divide: invalid value 'all'"),
])
def test_a_bad_mode_option_is_one_line_naming_the_flag(argv, message):
    with pytest.raises(ConfigError) as err:
        _launch(*argv).validate()
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_new_field_of_any_optional_type_gets_a_parser():
    @dataclass
    class Options:
        steps: int | None = field(default=None, metadata={"flags": ("--steps",)})
        rate: float = field(default=1.0, metadata={"flags": ("--rate",)})
        names: tuple[str, ...] = field(default=(), metadata={"flags": ("--names",)})

    hints = typing.get_type_hints(Options)
    parsers = {f.name: parser_for(f, hints) for f in dataclasses.fields(Options)}
    assert parsers["steps"]("12") == 12 and parsers["steps"]("none") is None
    assert parsers["rate"]("0.5") == 0.5 and parsers["names"]("a, b") == ("a", "b")
    with pytest.raises(ValueError):
        parsers["steps"]("twelve")

    @dataclass
    class Odd:
        when: complex = field(default=0j, metadata={"flags": ("--when",)})

    with pytest.raises(TypeError, match="no command-line parser for type"):
        parser_for(dataclasses.fields(Odd)[0], typing.get_type_hints(Odd))


def test_the_flag_reference_lists_common_and_mode_options():
    launch = reference().split("## `hetsync launch`")[1].split("## `hetsync worker`")[0]
    rows = dict(re.findall(r"^\| (.*?) \| (.*) \|$", launch, flags=re.M))
    assert "`-l`, `--learning-rate`" in rows and "`-ll`, `--local-lr`" in rows
    assert rows["`--dcasgd-lambda`"].startswith("[async, dcasgd]")
    assert isinstance(build_parser(), argparse.ArgumentParser)


def test_wrap_refuses_pytorchs_own_schemes_clearly():
    import torch

    import hetsync

    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="'ddp' is PyTorch's own scheme"):
        hetsync.wrap(torch.optim.SGD(model.parameters(), lr=0.1), model, mode="ddp")
    with pytest.raises(ValueError, match="'period' is not an option of mode sync"):
        hetsync.wrap(torch.optim.SGD(model.parameters(), lr=0.1), model, mode="sync", period=3)


def test_a_time_budget_given_alone_is_the_stopping_rule():
    from hetsync.cli import WORKER_DEFAULTS, build_parser

    args = build_parser().parse_args(["worker", "--time-budget", "60"])
    assert config_from_args(args, WORKER_DEFAULTS).epochs is None
    args = build_parser().parse_args(["worker", "--time-budget", "60", "--epochs", "2"])
    assert config_from_args(args, WORKER_DEFAULTS).epochs == 2
    args = build_parser().parse_args(["worker"])
    assert config_from_args(args, WORKER_DEFAULTS).epochs == 3


def test_launch_without_a_mode_runs_its_recipe_and_a_flag_given_wins(capsys, monkeypatch):
    """Bare `launch`: DiLoCo with 2 inner steps on balanced batches and shards sized by them
    (the benches' best on its cluster); -m given: that mode with its own defaults, none of
    the recipe's; each flag given wins over its part of the recipe."""
    cfg = _launch().validate()
    assert (cfg.mode, cfg.balanced_batches, cfg.mode_options().inner_steps) == ("diloco", True, 2)
    assert [cfg.batch_of(r) for r in range(cfg.workers)] == [64, 32, 16, 8]
    assert cfg.partition == "by-batch" and _launch("--partition", "iid").partition == "iid"
    cfg = _launch("-m", "diloco").validate()
    assert (cfg.balanced_batches, cfg.mode_options().inner_steps, cfg.partition) == \
        (False, 8, "iid")
    cfg = _launch("-m", "sync").validate()
    assert (cfg.mode, cfg.balanced_batches, cfg.options) == ("sync", False, {})
    cfg = _launch("--inner-steps", "4", "--balanced-batches", "0").validate()
    assert (cfg.mode, cfg.balanced_batches, cfg.mode_options().inner_steps) == ("diloco", False, 4)
    monkeypatch.setenv("COLUMNS", "1000")  # (a help line is not broken at a flag's hyphen)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["launch", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "(default: diloco --inner-steps 2 --balanced-batches 1 --partition by-batch; for a " \
           "text data set sync --balanced-batches 1)" in shown


@pytest.mark.parametrize("command", ["launch", "worker"])
def test_a_text_data_set_alone_trains_the_transformer_with_adamw(command):
    """`--dataset shakespeare` without -n/--optimizer/-l: gpt-char with AdamW at nanoGPT's
    rate, under torchrun's `worker` as under `launch`; a flag given wins."""
    from hetsync.cli import worker_config

    def config(*argv):
        args = build_parser().parse_args([command, "--dataset", "shakespeare", *argv])
        return (launch_config(args)[0] if command == "launch" else worker_config(args))

    cfg = config()
    assert (cfg.network, cfg.optimizer, cfg.lr) == ("gpt-char", "adamw", 0.003)
    if command == "launch":  # launch's text recipe: sync on balanced batches, unless asked
        assert (cfg.mode, cfg.balanced_batches) == ("sync", True)
        cfg = config("-m", "esync-outer")
        assert (cfg.mode, cfg.balanced_batches) == ("esync-outer", False)
        assert config("--balanced-batches", "0").balanced_batches is False
    cfg = config("--optimizer", "sgd", "-l", "0.2")
    assert (cfg.network, cfg.optimizer, cfg.lr) == ("gpt-char", "sgd", 0.2)
