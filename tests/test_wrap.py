"""`hetsync.wrap` in a user's own loop: uneven data, the agreed stop, schedulers, GradScaler,
the servers it starts, and the one-line errors of its misuses — on real gloo processes."""

import difflib
import io
import json
import math
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

import hetsync
from hetsync.algorithms import registry
from hetsync.telemetry.plots import plot_runs
from hetsync.telemetry.summarize import summarize
from distributed import free_port, run_ranks

STEPS = (12, 24, 36)   # each rank's own number of batches: uneven on purpose
EVAL_S = 0.3           # an evaluation's time, mid-run


def _task(rank: int, steps: int):
    """A linear teacher's labels on 16 features; rank's own batches of 32."""
    g = torch.Generator().manual_seed(0)
    teacher = torch.randn(16, 4, generator=g)
    x_all = torch.randn(2048, 16, generator=g)
    y_all = (x_all @ teacher).argmax(1)
    shard = torch.randperm(2048, generator=torch.Generator().manual_seed(rank))[:32 * steps]
    return x_all, y_all, [(x_all[i], y_all[i]) for i in shard.split(32)]


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def _loss(model, x, y) -> float:
    with torch.no_grad():
        return float(torch.nn.functional.cross_entropy(model(x), y))


def _uneven(rank, world, mode, run_dir, collective="native"):
    torch.manual_seed(rank)   # different starting points: wrap makes them rank 0's
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    if hetsync.serve_parameters(optimizer, model, mode=mode, collective=collective,
                                run_dir=run_dir):
        return None
    x_all, y_all, loader = _task(rank, STEPS[rank])
    opt = hetsync.wrap(optimizer, model, mode=mode, timeout=60, run_dir=run_dir,
                       slowdown=1.0 + rank, collective=collective)
    start = _loss(model, x_all, y_all)
    schedule = torch.optim.lr_scheduler.StepLR(opt, step_size=15, gamma=0.7)
    for i, (x, y) in enumerate(loader):   # the README's own loop
        opt.set_epoch(i // 6)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step(loss=loss.detach())
        schedule.step()
        if i == 8:  # an evaluation mid-run, inside global_model() (every rank: SelSync's rule)
            with opt.global_model():
                time.sleep(EVAL_S)
                opt.record_evaluation(test_acc=0.5, test_loss=_loss(model, x_all, y_all))
        if i == 5:  # a checkpoint mid-run, as the README says to write one
            saved = io.BytesIO()
            torch.save(opt.state_dict(), saved)
            saved.seek(0)
            assert "hetsync" in torch.load(saved, weights_only=True)
    last_step = time.time()
    with opt.global_model():  # the end of this rank's epoch: the others are still training
        before_finish = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    opt.finish()
    opt.record_evaluation(test_acc=0.5, test_loss=_loss(model, x_all, y_all))  # rank 0's
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    with opt.global_model():  # what an evaluation after the stop sees: the model as left
        evaluated = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return {"start": start, "end": _loss(model, x_all, y_all), "params": params,
            "evaluated": evaluated, "before_finish": before_finish,
            "last_step": last_step, "finished": time.time(), "lr": opt.param_groups[0]["lr"]}


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::hetsync.telemetry.plots.PlotWarning")  # no sync run
@pytest.mark.parametrize("mode,collective", [
    ("sync", "native"), ("esync", "native"), ("selsync", "native"), ("async", "native"),
    ("eager-solo", "native"), ("sync", "ps"), ("esync", "ps"), ("diloco", "native"),
    ("async-local-sgd", "native"), ("fedbuff", "native")])
def test_uneven_shards_train_and_every_worker_ends_together_with_one_model(mode, collective,
                                                                          tmp_path):
    # a parameter server (async, or sums over `ps`) is one more process: the last rank
    world = 4 if registry.get(mode).parameter_server or collective == "ps" else 3
    run_dir = tmp_path / "run"
    results = [r for r in run_ranks(_uneven, world, mode, str(run_dir), collective,
                                    timeout=150) if r is not None]
    assert len(results) == 3
    last = max(r["last_step"] for r in results)   # rank 2's, with the most data
    for rank, r in enumerate(results):
        assert r["end"] < 0.6 * r["start"], (rank, r["start"], r["end"])
        # nobody left before the last worker's data ran out: they waited, taking part
        assert r["finished"] >= last
        torch.testing.assert_close(r["params"], results[0]["params"])
        torch.testing.assert_close(r["evaluated"], r["params"])
    if mode in ("sync", "selsync"):  # nothing moved after the last rank's evaluation
        torch.testing.assert_close(results[-1]["before_finish"], results[-1]["params"])
        # each rank's scheduler stepped its own batches' worth
        assert r["lr"] == pytest.approx(0.5 * 0.7 ** (STEPS[rank] // 15))
    # the run directory is what `hetsync summarize` and `plot` read
    summary = summarize(run_dir)
    assert summary["complete"] and summary["mode"] == mode
    for rank, w in enumerate(summary["per_worker"]):
        assert w["slowdown"] == 1.0 + rank
        assert w["samples"] == 32 * STEPS[rank]
        assert w["compute_s"] > 0
        records = [json.loads(line) for line in
                   (run_dir / f"worker-{rank}.jsonl").read_text().splitlines()]
        assert all(r["compute_s"] >= 0 for r in records), records   # evaluation is not compute
        trained = [r for r in records if r["local_steps"]]
        assert all(math.isfinite(r["loss"]) and r["loss"] > 0 for r in trained), trained
        assert max(r["epoch"] for r in records) == (STEPS[rank] - 1) // 6
    assert summary["utilisation"] <= 1.0, summary["utilisation"]
    mid, final = [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines()]
    # the evaluation under way when it was recorded is not training time
    assert mid["t"] - mid["train_time"] >= EVAL_S, mid
    assert final["train_time"] > mid["train_time"]
    if world == 4:  # the parameter server's traffic and losses
        ps = json.loads((run_dir / "ps.jsonl").read_text())
        assert ps["lost"] == [] and ps["refused"] == [] and ps["bytes_recv"] > 0
    assert plot_runs([run_dir], tmp_path / "figures")


def _evaluated_then_finished(rank, world, mode):
    torch.manual_seed(0)
    model = _model()
    opt = hetsync.wrap(torch.optim.SGD(model.parameters(), lr=0.5), model, mode=mode,
                       timeout=60)
    x_all, y_all, loader = _task(rank, 12)  # even data: every worker evaluates at its end
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    with opt.global_model():  # the documented evaluation, after the last epoch
        evaluated = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    opt.finish()
    return evaluated, torch.cat([p.detach().reshape(-1) for p in model.parameters()])


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "selsync"])
def test_finish_leaves_every_rank_with_the_model_its_last_evaluation_saw(mode):
    # (SelSync used to end with the last worker's own model, not the average it evaluated.
    # A local-step mode's last round is still being summed at that evaluation: finish()
    # applies it, and the uneven test above checks what global_model() shows after it.)
    results = run_ranks(_evaluated_then_finished, 3, mode, timeout=120)
    for evaluated, final in results:
        torch.testing.assert_close(final, results[0][1])
        torch.testing.assert_close(final, evaluated)


def _with_adamw(rank, world, mode):
    torch.manual_seed(0)
    model = _model()
    opt = hetsync.wrap(torch.optim.AdamW(model.parameters(), lr=0.01), model, mode=mode,
                       timeout=60)
    x_all, y_all, loader = _task(rank, 24)
    start = _loss(model, x_all, y_all)
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    steps = {int(v["step"]) for v in opt.state.values()}  # AdamW's own, across the rounds
    opt.finish()
    return start, _loss(model, x_all, y_all), steps, opt.round, torch.cat(
        [p.detach().reshape(-1) for p in model.parameters()])


def _rank_0_evaluates(rank, world):
    torch.manual_seed(0)
    model = _model()
    opt = hetsync.wrap(torch.optim.SGD(model.parameters(), lr=0.5), model, mode="selsync",
                       timeout=60, delta=0.0)   # (delta 0: every step votes to synchronise)
    _, _, loader = _task(rank, STEPS[rank])
    for i, (x, y) in enumerate(loader):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if rank == 0 and i in (3, len(loader) - 1):  # as a DDP script's rank-0 test
            with opt.global_model():
                pass
    opt.finish()
    if rank == 0:
        with opt.global_model():  # after finish(): alone, as the others have left
            after = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return params, after if rank == 0 else params


@pytest.mark.slow
def test_selsync_lets_one_worker_evaluate_at_its_own_steps_with_uneven_data():
    results = run_ranks(_rank_0_evaluates, 3, timeout=120)
    for params, evaluated in results:
        torch.testing.assert_close(params, results[0][0])
        torch.testing.assert_close(evaluated, params)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["esync", "esync-outer", "diloco"])
