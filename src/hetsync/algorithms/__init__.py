"""The synchronisation modes; `build_algorithm` maps a mode name to its module."""

from __future__ import annotations

import torch

from hetsync.algorithms.async_ps import AsgdRule, AsynchronousSGD, DcasgdRule
from hetsync.algorithms.base import Algorithm, CommContext, PhaseClock
from hetsync.algorithms.esync import ESync
from hetsync.algorithms.local import LocalSGD
from hetsync.algorithms.sync import SynchronousSGD

#: mode name -> the worker-side class
ALGORITHMS: dict[str, type[Algorithm]] = {
    "local": LocalSGD,
    "sync": SynchronousSGD,
    "esync": ESync,
    "async": AsynchronousSGD,
    "dcasgd": AsynchronousSGD,
}


def build_algorithm(mode: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    comm: CommContext, *, state_client=None, global_lr: float = 1.0,
                    server_lr: float | None = None, device_name: str = "",
                    overlap: bool = True) -> Algorithm:
    """The worker side of `mode`; ValueError naming the mode if it is unknown."""
    if mode not in ALGORITHMS:
        raise ValueError(f"unknown mode {mode!r}; expected one of {', '.join(ALGORITHMS)}")
    if mode == "esync":
        if state_client is None:
            raise ValueError("mode 'esync' needs a state server client (-ip/-port)")
        return ESync(model, optimizer, comm, state_client=state_client, global_lr=global_lr,
                     device_name=device_name, overlap=overlap)
    if mode in ("async", "dcasgd"):
        if comm.ps_client is None:
            raise ValueError(f"mode {mode!r} needs a parameter server")
        lr = optimizer.param_groups[0]["lr"] if server_lr is None else server_lr
        return AsynchronousSGD(model, optimizer, comm, server_lr=lr)
    return ALGORITHMS[mode](model, optimizer, comm)


def build_server_rule(mode: str, weights: torch.Tensor, lr: float, dcasgd_lambda: float = 0.04):
    """The parameter server's rule for an asynchronous mode."""
    if mode == "async":
        return AsgdRule(weights, lr)
    if mode == "dcasgd":
        return DcasgdRule(weights, lr, dcasgd_lambda)
    raise ValueError(f"mode {mode!r} has no parameter-server rule; expected async or dcasgd")


__all__ = ["ALGORITHMS", "Algorithm", "AsgdRule", "AsynchronousSGD", "CommContext",
           "DcasgdRule", "ESync", "LocalSGD", "PhaseClock", "SynchronousSGD",
           "build_algorithm", "build_server_rule"]
