"""The global update of local-step modes: weightings and the outer optimizer (pure logic; the
modes that use them run on real processes in test_modes / test_mode_state)."""

import pytest
import torch

from hetsync.algorithms.esync import ESync, ESyncOptions, ESyncOuter
from hetsync.algorithms.local_rounds import global_update
from hetsync.algorithms.outer import (combine, contribution, momentum_buffer, outer_optimizer,
                                      outer_step, set_momentum_buffer)


def _deltas(workers=3, n=50, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=g) for _ in range(workers)]


def _summed(deltas, steps, weighting):
    return sum(contribution(d, s, weighting) for d, s in zip(deltas, steps))


def test_momentum_zero_and_rate_one_is_esyncs_update():
    deltas, w = _deltas(), torch.randn(50)
    summed = _summed(deltas, [5, 3, 1], "uniform")
    ours = w.clone()
    vector, scale = combine(summed, 3, "uniform")
    outer_step(outer_optimizer(ours, lr=1.0, momentum=0.0), vector * scale)
    torch.testing.assert_close(ours, w + sum(deltas) / 3)  # ESync: w_global += mean(delta)


def test_fednova_with_equal_local_steps_equals_uniform():
    deltas = _deltas(4)
    uniform = combine(_summed(deltas, [6] * 4, "uniform"), 4, "uniform")
    fednova = combine(_summed(deltas, [6] * 4, "fednova"), 4, "fednova")
    torch.testing.assert_close(fednova[0] * fednova[1], uniform[0] * uniform[1])


def test_unequal_steps_are_weighted_as_each_rule_says():
    deltas, steps = _deltas(2), [8, 2]
    vec, scale = combine(_summed(deltas, steps, "samples"), 2, "samples")
    torch.testing.assert_close(vec * scale, (8 * deltas[0] + 2 * deltas[1]) / 10)
    vec, scale = combine(_summed(deltas, steps, "fednova"), 2, "fednova")
    tau_eff = (8 + 2) / 2
    torch.testing.assert_close(vec * scale, tau_eff * (deltas[0] / 8 + deltas[1] / 2) / 2)
    with pytest.raises(ValueError, match="expected one of uniform, samples, fednova"):
        contribution(deltas[0], 1, "median")


def test_samples_weighting_counts_each_workers_batch_where_batches_differ():
    """--balanced-batches: τ_i counts steps × the worker's batch (relative to the others'),
    so each delta counts by the samples behind it."""
    deltas, steps, batches = _deltas(3), [8, 8, 4], [2.0, 1.0, 0.5]
    summed = sum(contribution(d, s, "samples", s * b) for d, s, b in zip(deltas, steps, batches))
    vec, scale = combine(summed, 3, "samples")
    samples = [s * b for s, b in zip(steps, batches)]
    torch.testing.assert_close(vec * scale, sum(n * d for n, d in zip(samples, deltas))
                               / sum(samples))


def test_nesterov_outer_step_is_torch_sgd_on_the_pseudo_gradient():
    w = torch.randn(20)
    ours, ref = w.clone(), torch.nn.Parameter(w.clone())
    sgd = torch.optim.SGD([ref], lr=0.7, momentum=0.9, nesterov=True)
    outer = outer_optimizer(ours, lr=0.7, momentum=0.9)
    buffer = torch.zeros(20)
    for seed in range(5):
        delta = _deltas(1, 20, seed)[0]
        outer_step(outer, delta)
        ref.grad = -delta  # the mean delta is a negative pseudo-gradient
        sgd.step()
        torch.testing.assert_close(ours, ref.detach())
        # by hand: b <- 0.9 b - delta (b <- -delta at first); w <- w - 0.7 (-delta + 0.9 b)
        buffer = -delta if seed == 0 else 0.9 * buffer - delta
        w = w - 0.7 * (-delta + 0.9 * buffer)
        torch.testing.assert_close(ours, w)
    copy = outer_optimizer(ours.clone(), lr=0.7, momentum=0.9)
    copy.load_state_dict(outer.state_dict())
    assert torch.equal(momentum_buffer(copy), momentum_buffer(outer))
    set_momentum_buffer(copy, None)
    assert momentum_buffer(copy) is None


def test_esync_outer_defaults_and_flags_override_them():
    paper = global_update(ESync.defaults, ESyncOptions())
    assert paper == {"global_lr": 1.0, "outer_momentum": 0.0, "weighting": "uniform",
                     "drift_correction": "none"}
    assert global_update(ESyncOuter.defaults, ESyncOptions()) == {
        "global_lr": 0.7, "outer_momentum": 0.9, "weighting": "uniform",
        "drift_correction": "none"}
    given = ESyncOptions(global_lr=0.5, weighting="fednova", drift_correction="scaffold",
                         overlap=False)
    assert global_update(ESyncOuter.defaults, given) == {
        "global_lr": 0.5, "outer_momentum": 0.9, "weighting": "fednova",
        "drift_correction": "scaffold"}