def test_a_local_step_mode_keeps_adamws_state_across_its_rounds(mode):
    results = run_ranks(_with_adamw, 2, mode, timeout=120)
    for start, end, steps, rounds, params in results:
        assert end < 0.7 * start, (start, end)
        assert steps == {24} and rounds > 1  # every step's moments, though the model was reset
        torch.testing.assert_close(params, results[0][4])


def _overflowing(rank, world):
    torch.manual_seed(0)
    model = _model()
    opt = hetsync.wrap(torch.optim.SGD(model.parameters(), lr=0.5), model, mode="sync",
                       collective="ring")
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    x_all, y_all, loader = _task(rank, 24)
    start = _loss(model, x_all, y_all)
    scales = []
    for i, (x, y) in enumerate(loader):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        if rank == 1 and i == 3:
            loss = loss * float("inf")   # this rank's gradients overflow, the others' do not
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
    opt.finish()
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return start, _loss(model, x_all, y_all), params, scales, opt.round


@pytest.mark.slow
def test_grad_scaler_with_one_rank_overflowing_keeps_every_worker_in_step():
    results = run_ranks(_overflowing, 2, timeout=90)
    (start0, end0, params0, scales0, rounds0), (_, end1, params1, scales1, rounds1) = results
    assert rounds0 == rounds1 == 1 + 24 + 1   # 24 steps and the round that ends all: none skipped
    torch.testing.assert_close(params0, params1)
    assert end0 < 0.6 * start0
    assert scales1[3] == 512.0 and scales0[3] == 1024.0   # only the overflowing rank backs off
    assert all(s == 1024.0 for s in scales0)


