"""The virtual clock (`hetsync.clock`): real gradients, time from the device and network model.

What a user checks: a collective's modelled cost is the α-β formula of its message pattern; a
step costs its device's time and nothing sleeps; the workers' clocks meet at every blocking
collective at the latest one's time plus the collective's cost; overlapped communication
costs time only where it is waited for; and a run's records are the same, to the bit, run
after run and beside a CPU-heavy neighbour.
"""

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from hetsync.algorithms.base import CommContext, PhaseClock
from hetsync.clock import Link, VirtualClock, all_reduce_seconds, broadcast_seconds
from hetsync.config import Config
from hetsync.options import ConfigError
from hetsync.runtime.heterogeneity import RandomStraggler, StepTimer
from hetsync.runtime.launcher import launch

from distributed import run_ranks

LINK = Link(latency_s=20e-6, bandwidth_bps=10e9)


# ----------------------------------------------------------------------------- the model
def test_collective_costs_follow_their_message_patterns():
    S, beta = 4e6, LINK.bytes_per_s  # 4 MB
    ring = 2 * 3 * 20e-6 + 2 * 3 / 4 * S / beta
    assert all_reduce_seconds("ring", 4, S, LINK) == pytest.approx(ring)
    assert all_reduce_seconds("native", 4, S, LINK) == pytest.approx(ring)
    assert all_reduce_seconds("butterfly", 4, S, LINK) == pytest.approx(2 * (20e-6 + S / beta))
    # 6 workers fold onto 4: two more whole-vector hops
    assert all_reduce_seconds("butterfly", 6, S, LINK) == pytest.approx(4 * (20e-6 + S / beta))
    assert all_reduce_seconds("binary-blocks", 4, S, LINK) == pytest.approx(
        4 * 20e-6 + 2 * 3 / 4 * S / beta)
    assert all_reduce_seconds("star", 4, S, LINK) == pytest.approx(2 * 20e-6 + 6 * S / beta)
    # the parameter server, a rank of its own: 4 vectors in and 4 sums out through its link,
    # and its work on each byte of them
    assert all_reduce_seconds("ps", 4, S, LINK) == pytest.approx(2 * 20e-6 + 8 * S / beta)
    assert all_reduce_seconds("ps", 4, S, LINK, server_s_per_byte=1e-9) == pytest.approx(
        2 * 20e-6 + 8 * S / beta + 8 * S * 1e-9)
    assert broadcast_seconds(5, S, LINK) == pytest.approx(3 * (20e-6 + S / beta))
    assert all_reduce_seconds("ring", 1, S, LINK) == 0.0
    # 100x less bandwidth: the transfer term 100x, the latency the same
    slow = Link(latency_s=20e-6, bandwidth_bps=100e6)
    assert all_reduce_seconds("ring", 4, S, slow) == pytest.approx(
        6 * 20e-6 + 100 * (ring - 6 * 20e-6))
    with pytest.raises(ValueError, match="no cost for all-reduce 'gossip'"):
        all_reduce_seconds("gossip", 4, S, LINK)


def test_a_step_on_the_virtual_clock_costs_its_devices_time_and_never_sleeps():
    clock = VirtualClock(LINK)
    timer = StepTimer(4.0, work=0.5, clock=clock)
    real = time.perf_counter()
    for share in (1.0, 1.0, 0.5):  # a lost worker's smaller batch: its own samples' time
        timer.begin()
        timer.emulate(share)
    assert clock.now() == pytest.approx(4 * 0.5 * 2.5)
    assert time.perf_counter() - real < 1.0  # 5 s of device time, no sleep
    with pytest.raises(ValueError, match="--step-work"):
        StepTimer(2.0, clock=VirtualClock())


