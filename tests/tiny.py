"""Small models, batches and a user-style loop shared by the multi-process tests."""

import torch
import torch.distributed as dist

from hetsync.algorithms.base import flatten


class SmallNet(torch.nn.Module):
    """Conv + BatchNorm + linear: small, with running statistics to average."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        self.fc = torch.nn.Linear(4 * 8 * 8, 10)

    def forward(self, x):
        return self.fc(torch.relu(self.bn(self.conv(x))).flatten(1))


def linear_net() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))


def sample_weight(batches, rank: int) -> float:
    """Rank `rank`'s share of a step's samples × P, as `Config.sample_weight_of` gives it."""
    return len(batches) * batches[rank] / sum(batches)


def batch(rank: int, n: int = 8):
    """Rank `rank`'s own reproducible batch of 8x8 images and labels."""
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g)


def sgd_on_every_sample(batches, lr: float) -> torch.Tensor:
    """The reference for a synchronous step: one process, `linear_net` from seed 0, one SGD
    step on the mean gradient over every rank's `batch(rank, batches[rank])`; its flat
    parameters."""
    torch.manual_seed(0)
    ref = linear_net()
    opt = torch.optim.SGD(ref.parameters(), lr=lr)
    xs, ys = zip(*(batch(r, n) for r, n in enumerate(batches)))
    opt.zero_grad()
    torch.nn.functional.cross_entropy(ref(torch.cat(xs)), torch.cat(ys)).backward()
    opt.step()
    return flatten(list(ref.parameters()))


def user_loop(opt, model, x, y, steps: int) -> list[float]:
    """A user's own training loop over a wrapped optimizer; the losses it saw."""
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    return losses


def gathered_parameters(model, world: int) -> list[torch.Tensor]:
    """Every rank's flat parameters (an all-gather)."""
    params = flatten(list(model.parameters()))
    gathered = [torch.zeros_like(params) for _ in range(world)]
    dist.all_gather(gathered, params)
    return gathered