def test_the_wrapper_is_an_optimizer_that_schedulers_and_state_dicts_accept():
    model = _model()
    inner = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt = hetsync.wrap(inner, model, mode="sync")
    assert isinstance(opt, torch.optim.Optimizer)
    schedule = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    schedule.step()
    assert inner.param_groups[0]["lr"] == 0.05   # the rate the mode's update uses
    state = opt.state_dict()
    assert state["hetsync"]["mode"]["round"] == 2 and state["param_groups"][0]["lr"] == 0.05
    again = hetsync.wrap(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), model,
                         mode="sync")
    again.load_state_dict(state)
    assert again.round == 2 and again.param_groups[0]["lr"] == 0.05
    assert again.state_dict()["state"][0]["momentum_buffer"].norm() > 0
    opt.finish()
    with pytest.raises(RuntimeError, match="step\\(\\) after finish\\(\\)"):
        opt.step()


def test_sgd_momentum_under_an_outer_nesterov_step_is_warned_of_once(monkeypatch):
    """esync-outer's outer Nesterov (0.9 at global_lr 0.7) over SGD momentum 0.9: a round of
    one step moves up to 70x the rate (a 2-worker run of it stayed at chance)."""
    monkeypatch.setenv("WORLD_SIZE", "1")
    model = _model()
    with pytest.warns(UserWarning) as caught:
        hetsync.wrap(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), model,
                     mode="esync-outer").finish()
    (warning,) = [w for w in caught if "compounds" in str(w.message)]
    assert "momentum 0.9 compounds with its outer Nesterov momentum 0.9 at global_lr 0.7" in \
        str(warning.message) and "70x" in str(warning.message)
    assert warning.filename == __file__  # (it points at the user's line)
    with warnings.catch_warnings():  # no momentum, no outer momentum, or a rate that fits it
        warnings.simplefilter("error")
        for mode, momentum, options in (("esync-outer", 0.0, {}), ("esync", 0.9, {}),
                                        ("esync-outer", 0.9, {"outer_momentum": 0.0})):
            hetsync.wrap(torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum),
                         model, mode=mode, **options).finish()


def test_a_script_run_without_torchrun_is_told_it_trains_alone(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    model = _model()
    with pytest.warns(UserWarning, match="no process group and no WORLD_SIZE: this process "
                                         "trains alone"):
        opt = hetsync.wrap(torch.optim.SGD(model.parameters(), lr=0.1), model, mode="sync")
    opt.finish()
    monkeypatch.setenv("WORLD_SIZE", "1")  # torchrun --nproc-per-node 1: as asked, no word
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hetsync.wrap(torch.optim.SGD(model.parameters(), lr=0.1), model, mode="sync").finish()


@pytest.mark.parametrize("mode", ["sync", "esync-outer"])
def test_an_evaluation_before_finish_is_neither_compute_nor_training_time(mode, monkeypatch,
                                                                         tmp_path):
    monkeypatch.setenv("WORLD_SIZE", "1")
    model = _model()
    opt = hetsync.wrap(torch.optim.SGD(model.parameters(), lr=0.1), model, mode=mode,
                       run_dir=tmp_path / "run")
    _, _, loader = _task(0, 4)
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    with opt.global_model():  # after the last step, before finish(): no step follows it
        time.sleep(EVAL_S)
        opt.record_evaluation(test_acc=0.5)
    opt.finish()
    records = [json.loads(line) for line in
               (tmp_path / "run" / "worker-0.jsonl").read_text().splitlines()]
    assert all(r["compute_s"] >= 0 for r in records), records
    summary = summarize(tmp_path / "run")
    assert summary["utilisation"] <= 1.0, summary["utilisation"]
    evaluation = json.loads((tmp_path / "run" / "eval.jsonl").read_text())
    assert evaluation["t"] - evaluation["train_time"] >= EVAL_S, evaluation


def test_a_parameter_server_mode_refuses_an_optimizer_it_would_not_apply():
    model = _model()
    with pytest.raises(ValueError, match="Adadelta\\(lr=1.*cannot be applied there"):
        hetsync.wrap(torch.optim.Adadelta(model.parameters(), lr=1.0), model, mode="async")
    with pytest.raises(ValueError, match="momentum=0.9.*without momentum"):
        hetsync.wrap(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), model,
                     mode="dcasgd")


def test_a_state_server_that_is_not_up_is_named_at_construction():
    model = _model()
    port = free_port()
    began = time.monotonic()
    with pytest.raises(Exception, match=f"state server at 127.0.0.1:{port} did not answer"):
        hetsync.wrap(torch.optim.SGD(model.parameters(), lr=0.1), model, mode="esync",
                     service=("127.0.0.1", port), timeout=2)
    assert time.monotonic() - began < 30


def test_one_worker_esync_starts_its_own_state_server_and_trains():
    model = _model()
    opt = hetsync.wrap(torch.optim.SGD(model.parameters(), lr=0.5), model, mode="esync")
    x_all, y_all, loader = _task(0, 36)
    start = _loss(model, x_all, y_all)
    with opt:   # finish() at the end of the block
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    assert _loss(model, x_all, y_all) < 0.6 * start


