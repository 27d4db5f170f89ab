"""Who talks to whom: group views, chunking and the power-of-two fold-in.

Pure helpers shared by the collectives; nothing here communicates.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist


@dataclass(frozen=True)
class GroupView:
    """The calling process's place in a process group.

    ``rank`` and ``size`` are group ranks (``rank`` is -1 when the caller is not a member);
    :meth:`global_rank` maps a group rank to the global rank that errors and the
    parameter server speak of. ``pg`` is the process group object itself (the world's when
    ``group`` is None), whose ``send``/``recv`` take group ranks.
    """

    group: dist.ProcessGroup | None
    rank: int
    size: int
    global_ranks: tuple[int, ...]

    @classmethod
    def of(cls, group: dist.ProcessGroup | None = None) -> "GroupView":
        if not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialised: call "
                               "torch.distributed.init_process_group first")
        if group is None or group is dist.GroupMember.WORLD:
            size = dist.get_world_size()
            return cls(None, dist.get_rank(), size, tuple(range(size)))
        rank = dist.get_rank(group)
        size = dist.get_world_size(group)
        if rank < 0:  # not a member: torch reports -1 for rank and size
            return cls(group, -1, 0, ())
        return cls(group, rank, size,
                   tuple(dist.get_global_rank(group, i) for i in range(size)))

    def global_rank(self, group_rank: int) -> int:
        return self.global_ranks[group_rank]

    @property
    def pg(self) -> dist.ProcessGroup:
        return dist.group.WORLD if self.group is None else self.group


def chunk_bounds(numel: int, parts: int) -> list[int]:
    """Offsets of ``parts`` nearly equal contiguous chunks of ``numel`` elements.

    Returns ``parts + 1`` offsets; chunk i is ``[b[i], b[i+1])``. The first ``numel % parts``
    chunks hold ``numel // parts + 1`` elements, the others ``numel // parts`` (so some are
    empty when ``numel < parts``).
    """
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    if numel < 0:
        raise ValueError(f"numel must be >= 0, got {numel}")
    base, extra = divmod(numel, parts)
    bounds = [0]
    for i in range(parts):
        bounds.append(bounds[-1] + base + (1 if i < extra else 0))
    return bounds


def largest_power_of_two(n: int) -> int:
    """The largest power of two <= n (n >= 1)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    return 1 << (n.bit_length() - 1)


@dataclass(frozen=True)
class Fold:
    """The standard fold-in of a non-power-of-two group onto p' = largest power of two <= P.

    The r = P - p' extra ranks p', ..., P-1 each pair with rank ``extra - p'`` inside p':
    an extra sends its vector to its partner (which adds it), sits out the power-of-two
    algorithm, and receives the result from its partner at the end (Thakur, Rabenseifner &
    Gropp 2005, section 4). ``inner`` is the caller's rank among the p' (``None`` for an
    extra); ``partner`` the group rank it exchanges with in the fold (``None`` for none).
    """

    size: int          # p'
    inner: int | None
    partner: int | None

    @classmethod
    def of(cls, rank: int, world_size: int) -> "Fold":
        p2 = largest_power_of_two(world_size)
        if rank >= p2:
            return cls(p2, None, rank - p2)
        partner = rank + p2 if rank + p2 < world_size else None
        return cls(p2, rank, partner)
