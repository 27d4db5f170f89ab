"""hetsync: data-parallel training of PyTorch models on heterogeneous clusters.

ESync (local steps sized to the slowest worker's step, then averaged weight deltas) and the
schemes it is measured against, over torch.distributed.
"""

__version__ = "0.1.0"


def wrap(optimizer, model, mode: str = "esync", **kwargs):
    """Wrap `optimizer` so that `step()` runs `mode`; see
    `hetsync.distributed_optimizer.DistributedOptimizer`. (The module is not called `wrap`:
    importing it would rebind this name to the module.)"""
    from hetsync.distributed_optimizer import wrap as _wrap

    return _wrap(optimizer, model, mode, **kwargs)


def serve_parameters(optimizer, model, mode: str = "async", **kwargs) -> bool:
    """On the parameter server's rank of a mode that needs one: serve until every worker has
    finished, and return True; elsewhere return False at once; see
    `hetsync.distributed_optimizer.serve_parameters`."""
    from hetsync.distributed_optimizer import serve_parameters as _serve

    return _serve(optimizer, model, mode, **kwargs)