def _ps_rank_wraps(rank, world):
    model = _model()
    if rank != 0:
        return None
    try:
        hetsync.wrap(torch.optim.SGD(model.parameters(), lr=0.1), model, mode="async",
                     ps_rank=0)
    except ValueError as err:
        return str(err)
    return None


@pytest.mark.slow
def test_the_parameter_servers_rank_is_told_to_serve_not_to_wrap():
    message = run_ranks(_ps_rank_wraps, 2, timeout=60)[0]
    assert "rank 0 is the parameter server: call hetsync.serve_parameters there" in message


def _scheduled_async(rank, world):
    torch.manual_seed(0)
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    if hetsync.serve_parameters(optimizer, model, mode="async"):
        return None
    opt = hetsync.wrap(optimizer, model, mode="async")
    schedule = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=1e-6)
    _, _, loader = _task(rank, 10)
    snapshots = [torch.cat([p.detach().reshape(-1) for p in model.parameters()])]
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        schedule.step()
        snapshots.append(torch.cat([p.detach().reshape(-1) for p in model.parameters()]))
    opt.finish()
    return snapshots


@pytest.mark.slow
def test_a_learning_rate_schedule_reaches_the_parameter_server():
    start, first, *_, last = run_ranks(_scheduled_async, 2, timeout=60)[0]
    # the server applied the first push at 0.5, the nine after it at 0.5e-6 and less
    assert (first - start).norm() > 1e-2
    assert (last - first).norm() < 1e-5 * (first - start).norm()


EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_the_example_differs_from_its_ddp_twin_in_a_few_lines():
    def code(name):  # the script less its docstring
        text = (EXAMPLES / name).read_text()
        return text[text.index('"""', 3) + 3:].splitlines()

    diff = [line for line in difflib.unified_diff(code("mnist_ddp.py"),
                                                  code("mnist_hetsync.py"), lineterm="", n=0)
            if line[:1] in "+-" and line[:3] not in ("+++", "---")]
    assert len([d for d in diff if d.startswith("-")]) <= 4, diff
    assert len([d for d in diff if d.startswith("+")]) <= 8, diff
    assert "+    optimizer = hetsync.wrap(optimizer, model, mode=args.mode, log_dir=\"runs\")" \
        in diff


@pytest.mark.slow
def test_the_example_runs_under_torchrun_and_its_run_directory_summarises(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3",
         str(EXAMPLES / "mnist_hetsync.py"), "--mode", "async", "--subset", "3000"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Test set: Average loss" in out.stdout
    (run_dir,) = (tmp_path / "runs").glob("async-net-*")
    summary = summarize(run_dir)
    assert summary["complete"] and summary["workers"] == 2   # the third rank served
    assert summary["samples"] == 3000 and summary["evaluations"] == 1
    assert summary["final_accuracy"] > 0.3


def test_a_refused_run_dir_leaves_no_server_running(tmp_path):
    import threading

    (tmp_path / "run.json").write_text("{}")
    model = _model()
    before = threading.active_count()
    with pytest.raises(ValueError, match="holds a run already \\(run.json\\)"):
        hetsync.wrap(torch.optim.SGD(model.parameters(), lr=0.1), model, mode="esync",
                     run_dir=tmp_path)
    deadline = time.monotonic() + 5
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() <= before   # its state server's thread stopped


def _one_raises(rank, world, mode):
    torch.manual_seed(0)
    model = _model()
    try:
        with hetsync.wrap(torch.optim.SGD(model.parameters(), lr=0.1), model, mode=mode,
                          timeout=30) as opt:
            for i, (x, y) in enumerate(_task(rank, 10)[2]):
                if rank == 1 and i == 3:
                    raise ValueError("boom in the user's loop")
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
    except Exception as err:  # noqa: BLE001 - what the user would see
        return f"{type(err).__name__}: {err}"
    return "finished"


@pytest.mark.slow
def test_a_worker_that_fails_mid_run_is_named_with_its_cause_by_the_others():
    """DiLoCo's blocking rounds, which cannot go on without a worker: the other stops,
    naming it and why."""
    began = time.monotonic()
    waiting, failed = run_ranks(_one_raises, 2, "diloco", timeout=90)
    assert failed == "ValueError: boom in the user's loop"
    assert waiting.startswith("CommError: worker 0: round 1 could not complete: worker 1 "
                              "raised ValueError: boom in the user's loop"), waiting
    assert time.monotonic() - began < 60   # not the 30 s collective timeout twice over


@pytest.mark.slow
def test_a_worker_that_fails_mid_run_in_sync_is_lost_and_the_other_goes_on():
    """sync goes on without a worker whose loop raised, as without a killed one: the
    raising worker sees its own error, the other finishes alone."""
    waiting, failed = run_ranks(_one_raises, 2, "sync", timeout=90)
    assert failed == "ValueError: boom in the user's loop"
    assert waiting == "finished"


def _user_collectives(rank, world, mode):
    """A DDP user's habits around wrap: the loss averaged over the default group every 10
    steps where the workers step in lockstep, a barrier once every worker has finished(), and
    rank 0 "saves", then a barrier. hetsync's own traffic is on groups of its own."""
    import torch.distributed as dist

    torch.manual_seed(rank)
    model = _model()
    opt = hetsync.wrap(torch.optim.SGD(model.parameters(), lr=0.5), model, mode=mode,
                       timeout=30, slowdown=1.0 + rank)
    _, _, loader = _task(rank, 30)
    averaged = []
    for i, (x, y) in enumerate(loader):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if i % 10 == 9 and mode in LOCKSTEP:
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            averaged.append(float(mean) / world)
    opt.finish()
    dist.barrier()                      # the epoch's end
    mean = torch.tensor([float(loss)])
    dist.all_reduce(mean)
    averaged.append(float(mean) / world)
    dist.barrier()                      # rank 0 saves, the others wait for it
    return averaged, torch.cat([p.detach().reshape(-1) for p in model.parameters()])


#: modes whose workers take the same steps between synchronisations (DiLoCo: H each): a
#: collective every K steps meets every worker at the same step. In the others a fast worker
#: takes more steps per round, so one waiting in such a collective would hold back the
#: rounds the slow one waits on: there, collectives of your own come after finish().
LOCKSTEP = ("sync", "selsync", "diloco")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "esync", "esync-outer", "eager-solo", "selsync",
                                  "diloco"])
