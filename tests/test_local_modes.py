"""DiLoCo, asynchronous local SGD and FedBuff: the parts they are built from, checked against
hand computations and, for DiLoCo, against torch.distributed's own all-reduce on real gloo
ranks."""

import math

import pytest
import torch
import torch.distributed as dist

from distributed import run_ranks
from tiny import SmallNet, batch, sample_weight
from hetsync.algorithms import Action, CommContext, Step
from hetsync.algorithms.async_local_sgd import DelayedNesterovRule
from hetsync.algorithms.async_rounds import dynamic_steps
from hetsync.algorithms.base import flatten, unflatten_into
from hetsync.algorithms.diloco import DiLoCo, DiLoCoOptions
from hetsync.algorithms.fedbuff import BufferedRule
from hetsync.algorithms.round_length import FixedSteps

LR = 0.1


def _diloco_run(rank, world, inner_steps, outer_lr, momentum, rounds, batches=None,
                held=None):
    """DiLoCo on real ranks, and beside it the same training computed by hand: plain SGD
    steps, torch.distributed.all_reduce of the deltas, torch.optim.SGD on their mean's
    negative (`batches`: each rank's batch, the deltas weighted by the samples behind them, as
    --balanced-batches runs it; `held`: the batch of a lost worker's shard that rank 1 draws
    at the first step of the first round, as the training loop does). Returns (DiLoCo's
    global weights, the hand's, the workers' models averaged after every step — synchronous
    model averaging) after `rounds` rounds."""
    group = dist.new_group(list(range(world)))
    torch.manual_seed(rank)  # different models: DiLoCo's setup must make them rank 0's
    model = SmallNet()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    batches = batches or [8] * world
    algo = DiLoCo(model, opt, CommContext(rank=rank, workers=world, group=group,
                                          sample_weight=sample_weight(batches, rank)),
                  DiLoCoOptions(inner_steps=inner_steps, global_lr=outer_lr,
                                outer_momentum=momentum,
                                weighting="samples" if len(set(batches)) > 1 else None))
    algo.setup()
    params = list(model.parameters())
    start = flatten(params).clone()
    hand = torch.nn.Parameter(start.clone())
    hand_outer = torch.optim.SGD([hand], lr=outer_lr, momentum=momentum,
                                 nesterov=momentum > 0)
    twin = SmallNet()  # plain SGD with every worker's model averaged after each step
    unflatten_into(start, list(twin.parameters()))
    twin_opt = torch.optim.SGD(twin.parameters(), lr=LR)
    own = batch(rank, batches[rank])
    for r in range(rounds):
        fast = SmallNet()
        unflatten_into(hand.detach(), list(fast.parameters()))
        fast.load_state_dict({**fast.state_dict(), **{k: v for k, v in model.state_dict().items()
                                                     if k.startswith("bn.")}})
        fast_opt = torch.optim.SGD(fast.parameters(), lr=LR)
        samples = 0
        for k in range(inner_steps):
            x, y = batch(world, held) if held and rank == 1 and r == k == 0 else own
            algo.batch_share, samples = len(y) / batches[rank], samples + len(y)
            for net, o in ((model, opt), (fast, fast_opt), (twin, twin_opt)):
                o.zero_grad()
                torch.nn.functional.cross_entropy(net(x), y).backward()
            algo.poll()
            action = algo.decide(Step(0.0, 0.01))
            assert (action is Action.AVERAGE_MODELS) == (k == inner_steps - 1)
            fast_opt.step()
            twin_opt.step()
            with torch.no_grad():
                averaged = flatten(list(twin.parameters()))
                dist.all_reduce(averaged, group=group)
                unflatten_into(averaged / world, list(twin.parameters()))
            algo.perform(action)
        delta = (flatten(list(fast.parameters())) - hand.detach()) * samples
        total = torch.tensor([float(samples)])
        dist.all_reduce(delta, group=group)
        dist.all_reduce(total, group=group)
        hand.grad = -delta / total
        hand_outer.step()
    with algo.global_model():
        ours = flatten(params).clone()
    algo.finish()
    return ours, hand.detach().clone(), flatten(list(twin.parameters())).clone()


@pytest.mark.slow
def test_diloco_with_one_inner_step_and_outer_sgd_at_rate_one_is_synchronous_averaging():
    for ours, hand, averaged in run_ranks(_diloco_run, 3, 1, 1.0, 0.0, 4):
        torch.testing.assert_close(ours, averaged)
        torch.testing.assert_close(ours, hand)


@pytest.mark.slow
@pytest.mark.parametrize("batches,held", [(None, None), ([8, 4, 2], None), ([8, 4, 2], 2)],
                         ids=["equal", "balanced", "balanced-holding"])
