"""The modes' aggregation on real gloo processes: what one round must produce."""

import os

import pytest
import torch
import torch.distributed as dist

from distributed import run_ranks
from tiny import (SmallNet, batch as _batch, gathered_parameters, linear_net, sample_weight,
                  sgd_on_every_sample, user_loop)
from hetsync.algorithms import Action, CommContext, Step
from hetsync.algorithms.async_ps import AsyncOptions, AsynchronousSGD
from hetsync.algorithms.base import bn_statistics, flatten
from hetsync.algorithms.esync import ESync, ESyncOptions
from hetsync.algorithms.registry import build_server_rule
from hetsync.algorithms.sync import SynchronousSGD
from hetsync.comm import ALGORITHMS
from hetsync.comm.channel import Channel

LR = 0.1


def _step(model, opt, rank):
    x, y = _batch(rank)
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()


def _esync_each_collective(rank, world, state_port):
    from hetsync.comm import ParameterServer, connect
    from hetsync.state import StateClient

    workers = world - 1  # the last rank is the parameter server for the `ps` collective
    group = dist.new_group(list(range(workers)))
    channel_group = dist.new_group(list(range(workers)))
    if rank == workers:
        ParameterServer(list(range(workers))).serve()
        return None
    client = StateClient("127.0.0.1", state_port)
    ps = connect(workers)
    channel = Channel(channel_group)
    out = {}
    # ESync as published over every collective; then, over native, with the sum in the
    # background and one local step taken before it comes in.
    for collective, overlap in [(c, False) for c in ALGORITHMS] + [("native", True)]:
        dist.barrier(group=group)
        if rank == 0:
            client.init(workers, 0.0)  # a fresh warm-up round: everyone aggregates after 1 step
        dist.barrier(group=group)
        torch.manual_seed(0)
        model = SmallNet()
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        algo = ESync(model, opt, CommContext(rank=rank, workers=workers, group=group,
                                             collective=collective, ps_client=ps,
                                             service=client, channel=channel),
                     ESyncOptions(global_lr=1.0, overlap=overlap))
        algo.setup()
        _step(model, opt, rank)
        # the local model after this step's SGD update (no momentum): w - lr * g
        local = torch.cat([(p - LR * p.grad).detach().reshape(-1) for p in model.parameters()])
        stats = flatten(bn_statistics(model)).clone()
        assert algo.decide(Step(0.0, 0.01)) is Action.AVERAGE_MODELS, \
            "warm-up round must aggregate after one step"
        # What ESync must give with global_lr 1: the mean of the local models and statistics,
        # computed here with torch.distributed's own all-reduce (before ESync's, which may run
        # in the background: one collective in flight at a time).
        expected = torch.cat([local, stats])
        dist.all_reduce(expected, group=group)
        expected /= workers
        # blocking, the loop's proposal rides on the round's sum (ControlPath.WITH_SUM)
        proposal = torch.tensor([float(rank), 1.0, float(rank == 0), 0.0])
        algo.proposal = None if overlap else proposal.clone()
        algo.perform(Action.AVERAGE_MODELS)
        if overlap:  # a step while the sum travels is kept on top of it (CoCoD-SGD)
            _step(model, opt, rank)
            algo.perform(Action.LOCAL)
            drift = torch.cat([flatten(list(model.parameters())),
                               flatten(bn_statistics(model))]) - torch.cat([local, stats])
            algo.settle()
            expected += drift
        key = collective + (" overlapped" if overlap else "")
        out[key] = (torch.cat([flatten(list(model.parameters())),
                               flatten(bn_statistics(model))]), expected)
        if not overlap:
            out[key + " with sum"] = (algo.agreed, proposal)
        # the loop's barrier (the agreement's sum; under star through the first worker)
        out[key + " barrier"] = (algo.comm.barrier(proposal.clone()), proposal)
    channel.close()
    ps.close()
    client.close()
    return out


@pytest.mark.slow
def test_esync_round_over_every_collective_is_the_mean_of_the_local_models():
    from hetsync.state import StateServer

    server = StateServer(workers=3, port=0).start()
    try:
        results = run_ranks(_esync_each_collective, 4, server.port, timeout=180)
    finally:
        server.stop()
    for rank, out in enumerate(results[:3]):
        for collective, (got, expected) in out.items():
            barrier = collective.endswith((" barrier", " with sum"))
            if barrier:  # every rank's proposal, summed
                expected = sum(results[r][collective][1] for r in range(3))
            torch.testing.assert_close(got, expected, msg=f"rank {rank}, {collective}")
            if not barrier and "overlapped" not in collective:
                torch.testing.assert_close(got, results[0]["native"][0],
                                           msg=f"rank {rank}: {collective} differs from native")