def test_the_users_own_collectives_on_the_default_group_work_beside_hetsync(mode):
    out = run_ranks(_user_collectives, 3, mode, timeout=120)
    averages = [a for a, _ in out]
    assert len(averages[0]) == (4 if mode in LOCKSTEP else 1)
    assert averages[0] == averages[1] == averages[2]
    for _, params in out[1:]:  # finish() left every rank with the same model
        torch.testing.assert_close(params, out[0][1])


def _one_dies(rank, world, run_dir):
    import os

    torch.manual_seed(0)
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    if hetsync.serve_parameters(optimizer, model, mode="async", run_dir=run_dir, timeout=30):
        return None
    x_all, y_all, loader = _task(rank, 40)
    opt = hetsync.wrap(optimizer, model, mode="async", run_dir=run_dir, timeout=30)
    start = _loss(model, x_all, y_all)
    for i, (x, y) in enumerate(loader):
        if rank == 1 and i == 5:
            os._exit(9)   # kill -9: no goodbye, no word in the store
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    began = time.monotonic()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt.finish()
    said = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    return time.monotonic() - began, said, opt.lost_workers, start, _loss(model, x_all, y_all)


@pytest.mark.slow
def test_an_asynchronous_run_ends_without_a_worker_that_died(tmp_path):
    """kill -9 of a worker in `async`: the server sees its connection close and tells the
    others, whose finish() returns with the server's model at once (not after the
    timeout), naming the lost worker; the records say so."""
    ended, died, served = run_ranks(_one_dies, 3, tmp_path, timeout=120, allow_failures=True)
    assert isinstance(died, RuntimeError) and "exit code 9" in str(died) and served is None
    took, said, lost, start, end = ended
    assert took < 30 and lost == [1]   # well within the 30 s timeout it would have waited
    assert any("worker 1 was lost" in s and "ends without it" in s for s in said), said
    assert end < start                 # it trained, and ended with a model
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["lost_workers"] == [1]
    assert json.loads((tmp_path / "ps.jsonl").read_text().splitlines()[-1])["lost"] == [1]


def _one_of_three_dies(rank, world, mode, run_dir, victim=1):
    import os

    torch.manual_seed(rank)
    model = _model()
    opt = hetsync.wrap(torch.optim.SGD(model.parameters(), lr=0.1), model, mode=mode,
                       run_dir=run_dir, timeout=30, slowdown=1.0 + rank)
    x_all, y_all, loader = _task(rank, 60)
    start = _loss(model, x_all, y_all)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i, (x, y) in enumerate(loader):
            if rank == victim and i == 10:
                os._exit(9)   # kill -9
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        opt.finish()
    said = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    end = _loss(model, x_all, y_all)
    opt.record_evaluation(0.5, end)  # (every survivor: the one that leads writes it)
    return (said, opt.lost_workers, opt.workers, start, end,
            torch.cat([p.detach().reshape(-1) for p in model.parameters()]))


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "esync-outer", "eager-solo"])
def test_a_wrapped_run_goes_on_without_a_worker_that_died(mode, tmp_path):
    """kill -9 of a worker under `wrap` in a mode whose workers go on without one (sync,
    ESync's background rounds, eager-SGD): the survivors regroup as under `launch`, name the lost
    worker, train on, and end with one model."""
    first, died, last = run_ranks(_one_of_three_dies, 3, mode, tmp_path, timeout=150,
                                  allow_failures=True)
    assert isinstance(died, RuntimeError) and "exit code 9" in str(died)
    assert isinstance(first, tuple) and isinstance(last, tuple), (first, last)
    for said, lost, workers, start, end, _ in (first, last):
        assert lost == [1] and workers == 2
        assert any("worker(s) 1 lost; the others go on" in s for s in said), said
        assert end < start
    torch.testing.assert_close(first[-1], last[-1])   # one model at the end
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["lost_workers"] == [1]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "esync-outer", "eager-solo"])
def test_a_wrapped_run_goes_on_without_rank_0_and_the_lowest_survivor_leads(mode, tmp_path):
    """kill -9 of rank 0 where the store is not in its process (torchrun's agent holds it):
    the others go on — in ESync without the state server that was rank 0's thread, on its
    last plan — and rank 1 leads: it writes the evaluation and run.json's end."""
    died, first, last = run_ranks(_one_of_three_dies, 3, mode, tmp_path, 0, timeout=150,
                                  allow_failures=True, agent_store=True)
    assert isinstance(died, RuntimeError) and "exit code 9" in str(died)
    assert isinstance(first, tuple) and isinstance(last, tuple), (first, last)
    for said, lost, workers, start, end, _ in (first, last):
        assert lost == [0] and workers == 2
        assert any("worker(s) 0 lost; the others go on" in s for s in said), said
        assert mode != "esync-outer" or any("the rounds follow its last plan" in s
                                            for s in said), said
        assert end < start
    torch.testing.assert_close(first[-1], last[-1])
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["lost_workers"] == [0] and run["end_time"] > run["start_time"]
    evals = [json.loads(line) for line in (tmp_path / "eval.jsonl").read_text().splitlines()]
    assert len(evals) == 1 and evals[0]["test_loss"] == pytest.approx(first[4])