def test_diloco_is_h_inner_steps_then_nesterov_on_the_mean_delta(batches, held):
    """(balanced: each delta counts by its worker's samples; holding: rank 1's a batch of 2
    of a lost worker's shard among its batches of 4)"""
    results = run_ranks(_diloco_run, 3, 3, 0.7, 0.9, 3, batches, held)
    for ours, hand, _ in results:
        torch.testing.assert_close(ours, hand)
        torch.testing.assert_close(ours, results[0][0])  # one global model


def _overlapped_diloco(rank, world, **options):
    """DiLoCo with --overlap 1 and `options` on real ranks, set up from one model: (its
    background channel, the model, its SGD, the mode)."""
    from hetsync.comm.channel import Channel

    group = dist.new_group(list(range(world)))
    channel = Channel(dist.new_group(list(range(world))))
    torch.manual_seed(0)
    model = SmallNet()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    algo = DiLoCo(model, opt, CommContext(rank=rank, workers=world, group=group,
                                          channel=channel),
                  DiLoCoOptions(overlap=True, **options))
    algo.setup()
    return channel, model, opt, algo


def _round_beside(algo, mode_net, hand_net, data, inner_steps):
    """One round of `inner_steps`: the mode's steps on (model, optimizer) `mode_net` and plain
    SGD steps on `hand_net` beside them, on the same batch `data`; the round ends at the last."""
    (model, opt), (fast, fast_opt), (x, y) = mode_net, hand_net, data
    for k in range(inner_steps):
        for net, o in ((model, opt), (fast, fast_opt)):
            o.zero_grad()
            torch.nn.functional.cross_entropy(net(x), y).backward()
        action = algo.decide(Step(0.0, 0.01))
        assert (action is Action.AVERAGE_MODELS) == (k == inner_steps - 1)
        fast_opt.step()
        algo.perform(action)


def _overlapped_diloco_run(rank, world, inner_steps, rounds):
    """DiLoCo with --overlap 1 on real ranks, and beside it by hand: each round's mean delta
    is applied by torch.optim.SGD (Nesterov) at the end of the next round, the steps taken
    meanwhile kept on top of the new global weights, and the last one at `finish`. (The loop
    also `poll`s, which applies a sum as soon as it is in; without it each waits for the
    next round's end: the latest it can be applied.) Returns (DiLoCo's global weights, the
    hand's, this rank's local weights before `finish`)."""
    channel, model, opt, algo = _overlapped_diloco(rank, world, inner_steps=inner_steps)
    group = algo.comm.group
    params = list(model.parameters())
    hand = torch.nn.Parameter(flatten(params).clone())
    hand_outer = torch.optim.SGD([hand], lr=0.7, momentum=0.9, nesterov=True)
    fast = SmallNet()
    fast.load_state_dict(model.state_dict())
    fast_opt = torch.optim.SGD(fast.parameters(), lr=LR)
    x, y = batch(rank)
    pending = None  # (the mean delta in flight, the local weights sent with it)

    def settle_by_hand():
        mean, sent = pending
        hand.grad = -mean
        hand_outer.step()
        local = flatten(list(fast.parameters()))
        unflatten_into(hand.detach() + (local - sent), list(fast.parameters()))

    for r in range(rounds):
        _round_beside(algo, (model, opt), (fast, fast_opt), (x, y), inner_steps)
        if pending is not None:
            settle_by_hand()
        sent = flatten(list(fast.parameters())).clone()
        delta = sent - hand.detach()
        dist.all_reduce(delta, group=group)
        pending = delta / world, sent
    local = flatten(params).clone()
    algo.finish()
    settle_by_hand()
    ours = flatten(params).clone()
    channel.close()
    return ours, hand.detach().clone(), local


@pytest.mark.slow
def test_overlapped_diloco_applies_each_rounds_outer_step_one_round_late():
    results = run_ranks(_overlapped_diloco_run, 3, 2, 3)
    for ours, hand, _ in results:
        torch.testing.assert_close(ours, hand)
        torch.testing.assert_close(ours, results[0][0])  # one global model
    assert not torch.allclose(results[0][2], results[1][2])  # from workers' own models


