"""A mode added from this file alone — one class and one registry entry — runs through
`hetsync launch` (a plugin of every worker process) and through `hetsync.wrap`."""

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from distributed import run_ranks
from tiny import batch, gathered_parameters, linear_net, user_loop
from hetsync.algorithms import Action, Mode, ModeSpec, Step, register, registry
from hetsync.algorithms.base import flatten, unflatten_into
from hetsync.cli import build_parser
from hetsync.config import Config, ConfigError, config_from_args
from hetsync.runtime.launcher import launch
from hetsync.telemetry.summarize import summarize

TOY = "toy-every-k"


@dataclass
class EveryKOptions:
    period: int = field(default=4, metadata={"flags": ("--toy-period",),
                                             "help": "steps between model averages"})


class PeriodicAveraging(Mode):
    """Local SGD steps; every K-th step, the mean of the workers' models."""

    name = TOY
    Options = EveryKOptions

    def setup(self) -> None:
        self.broadcast_model()
        self.steps = 0

    def decide(self, step: Step) -> Action:
        last = (self.steps + 1) % self.options.period == 0
        return Action.AVERAGE_MODELS if last else Action.LOCAL

    def apply(self, action: Action) -> None:
        self.optimizer.step()
        self.steps += 1
        if action is Action.AVERAGE_MODELS:
            mean = self.comm.all_reduce(flatten(self.parameters())) / self.comm.workers
            unflatten_into(mean, self.parameters())

    def state_dict(self) -> dict:
        return {**super().state_dict(), "steps": self.steps}  # the round's place, resumed

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.steps = int(state["steps"])


register(ModeSpec(TOY, PeriodicAveraging, "average the models every K steps",
                  options=EveryKOptions))


def test_the_toy_mode_is_registered_with_its_option_flag():
    assert TOY in registry.names()
    cfg = Config(mode=TOY, options={"period": 3})
    assert cfg.mode_options().period == 3 and not cfg.needs_ps
    with pytest.raises(ConfigError, match="--toy-period: is an option of mode toy-every-k"):
        config_from_args(build_parser().parse_args(["launch", "--toy-period", "3"]),
                         Config(mode="sync"))


def test_a_mode_option_may_not_take_a_flag_every_run_has():
    @dataclass
    class Clashing:
        seed: int = field(default=0, metadata={"flags": ("--seed",), "help": "mine"})

    with pytest.raises(ValueError, match="option flag --seed is one of every run's"):
        register(ModeSpec("clashing", PeriodicAveraging, "clashes", options=Clashing))
    assert "clashing" not in registry.names()


@pytest.mark.slow
def test_the_toy_mode_runs_through_launch(tmp_path, monkeypatch):
    tests = str(Path(__file__).parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [tests] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    cfg = Config(mode=TOY, plugins=("test_mode_registry",), options={"period": 3},
                 dataset="synthetic", network="mlp", workers=2, slowdowns=(1.0, 2.0),
                 epochs=None, time_budget=3.0, eval_interval=1.0, timeout=30.0, lr=0.1,
                 log_dir=str(tmp_path))
    run_dir = launch(cfg, show_progress=False, figures=False, stream=open(os.devnull, "w"))
    s = summarize(run_dir)
    assert s["complete"] and s["mode"] == TOY and s["final_accuracy"] > 0.5
    for rank in (0, 1):
        records = [json.loads(line) for line in
                   (run_dir / f"worker-{rank}.jsonl").read_text().splitlines()]
        assert all(r["local_steps"] == 3 for r in records)  # a round is K steps
        assert records[-1]["loss"] < 0.5 * records[0]["loss"]


def _wrapped_toy(rank, world):
    import hetsync

    torch.manual_seed(rank)  # different starting points: wrap makes them equal
    model = linear_net()
    opt = hetsync.wrap(torch.optim.SGD(model.parameters(), lr=0.1), model, mode=TOY, period=3)
    losses = user_loop(opt, model, *batch(rank, 32), steps=12)
    gathered, rounds = gathered_parameters(model, world), opt.round
    opt.finish()
    return losses, gathered, rounds


@pytest.mark.slow
def test_the_toy_mode_runs_through_wrap():
    for losses, gathered, rounds in run_ranks(_wrapped_toy, 2):
        assert rounds == 1 + 12 // 3
        assert losses[-1] < losses[0]
        torch.testing.assert_close(gathered[0], gathered[1])  # averaged after step 12


def test_wrap_under_torchrun_without_a_process_group_says_so(monkeypatch):
    """torchrun started 3 processes, the script forgot init_process_group: one clear error,
    not three unrelated models."""
    import hetsync

    monkeypatch.setenv("WORLD_SIZE", "3")
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match=r"WORLD_SIZE=3 but no process group.*init_process_group"):
        hetsync.wrap(torch.optim.SGD(model.parameters(), lr=0.1), model, mode="sync")


@pytest.mark.slow
def test_the_toy_mode_runs_through_the_bench(tmp_path, monkeypatch):
    from hetsync.cli import main

    tests = str(Path(__file__).parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [tests] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    results = tmp_path / "results"
    code = main(["bench", "--plugin", "test_mode_registry", "--modes", TOY, "--baselines", "",
                 "--reference", "", "--toy-period", "3", "--workers", "2", "--slowdowns", "1,2",
                 "-n", "mlp", "--dataset", "synthetic", "--time-budget", "3",
                 "--eval-interval", "1", "--timeout", "30", "--quiet", "--name", "toy",
                 "-ld", str(tmp_path / "runs"), "--results-dir", str(results)])
    assert code == 0
    (run,) = json.loads((results / "bench-toy.json").read_text())["runs"]
    assert run["label"] == TOY and run["summary"]["final_accuracy"] > 0.5
    records = [json.loads(line) for line in
               (Path(run["run_dir"]) / "worker-0.jsonl").read_text().splitlines()]
    assert all(r["local_steps"] == 3 for r in records)  # --toy-period reached the workers