def _balanced_step(rank, world, profile):
    """One `sync` step of batches balanced to `profile`; this rank's batch and the model."""
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4)
    opt = hetsync.wrap(torch.optim.SGD(model.parameters(), lr=0.5), model, mode="sync",
                       timeout=60, batch_size=8, profile=profile)
    x_all, y_all, _ = _task(0, 1)
    first = sum(_balanced_sizes(profile)[:rank])  # each rank's own samples, one after another
    x, y = x_all[first:first + opt.batch_size], y_all[first:first + opt.batch_size]
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()  # (the mean over its batch)
    opt.step()
    opt.finish()
    return opt.batch_size, [p.detach().clone() for p in model.parameters()]


def _balanced_sizes(profile) -> list[int]:
    return hetsync.clock.profile.load(profile).batches(8)


def test_batches_balanced_to_a_profile_count_every_sample_once_in_the_sum(tmp_path):
    """A profile of devices 1x and 2x slower per sample: batches 8 and 4, and `sync`'s sum
    weighs each worker's gradient by its share of the samples, so the step is the one of
    the mean loss over all 12 (a hand computation in this process)."""
    import hetsync.clock.profile  # noqa: F401 - (the helper above reads it)

    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({"format": "hetsync-profile", "version": 1, "devices": [
        {"step_s": 0.0, "sample_s": 0.001}, {"step_s": 0.0, "sample_s": 0.002}]}))
    (batch0, after), (batch1, other) = run_ranks(_balanced_step, 2, str(profile))
    assert (batch0, batch1) == (8, 4)
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4)
    x_all, y_all, _ = _task(0, 1)
    torch.nn.functional.cross_entropy(model(x_all[:12]), y_all[:12]).backward()
    with torch.no_grad():
        expected = [p - 0.5 * p.grad for p in model.parameters()]
    for got, theirs, want in zip(after, other, expected):
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(theirs, want)


def test_a_profile_for_another_cluster_or_a_mode_counting_workers_is_refused(tmp_path):
    three = tmp_path / "three.json"
    three.write_text(json.dumps({"devices": [{"step_s": 0.0, "sample_s": 0.001,
                                              "count": 3}]}))
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match=r"three.json': it has 3 device\(s\), one per "
                                         r"worker; this run has 1 workers"):
        hetsync.wrap(torch.optim.SGD(model.parameters(), lr=0.1), model, mode="sync",
                     batch_size=8, profile=str(three))
    with pytest.raises(ValueError, match="give batch_size= too"):
        hetsync.wrap(torch.optim.SGD(model.parameters(), lr=0.1), model, mode="sync",
                     profile=str(three))
    with pytest.raises(ValueError, match="batch_size=0: expected an integer >= 1"):
        hetsync.wrap(torch.optim.SGD(model.parameters(), lr=0.1), model, mode="sync",
                     batch_size=0)
    # (the rule alone: a run of two ranks on the profile, every rank's batch; the sample
    # weights follow from them, as the test above checks)
    from hetsync.distributed_optimizer import _balanced

    two = tmp_path / "two.json"
    two.write_text(json.dumps({"devices": [{"step_s": 0.0, "sample_s": 0.001},
                                           {"step_s": 0.0, "sample_s": 0.003}]}))
    assert _balanced(9, str(two), 2, registry.get("diloco")) == [9, 3]
    with pytest.raises(ValueError, match="mode 'async''s sums count workers, not samples"):
        _balanced(9, str(two), 2, registry.get("async"))