def _esync_scaffold(rank, world, state_port):
    from hetsync.state import StateClient

    group = dist.new_group(list(range(world)))
    channel = Channel(dist.new_group(list(range(world))))
    client = StateClient("127.0.0.1", state_port)
    if rank == 0:
        client.init(world, 0.0)
    dist.barrier(group=group)
    torch.manual_seed(0)
    model = SmallNet()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    algo = ESync(model, opt, CommContext(rank=rank, workers=world, group=group,
                                         service=client, channel=channel),
                 ESyncOptions(drift_correction="scaffold", overlap=False))
    algo.setup()
    out = []
    for _ in range(2):  # rounds of one step: the round's mean gradient is the step's own
        _step(model, opt, rank)
        raw = flatten([p.grad for p in model.parameters()])
        before = flatten(list(model.parameters()))
        correction = (torch.zeros_like(raw) if algo.variates.own is None
                      else algo.variates.common - algo.variates.own)
        algo.perform(Action.AVERAGE_MODELS)
        algo.settle()
        # torch.distributed's own sums, for reference: the gradients, and the local models
        # after a step corrected by c − c_i (the global model is their mean: one step each)
        mean, sent = raw.clone(), before - LR * (raw + correction)
        dist.all_reduce(mean, group=group)
        dist.all_reduce(sent, group=group)
        out.append({"c_i": (algo.variates.own, raw), "c": (algo.variates.common, mean / world),
                    "w_global": (flatten(list(model.parameters())), sent / world)})
    channel.close()
    client.close()
    return out


@pytest.mark.slow
def test_esync_with_control_variates_sums_every_workers_round_gradient():
    """--drift-correction scaffold on real processes: after each round c_i is the worker's
    gradient of the round, c their mean, and the step taken was corrected by c − c_i."""
    from hetsync.state import StateServer

    server = StateServer(workers=2, port=0).start()
    try:
        results = run_ranks(_esync_scaffold, 2, server.port, timeout=120)
    finally:
        server.stop()
    for rank, rounds in enumerate(results):
        for r, checks in enumerate(rounds):
            for name, (got, expected) in checks.items():
                torch.testing.assert_close(got, expected, msg=f"rank {rank}, round {r}: {name}")


def _sync_step(rank, world, batches):
    torch.manual_seed(0)
    model = linear_net()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    algo = SynchronousSGD(model, opt, CommContext(rank=rank, workers=world, collective="ring",
                                                  sample_weight=sample_weight(batches, rank)))
    algo.setup()
    x, y = _batch(rank, batches[rank])
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    algo.perform(algo.decide(Step(0.0, 0.01)))
    # Reference: one process, one SGD step on the mean gradient over every worker's samples
    # (with equal batches, the mean of the workers' mean gradients).
    return flatten(list(model.parameters())), sgd_on_every_sample(batches, LR)


@pytest.mark.slow
@pytest.mark.parametrize("batches", [(8, 8, 8), (8, 4, 2)], ids=["equal", "balanced"])
def test_sync_step_equals_sgd_on_the_mean_gradient_over_every_workers_samples(batches):
    for got, expected in run_ranks(_sync_step, 3, batches):
        torch.testing.assert_close(got, expected)


