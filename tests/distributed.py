"""Run a function on P real torch.distributed (gloo) processes on loopback.

Used by the multi-process tests: `run_ranks(fn, world_size, *args)` starts `world_size`
processes (forked from a server that imported torch once), each calling
`fn(rank, world_size, *args)` inside an initialised gloo process group, and returns the
values they returned (which must be picklable: they travel back through a multiprocessing
queue, never through torch.distributed). A rank that raises fails the call with its
traceback; a rank that hangs is killed after `timeout` seconds.
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import pickle
import queue
import socket
import traceback
from typing import Any, Callable


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(fn, rank, world_size, port, pg_timeout, agent_store, args, results):
    import torch
    import torch.distributed as dist

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    if agent_store:  # the store is the caller's, as torchrun's agent's: rank 0 connects to it
        os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "True"
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    try:
        dist.init_process_group(
            "gloo", rank=rank, world_size=world_size,
            timeout=datetime.timedelta(seconds=pg_timeout),
        )
        # Gloo's full mesh can be up on one rank while a peer is still reading its handshake;
        # a rank whose `fn` returns at once would then close its sockets under that peer
        # ("Connection closed by peer" in init_process_group, seen once in CI). torch no
        # longer barriers after init unless TORCH_DIST_INIT_BARRIER=1.
        dist.barrier()
        value = fn(rank, world_size, *args)
        # Plain pickle copies tensors by value; the queue's own reducer would share them by file
        # descriptor, which dies with this process.
        results.put((rank, True, pickle.dumps(value)))
    except BaseException:  # report every failure, KeyboardInterrupt included
        results.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:
                pass


def _context(start: str) -> mp.context.BaseContext:
    """`forkserver`: a server that imported torch and hetsync once forks every rank of every
    test, which then starts in milliseconds instead of seconds (torch, and the torch._dynamo
    the first optimizer imports). The server imports nothing that starts a thread. Its ranks
    see the environment the server started with, not later changes to os.environ; `spawn`
    (a fresh interpreter per rank) is for ranks that use a GPU."""
    ctx = mp.get_context(start)
    if start == "forkserver":
        ctx.set_forkserver_preload(["torch", "torch.distributed", "torch._dynamo",
                                    "hetsync.distributed_optimizer"])
    return ctx


def run_ranks(fn: Callable[..., Any], world_size: int, *args: Any,
              timeout: float = 120.0, pg_timeout: float = 60.0,
              allow_failures: bool = False, start: str = "forkserver",
              agent_store: bool = False) -> list[Any]:
    """Run `fn(rank, world_size, *args)` on `world_size` gloo processes; return per-rank results.

    With `allow_failures`, a rank that raised yields an `Exception` carrying its traceback
    instead of failing the whole call (for fault-injection tests). `start`: how the ranks
    start (see `_context`). `agent_store`: the key-value store lives in this process, as
    under torchrun (in its agent), not in rank 0's, which may then be lost.
    """
    ctx = _context(start)
    results = ctx.Queue()
    port = free_port()
    store = None
    if agent_store:
        import torch.distributed as dist

        store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                              timeout=datetime.timedelta(seconds=pg_timeout))
    procs = [ctx.Process(target=_entry, args=(fn, r, world_size, port, pg_timeout, agent_store,
                                              args, results), daemon=True)
             for r in range(world_size)]
    for p in procs:
        p.start()
    out: dict[int, Any] = {}
    deadline = datetime.datetime.now() + datetime.timedelta(seconds=timeout)
    try:
        while len(out) < world_size:
            left = (deadline - datetime.datetime.now()).total_seconds()
            if left <= 0:
                raise TimeoutError(f"ranks {sorted(set(range(world_size)) - set(out))} "
                                   f"did not finish within {timeout} s")
            try:
                rank, ok, value = results.get(timeout=min(left, 1.0))
            except queue.Empty:
                dead = [r for r, p in enumerate(procs)
                        if r not in out and not p.is_alive() and p.exitcode not in (0, None)]
                for r in dead:
                    out[r] = RuntimeError(f"rank {r} died with exit code {procs[r].exitcode}")
                    if not allow_failures:
                        raise out[r]
                continue
            if not ok:
                if not allow_failures:
                    raise RuntimeError(f"rank {rank} failed:\n{value}")
                value = RuntimeError(value)
            else:
                value = pickle.loads(value)
            out[rank] = value
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
        del store  # (after the ranks: they may still be talking to it)
    return [out[r] for r in range(world_size)]