def _epochs_of_batches(rank, world, mode, run_dir, victim=None, epochs=2):
    """Two epochs of a loader drawn by hetsync's batch sampler (2,048 samples, batches of
    16); rank `victim` dies at its 10th batch of epoch 0. The batches each pass yielded. In
    a world of 4, rank 3 serves the parameters (`mode` one of the parameter-server's)."""
    import os

    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0 if world == 4 else rank)  # (a parameter server: the same model)
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if world == 4 and hetsync.serve_parameters(optimizer, model, mode=mode, run_dir=run_dir,
                                               timeout=30):
        return None
    opt = hetsync.wrap(optimizer, model, mode=mode, run_dir=run_dir, timeout=30,
                       slowdown=1.0 + rank)
    x_all, y_all, _ = _task(rank, 1)
    loader = DataLoader(TensorDataset(x_all, y_all),
                        batch_sampler=opt.batch_sampler(len(x_all), 16, seed=3))
    passes = []
    for epoch in range(epochs):
        passes.append(0)
        for i, (x, y) in enumerate(loader):
            if rank == victim and epoch == 0 and i == 10:
                os._exit(9)   # kill -9, mid-epoch
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            passes[-1] += len(x)
            if world == 4:  # (steps of 10 ms: the survivors' passes outlast the server's
                time.sleep(0.01)  # word of the loss, as a real model's steps would)
    opt.finish()
    return passes, len(loader), opt.lost_workers


def test_hetsyncs_batch_sampler_gives_each_worker_its_own_shard_once_an_epoch(tmp_path):
    """2 workers, no loss: each pass is one epoch of the worker's own shard (1,024 samples,
    64 batches of 16), and the ledger has every batch of both epochs drawn once."""
    results = run_ranks(_epochs_of_batches, 2, "esync-outer", tmp_path)
    for passes, batches, lost in results:
        assert passes == [1024, 1024] and batches == 64 and lost == []
    ledger = summarize(tmp_path)["ledger"]
    assert ledger["batches_twice"] == ledger["batches_skipped"] == 0, ledger
    for shard in ("0", "1"):
        led = ledger["per_worker"][shard]
        assert (led["epochs"], led["batches_left_in_last_epoch"]) == (2, 0), led


def test_the_batch_sampler_by_batch_ends_every_workers_epoch_together():
    """``partition="by-batch"`` (as `launch`'s): under batches of 64, 32 and 16, the shards of
    700 samples are 400, 200 and 100, disjoint and whole, so each worker's epoch is 7 batches
    — where equal shards give the fastest worker 4 batches and the slowest 15; an unknown
    partition is refused, naming the valid ones."""
    from hetsync.runtime.rounds import RoundAccount
    from hetsync.runtime.shard_batches import ShardBatchSampler

    def epoch_of(rank, partition):
        sampler = ShardBatchSampler(rank, 3, 700, [64, 32, 16], RoundAccount, shuffle=True,
                                    seed=3, partition=partition)
        return [i for batch in sampler for i in batch], len(sampler)

    by_batch = [epoch_of(rank, "by-batch") for rank in range(3)]
    assert [len(drawn) for drawn, _ in by_batch] == [400, 200, 100]
    assert [batches for _, batches in by_batch] == [7, 7, 7]
    assert len(set().union(*(drawn for drawn, _ in by_batch))) == 700
    assert [epoch_of(rank, "iid")[1] for rank in range(3)] == [4, 8, 15]
    with pytest.raises(ValueError, match=r"partition='shared': expected one of 'iid', "
                                         r"'by-batch'"):
        epoch_of(0, "shared")


def _passes(sampler, epochs: int) -> list[list[list[int]]]:
    out = []
    for epoch in epochs:
        sampler.set_epoch(epoch)
        out.append(list(sampler))
    return out


def test_the_batch_sampler_resumed_at_an_epoch_draws_what_the_run_drew_in_it(monkeypatch):
    """A script started again from its checkpoint at the end of epoch 1 (torchrun's
    restart) calls `set_epoch(2)`, as with a DistributedSampler: its next pass draws epoch
    2's batches, the same the run that was not stopped drew — not epoch 0's again; called
    every epoch, or with an epoch already passed, it changes nothing."""
    monkeypatch.setenv("WORLD_SIZE", "1")

    def sampler():
        model = _model()
        opt = hetsync.wrap(torch.optim.SGD(model.parameters(), lr=0.1), model, mode="sync")
        return opt.batch_sampler(256, 16, seed=3)

    whole = _passes(sampler(), range(4))
    assert all(len(p) == 16 for p in whole) and whole[2] != whole[0]
    assert _passes(sampler(), [2, 3]) == whole[2:]
    resumed = sampler()
    assert _passes(resumed, [2, 1]) == [whole[2], whole[3]]  # (1 passed: no going back)
    with pytest.raises(ValueError, match=r"set_epoch\(-1\): expected an int >= 0"):
        resumed.set_epoch(-1)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "esync-outer", "eager-solo", "async"])
def test_a_lost_workers_shard_is_drawn_by_a_survivor_under_wrap(mode, tmp_path):
    """kill -9 of rank 1 at its 10th batch of epoch 0, in a mode whose survivors go on
    (`async`: by the parameter server's rule, rank 3 serving): the survivor that holds its
    shard now (`shards.holder`: rank 2) draws the rest of it within its own passes, and the
    ledger has every batch of every shard, both epochs, drawn once — none skipped, none
    twice, none left."""
    server = mode == "async"
    first, died, last, *served = run_ranks(_epochs_of_batches, 4 if server else 3, mode,
                                           tmp_path, 1, timeout=150, allow_failures=True)
    assert isinstance(died, RuntimeError) and "exit code 9" in str(died)
    assert served == ([None] if server else [])
    assert isinstance(first, tuple) and isinstance(last, tuple), (first, last)
    assert first[2] == last[2] == [1]
    # rank 2 drew its own shard and rank 1's from where rank 1's records end (the passes
    # count the batches of the round the regroup dropped twice: they were drawn again)
    assert sum(first[0]) >= 682 * 2 and sum(last[0]) > 682 * 3, (first[0], last[0])
    ledger = summarize(tmp_path)["ledger"]
    assert ledger["batches_twice"] == ledger["batches_skipped"] == 0, ledger
    for shard in ("0", "1", "2"):
        led = ledger["per_worker"][shard]
        assert (led["epochs"], led["batches_left_in_last_epoch"]) == (2, 0), led
    assert ledger["per_worker"]["1"]["drawn_by"] == [1, 2]