def test_jitter_and_stragglers_are_seeded_and_jitter_keeps_the_mean():
    def times(seed, jitter=0.3, straggler=None):
        clock = VirtualClock()
        timer = StepTimer(2.0, work=0.01, clock=clock, jitter=jitter, seed=seed,
                          straggler=straggler)
        out = []
        for _ in range(4000):
            start = clock.now()
            timer.begin()
            timer.emulate()
            out.append(clock.now() - start)
        return out

    a, b = times(1), times(1)
    assert a == b and a != times(2)
    assert sum(a) / len(a) == pytest.approx(0.02, rel=0.03)  # lognormal of mean 1
    assert min(a) < 0.015 < 0.027 < max(a)
    late = times(0, jitter=0.0, straggler=RandomStraggler(0.25, 4.0, relative=True, seed=3))
    delayed = [t for t in late if t > 0.02 + 1e-12]
    assert all(t == pytest.approx(0.02 + 4 * 0.02) for t in delayed)
    assert 0.2 < len(delayed) / len(late) < 0.3


# ----------------------------------------------------------------------------- real gloo ranks
def _meet_and_sum(rank, world):
    clock = VirtualClock(LINK)
    comm = CommContext(rank=rank, workers=world, clock=PhaseClock(clock))
    clock.spend(0.1 * (rank + 1))  # rank 2 is the last to arrive, at 0.3 s
    x = torch.arange(1000, dtype=torch.float32) * (rank + 1)
    expected = x.clone()
    dist.all_reduce(expected)
    summed = comm.all_reduce(x.clone())
    torch.testing.assert_close(summed, expected)
    after_sum = clock.now()
    phases = comm.clock.take()
    # overlapped: a background sum sent at different times on each clock
    clock.spend(0.05 * (world - rank))  # now rank 0 is the last to submit
    sent = clock.now()
    from hetsync.comm.channel import Channel

    comm.channel = Channel.for_ranks(list(range(world)))
    future = comm.start_all_reduce(x.clone(), "a background sum")
    end = after_sum + 0.05 * world + all_reduce_seconds("native", world, 4000, LINK)
    early = future.done()  # this worker's clock has not reached the sum's end
    clock.spend(end - clock.now() + 1e-9)
    late = future.done()
    background = future.result()  # already done: waiting for it moves the clock no further
    comm.channel.close()
    return (after_sum, phases, sent, early, late, clock.now(), end,
            torch.equal(background, expected))


def test_the_workers_clocks_meet_at_a_blocking_sum_and_a_background_one_costs_only_its_wait():
    results = run_ranks(_meet_and_sum, 3)
    cost = all_reduce_seconds("native", 3, 4000, LINK)
    for rank, (after_sum, phases, sent, early, late, now, end, same) in enumerate(results):
        assert after_sum == pytest.approx(0.3 + cost, abs=1e-12)  # the last, plus the sum
        assert phases["comm"] == pytest.approx(0.3 - 0.1 * (rank + 1) + cost, abs=1e-12)
        assert end == pytest.approx(after_sum + 0.15 + cost)
        # not done until this worker's clock passes the end, whoever submitted last
        assert sent < end and early is False and late is True
        assert now == pytest.approx(end, abs=1e-8)
        assert same


class _OrderRule:
    """Records the order of the pushes it applies; w += update."""

    def __init__(self):
        self.w, self.order = torch.zeros(4), []

    def pull(self, worker):
        return self.w.clone()

    def push(self, worker, update):
        self.w += update
        self.order.append(worker)
        return self.w.clone()


def _pushes_in_virtual_order(rank, world, work_s_per_byte=0.0):
    from hetsync.comm import ParameterServer, PSClient

    server = world - 1
    if rank == server:
        rule = _OrderRule()
        ParameterServer(list(range(server)), rule, timeout=30, link=LINK,
                        work_s_per_byte=work_s_per_byte).serve()
        return rule.order
    clock = VirtualClock(LINK)
    with PSClient(server, timeout=30) as ps:
        ps.clock = clock
        # virtual: rank 1 first (0.1 s), then 2 (0.2 s), then 0 (0.3 s); real: the reverse,
        # rank 1 pushing last of all
        clock.spend({0: 0.3, 1: 0.1, 2: 0.2}[rank])
        time.sleep({0: 0.0, 1: 0.6, 2: 0.3}[rank])
        sent = clock.now()
        ps.push_pull(torch.ones(4))
        return sent, clock.now()