def _eager_diloco_run(rank, world, inner_steps, rounds, outer_lr, momentum):
    """DiLoCo with --overlap 1 --eager-updates 1 on real ranks, and beside it by hand: at each
    round's end one torch.optim.SGD step on this rank's own delta ÷ P, plus the previous
    round's mean delta less the own part it already applied; the next round starts from the
    new global weights; `finish` applies the last mean less the own part. Returns (DiLoCo's
    global weights, the hand's)."""
    channel, model, opt, algo = _overlapped_diloco(
        rank, world, inner_steps=inner_steps, eager_updates=True, global_lr=outer_lr,
        outer_momentum=momentum)
    group = algo.comm.group
    params = list(model.parameters())
    hand = torch.nn.Parameter(flatten(params).clone())
    hand_outer = torch.optim.SGD([hand], lr=outer_lr, momentum=momentum, nesterov=momentum > 0)
    fast = SmallNet()
    fast.load_state_dict(model.state_dict())
    fast_opt = torch.optim.SGD(fast.parameters(), lr=LR)
    x, y = batch(rank)
    late = torch.zeros_like(hand)  # the mean in flight less this rank's part of it

    def outer_step_by_hand(update):
        hand.grad = -update
        hand_outer.step()

    for r in range(rounds):
        _round_beside(algo, (model, opt), (fast, fast_opt), (x, y), inner_steps)
        delta = flatten(list(fast.parameters())) - hand.detach()
        outer_step_by_hand(late + delta / world)
        unflatten_into(hand.detach(), list(fast.parameters()))
        mean = delta.clone()
        dist.all_reduce(mean, group=group)
        late = (mean - delta) / world
    algo.finish()
    outer_step_by_hand(late)
    ours = flatten(params).clone()
    channel.close()
    return ours, hand.detach().clone()


@pytest.mark.slow
def test_eager_diloco_applies_its_own_delta_at_once_and_the_others_a_round_late():
    results = run_ranks(_eager_diloco_run, 3, 2, 3, 0.7, 0.9)
    for ours, hand in results:
        torch.testing.assert_close(ours, hand)
    assert not torch.allclose(results[0][0], results[1][0])  # each rank's own part first


@pytest.mark.slow
def test_eager_updates_apply_every_rounds_mean_once_in_all():
    """With outer SGD at rate 1 (no momentum) the order does not matter: after `finish`
    every rank holds the same weights, the start plus every round's mean delta."""
    results = run_ranks(_eager_diloco_run, 3, 2, 3, 1.0, 0.0)
    for ours, hand in results:
        torch.testing.assert_close(ours, hand)  # (by hand: the start plus the means)
        torch.testing.assert_close(ours, results[0][0])


def _push(rule, worker, g, steps=4, step_time=0.01):
    return rule.push(worker, torch.cat([g, torch.tensor([float(steps), step_time])]))


def test_delayed_nesterov_by_hand():
    w0 = torch.linspace(-1, 1, 5)
    rule = DelayedNesterovRule(w0, lr=0.5, momentum=0.9, every=2, inner_steps=4,
                               dynamic=False)
    gs = [torch.full((5,), v) for v in (1.0, 3.0, -2.0, 4.0, 0.5)]
    w, m = w0.clone(), torch.zeros(5)
    for t, g in enumerate(gs, start=1):
        answer = _push(rule, t % 2, g)
        if t % 2 == 0:  # the momentum changes every 2nd arrival, by the mean of the two
            m = 0.9 * m + (gs[t - 2] + g) / 2
            w = w - 0.5 * (g / 2 + 0.9 * m)
        else:
            w = w - 0.5 / 2 * g
        torch.testing.assert_close(answer[:-1], w)
        assert answer[-1] == 4  # H, without DyLU


def test_delayed_nesterov_over_n_arrivals_is_one_nesterov_step_on_their_mean():
    g = torch.Generator().manual_seed(0)
    w0 = torch.randn(7, generator=g)
    rule = DelayedNesterovRule(w0, lr=0.7, momentum=0.9, every=3, inner_steps=8)
    ref = torch.nn.Parameter(w0.clone())
    sgd = torch.optim.SGD([ref], lr=0.7, momentum=0.9, nesterov=True)
    for _ in range(4):
        gs = [torch.randn(7, generator=g) for _ in range(3)]
        for worker, pseudo in enumerate(gs):
            answer = _push(rule, worker, pseudo)
        ref.grad = sum(gs) / 3
        sgd.step()
        torch.testing.assert_close(answer[:-1], ref.detach())


def test_dynamic_local_updates_give_each_worker_steps_in_proportion_to_its_speed():
    times = {0: 0.010, 1: 0.021, 2: 0.039, 3: 0.082}
    assert [dynamic_steps(8, times, w) for w in range(4)] == [8, 4, 2, 1]
    assert dynamic_steps(8, {0: 0.01}, 5) == 8  # not reported yet: H
    assert dynamic_steps(8, {0: 0.01, 1: 1.0}, 1) == 1  # at least one step
    rule = DelayedNesterovRule(torch.zeros(3), 0.7, 0.9, 4, 8)
    _push(rule, 0, torch.zeros(3), step_time=0.01)
    assert _push(rule, 1, torch.zeros(3), step_time=0.04)[-1] == 2