def _leaders_prior(seed: int, optimizer_cls=torch.optim.SGD, steps: int = 1, **kw):
    """A model and optimizer with some history of their own: `steps` local steps on a batch
    drawn from `seed` (momentum, or Adam's moments and step count)."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
    opt = optimizer_cls(model.parameters(), lr=LR, **kw)
    for _ in range(steps):
        x, y = _batch(seed)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return model, opt


def _sync_survivors(rank, world, batches):
    """Rank 1 is lost; ranks 0 and 2 regrouped (group [0, 2]), and rank 2 holds rank 1's
    shard. Each survivor had its own history; `rejoin` gives both the leader's, then one step
    sums rank 0's own batch and rank 2's step on rank 1's batch (held: batch_share 4 / 2)."""
    survivors = dist.new_group([0, 2])
    if rank == 1:
        return None
    model, opt = _leaders_prior(seed=rank, momentum=0.9)
    algo = SynchronousSGD(model, opt, CommContext(rank=rank, workers=2, group=survivors,
                                                  collective="ring", run_workers=3,
                                                  sample_weight=sample_weight(batches, rank)))
    algo.round = 7 if rank == 0 else 5
    algo.rejoin()
    x, y = _batch(0, batches[0]) if rank == 0 else _batch(1, batches[1])
    algo.batch_share = 1.0 if rank == 0 else batches[1] / batches[2]
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    algo.perform(algo.decide(Step(0.0, 0.01)))
    # by hand: the leader's model and momentum, one step on the gradient summed over the
    # samples that arrived (rank 0's 8 and rank 1's 4) over a whole step's (8 + 4 + 2)
    ref, ref_opt = _leaders_prior(seed=0, momentum=0.9)
    ref_opt.zero_grad()
    xs, ys = zip(_batch(0, batches[0]), _batch(1, batches[1]))
    (torch.nn.functional.cross_entropy(ref(torch.cat(xs)), torch.cat(ys), reduction="sum")
     / sum(batches)).backward()
    ref_opt.step()
    momenta = [opt.state[p]["momentum_buffer"] for p in model.parameters()]
    ref_momenta = [ref_opt.state[p]["momentum_buffer"] for p in ref.parameters()]
    return (algo.round, flatten(list(model.parameters())), flatten(list(ref.parameters())),
            flatten(momenta), flatten(ref_momenta))


def test_sync_survivors_take_the_leaders_state_and_step_by_the_samples_that_arrived():
    """After a regroup, sync's step sums the gradients of the samples the survivors brought
    (a held shard's batch weighed as its own) over a whole step's samples, and every
    survivor starts from the leader's model, momentum and round — checked against one SGD
    step by hand."""
    results = run_ranks(_sync_survivors, 3, (8, 4, 2))
    for rank in (0, 2):
        rounds, got, expected, momenta, ref_momenta = results[rank]
        assert rounds == 8, rank  # the leader's round, then the step's
        torch.testing.assert_close(got, expected, msg=f"rank {rank}: parameters")
        torch.testing.assert_close(momenta, ref_momenta, msg=f"rank {rank}: momentum")


def _selsync_survivors_and_joiner(rank, world):
    """Rank 1 is lost: ranks 0 and 2 (group [0, 2]) `rejoin`, each from a model of its own;
    then rank 1 comes back with a model of its own and all three `admit` it."""
    from hetsync.algorithms.selsync import SelSync

    survivors = dist.new_group([0, 2])
    model, opt = _leaders_prior(seed=rank)
    parts = lambda: flatten(list(model.parameters()))  # noqa: E731
    own = parts()
    after_rejoin = None
    if rank != 1:
        algo = SelSync(model, opt, CommContext(rank=rank, workers=2, group=survivors))
        algo.round = 7 if rank == 0 else 6
        algo.rejoin()
        after_rejoin = (algo.round, parts())
    algo = SelSync(model, opt, CommContext(rank=rank, workers=world))
    algo.round = 9 if rank == 0 else 3
    algo.admit(joined=rank == 1)
    return own, after_rejoin, (algo.round, parts())


def test_selsync_survivors_average_their_models_and_a_joiner_takes_the_members_mean():
    (own0, rejoined0, admitted0), (own1, _, admitted1), (own2, rejoined2, admitted2) = \
        run_ranks(_selsync_survivors_and_joiner, 3)
    mean = (own0 + own2) / 2
    for rounds, params in (rejoined0, rejoined2):
        assert rounds == 7  # the leader's
        torch.testing.assert_close(params, mean)
    for rounds, params in (admitted0, admitted1, admitted2):
        assert rounds == 9
        # the members' mean again (their models were the mean already), the joiner's own
        # model not in it
        torch.testing.assert_close(params, mean)
    assert not torch.allclose(own1, mean)


def _leaders_adam(rank, world):
    """Rank 0 took two Adam steps, rank 1 none (as a worker that joins): after
    `take_leaders_state`, both hold rank 0's parameters, moments and step count."""
    from hetsync.algorithms.leader_state import take_leaders_state

    model, opt = _leaders_prior(seed=3, optimizer_cls=torch.optim.Adam,
                                steps=2 if rank == 0 else 0)
    if rank == 1:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
    counts = take_leaders_state(CommContext(rank=rank, workers=world), list(model.parameters()),
                                opt, [float(10 + rank), 0.5])
    state = {(i, k): v.clone() for i, s in opt.state_dict()["state"].items() for k, v in s.items()}
    return counts, flatten(list(model.parameters())), state