def _lookahead_run(rank, world, steps, every, lr, momentum, mode="lookahead"):
    """`mode` (`lookahead`, or `sync-lookahead` on `world` ranks) on real gloo ranks: its
    slow weights after `steps` steps."""
    import torch.distributed as dist

    from hetsync.algorithms import Step, registry
    from hetsync.algorithms.base import flatten
    from hetsync.runtime.assembly import Wiring, assemble

    from tiny import SmallNet

    spec = registry.get(mode)
    torch.manual_seed(0)
    model = SmallNet()
    start = flatten(list(model.parameters())).clone()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    options = spec.make_options({"lookahead_steps": every, "lookahead_lr": lr,
                                 "lookahead_momentum": momentum})
    assembly = assemble(spec, options, model, opt,
                        Wiring(rank=rank, workers=world, group=dist.new_group(list(range(world))),
                               timeout=30))
    algo = assembly.mode
    g = torch.Generator().manual_seed(1 + rank)
    batches = [(torch.randn(8, 1, 8, 8, generator=g), torch.randint(0, 10, (8,), generator=g))
               for _ in range(steps)]
    for i, (x, y) in enumerate(batches):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(algo.module(x), y).backward()
        algo.poll()
        algo.perform(algo.decide(Step(float(i), i + 0.01)))
    with algo.global_model():
        slow = flatten(list(model.parameters())).clone()
    rounds = algo.round
    algo.finish()
    assembly.close()
    return start, batches, slow, rounds


def _sgd_from(weights, steps, lr=0.1):
    """Plain SGD steps of SmallNet from `weights`; each step's gradient is the mean of its
    batches' (one batch: one device; one a rank: `sync`'s step); the weights after them."""
    from hetsync.algorithms.base import flatten, unflatten_into

    from tiny import SmallNet

    model = SmallNet()
    unflatten_into(weights, list(model.parameters()))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for batches in steps:
        opt.zero_grad()
        for x, y in batches:
            (torch.nn.functional.cross_entropy(model(x), y) / len(batches)).backward()
        opt.step()
    return flatten(list(model.parameters())).detach().clone()


def _outer_nesterov(start, steps, every, lr, momentum):
    """SNOO by hand: SGD's `every` steps from the slow weights, then torch's Nesterov SGD on
    their difference (the pseudo-gradient -D), for each whole round of `steps`."""
    param = torch.nn.Parameter(start.clone())
    outer = torch.optim.SGD([param], lr=lr, momentum=momentum, nesterov=momentum > 0)
    for k in range(len(steps) // every):
        fast = _sgd_from(param.detach().clone(), steps[every * k:every * (k + 1)])
        param.grad = param.detach() - fast
        outer.step()
    return param.detach()


@pytest.mark.slow
def test_lookahead_is_an_outer_nesterov_step_every_k_steps():
    from distributed import run_ranks

    # K = 1, outer rate 1, no momentum: plain SGD
    (start, batches, slow, rounds), = run_ranks(_lookahead_run, 1, 4, 1, 1.0, 0.0)
    torch.testing.assert_close(slow, _sgd_from(start, [[b] for b in batches]))
    assert rounds == 5  # counted from 1: four done, the fifth under way
    # K = 3, rate 0.5, momentum 0.9: 7 steps are 2 rounds, and the last step's weights are
    # in no outer step
    (start, batches, slow, rounds), = run_ranks(_lookahead_run, 1, 7, 3, 0.5, 0.9)
    torch.testing.assert_close(slow, _outer_nesterov(start, [[b] for b in batches], 3, 0.5, 0.9))
    assert rounds == 3


@pytest.mark.slow
def test_sync_lookahead_is_the_outer_step_on_syncs_steps_the_same_on_every_worker():
    from distributed import run_ranks

    # K = 3, rate 0.5, momentum 0.9 on 2 ranks: each step the mean of the two ranks'
    # gradients, every 3 the outer step; 7 steps, each a round of sync's
    ranks = run_ranks(_lookahead_run, 2, 7, 3, 0.5, 0.9, "sync-lookahead")
    (start, ours, slow, rounds), (_, theirs, other_slow, _) = ranks
    torch.testing.assert_close(slow, other_slow, rtol=0, atol=0)
    torch.testing.assert_close(slow, _outer_nesterov(start, list(zip(ours, theirs)), 3, 0.5, 0.9))
    assert rounds == 8


@pytest.mark.parametrize("weighting", ["uniform", "samples", "fednova"])
def test_a_contribution_stays_on_the_deltas_device(weighting):
    """τ is made where the delta is (a CUDA model's delta: the sum's buffer is one tensor);
    the meta device stands in for a GPU here."""
    out = contribution(torch.zeros(5, device="meta"), 3, weighting)
    assert out.device.type == "meta" and out.shape == (6,)
