"""A mode added from this file alone — one class and one registry entry — runs through
`hetsync launch` (a plugin of every worker process) and through `hetsync.wrap`; so does one
that declares a service of its own (`RunService`), which launch starts and wrap serves."""

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from distributed import run_ranks
from tiny import batch, gathered_parameters, linear_net, user_loop
from hetsync.algorithms import Action, Mode, ModeSpec, Step, register, registry
from hetsync.services import RunService
from hetsync.algorithms.base import flatten, unflatten_into
from hetsync.cli import build_parser, main
from hetsync.command_line import config_from_args
from hetsync.config import Config
from hetsync.options import ConfigError
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


COUNTED = "toy-counted"


def _tally_app(instance: str | None = None):
    """A service that counts the averages the workers tell it of."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    ticks = []

    async def tick(request):
        ticks.append((await request.json())["rank"])
        return JSONResponse({"ticks": len(ticks)})

    return Starlette(routes=[
        Route("/healthz", lambda r: JSONResponse({"instance": instance})),
        Route("/tick", tick, methods=["POST"]),
        Route("/status", lambda r: JSONResponse({"requests": len(ticks), "bytes_sent": 0,
                                                 "bytes_recv": 0, "ranks": sorted(set(ticks))}))])


def serve_tally(host: str, port: str, instance: str) -> None:
    """The tally as its own process (`launch`)."""
    from hetsync.serving import Service

    Service(_tally_app(instance), host, int(port)).serve_forever()


class TallyClient:
    def __init__(self, host, port, timeout, token):
        from hetsync.services import JsonClient

        self.http = JsonClient(host, port, timeout, token, what="tally")
        self.wait_until_up, self.post, self.close = (self.http.wait_until_up, self.http.post,
                                                     self.http.close)

    def traffic(self):
        return self.http.get("/status")


def _serve_in_thread(workers, host, token):
    from hetsync.serving import Service

    return Service(_tally_app(), host, 0).start()


TALLY = RunService(
    "tally", "tally", connect=TallyClient, serve=_serve_in_thread, restarts=1,
    command=lambda host, port, workers, options, instance: [
        sys.executable, "-c", "import sys, test_mode_registry as t; t.serve_tally(*sys.argv[1:])",
        host, str(port), instance])


class CountedAveraging(PeriodicAveraging):
    """PeriodicAveraging that tells its service of every average."""

    name = COUNTED

    def apply(self, action: Action) -> None:
        super().apply(action)
        if action is Action.AVERAGE_MODELS:
            self.comm.service.post("/tick", {"rank": self.comm.rank})


register(ModeSpec(COUNTED, CountedAveraging, "average every K steps, counted by a service",
                  options=EveryKOptions, service=TALLY))


def test_the_toy_mode_is_registered_with_its_option_flag():
    assert TOY in registry.names()
    cfg = Config(mode=TOY, options={"period": 3})
    assert cfg.mode_options().period == 3 and not cfg.needs_ps
    with pytest.raises(ConfigError, match="--toy-period: is an option of modes? toy-every-k"):
        config_from_args(build_parser().parse_args(["launch", "--toy-period", "3"]),
                         Config(mode="sync"))


def test_a_plugin_mode_option_may_not_take_a_flag_every_run_has(tmp_path, monkeypatch, capsys):
    (tmp_path / "clashing_plugin.py").write_text(
        "from dataclasses import dataclass, field\n"
        "from hetsync.algorithms import ModeSpec, register\n"
        "from test_mode_registry import PeriodicAveraging\n"
        "@dataclass\n"
        "class Clashing:\n"
        "    seed: int = field(default=0, metadata={'flags': ('--seed',), 'help': 'mine'})\n"
        "register(ModeSpec('clashing', PeriodicAveraging, 'clashes', options=Clashing))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))  # undone after
    assert main(["launch", "--plugin", "clashing_plugin", "-m", "clashing"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("hetsync: error: --plugin: mode 'clashing': option flag --seed is one of "
                   "every run's (hetsync.config.Config)")


def _on_path(monkeypatch) -> None:
    """Every process of the run imports this file as a plugin."""
    tests = str(Path(__file__).parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [tests] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))


def _launch_plugin(mode: str, tmp_path, monkeypatch) -> Path:
    """`mode` (period 3) launched on 2 workers, 1 and 2, for 3 s."""
    _on_path(monkeypatch)
    cfg = Config(mode=mode, plugins=("test_mode_registry",), options={"period": 3},
                 dataset="synthetic", network="mlp", workers=2, slowdowns=(1.0, 2.0),
                 epochs=None, time_budget=3.0, eval_interval=1.0, timeout=30.0, lr=0.1,
                 log_dir=str(tmp_path))
    return launch(cfg, show_progress=False, figures=False, stream=open(os.devnull, "w"))


@pytest.mark.slow
def test_the_toy_mode_runs_through_launch(tmp_path, monkeypatch):
    run_dir = _launch_plugin(TOY, tmp_path, monkeypatch)
    s = summarize(run_dir)
    assert s["complete"] and s["mode"] == TOY and s["final_accuracy"] > 0.5
    for rank in (0, 1):
        records = [json.loads(line) for line in
                   (run_dir / f"worker-{rank}.jsonl").read_text().splitlines()]
        assert all(r["local_steps"] == 3 for r in records)  # a round is K steps
        assert records[-1]["loss"] < 0.5 * records[0]["loss"]


@pytest.mark.slow
def test_a_mode_with_a_service_of_its_own_runs_through_launch(tmp_path, monkeypatch):
    """launch starts the service the mode declares, hands its workers its port, and the
    leader records its counts in service.json: no other file knows of it."""
    run_dir = _launch_plugin(COUNTED, tmp_path, monkeypatch)
    s = summarize(run_dir)
    assert s["complete"] and s["mode"] == COUNTED
    averages = sum(len((run_dir / f"worker-{r}.jsonl").read_text().splitlines())
                   for r in (0, 1))
    tally = json.loads((run_dir / "service.json").read_text())
    assert tally["service"] == "tally" and tally["ranks"] == [0, 1]
    assert s["service_requests"] == tally["requests"] >= averages - 2  # (the last, at the end)
    assert (run_dir / "logs" / "tally.log").exists()


def _wrapped_counted(rank, world):
    import hetsync

    model = linear_net()
    opt = hetsync.wrap(torch.optim.SGD(model.parameters(), lr=0.1), model, mode=COUNTED,
                       period=3)
    user_loop(opt, model, *batch(rank, 32), steps=12)
    told = opt.assembly.comm.service.traffic()
    opt.finish()
    return told


@pytest.mark.slow
def test_a_mode_with_a_service_of_its_own_runs_through_wrap():
    """wrap serves the declared service on a thread of rank 0; every worker talks to it."""
    for told in run_ranks(_wrapped_counted, 2):
        assert told["ranks"] == [0, 1] and told["requests"] >= 2 * (12 // 3) - 2


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

    _on_path(monkeypatch)
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


def test_a_modes_own_defaults_are_declared_once_and_its_help_shows_them():
    """A shared option a mode leaves None (its global rate) takes the mode's own default,
    declared once (`ModeSpec.defaults`): `hetsync launch -m diloco --help` shows it, the
    worker's global update reads the same dict, and the bench's note names it -- or the rate
    a run gives in its place."""
    import subprocess
    import sys

    from hetsync.algorithms import registry

    spec = registry.get("diloco")
    assert spec.worker.defaults is spec.defaults  # (the one dict the workers read)
    out = subprocess.run([sys.executable, "-m", "hetsync", "launch", "-m", "diloco", "--help"],
                         capture_output=True, text=True, check=True).stdout
    text = " ".join(out.split())
    assert f"(default: {spec.defaults['global_lr']:g} for diloco)" in text, text[-3000:]
    assert f"(default: {spec.defaults['outer_momentum']:g} for diloco)" in text
    assert spec.rate_note() == f"inner rate, outer {spec.defaults['global_lr']:g}"
    assert spec.rate_note(0.5) == "inner rate, outer 0.5"
    assert f"lr {spec.defaults['global_lr']:g}," in spec.summary


def test_going_on_and_admitting_are_capabilities_a_mode_opts_into():
    """A mode goes on without a lost worker, or takes one in, only where it opted in
    (`GoesOn`, `Admits`, as a module opts into torch's `Join`) and its options let it; one
    that opts in must say how (`rejoin`, `admit`), or it cannot be made."""
    from hetsync.algorithms.base import Admits, GoesOn, admits, goes_on

    def options(name, **changes):
        return registry.get(name).make_options(changes)

    assert [name for name in ("sync", "selsync", "esync-outer", "eager-solo", "async",
                              "diloco", "ddp", TOY)
            if goes_on(registry.get(name).worker, options(name))] == \
        ["sync", "selsync", "esync-outer", "eager-solo"]
    assert goes_on(registry.get("diloco").worker, options("diloco", overlap=True))
    assert not admits(registry.get("eager-solo").worker, options("eager-solo"))
    assert admits(registry.get("sync").worker, options("sync"))

    class Forgetful(Admits, PeriodicAveraging):  # opts in, says nothing of `admit`
        def rejoin(self) -> None:
            pass

    assert issubclass(Forgetful, GoesOn) and goes_on(Forgetful, EveryKOptions())
    with pytest.raises(TypeError, match="admit"):
        Forgetful(linear_net(), torch.optim.SGD(linear_net().parameters(), lr=0.1), None,
                  EveryKOptions())