def test_the_parameter_server_serves_pushes_in_the_order_of_the_virtual_clock():
    *workers, order = run_ranks(_pushes_in_virtual_order, 4)
    assert order == [1, 2, 0]
    message = LINK.message_seconds(112 + 16) - LINK.latency_s  # header + 4 floats, no α
    for sent, back in workers:
        # in: α, then the bytes through the server's link; out: the reply's bytes, then α
        assert back == pytest.approx(sent + 2 * (LINK.latency_s + message), rel=1e-9)


def test_the_parameter_servers_own_work_queues_the_pushes_on_the_virtual_clock():
    """0.15 s of server work per request (request and reply: 2 × 128 bytes): rank 1's push
    (sent at 0.1 s) is served at once, rank 2's (0.2 s) once rank 1's is done (0.25 s), rank
    0's (0.3 s) once rank 2's is (0.4 s); each reply leaves when its work is done."""
    *workers, order = run_ranks(_pushes_in_virtual_order, 4, 0.15 / 256)
    assert order == [1, 2, 0]
    message = LINK.message_seconds(112 + 16) - LINK.latency_s
    for (sent, back), done in zip(workers, (0.55, 0.25, 0.4)):
        assert back == pytest.approx(done + 2 * (LINK.latency_s + message), rel=1e-9)


def _a_push_held_behind_a_worker_that_dies(rank, world):
    from hetsync.comm import ParameterServer, PSClient

    server = world - 1
    if rank == server:
        return ParameterServer([0, 1], _OrderRule(), timeout=30, link=LINK).serve().lost
    clock = VirtualClock(LINK)
    with PSClient(server, timeout=30) as ps:
        ps.clock = clock
        if rank == 1:  # at 0 s on its clock it could still send first; it crashes instead
            time.sleep(0.5)
            os._exit(17)
        clock.spend(0.3)
        ps.push_pull(torch.ones(4))
        return clock.now()


def test_a_push_held_behind_a_worker_is_served_once_that_worker_is_lost():
    """Rank 0's push (0.3 s on its clock) waits for rank 1, whose clock says it could still
    send an earlier one, until rank 1's process dies: then it is served (not left waiting
    until its timeout for a request that will never come)."""
    back, died, lost = run_ranks(_a_push_held_behind_a_worker_that_dies, 3, allow_failures=True)
    assert isinstance(died, Exception) and lost == [1]
    assert isinstance(back, float) and back > 0.3, back


# ----------------------------------------------------------------------------- whole runs
VIRTUAL = dict(dataset="synthetic", network="mlp", workers=4, slowdowns=(1.0, 2.0, 4.0, 8.0),
               clock="virtual", step_work=0.01, time_budget=1.5, epochs=None,
               eval_interval=0.5, timeout=60.0, seed=3)


def _run(tmp_path: Path, name: str, **extra) -> Path:
    cfg = Config(log_dir=str(tmp_path), run_name=name, **{**VIRTUAL, **extra})
    return launch(cfg, show_progress=False, figures=False, stream=open(os.devnull, "w"))


def _records(run_dir: Path, name: str) -> list[dict]:
    return [json.loads(line) for line in (run_dir / name).read_text().splitlines()]


