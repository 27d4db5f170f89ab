"""SCAFFOLD's control variates (pure logic; ESync runs them on real processes in
test_modes)."""

import io

import torch

from hetsync.algorithms.scaffold import ControlVariates

STEPS = [8, 4, 2, 1]  # the demo cluster's local steps per round


def _rounds(correct: bool, rounds=300, lr=0.05, seed=0):
    """Local SGD on f_i(x) = ½‖x − a_i‖² with unequal local steps, the mean delta applied;
    returns the distance to the minimiser of the mean objective, mean a_i."""
    a = torch.randn(len(STEPS), 5, generator=torch.Generator().manual_seed(seed)) * 3
    x = torch.zeros(5)
    variates = [ControlVariates() for _ in STEPS]
    for _ in range(rounds):
        deltas, means = [], []
        for i, steps in enumerate(STEPS):
            p = torch.nn.Parameter(x.clone())
            for _ in range(steps):
                p.grad = p.detach() - a[i]
                if correct:
                    variates[i].correct([p], lr)
                p.data.add_(p.grad, alpha=-lr)
            deltas.append(p.detach() - x)
            if correct:
                means.append(variates[i].contribution(deltas[-1]))
        x = x + sum(deltas) / len(STEPS)
        for v in variates if correct else []:
            v.update(sum(means), len(STEPS))
    return (x - a.mean(0)).norm().item(), variates


def test_control_variates_remove_the_drift_of_unequal_local_steps():
    plain, _ = _rounds(correct=False)
    corrected, variates = _rounds(correct=True)
    assert plain > 1.0  # the mean delta converges towards the fast worker's data
    assert corrected < 1e-4
    # c is the mean of the c_i, as SCAFFOLD keeps it
    torch.testing.assert_close(variates[0].common,
                               sum(v.own for v in variates) / len(variates))


def test_the_round_mean_gradient_is_exact_when_the_variates_change_mid_round():
    """Under ESync's background aggregation a round's sum comes in a few steps into the next
    round: ḡ_i must still be the rate-weighted mean of the raw gradients its round saw."""
    g = torch.Generator().manual_seed(1)
    v = ControlVariates()
    p = torch.nn.Parameter(torch.zeros(6))

    def steps(rates):
        raw = []
        for lr in rates:
            p.grad = torch.randn(6, generator=g)
            raw.append(p.grad.clone())
            v.correct([p], lr)
            p.data.add_(p.grad, alpha=-lr)
        return raw

    start = p.detach().clone()
    steps([0.1])
    v.contribution(p.detach() - start)   # round A sent
    v.update(torch.randn(6, generator=g), 1)   # ... and summed: c, c_i from now on
    start = p.detach().clone()
    steps([0.1, 0.1])
    v.contribution(p.detach() - start)   # round B sent
    start = p.detach().clone()
    rates = [0.1, 0.08, 0.05, 0.03]
    raw = steps(rates[:2])
    v.update(torch.randn(6, generator=g), 1)   # B's sum comes in two steps into round C
    raw += steps(rates[2:])
    expected = sum(lr * r for lr, r in zip(rates, raw)) / sum(rates)
    torch.testing.assert_close(v.contribution(p.detach() - start), expected)


def test_control_variates_survive_a_checkpoint():
    _, variates = _rounds(correct=True, rounds=3)
    buf = io.BytesIO()
    torch.save(variates[1].state_dict(), buf)
    buf.seek(0)
    copy = ControlVariates()
    copy.load_state_dict(torch.load(buf, weights_only=True))
    assert torch.equal(copy.own, variates[1].own)
    assert torch.equal(copy.common, variates[1].common)
    copy.reset()
    assert copy.own is None and copy.common is None