#: a user's script that checkpoints at each epoch's end and resumes from it (torchrun
#: starts it again when a machine joins), drawing with hetsync's sampler; it prints each
#: epoch's batches. Its first process waits after epoch 0 for the second machine (so that
#: the join comes mid-run whatever the machine's speed): torchrun stops it to restart.
_RESUMING_SCRIPT = '''
import json, os, sys, time
import torch, torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset
import hetsync

mode, checkpoint, epochs = sys.argv[1], sys.argv[2], 4
torch.manual_seed(0)
dist.init_process_group("gloo")
g = torch.Generator().manual_seed(0)
x = torch.randn(2048, 16, generator=g)
y = (x @ torch.randn(16, 4, generator=g)).argmax(1)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
opt = hetsync.wrap(torch.optim.SGD(model.parameters(), lr=0.1), model, mode=mode, timeout=60)
start = 0
if os.path.exists(checkpoint):
    saved = torch.load(checkpoint, weights_only=True)
    model.load_state_dict(saved["model"])
    opt.load_state_dict(saved["optimizer"])
    start = saved["epoch"] + 1
sampler = opt.batch_sampler(len(x), 32, seed=1)
loader = DataLoader(TensorDataset(torch.arange(len(x)), x, y), batch_sampler=sampler)
for epoch in range(start, epochs):
    if epoch == 1 and opt.workers == 1:
        time.sleep(600)   # until the second machine joins: torchrun restarts this script
    sampler.set_epoch(epoch)
    drawn = []
    for i, xb, yb in loader:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        drawn += i.tolist()
    state = opt.state_dict()
    if opt.rank == 0:
        torch.save({"model": model.state_dict(), "optimizer": state, "epoch": epoch},
                   checkpoint + ".tmp")
        os.replace(checkpoint + ".tmp", checkpoint)
    print(json.dumps({"rank": opt.rank, "workers": opt.workers, "epoch": epoch,
                      "resumed_at": start, "drawn": drawn, "loss": loss.item()}), flush=True)
opt.finish()
dist.destroy_process_group()
'''


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "diloco"])
def test_a_machine_that_joins_a_wrapped_torchrun_job_trains_every_later_epoch_once(
        mode, tmp_path):
    """torchrun's way of taking in a machine (`--nnodes 1:2`): a second agent joins the
    running job, torchrun stops its worker and starts both at the new size, and the script
    resumes from its checkpoint at epoch 0's end (`opt.state_dict()`, `sampler.set_epoch`).
    Each later epoch is drawn by both workers, every sample once: none twice, none left.
    (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: with torch's default the joining agent waits
    forever for the new round's address, docs/own-loop.md.)"""
    import os

    script = tmp_path / "train.py"
    script.write_text(_RESUMING_SCRIPT)
    checkpoint = tmp_path / "checkpoint.pt"
    port = free_port()
    agent = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1:2",
             "--nproc-per-node", "1", "--rdzv-backend", "c10d",
             "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "join",
             "--rdzv-conf", "last_call_timeout=1", "--max-restarts", "0",
             "--monitor-interval", "1", str(script), mode, str(checkpoint)]
    env = {**os.environ, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    first = subprocess.Popen(agent, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not checkpoint.exists() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert checkpoint.exists(), first.communicate(timeout=10)
        second = subprocess.run(agent, cwd=tmp_path, env=env, capture_output=True, text=True,
                                timeout=180)
        out, err = first.communicate(timeout=60)
    finally:
        first.kill()
    assert first.returncode == 0 and second.returncode == 0, err[-3000:] + second.stderr[-3000:]
    epochs = [json.loads(line) for text in (out, second.stdout)
              for line in text.splitlines() if line.startswith("{")]
    alone = [e for e in epochs if e["workers"] == 1]
    assert [e["epoch"] for e in alone] == [0] and sorted(alone[0]["drawn"]) == list(range(2048))
    joined = [e for e in epochs if e["workers"] == 2]
    assert sorted((e["epoch"], e["rank"]) for e in joined) == [
        (epoch, rank) for epoch in (1, 2, 3) for rank in (0, 1)], epochs
    assert {e["resumed_at"] for e in joined} == {1}
    for epoch in (1, 2, 3):
        drawn = [i for e in joined if e["epoch"] == epoch for i in e["drawn"]]
        assert sorted(drawn) == list(range(2048)), epoch   # every sample once
    assert joined[-1]["loss"] < 0.5 * math.log(4)   # it trained (chance: log 4)
