"""SelSync's significance vote (pure rules), its aggregation on real gloo processes, and
data injection for non-IID partitions."""

import math

import numpy as np
import pytest
import torch

from distributed import run_ranks
from hetsync.algorithms import Action, CommContext, Step
from hetsync.algorithms.base import flatten
from hetsync.algorithms.selsync import (SelSync, SelSyncOptions, significance_vote,
                                        windowed_ewma)
from hetsync.algorithms.sync import SynchronousSGD
from hetsync.data.injection import InjectingSampler, injection_counts
from tiny import batch, linear_net

LR = 0.1


# ---------------------------------------------------------------------- pure rules
def test_windowed_ewma_weighs_the_newest_most_and_guards_the_empty_window():
    assert windowed_ewma([], 0.01) == 0.0
    assert windowed_ewma([5.0], 0.5) == 5.0
    # weights (1-a)^k, k = 1 for the newest: [0.25, 0.5] for oldest, newest at a = 0.5
    assert windowed_ewma([1.0, 3.0], 0.5) == pytest.approx((0.25 * 1 + 0.5 * 3) / 0.75)
    assert windowed_ewma([2.0, 2.0, 2.0], 0.01) == pytest.approx(2.0)


def test_the_vote_holds_while_the_window_fills_then_follows_the_threshold():
    assert significance_vote(0.0, steps=3, window=25, delta=0.3)
    assert not significance_vote(0.1, steps=25, window=25, delta=0.3)
    assert significance_vote(0.3, steps=40, window=25, delta=0.3)


def test_injection_adds_the_stated_counts_of_foreign_classes():
    labels = np.repeat(np.arange(10), 100)           # 10 classes, 100 samples each
    shard = np.flatnonzero(labels < 3)                # this worker holds classes 0, 1, 2
    base = [(0, shard[:32]), (0, shard[32:64])]
    sampler = InjectingSampler(base, labels, shard, batch_size=32, workers=4, alpha=0.25,
                               beta=0.25, seed=1)
    k, each = injection_counts(10, 32, 4, 0.25, 0.25)
    assert (k, each) == (math.ceil(2.5), math.floor(0.25 * 32 * 4 / 10)) == (3, 3)
    for (_, idx), (_, own) in zip(sampler, base):
        np.testing.assert_array_equal(idx[:32], own)  # the worker's own batch comes first
        extra = labels[idx[32:]]
        classes, counts = np.unique(extra, return_counts=True)
        assert len(idx) == 32 + k * each and len(classes) == k
        assert set(classes.tolist()).isdisjoint({0, 1, 2}) and (counts == each).all()


# ---------------------------------------------------------------------- real processes
def _selsync(model, rank, world, **options):
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    algo = SelSync(model, opt, CommContext(rank=rank, workers=world, collective="ring"),
                   SelSyncOptions(**options))
    algo.setup()
    return algo, opt


def _step(algo, opt, model, rank, k, vote=None):
    x, y = batch(rank + 10 * k, 16)
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    grad = flatten([p.grad for p in model.parameters()]).clone()
    action = algo.decide(Step(0.0, 0.01))
    if vote is not None:
        algo._vote = vote  # the rule's outcome, forced: what the others do with it
    algo.perform(action)
    return action, grad


def _one_voter(rank, world):
    torch.manual_seed(0)
    model = linear_net()
    algo, opt = _selsync(model, rank, world, window=1, delta=1e9)
    _step(algo, opt, model, rank, 0)   # the first window synchronises
    before = flatten(list(model.parameters())).clone()
    mean_before = before.clone()
    torch.distributed.all_reduce(mean_before)
    mean_before /= world
    action, grad = _step(algo, opt, model, rank, 1, vote=(rank == 0))  # only rank 0 votes
    return action, algo.synced, flatten(list(model.parameters())), mean_before - LR * grad


@pytest.mark.slow
def test_one_rank_voting_makes_every_rank_aggregate():
    for action, synced, got, expected in run_ranks(_one_voter, 3):
        assert action is Action.VOTE and synced
        # parameter mode: the mean of the models, then the worker's own gradient step
        torch.testing.assert_close(got, expected)


def _against_sync(rank, world, steps):
    torch.manual_seed(0)
    model = linear_net()
    algo, opt = _selsync(model, rank, world, delta=0.0, aggregate="gradients")
    torch.manual_seed(0)
    ref = linear_net()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=LR)
    sync = SynchronousSGD(ref, ref_opt, CommContext(rank=rank, workers=world,
                                                    collective="ring"))
    sync.setup()
    synced = []
    for k in range(steps):
        _step(algo, opt, model, rank, k)
        synced.append(algo.synced)
        x, y = batch(rank + 10 * k, 16)
        ref_opt.zero_grad()
        torch.nn.functional.cross_entropy(ref(x), y).backward()
        sync.perform(sync.decide(Step(0.0, 0.01)))
    return synced, flatten(list(model.parameters())), flatten(list(ref.parameters()))


@pytest.mark.slow
def test_with_delta_zero_every_step_synchronises_and_equals_sync():
    for synced, got, expected in run_ranks(_against_sync, 2, 30):
        assert all(synced)
        torch.testing.assert_close(got, expected)


def _huge_delta(rank, world):
    torch.manual_seed(0)
    model = linear_net()
    algo, opt = _selsync(model, rank, world, window=5, delta=1e9)
    synced = []
    for k in range(20):
        _step(algo, opt, model, rank, k)
        synced.append(algo.synced)
    return synced, algo.round_record()


@pytest.mark.slow
def test_with_a_huge_delta_only_the_first_window_synchronises():
    for synced, record in run_ranks(_huge_delta, 2):
        assert synced == [True] * 5 + [False] * 15
        assert record == {"synced": 0}


def _evaluated_model(rank, world):
    torch.manual_seed(0)
    model = linear_net()
    algo, opt = _selsync(model, rank, world, window=1, delta=1e9)
    for k in range(3):  # local steps on different batches: the models drift apart
        _step(algo, opt, model, rank, k)
    local = flatten(list(model.parameters())).clone()
    mean = local.clone()
    torch.distributed.all_reduce(mean)
    with algo.global_model():
        inside = flatten(list(model.parameters())).clone()
    after = flatten(list(model.parameters())).clone()
    algo.finish()
    return local, mean / world, inside, after, flatten(list(model.parameters()))


@pytest.mark.slow
def test_evaluation_sees_the_workers_average_and_the_run_ends_with_it():
    results = run_ranks(_evaluated_model, 2)
    assert not torch.equal(results[0][0], results[1][0])  # the local models differ
    for local, mean, inside, after, final in results:
        torch.testing.assert_close(inside, mean)
        assert torch.equal(after, local)  # training goes on from the local model
        torch.testing.assert_close(final, mean)
