"""Every mode and every server rule can be checkpointed: `state_dict()` → `torch.save` →
`torch.load(weights_only=True)` → `load_state_dict()` gives back exactly the same state."""

import io

import pytest
import torch
import torch.distributed as dist

from distributed import run_ranks
from tiny import SmallNet
from hetsync.algorithms import Step, registry
from hetsync.algorithms.async_ps import AsgdRule, DcasgdRule

LR = 0.1


def _through_disk(state):
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def _assert_same(a, b, where="state"):
    """Exactly equal: the same keys, numbers and tensors (values, dtypes, shapes)."""
    assert type(a) is type(b) or (isinstance(a, (int, float)) and isinstance(b, (int, float))), \
        (where, type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert list(a) == list(b), (where, list(a), list(b))
        for k in a:
            _assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, (where, a, b)


def _round_trip(rank, world, mode, module, state_port):
    from hetsync.comm import ParameterServer
    from hetsync.runtime.assembly import Wiring, assemble

    registry.import_plugins([module])  # a mode registered outside hetsync, too
    spec = registry.get(mode)
    group = dist.new_group([0])
    torch.manual_seed(0)
    model = SmallNet()
    if rank == 1:  # the parameter server, when the mode has one
        if spec.needs_parameter_server("native"):
            weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
            ParameterServer([0], registry.build_server_rule(mode, weights, LR)).serve()
        return None
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    options = spec.make_options()
    assembly = assemble(spec, options, model, opt,
                        Wiring(rank=0, workers=1, group=group, service=("127.0.0.1", state_port),
                               ps_rank=1, timeout=30))
    algo = assembly.mode
    g = torch.Generator().manual_seed(1)
    for i in range(5):
        x, y = torch.randn(8, 1, 8, 8, generator=g), torch.randint(0, 10, (8,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(algo.module(x), y).backward()
        algo.poll()
        algo.perform(algo.decide(Step(float(i), i + 0.01)))
    if hasattr(algo, "settle"):
        algo.settle()
    saved = algo.state_dict()
    loaded = _through_disk(saved)
    torch.manual_seed(1)  # another model: the state must carry everything the mode adds
    other_model = SmallNet()
    other = spec.worker(other_model, torch.optim.SGD(other_model.parameters(), lr=LR),
                        assembly.comm, options)
    other.load_state_dict(loaded)
    _assert_same(saved, other.state_dict())
    _assert_same(saved, _through_disk(other.state_dict()))
    with algo.global_model():
        mine = [p.detach().clone() for p in list(model.parameters()) + list(model.buffers())]
    if "global_weights" in saved:  # ESync: the global model and BN statistics come back
        with other.global_model():
            theirs = list(other_model.parameters()) + list(other_model.buffers())
            for a, b in zip(mine[:len(theirs)], theirs):
                if a.is_floating_point():
                    assert torch.equal(a, b.detach())
    algo.finish()
    assembly.close()
    return sorted(saved)


@pytest.mark.slow
@pytest.mark.parametrize("mode", registry.names())
def test_every_mode_state_round_trips_exactly_through_torch_load(mode):
    service = registry.get(mode).service  # (the mode's own, if it declares one)
    server = service.serve(1, "127.0.0.1", None) if service is not None else None
    try:
        keys, _ = run_ranks(_round_trip, 2, mode, registry.get(mode).worker.__module__,
                            server.port if server else 0, timeout=120)
    finally:
        if server is not None:
            server.stop()
    assert "round" in keys
    if mode == "esync":
        assert {"global_weights", "global_bn_stats"} <= set(keys)


@pytest.mark.parametrize("rule", [
    lambda: AsgdRule(torch.arange(6.0), lr=0.5),
    lambda: DcasgdRule(torch.arange(6.0), lr=0.5, lam=0.1),
])
def test_every_server_rule_state_round_trips_and_continues_identically(rule):
    a = rule()
    a.pull(0)
    a.push(1, torch.ones(6))
    a.pull(1)
    b = rule()
    b.load_state_dict(_through_disk(a.state_dict()))
    _assert_same(a.state_dict(), b.state_dict())
    update = torch.linspace(-1, 1, 6)
    torch.testing.assert_close(a.push(0, update), b.push(0, update), rtol=0, atol=0)
