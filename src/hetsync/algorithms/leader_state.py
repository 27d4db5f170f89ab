"""The leader's model, optimizer state and counts on every member: what the survivors of a
regroup, and a worker that joins, go on from (`runtime/membership.py`).

A mode that keeps the same model on every worker (`sync`, eager-SGD) cannot tell after a
lost peer which of the failed round's updates each survivor applied, nor what a joiner
should hold. `take_leaders_state` makes every member hold the leader's (the group's first,
`CommContext.leads`):

1. the leader describes its optimizer's per-parameter state (torch's
   ``optimizer.state_dict()["state"]``: each tensor's parameter index, key, shape and dtype;
   each number as it is) in JSON, and broadcasts its length, then its bytes;
2. it broadcasts its counts and, in checked chunks (`CommContext.broadcast_state`), the
   given tensors (parameters, and buffers where the mode shares them) and every state tensor,
   in float64, which holds float32 and counts below 2^53 exactly;
3. every member copies the tensors in place and loads the state into its optimizer
   (`load_state_dict`, which casts each tensor back to its parameter's dtype and device),
   keeping its own hyperparameters (`param_groups`), which are the run's.

JSON, not pickle, crosses the wire (a member reads nothing it could run). A member with no
optimizer state yet (a joiner) takes the leader's whole; one the leader has none of (no step
taken yet) ends with none.
"""

from __future__ import annotations

import json

import torch

from hetsync.algorithms.base import CommContext, flatten, unflatten_into


def take_leaders_state(comm: CommContext, tensors: list[torch.Tensor],
                       optimizer: torch.optim.Optimizer, counts: list[float]) -> list[float]:
    """Copy the leader's `tensors` (in place) and `optimizer` state onto every member;
    returns the leader's `counts` (numbers each member passes, the leader's stand)."""
    if comm.workers == 1:
        return list(counts)
    layout, values = _described(optimizer) if comm.leads else ([], [])
    text = json.dumps(layout).encode() if comm.leads else b""
    head = comm.broadcast(torch.tensor([float(len(text)), *map(float, counts)],
                                       dtype=torch.float64))
    raw = torch.frombuffer(bytearray(text), dtype=torch.uint8) if comm.leads \
        else torch.zeros(int(head[0]), dtype=torch.uint8)
    layout = json.loads(bytes(comm.broadcast(raw).tolist()).decode()) if len(raw) else []
    sizes = [t.numel() for t in tensors] + [_numel(entry) for entry in layout
                                             if entry["kind"] == "tensor"]
    mine = (torch.cat([flatten([t.detach() for t in tensors]).double(),
                       *[v.reshape(-1).double().cpu() for v in values]])
            if comm.leads else torch.zeros(sum(sizes), dtype=torch.float64))
    state = comm.broadcast_state(mine)
    shared = state[:sum(t.numel() for t in tensors)]
    with torch.no_grad():
        unflatten_into(shared, [t.data for t in tensors])
    _load(optimizer, layout, state[shared.numel():])
    return head[1:].tolist()


def _described(optimizer: torch.optim.Optimizer) -> tuple[list[dict], list[torch.Tensor]]:
    """The optimizer's per-parameter state: its layout (JSON-able) and its tensors, in order."""
    layout, values = [], []
    for index, entries in sorted(optimizer.state_dict()["state"].items()):
        for key, value in sorted(entries.items()):
            if isinstance(value, torch.Tensor):
                layout.append({"kind": "tensor", "param": index, "key": key,
                               "shape": list(value.shape), "dtype": str(value.dtype)})
                values.append(value.detach())
            else:
                layout.append({"kind": "value", "param": index, "key": key, "value": value})
    return layout, values


def _numel(entry: dict) -> int:
    n = 1
    for size in entry["shape"]:
        n *= size
    return n


def _load(optimizer: torch.optim.Optimizer, layout: list[dict], flat: torch.Tensor) -> None:
    """Load `layout`'s state (its tensors' values in `flat`) into `optimizer`."""
    state: dict[int, dict] = {}
    offset = 0
    for entry in layout:
        if entry["kind"] == "tensor":
            n = _numel(entry)
            dtype = getattr(torch, entry["dtype"].removeprefix("torch."))
            value = flat[offset:offset + n].reshape(entry["shape"]).to(dtype)
            offset += n
        else:
            value = entry["value"]
        state.setdefault(int(entry["param"]), {})[entry["key"]] = value
    optimizer.load_state_dict({"state": state,
                               "param_groups": optimizer.state_dict()["param_groups"]})
