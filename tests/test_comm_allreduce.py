"""Every all-reduce algorithm equals torch.distributed.all_reduce, and moves the bytes the
theory says, on real gloo processes (world sizes 1-5, a subgroup, the parameter server).

One launch per world size runs every case (process start-up is the slow part); the tests
below read its cached results.
"""

from __future__ import annotations

import functools
import hashlib
import math

import pytest
import torch

from distributed import run_ranks

ALGS = ("native", "ring", "butterfly", "binary-blocks", "star")
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
HALF_WORLDS = (3, 4)   # half types are checked at these world sizes (to keep the suite short)
TOL = {torch.float32: {}, torch.float64: {},
       torch.float16: {"rtol": 2e-3, "atol": 1e-2},
       torch.bfloat16: {"rtol": 1.6e-2, "atol": 1e-1}}
SUBGROUP = (0, 1, 2, 3)
SHIFTED = (1, 2, 3)


def lengths(p: int) -> list[int]:
    return sorted({1, p - 1, 3000} - {0})


def dtypes(p: int) -> tuple[torch.dtype, ...]:
    return DTYPES if p in HALF_WORLDS else DTYPES[:2]


def _data(rank: int, n: int, dtype: torch.dtype, salt: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * rank + n + salt)
    return torch.randn(n, generator=g, dtype=torch.float64).to(dtype)