def test_fedbuff_steps_on_every_k_deltas_weighted_by_staleness():
    w0 = torch.zeros(4)
    rule = BufferedRule(w0, lr=1.0, momentum=0.0, buffer_size=2, inner_steps=5)
    for worker in range(3):
        rule.pull(worker)  # everyone starts at version 0
    d = [torch.full((4,), v) for v in (1.0, 2.0, 4.0, 8.0)]
    a = _push(rule, 0, -d[0])  # a pseudo-gradient is the negative delta; buffered
    torch.testing.assert_close(a[:-1], w0)
    assert a[-1] == 5
    b = _push(rule, 1, -d[1])  # the second: a server step on the mean, version 1
    torch.testing.assert_close(b[:-1], (d[0] + d[1]) / 2)
    c = _push(rule, 2, -d[2])  # worker 2 pulled version 0: staleness 1
    torch.testing.assert_close(c[:-1], b[:-1])
    e = _push(rule, 1, -d[3])  # worker 1 received version 1 with its answer: staleness 0
    torch.testing.assert_close(e[:-1], b[:-1] + (d[2] / math.sqrt(2) + d[3]) / 2)


@pytest.mark.parametrize("rule", [
    lambda: DelayedNesterovRule(torch.arange(6.0), 0.7, 0.9, 2, 8),
    lambda: BufferedRule(torch.arange(6.0), 1.0, 0.9, 2, 8),
])
def test_the_new_server_rules_round_trip_and_continue_identically(rule, tmp_path):
    a = rule()
    a.pull(0)
    for worker in (1, 0, 1):
        _push(a, worker, torch.linspace(0, 1, 6), step_time=0.01 * (worker + 1))
    torch.save(a.state_dict(), tmp_path / "rule.pt")
    b = rule()
    b.load_state_dict(torch.load(tmp_path / "rule.pt", weights_only=True))
    update = torch.linspace(-1, 1, 6)
    torch.testing.assert_close(_push(a, 0, update), _push(b, 0, update), rtol=0, atol=0)
    torch.testing.assert_close(_push(a, 1, update), _push(b, 1, update), rtol=0, atol=0)


def test_fixed_steps_end_a_round_after_h():
    length = FixedSteps(3)
    assert [length.ends_round(Step(0.0, 0.01), k) for k in (1, 2, 3)] == [False, False, True]
    with pytest.raises(ValueError, match="at least 1"):
        FixedSteps(0)


def test_a_resumed_run_takes_its_outer_rate_from_its_own_options():
    model = SmallNet()
    make = lambda gl: DiLoCo(model, torch.optim.SGD(model.parameters(), lr=LR), CommContext(),
                             DiLoCoOptions(global_lr=gl))
    saved = make(0.7)
    saved.setup()
    resumed = make(0.3)
    resumed.load_state_dict(saved.state_dict())
    assert resumed.outer.param_groups[0]["lr"] == 0.3
    assert resumed.describe()["global_update"]["global_lr"] == 0.3


@pytest.mark.slow
def test_scaffold_sums_fit_the_parameter_server(tmp_path):
    import os

    from hetsync.config import Config
    from hetsync.runtime.launcher import launch
    from hetsync.telemetry.summarize import summarize

    cfg = Config(mode="esync-outer", collective="ps", dataset="synthetic", network="mlp",
                 options={"overlap": False, "drift_correction": "scaffold"}, workers=2,
                 slowdowns=(1.0, 2.0), epochs=None, time_budget=3.0, eval_interval=1.0,
                 timeout=30.0, lr=0.1, log_dir=str(tmp_path))
    run_dir = launch(cfg, show_progress=False, figures=False, stream=open(os.devnull, "w"))
    s = summarize(run_dir)
    assert s["complete"] and s["final_accuracy"] > 0.5


def test_diloco_keeps_its_inner_adamw_state_across_rounds():
    torch.manual_seed(0)
    model = SmallNet()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    algo = DiLoCo(model, opt, CommContext(), DiLoCoOptions(inner_steps=2))
    algo.setup()
    x, y = batch(0)
    for _ in range(4):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        algo.poll()
        algo.perform(algo.decide(Step(0.0, 0.01)))
    assert algo.round == 3  # two rounds of two inner steps done
    state = opt.state[model.conv.weight]
    assert int(state["step"]) == 4 and state["exp_avg_sq"].abs().sum() > 0  # not reset
