"""The persistent background channel on real gloo processes: its own group, in-order jobs,
deadlines instead of hangs."""

import time

import pytest
import torch
import torch.distributed as dist

from distributed import run_ranks
from hetsync.comm import CommError, CommTimeoutError, all_reduce
from hetsync.comm.channel import Channel


def _background_beside_main(rank, world):
    main = dist.new_group(list(range(world)))
    channel = Channel(dist.new_group(list(range(world))), timeout=30)
    futures, mains, expected = [], [], []
    for k in range(20):
        # Both threads run ring all-reduces (point-to-point on the same tag) at once: only
        # separate groups keep their messages apart.
        bg = torch.full((50_000,), float(rank + k))
        ref = bg.clone()
        dist.all_reduce(ref, group=main)
        expected.append(ref)
        futures.append(channel.submit(
            lambda group, t=bg: all_reduce(t, algorithm="ring", group=group, timeout=30),
            f"job {k}"))
        fg = torch.full((50_000,), float(10 * rank - k))
        all_reduce(fg, algorithm="ring", group=main, timeout=30)
        mains.append(fg)
    results = [f.result() for f in futures]
    channel.close()
    return results, expected, mains


@pytest.mark.slow
def test_background_collectives_never_cross_the_main_threads():
    world = 3
    for results, expected, mains in run_ranks(_background_beside_main, world):
        for k, (got, ref) in enumerate(zip(results, expected)):
            torch.testing.assert_close(got, ref, msg=f"background job {k}")
        for k, got in enumerate(mains):
            want = float(sum(10 * r - k for r in range(world)))
            torch.testing.assert_close(got, torch.full_like(got, want), msg=f"main {k}")


def _dead_peer(rank, world):
    channel = Channel(dist.new_group(list(range(world))), timeout=3)
    if rank == world - 1:
        time.sleep(6)  # alive but silent: its peers' jobs cannot complete
        return None
    start = time.monotonic()
    first = channel.submit(lambda g: all_reduce(torch.ones(8), "ring", group=g, timeout=3),
                           "first")
    second = channel.submit(lambda g: "never run", "second")
    out = {}
    for name, fut in (("first", first), ("second", second)):
        try:
            fut.result()
            out[name] = "no error"
        except CommError as err:
            out[name] = (type(err).__name__, str(err))
    out["seconds"] = time.monotonic() - start
    return out


@pytest.mark.slow
def test_a_silent_peer_fails_the_job_within_its_deadline_and_the_jobs_after_it():
    for out in run_ranks(_dead_peer, 3, timeout=60)[:2]:
        assert out["first"][0] == "CommTimeoutError", out
        assert "broke earlier" in out["second"][1], out
        assert out["seconds"] < 10, out


def test_a_future_past_its_deadline_raises_instead_of_waiting():
    channel = Channel(None, timeout=0.2)
    started = time.monotonic()
    slow = channel.submit(lambda g: time.sleep(1.0), "slow job")
    with pytest.raises(CommTimeoutError, match="slow job: not done in time"):
        slow.result()
    assert time.monotonic() - started < 0.9
    channel.close(wait=False)


def test_a_long_running_job_has_no_deadline_but_its_caller_bounds_the_wait():
    channel = Channel(None, timeout=0.2)
    job = channel.submit(lambda g: time.sleep(0.5) or "done", "engine", long_running=True)
    assert job.result(within=5.0) == "done"  # longer than the channel's timeout: still fine
    stuck = channel.submit(lambda g: time.sleep(1.0), "stuck", long_running=True)
    with pytest.raises(CommTimeoutError, match="stuck: not done in time"):
        stuck.result(within=0.1)
    channel.close(wait=False)


def _held_by_a_pending_work(rank, world):
    from hetsync.comm.p2p import wait_released

    store = dist.distributed_c10d._get_default_store()
    buf = torch.full((4,), float(rank))
    if rank == 0:
        store.wait(["posted"])
        dist.broadcast(buf, src=0)
        return None
    work = dist.broadcast(buf, src=0, async_op=True)
    pending = wait_released([buf], within=0.2)
    store.set("posted", "1")
    work.wait()
    del work  # (the caller's handle holds the work, and so the tensor, too)
    return pending, wait_released([buf], within=30), buf._use_count(), buf.tolist()


def test_wait_released_waits_while_a_work_holds_the_tensor_and_returns_once_torch_let_go():
    """`wait_released` (before a process exits after its last collective): while a gloo
    work still holds a tensor, it says so after its wait; once the work is done and torch's
    thread dropped it, the caller's reference is the only one. (A canary for torch's
    `Tensor._use_count` too: if it stopped counting the work's hold, the first check fails.)"""
    _, (pending, released, holders, value) = run_ranks(_held_by_a_pending_work, 2, timeout=60)
    assert (pending, released, holders, value) == (False, True, 1, [0.0] * 4)
