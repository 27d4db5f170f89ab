"""Gradient compression, kept apart from transport (as GRACE keeps compressor, memory and
communicator apart):

- a *selector* (`sparsify.py`) says which coordinates of a flat vector to send, per layer;
  it states the transport it needs (`TopK.transport`: top-k sets cannot be summed by an
  all-reduce, so they go to a parameter server);
- a *memory* (`memory.py`) keeps what was not sent (error feedback) and never communicates;
- the transport is the mode's: `hetsync.comm.wire.SparseMessage` over the parameter server
  (int32 indices, fp32 values, sizes in the header).

Both go by name through :data:`SELECTORS` and :data:`MEMORIES`.
"""

from hetsync.compression.memory import MomentumCorrection, ResidualMemory, SAMomentum
from hetsync.compression.sparsify import Layout, SampledTopK, TopK, layer_k

SELECTORS = {"topk": TopK, "sampled-topk": SampledTopK}
MEMORIES = {"residual": ResidualMemory, "momentum-correction": MomentumCorrection,
            "samomentum": SAMomentum}


def selector(name: str, layout: Layout):
    """The selector registered as `name`; ValueError naming the valid ones."""
    if name not in SELECTORS:
        raise ValueError(f"unknown selector {name!r}; expected one of {', '.join(SELECTORS)}")
    return SELECTORS[name](layout)


def memory(name: str, numel: int, **options):
    """The memory registered as `name` (options: momentum, weight_decay)."""
    if name not in MEMORIES:
        raise ValueError(f"unknown memory {name!r}; expected one of {', '.join(MEMORIES)}")
    return MEMORIES[name](numel, **options)


__all__ = ["Layout", "MEMORIES", "MomentumCorrection", "ResidualMemory", "SAMomentum",
           "SELECTORS", "SampledTopK", "TopK", "layer_k", "memory", "selector"]