@pytest.mark.parametrize("collective,server_work", [("native", 0.0), ("ps", 0.01)])
def test_a_sync_run_on_the_virtual_clock_waits_for_the_slowest_device_each_round(
        tmp_path, collective, server_work):
    run_dir = _run(tmp_path, "sync", mode="sync", collective=collective,
                   server_work=server_work)
    records = {r: _records(run_dir, f"worker-{r}.jsonl") for r in range(4)}
    rounds = len(records[0])
    assert rounds >= 10 and all(len(records[r]) == rounds for r in range(4))
    # the slowest device waits for nobody: its sum costs its collective's formula for the
    # gradient, its sample weight, the share that sits out, a count and the loop's four-float
    # agreement that rides on it (over `ps`, the server's work of `server_work` s per MB on
    # each byte in and out too)
    cfg = Config(**VIRTUAL)
    numel = sum(p.numel() for p in cfg.build_model(cfg.load_data()).parameters())
    cost = all_reduce_seconds(collective, 4, (numel + 3 + 4) * 4, LINK, server_work / 1e6)
    for k in range(rounds):
        ends = {records[r][k]["t_end"] for r in range(4)}
        assert max(ends) - min(ends) < 1e-9  # every worker leaves the sum together
        for r, factor in enumerate((1, 2, 4, 8)):
            assert records[r][k]["compute_s"] == pytest.approx(factor * 0.01, abs=1e-9)
        assert records[3][k]["comm_s"] == pytest.approx(cost, abs=1e-12)
        # the fastest waits 7 of the slowest's 8 steps' time inside the sum
        assert records[0][k]["comm_s"] == pytest.approx(0.07 + cost, abs=1e-9)
    assert records[0][-1]["t_end"] == pytest.approx(rounds * (0.08 + cost), abs=1e-6)
    run = json.loads((run_dir / "run.json").read_text())
    assert run["clock"]["kind"] == "virtual" and run["clock"]["real_s"] > 0
    assert run["train_time"] >= 1.5  # the budget is virtual seconds


@pytest.mark.parametrize("mode", ["ddp", pytest.param("post-local-sgd", marks=pytest.mark.slow)])
def test_pytorchs_own_schemes_run_unchanged_and_their_sums_cost_the_models_time(tmp_path, mode):
    """DDP's hook and PostLocalSGDOptimizer's average are PyTorch's code; the clock meets at
    the hook's barrier (the fast device waits out the slow one's step) and prices each sum."""
    two = dict(workers=2, slowdowns=(1.0, 2.0))
    first, second = (_run(tmp_path, name, mode=mode, **two) for name in ("first", "second"))
    for r in (0, 1):
        name = f"worker-{r}.jsonl"
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    fast, slow = (_records(first, f"worker-{r}.jsonl")[2:] for r in (0, 1))
    assert len(fast) >= 5 and len(fast) == len(slow)
    for f, w in zip(fast, slow):
        steps = f["local_steps"]  # (post-local SGD: K local steps a round; DDP: one)
        assert f["compute_s"] == pytest.approx(0.01 * steps) and \
            w["compute_s"] == pytest.approx(0.02 * steps)
        # the fast device waits out its peer's longer steps (both pay the barrier's cost)
        assert f["wait_s"] - w["wait_s"] == pytest.approx(0.01 * steps, abs=1e-9)
        assert f["t_end"] == w["t_end"] and f["comm_s"] == pytest.approx(w["comm_s"])
    assert _records(first, "eval.jsonl")[-1]["test_acc"] > 0.3


def _twice_beside_a_busy_neighbour(tmp_path: Path, mode: str, **extra) -> Path:
    """Run `mode` twice, the second time beside a CPU-heavy process; assert the records are
    the same to the bit; the first run's directory."""
    first = _run(tmp_path, "first", mode=mode, **extra)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        second = _run(tmp_path, "second", mode=mode, **extra)
    finally:
        busy.kill()
        busy.wait()
    for name in ["eval.jsonl"] + [f"worker-{r}.jsonl" for r in range(4)]:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    # what the bits depend on besides the seed, for a reader comparing runs of two machines
    run = json.loads((first / "run.json").read_text())
    assert run["cpu_capability"] == torch.backends.cpu.get_cpu_capability(), run
    assert run["torch_threads"] >= 1 and run["torch_version"] == torch.__version__
    return first