def _digest(t: torch.Tensor) -> str:
    return hashlib.sha1(t.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


def _check(x: torch.Tensor, ref: torch.Tensor) -> str | None:
    try:
        torch.testing.assert_close(x, ref, **TOL[x.dtype])
    except AssertionError as err:
        return str(err)
    return None


def _case(x, alg, group=None):
    import torch.distributed as dist
    from hetsync.comm import all_reduce, meter

    ref = x.clone()
    dist.all_reduce(ref, group=group)
    meter.reset()
    out = all_reduce(x, alg, group=group, timeout=30)
    assert out is x
    return {"error": _check(x, ref), "bytes": meter.snapshot(), "digest": _digest(x)}


def _rank_cases(rank: int, world_size: int) -> dict:
    import torch.distributed as dist
    from hetsync.comm import ParameterServer, all_reduce, connect, disconnect, meter

    res = {}
    for dtype in dtypes(world_size):
        for n in lengths(world_size):
            for alg in ALGS:
                res[(alg, str(dtype), n)] = _case(_data(rank, n, dtype), alg)
    for alg in ALGS:   # a non-contiguous 2-D view, reduced through a copy, written back
        base = _data(rank, 48, torch.float64).view(6, 8)
        view = base[:, ::2]
        untouched = base[:, 1::2].clone()
        r = _case(view, alg)
        r["error"] = r["error"] or _check(base[:, 1::2], untouched)
        r["error"] = r["error"] or (None if view.shape == (6, 4) else "shape changed")
        res[(alg, "strided", 24)] = r
    from hetsync.comm import p2p
    saved, p2p.SEGMENT_BYTES = p2p.SEGMENT_BYTES, 256   # exercise the pipelined paths
    try:
        for dtype in DTYPES[:2]:
            for n in (3000, 3001):
                for alg in ALGS[1:]:
                    res[(alg, str(dtype), n, "segmented")] = _case(_data(rank, n, dtype), alg)
    finally:
        p2p.SEGMENT_BYTES = saved
    empty = torch.empty(0)
    for alg in ALGS:
        assert all_reduce(empty, alg) is empty
    if world_size == 5:   # subgroup 0..3 of the world; rank 4 serves the "ps" algorithm
        group = dist.new_group(list(SUBGROUP))
        shifted = dist.new_group(list(SHIFTED))  # group rank 0 = global rank 1
        if rank == 4:
            meter.reset()
            ParameterServer(list(SUBGROUP), timeout=60).serve()
            res["server_bytes"] = meter.snapshot()
            return res
        connect(4)
        for alg in ALGS + ("ps",):
            for n in (1, 3000):
                res[("sub", alg, n)] = _case(_data(rank, n, torch.float32, salt=7), alg, group)
        for alg in ALGS:
            if rank in SHIFTED:
                res[("shifted", alg)] = _case(_data(rank, 3000, torch.float32, salt=9), alg,
                                              shifted)
        meter.reset()
        disconnect()
        res["bye_bytes"] = meter.snapshot()
    return res


@functools.lru_cache(maxsize=None)
def results(p: int) -> list[dict]:
    return run_ranks(_rank_cases, p, timeout=180)


WORLDS = [1, 2, 3, 4, 5]


# -- correctness ---------------------------------------------------------------------------
@pytest.mark.parametrize("p", WORLDS)
def test_matches_native_all_reduce(p):
    errors = [(rank, key, r["error"]) for rank, res in enumerate(results(p))
              for key, r in res.items() if isinstance(r, dict) and r.get("error")]
    assert not errors, errors[:3]
    cases = {k for k in results(p)[0] if isinstance(k, tuple) and k[0] in ALGS}
    segmented = (len(ALGS) - 1) * 2 * 2
    assert len(cases) == len(ALGS) * (len(dtypes(p)) * len(lengths(p)) + 1) + segmented


@pytest.mark.parametrize("p", WORLDS)
def test_every_rank_gets_bitwise_the_same_sum(p):
    """Each algorithm sums every element in one order, so all ranks agree exactly."""
    res = results(p)
    for key in res[0]:
        if isinstance(key, tuple) and key[0] in ALGS and key[0] != "native":
            assert len({res[r][key]["digest"] for r in range(p)}) == 1, key


def test_subgroup_and_parameter_server_match_native():
    res = results(5)
    for rank in SUBGROUP:
        for alg in ALGS + ("ps",):
            for n in (1, 3000):
                r = res[rank][("sub", alg, n)]
                assert r["error"] is None, (rank, alg, n, r["error"])
                assert r["digest"] == res[0][("sub", alg, n)]["digest"]


def test_a_group_without_global_rank_0_matches_native():
    """Group rank 0 is global rank 1: each algorithm's roles follow the group's ranks (star's
    root is global rank 1), the bytes too."""
    res = results(5)
    for group_rank, rank in enumerate(SHIFTED):
        for alg in ALGS:
            r = res[rank][("shifted", alg)]
            assert r["error"] is None, (rank, alg, r["error"])
            assert r["digest"] == res[SHIFTED[0]][("shifted", alg)]["digest"], (rank, alg)
        assert res[rank][("shifted", "star")]["bytes"] == {"all_reduce/star": tuple(
            4 * e for e in star_elems(3000, len(SHIFTED), group_rank))}


# -- byte counts -----------------------------------------------------------------------------
def chunks(n: int, p: int) -> list[int]:
    return [n // p + (1 if i < n % p else 0) for i in range(p)]


def ring_elems(n: int, p: int, r: int) -> tuple[int, int]:
    """Rank r of a ring all-reduce: sent = 2n - c_r - c_{r+1}, recv = 2n - c_{r-1} - c_r."""
    if p == 1:
        return 0, 0
    c = chunks(n, p)
    return 2 * n - c[r] - c[(r + 1) % p], 2 * n - c[(r - 1) % p] - c[r]


def butterfly_elems(n: int, p: int, r: int) -> tuple[int, int]:
    """log2(p') n inside the power of two p'; the fold-in adds n each way to the pair."""
    if p == 1:
        return 0, 0
    p2 = 1 << (p.bit_length() - 1)
    steps = int(math.log2(p2))
    if r >= p2:
        return n, n
    e = steps * n + (n if r < p - p2 else 0)
    return e, e


def binary_blocks_elems(n: int, p: int, r: int) -> tuple[int, int]:
    """Halving: at step k rank i keeps the aligned block of p'/2^k chunks holding i and
    receives it; doubling mirrors that. Each way: sum_k |kept block_k| + (n - c_i)."""
    if p == 1:
        return 0, 0
    p2 = 1 << (p.bit_length() - 1)
    if r >= p2:
        return n, n
    c = chunks(n, p2)
    kept, width = 0, p2 // 2
    while width >= 1:
        lo = r - r % width
        kept += sum(c[lo:lo + width])
        width //= 2
    e = kept + n - c[r] + (n if r < p - p2 else 0)
    return e, e


def star_elems(n: int, p: int, r: int) -> tuple[int, int]:
    """The root (rank 0) receives and sends the whole vector once per other rank; the
    others send it once and receive the sum once."""
    if p == 1:
        return 0, 0
    e = (p - 1) * n if r == 0 else n
    return e, e


FORMULAS = {"native": ring_elems, "ring": ring_elems, "butterfly": butterfly_elems,
            "binary-blocks": binary_blocks_elems, "star": star_elems}


@pytest.mark.parametrize("p", WORLDS)
def test_byte_counts_equal_the_formulas(p):
    res = results(p)
    for rank in range(p):
        for (alg, dtype, n, *_), r in ((k, v) for k, v in res[rank].items()
                                       if isinstance(k, tuple) and k[0] in ALGS):
            size = 8 if dtype == "strided" else torch.empty((), dtype=getattr(
                torch, dtype.split(".")[1])).element_size()
            sent, recv = FORMULAS[alg](n, p, rank)
            got = r["bytes"].get(f"all_reduce/{alg}", (0, 0))
            assert got == (sent * size, recv * size), (rank, alg, dtype, n)
            assert set(r["bytes"]) <= {f"all_reduce/{alg}"}


@pytest.mark.parametrize("p", [2, 4])
def test_power_of_two_closed_forms(p):
    """For P a power of two dividing n (n = 3000, 4 bytes): ring, native and binary-blocks
    move 2(P-1)/P n elements each way, butterfly log2(P) n."""
    n, size = 3000, 4
    for rank, res in enumerate(results(p)):
        b = {alg: res[(alg, "torch.float32", n)]["bytes"][f"all_reduce/{alg}"] for alg in ALGS}
        two = 2 * (p - 1) * n // p * size
        assert b["ring"] == b["native"] == b["binary-blocks"] == (two, two)
        assert b["butterfly"] == (int(math.log2(p)) * n * size,) * 2


def test_ps_byte_counts_include_the_fixed_header():
    from hetsync.comm import HEADER_BYTES
    res = results(5)
    for rank in SUBGROUP:
        for n in (1, 3000):
            assert res[rank][("sub", "ps", n)]["bytes"] == {
                "all_reduce/ps": (HEADER_BYTES + 4 * n, HEADER_BYTES + 4 * n)}
            # the subgroup ring ran with group ranks 0..3 = global ranks 0..3
            assert res[rank][("sub", "ring", n)]["bytes"]["all_reduce/ring"] == tuple(
                4 * e for e in ring_elems(n, 4, rank))
        assert res[rank]["bye_bytes"] == {"ps/bye": (HEADER_BYTES, HEADER_BYTES)}
    per_worker = sum(HEADER_BYTES + 4 * n for n in (1, 3000))
    assert res[4]["server_bytes"] == {"ps/sum": (4 * per_worker, 4 * per_worker),
                                      "ps/bye": (4 * HEADER_BYTES, 4 * HEADER_BYTES)}
