"""Gradient compression (selection, error-feedback memories, DGC's warm-up) as pure logic, and
the sparse parameter-server modes `dgs`, `gd`, `dgc` on real gloo processes."""

import pytest
import torch

from distributed import run_ranks
from hetsync.algorithms import Step
from hetsync.algorithms.base import flatten
from hetsync.algorithms.dgc import warmup_density
from hetsync.algorithms.dgs import DgsRule
from hetsync.algorithms.registry import build_server_rule, get
from hetsync.algorithms.sparse_ps import sparse
from hetsync.comm import HEADER_BYTES
from hetsync.compression import (Layout, MomentumCorrection, ResidualMemory, SAMomentum,
                                 SampledTopK, TopK, layer_k, memory, selector)

LAYOUT = Layout((3, 50, 1000, 7))


def _vector(seed=0, n=LAYOUT.numel):
    return torch.randn(n, generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------- selection
def test_top_k_keeps_the_largest_of_each_layer_and_at_least_one():
    v = _vector()
    picked = TopK(LAYOUT).select(v, 0.01)
    assert torch.equal(picked, picked.sort().values)
    for (start, end), n in zip(LAYOUT.spans(), LAYOUT.sizes):
        mine = picked[(picked >= start) & (picked < end)] - start
        k = layer_k(n, 0.01)
        assert mine.numel() == k == max(1, int(n * 0.01))
        layer = v[start:end].abs()
        assert layer[mine].min() >= layer.topk(k).values.min()  # nothing larger left out


def test_sampled_threshold_keeps_close_to_k():
    v = _vector(1, 200_000)
    layout = Layout((200_000,))
    picked = SampledTopK(layout).select(v, 0.001)
    assert 0.8 * 200 <= picked.numel() <= 1.3 * 200
    threshold = v.abs()[picked].min()
    assert int((v.abs() >= threshold).sum()) == picked.numel()  # all above the threshold


def test_selection_refuses_a_vector_of_another_layout_or_a_bad_density():
    with pytest.raises(ValueError, match="layout 1060"):
        TopK(LAYOUT).select(torch.zeros(5), 0.01)
    with pytest.raises(ValueError, match="density"):
        TopK(LAYOUT).select(_vector(), 0.0)
    with pytest.raises(ValueError, match="expected one of"):
        selector("top", LAYOUT)


# ---------------------------------------------------------------------- memories
def _scatter(values, indices, n):
    out = torch.zeros(n)
    out[indices] = values
    return out


def test_gradient_dropping_accounts_for_every_coordinate_exactly():
    mem, total = ResidualMemory(LAYOUT.numel), torch.zeros(LAYOUT.numel)
    sent_sum = torch.zeros(LAYOUT.numel)
    for step in range(20):
        grad = _vector(step)
        total += 0.1 * grad
        candidate = mem.accumulate(grad, torch.zeros(LAYOUT.numel), lr=0.1).clone()
        indices = TopK(LAYOUT).select(candidate, 0.01)
        sent = _scatter(mem.take(indices), indices, LAYOUT.numel)
        assert torch.equal(sent + mem.residual, candidate)  # sent + residual = total
        assert (mem.residual[indices] == 0).all()
        sent_sum += sent
    torch.testing.assert_close(sent_sum + mem.residual, total)


def test_dgc_sends_lr_times_the_accumulation_and_masks_the_momentum():
    mem = MomentumCorrection(LAYOUT.numel, momentum=0.9)
    for step in range(5):
        candidate = mem.accumulate(_vector(step), torch.zeros(LAYOUT.numel), lr=0.5).clone()
        velocity = mem.velocity.clone()
        indices = TopK(LAYOUT).select(candidate, 0.01)
        sent = _scatter(mem.take(indices), indices, LAYOUT.numel)
        torch.testing.assert_close(sent / 0.5 + mem.accumulated, candidate)
        assert (mem.velocity[indices] == 0).all()           # momentum-factor masking
        kept = torch.ones(LAYOUT.numel, dtype=torch.bool)
        kept[indices] = False
        assert torch.equal(mem.velocity[kept], velocity[kept])


def test_samomentum_keeps_the_unsent_undecayed_and_the_sent_momentum():
    m = 0.7
    mem = SAMomentum(LAYOUT.numel, momentum=m)
    first = _vector(0)
    candidate = mem.accumulate(first, torch.zeros(LAYOUT.numel), lr=1.0).clone()
    indices = TopK(LAYOUT).select(candidate, 0.01)
    sent = _scatter(mem.take(indices), indices, LAYOUT.numel)
    unsent = sent == 0
    torch.testing.assert_close(sent + m * mem.velocity * unsent, candidate)
    # next step with no gradient: unsent coordinates come back undecayed, sent ones decay
    again = mem.accumulate(torch.zeros(LAYOUT.numel), torch.zeros(LAYOUT.numel), lr=1.0)
    torch.testing.assert_close(again[unsent], first[unsent])
    torch.testing.assert_close(again[indices], m * first[indices])
    with pytest.raises(ValueError, match="momentum in"):
        memory("samomentum", 4, momentum=0.0)


def test_dgc_warm_up_gives_the_papers_densities():
    densities = [warmup_density(e, 0.001, 4) for e in range(6)]
    assert densities == [0.25, 0.0625, 0.015625, 0.00390625, 0.001, 0.001]
    assert [round(1 - d, 4) for d in densities[:5]] == [0.75, 0.9375, 0.9844, 0.9961, 0.999]
    assert warmup_density(0, 0.001, 0) == 0.001


# ---------------------------------------------------------------------- the DGS server
def test_dgs_rule_answers_what_the_worker_lacks_and_resyncs_dense():
    w = _vector(3)
    rule = DgsRule(w, LAYOUT, density=0.01, resync=4)
    models = {k: rule.pull(k).clone() for k in (0, 1)}
    for step in range(12):
        k = step % 2
        update = TopK(LAYOUT).select(_vector(10 + step), 0.05)
        reply = rule.push(k, sparse(_vector(20 + step)[update], update, LAYOUT.numel))
        if isinstance(reply, torch.Tensor):  # every 4 updates: the snapshot, dense
            assert rule.updates % 4 in (0, 1) and torch.equal(reply, rule.snapshot)
            models[k] = reply.clone()
        else:
            models[k].index_add_(0, reply.indices.long(), reply.values)
        torch.testing.assert_close(models[k], rule.snapshot + rule.sent[k])
    with pytest.raises(ValueError, match="pushed before it pulled"):
        rule.push(5, sparse(torch.ones(1), torch.tensor([0]), LAYOUT.numel))


# ---------------------------------------------------------------------- real processes
class RecordingDgsRule(DgsRule):
    """DGS's server, recording S + acc_k after every reply it gives worker k."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.views = {}

    def _record(self, worker, reply):
        self.views.setdefault(worker, []).append(self.snapshot + self.sent[worker])
        return reply

    def pull(self, worker):
        return self._record(worker, super().pull(worker))

    def push(self, worker, update):
        return self._record(worker, super().push(worker, update))


def _sparse_run(rank, world, mode, steps, options, zero_rate_from=None):
    import torch.distributed as dist

    from hetsync.comm import ParameterServer, meter
    from hetsync.models import build_model
    from hetsync.runtime.assembly import Wiring, assemble

    server = world - 1
    group = dist.new_group(list(range(server)))
    torch.manual_seed(0)
    model = build_model("lenet", (1, 28, 28))
    spec = get(mode)
    options = spec.make_options(options)
    params = list(model.parameters())
    if rank == server:
        layout = Layout.of(params)
        rule = (RecordingDgsRule(flatten(params), layout, 0.01, options.resync) if mode == "dgs"
                else build_server_rule(mode, flatten(params), 0.05, options, layout))
        ParameterServer(list(range(server)), rule).serve()
        return {k: [v.clone() for v in vs] for k, vs in getattr(rule, "views", {}).items()}
    opt = torch.optim.SGD(params, lr=0.05)
    algo = assemble(spec, options, model, opt, Wiring(rank=rank, workers=server, group=group,
                                                     ps_rank=server, timeout=30)).mode
    views = [flatten(params).clone()]
    g = torch.Generator().manual_seed(rank)
    before = meter.totals()
    for i in range(steps):
        if zero_rate_from is not None and i >= zero_rate_from:  # (a cosine schedule's end)
            opt.param_groups[0]["lr"] = 0.0
        x, y = torch.randn(8, 1, 28, 28, generator=g), torch.randint(0, 10, (8,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(algo.module(x), y).backward()
        algo.perform(algo.decide(Step(float(i), i + 0.01)))
        views.append(flatten(params).clone())
    after = meter.totals()
    # finish() pulls the server's view once more, and a DGS pull renews S (the others' next
    # reply is dense): every worker finishes its steps before any of them pulls
    dist.barrier(group)
    algo.finish()
    views.append(flatten(params).clone())
    return views, (after[0] - before[0]) / steps, (after[1] - before[1]) / steps, algo.sent / steps


def test_a_dgs_worker_pushes_on_when_its_rate_reaches_zero():
    """DGS's density follows the rate (1 % x lr_t / lr_0): at a rate of 0 -- a cosine
    schedule's last step, which a step past the time budget reaches before the stop is agreed
    -- it keeps one coordinate a layer instead of failing on a density of 0 (issue 59: such a
    run's workers crashed and were started again until the restarts ran out)."""
    results = run_ranks(_sparse_run, 3, "dgs", 6, {}, 3, timeout=120)
    for views, _, _, _ in results[:-1]:
        assert len(views) == 1 + 6 + 1
        assert all(torch.isfinite(v).all() for v in views)


@pytest.mark.slow
def test_a_dgs_worker_holds_s_plus_acc_after_every_reply_and_resync():
    results = run_ranks(_sparse_run, 3, "dgs", 12, {"resync": 5})
    server_views = results[-1]
    for rank, (views, _, _, _) in enumerate(results[:-1]):
        assert len(views) == len(server_views[rank]) == 1 + 12 + 1  # pulls and replies
        for step, (mine, servers) in enumerate(zip(views, server_views[rank])):
            torch.testing.assert_close(mine, servers, msg=f"rank {rank} step {step}")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["gd", "dgc", "dgs"])
def test_a_push_at_one_percent_is_under_a_thirtieth_of_a_dense_one(mode):
    from hetsync.models import build_model

    numel = sum(p.numel() for p in build_model("lenet", (1, 28, 28)).parameters())
    dense = HEADER_BYTES + 4 * numel  # async's push, and its reply: a header and fp32 weights
    options = {"density": 0.01, "warmup_epochs": 0} if mode == "dgc" else {}
    results = run_ranks(_sparse_run, 3, mode, 6, options)
    for views, sent, recv, nonzeros in results[:-1]:
        assert sent == pytest.approx(HEADER_BYTES + 8 * nonzeros)  # 8 bytes per non-zero
        assert sent <= dense / 30
        if mode == "dgs":  # dual-way: the replies too (no resync within 150 updates)
            assert recv <= dense / 30
        else:
            assert recv == dense
        assert not torch.equal(views[0], views[-1])  # the model moved


def test_the_dgs_server_state_round_trips_and_continues_identically(tmp_path):
    def fresh():
        return DgsRule(_vector(3), LAYOUT, density=0.01, resync=3)

    a = fresh()
    for k in (0, 1):
        a.pull(k)
    for step in range(4):
        idx = TopK(LAYOUT).select(_vector(30 + step), 0.02)
        a.push(step % 2, sparse(_vector(40 + step)[idx], idx, LAYOUT.numel))
    torch.save(a.state_dict(), tmp_path / "rule.pt")
    b = fresh()
    b.load_state_dict(torch.load(tmp_path / "rule.pt", weights_only=True))
    for step in range(4):
        idx = TopK(LAYOUT).select(_vector(50 + step), 0.02)
        update = sparse(_vector(60 + step)[idx], idx, LAYOUT.numel)
        ra, rb = a.push(step % 2, update), b.push(step % 2, update)
        if isinstance(ra, torch.Tensor):
            assert torch.equal(ra, rb)
        else:
            assert torch.equal(ra.indices, rb.indices) and torch.equal(ra.values, rb.values)


@pytest.mark.slow
def test_a_full_sparse_message_crosses_the_wire():
    # density 1: every coordinate travels (nnz = numel); the empty message (nnz = 0) is
    # test_comm_ps's test_sparse_push_and_reply_round_trip
    from hetsync.models import build_model

    numel = sum(p.numel() for p in build_model("lenet", (1, 28, 28)).parameters())
    for views, sent, recv, nonzeros in run_ranks(_sparse_run, 3, "gd", 3,
                                                 {"density": 1.0})[:-1]:
        assert nonzeros == numel and sent == HEADER_BYTES + 8 * numel
        assert not torch.equal(views[0], views[-1])