# (the default tier: one run per transport, the background channel's and the state server's
# here; the rest in the slow one)
@pytest.mark.parametrize("mode,extra", [
    pytest.param("diloco", {}, marks=pytest.mark.slow),
    ("diloco", {"options": {"overlap": True}}),
    # ESync's plan from the state server, which holds a round's reports until all are in
    pytest.param("esync-outer", {}, marks=pytest.mark.slow),
    ("esync", {"options": {"overlap": False}, "step_jitter": 0.2})])
def test_a_virtual_run_is_the_same_to_the_bit_again_and_beside_a_busy_neighbour(
        tmp_path, mode, extra):
    first = _twice_beside_a_busy_neighbour(tmp_path, mode, **extra)
    evals = _records(first, "eval.jsonl")
    assert len(evals) >= 3 and evals[-1]["test_acc"] > 0.3
    assert "lag_s" not in evals[-1]  # (a real lag would differ from run to run)


def test_an_asynchronous_run_on_the_virtual_clock_trains_the_same_again(tmp_path):
    """ASGD's pushes in the virtual clock's order: the workers' records and the accuracies
    (with the samples seen at each, counted from the records) are the same twice, beside a
    busy neighbour."""
    first = _twice_beside_a_busy_neighbour(tmp_path, "async")
    evals = _records(first, "eval.jsonl")
    assert evals[-1]["test_acc"] > 0.3
    # the last evaluation is the leader's at the budget: each other worker's last push may
    # end after it (64 samples each)
    total = sum(r["samples"] for k in range(4) for r in _records(first, f"worker-{k}.jsonl"))
    assert total - 3 * 64 <= evals[-1]["samples_seen"] <= total
    # the fastest device pushes up to 8 times as often as the slowest (a push costs its
    # transfer besides its step: 0.75 ms of this model each way at 10 Gbit/s, beside 10 ms)
    pushes = [len(_records(first, f"worker-{r}.jsonl")) for r in (0, 3)]
    assert 6 <= pushes[0] / pushes[1] <= 8


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["eager-solo", "eager-majority"])
def test_eager_sgds_rounds_start_in_the_order_of_the_clocks(tmp_path, mode):
    """A partial round starts at the first arrival (solo) or its drawn initiator's
    (majority) on the workers' clocks; a gradient that arrives later joins a later round. The
    same twice, beside a busy neighbour; the fast device does not wait out the slow one."""
    first = _twice_beside_a_busy_neighbour(tmp_path, mode)
    fast, slow = (_records(first, f"worker-{r}.jsonl") for r in (0, 3))
    # solo: only every 33rd round waits for everyone; majority: for the initiator
    assert len(fast) / len(slow) >= (4 if mode == "eager-solo" else 1.5)
    # the slowest device's gradients arrive after rounds that started without them
    assert sum(r["staleness"] for r in slow) / len(slow) > 1
    assert _records(first, "eval.jsonl")[-1]["test_acc"] > 0.15


@pytest.mark.parametrize("args,needle", [
    ({"clock": "sundial"}, "--clock: invalid value 'sundial'; expected wall or virtual"),
    ({"clock": "virtual", "mode": "async", "epochs": 1.0},
     "unless it stops by --time-budget alone"),
    ({"clock": "virtual", "link_bandwidth": "fast"}, "--link-bandwidth: invalid value 'fast'"),
    ({"step_jitter": 0.2}, "--step-jitter: invalid value 0.2; expected 0 unless --clock "
                           "virtual"),
])
def test_bad_clock_options_are_one_line_naming_the_value(args, needle):
    with pytest.raises(ConfigError) as err:
        Config(**{**VIRTUAL, "clock": "wall", "slowdowns": (), **args}).validate()
    assert needle in str(err.value) and "\n" not in str(err.value)