def test_the_leaders_optimizer_state_reaches_a_member_that_has_none():
    (counts0, params0, state0), (counts1, params1, state1) = run_ranks(_leaders_adam, 2)
    assert counts0 == counts1 == [10.0, 0.5]
    torch.testing.assert_close(params1, params0)
    assert sorted(state1) == sorted(state0) and len(state0) == 6  # exp_avg(_sq), step: 2 params
    for key, value in state0.items():
        assert state1[key].dtype == value.dtype, key
        torch.testing.assert_close(state1[key], value, msg=str(key))


def _async_pushes(rank, world, mode):
    from hetsync.comm import ParameterServer, PSClient

    workers = world - 1
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
    if rank == workers:
        rule = build_server_rule(mode, flatten(list(model.parameters())), LR,
                                 AsyncOptions(dcasgd_lambda=0.04))
        ParameterServer(list(range(workers)), rule).serve()
        return rule.weights
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    algo = AsynchronousSGD(model, opt, CommContext(rank=rank, workers=workers,
                                                   ps_client=PSClient(workers)))
    algo.setup()
    losses = []
    x, y = _batch(rank, 64)
    for _ in range(30):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        losses.append(float(loss))
        algo.perform(algo.decide(Step(0.0, 0.01)))
    algo.finish()
    return losses


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["async", "dcasgd"])
def test_async_modes_train_through_the_parameter_server(mode):
    *losses, server_weights = run_ranks(_async_pushes, 3, mode)
    for worker_losses in losses:
        assert worker_losses[-1] < 0.5 * worker_losses[0]
    assert torch.isfinite(server_weights).all()


def test_dcasgd_compensates_with_the_distance_since_the_workers_pull():
    w = torch.tensor([1.0, 2.0])
    rule = build_server_rule("dcasgd", w, 0.5, AsyncOptions(dcasgd_lambda=0.1))
    rule.pull(worker=0)            # worker 0 sees [1, 2]
    rule.push(1, torch.tensor([2.0, 0.0]))  # worker 1 moves the model to [0, 2]
    g = torch.tensor([1.0, 1.0])
    after = rule.push(0, g)        # stale by one update
    # g~ = g + λ g⊙g⊙(w_now − w_seen) = [1, 1] + 0.1·[1, 1]⊙[−1, 0] = [0.9, 1]
    torch.testing.assert_close(after, torch.tensor([0.0 - 0.5 * 0.9, 2.0 - 0.5 * 1.0]))


def test_asgd_applies_each_push_at_once():
    rule = build_server_rule("async", torch.zeros(2), lr=0.1)
    rule.push(0, torch.tensor([1.0, 0.0]))
    torch.testing.assert_close(rule.push(1, torch.tensor([0.0, 2.0])), torch.tensor([-0.1, -0.2]))


def test_unknown_server_rule_is_named():
    with pytest.raises(ValueError, match="'sync'"):
        build_server_rule("sync", torch.zeros(1), lr=0.1)


def _wrapped(rank, world):
    import hetsync

    torch.manual_seed(rank)  # different starting points: wrap must make them equal
    model = linear_net()
    opt = hetsync.wrap(torch.optim.SGD(model.parameters(), lr=LR), model, mode="sync",
                       collective="butterfly")
    losses = user_loop(opt, model, *_batch(rank, 32), steps=20)
    return losses, gathered_parameters(model, world), opt.round


@pytest.mark.slow
def test_wrap_turns_a_users_loop_into_synchronous_sgd():
    for losses, gathered, rounds in run_ranks(_wrapped, 2):
        assert rounds == 21
        assert losses[-1] < losses[0]
        torch.testing.assert_close(gathered[0], gathered[1])  # identical models everywhere


def _wrapped_async(rank, world):
    import hetsync
    from hetsync.comm import ParameterServer

    server = world - 1
    torch.manual_seed(0)
    model = linear_net()
    if rank == server:
        weights = flatten(list(model.parameters()))
        ParameterServer(list(range(server)), build_server_rule("async", weights, LR)).serve()
        return None
    opt = hetsync.wrap(torch.optim.SGD(model.parameters(), lr=LR), model, mode="async",
                       ps_rank=server)
    losses = user_loop(opt, model, *_batch(rank, 32), steps=20)
    workers = opt.mode.comm.workers
    opt.finish()
    return losses, workers


@pytest.mark.slow
def test_wrap_counts_the_workers_without_the_parameter_server():
    for losses, workers in run_ranks(_wrapped_async, 3)[:2]:
        assert workers == 2
        assert losses[-1] < losses[0]
