"""Fault injection with real processes: a killed peer or a silent one makes the others raise
CommError / CommTimeoutError, naming the operation and the peer, within the timeout."""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch

from distributed import run_ranks

TIMEOUT = 5.0
SLACK = 3.0     # scheduling on a loaded 2-core machine


def _attempt(fn):
    from hetsync.comm import CommError
    t0 = time.monotonic()
    try:
        fn()
    except CommError as err:
        return {"type": type(err).__name__, "msg": str(err), "peer": err.peer,
                "seconds": getattr(err, "seconds", None), "elapsed": time.monotonic() - t0}
    return {"type": None, "elapsed": time.monotonic() - t0}


def _killed_peer(rank: int, world_size: int, algorithm: str):
    import torch.distributed as dist
    from hetsync.comm import all_reduce
    dist.barrier()          # every connection is up; then the last rank dies
    if rank == world_size - 1:
        os._exit(1)
    return _attempt(lambda: all_reduce(torch.ones(1000), algorithm, timeout=TIMEOUT))


# the transport is shared; star's roles are not (the dead rank's only peer is the root)
@pytest.mark.parametrize("algorithm", ["ring", "star"])
def test_killed_peer_raises_comm_error_quickly(algorithm):
    *alive, dead = run_ranks(_killed_peer, 4, algorithm, allow_failures=True, timeout=60)
    assert isinstance(dead, Exception)
    for r in alive:
        assert r["type"] in ("CommError", "CommTimeoutError"), r
        assert r["elapsed"] < TIMEOUT + SLACK, r
        assert r["msg"].startswith(f"all_reduce/{algorithm}: ") and "rank " in r["msg"]
    # the dead rank's direct neighbours name it
    assert any(r["peer"] == 3 and "rank 3" in r["msg"] for r in alive), alive


def _silent_peer(rank: int, world_size: int):
    from hetsync.comm import all_reduce, set_default_timeout
    if rank == 2:
        time.sleep(2 * 2.0 + 2)     # outlives the others' timeout, then leaves quietly
        return None
    set_default_timeout(2.0)        # the process-wide default bounds the wait
    return _attempt(lambda: all_reduce(torch.ones(10), "butterfly"))


def test_silent_peer_times_out_naming_peer_and_seconds():
    r0, r1, _ = run_ranks(_silent_peer, 3, allow_failures=True, timeout=60)
    # rank 0 folds in rank 2 (3 = 2 + 1 extra), so it waits on rank 2 and times out
    assert r0["type"] == "CommTimeoutError" and r0["peer"] == 2 and r0["seconds"] == 2.0
    assert "all_reduce/butterfly" in r0["msg"] and "rank 2" in r0["msg"] and "2 s" in r0["msg"]
    assert 2.0 <= r0["elapsed"] < 2.0 + SLACK
    assert r1["type"] in ("CommError", "CommTimeoutError") and r1["elapsed"] < 2.0 + SLACK


def _ps_dead(rank: int, world_size: int, who: str):
    import torch.distributed as dist
    from hetsync.comm import CommError, ParameterServer, PSClient

    class Echo:
        def pull(self, worker):
            return torch.zeros(3)

        def push(self, worker, update):
            return update

    dist.barrier()
    server = world_size - 1
    if (who == "server" and rank == server) or (who == "worker" and rank == 1):
        os._exit(1)
    if who == "silent worker" and rank == 1:
        time.sleep(TIMEOUT + SLACK)     # alive, connected, and says nothing
        return None
    if rank == server:
        t0 = time.monotonic()
        try:
            stats = ParameterServer([0, 1], Echo(), timeout=TIMEOUT).serve()
        except CommError as err:
            return {"type": type(err).__name__, "msg": str(err),
                    "elapsed": time.monotonic() - t0}
        return {"type": None, "lost": stats.lost, "elapsed": time.monotonic() - t0}
    client = PSClient(server, timeout=TIMEOUT)
    if who == "server":
        return _attempt(lambda: client.push_pull(torch.ones(3)))
    client.push_pull(torch.ones(3))
    client.close()
    return {"type": None}


def test_dead_parameter_server_fails_the_worker():
    w0, w1, dead = run_ranks(_ps_dead, 3, "server", allow_failures=True, timeout=60)
    assert isinstance(dead, Exception)
    for r in (w0, w1):
        assert r["type"] in ("CommError", "CommTimeoutError") and r["peer"] == 2, r
        assert r["msg"].startswith("ps/push_pull: ") and r["elapsed"] < TIMEOUT + SLACK


def test_dead_worker_is_lost_at_once_and_the_server_finishes():
    w0, dead, server = run_ranks(_ps_dead, 3, "worker", allow_failures=True, timeout=60)
    assert w0 == {"type": None} and isinstance(dead, Exception)
    # its closed connection names it: the server does not wait out its timeout for it
    assert server["type"] is None and server["lost"] == [1], server
    assert server["elapsed"] < TIMEOUT, server


def test_silent_worker_stops_the_server_within_its_timeout():
    w0, _, server = run_ranks(_ps_dead, 3, "silent worker", allow_failures=True, timeout=60)
    assert w0 == {"type": None}
    assert server["type"] == "CommTimeoutError", server
    assert "ps/serve" in server["msg"] and "[1]" in server["msg"]
    assert TIMEOUT <= server["elapsed"] < TIMEOUT + SLACK


def _worker_dies_mid_request(rank: int, world_size: int, when: str):
    import torch.distributed as dist
    from hetsync.comm import ParameterServer, PSClient
    from hetsync.comm.ps import TAG_REQUEST
    from hetsync.comm.wire import Header, Op, describe

    class Sum:
        def __init__(self):
            self.w = torch.zeros(1000)

        def pull(self, worker):
            if worker == 1:
                time.sleep(1.0)  # rank 1 announces its next request and dies meanwhile
            return self.w

        def push(self, worker, update):
            if worker == 1 and when == "before its reply":
                time.sleep(1.0)  # rank 1 dies while the server works on its push
            self.w += update
            return self.w

    server = world_size - 1
    dist.barrier()
    if rank == server:
        stats = ParameterServer([0, 1], Sum(), timeout=TIMEOUT, linger=1.0).serve()
        return {"lost": stats.lost, "per_worker": stats.per_worker}
    client = PSClient(server, timeout=TIMEOUT)
    if rank == 1:
        if when == "before its payload":  # a header announcing 1000 values, then nothing
            header = Header(op=Op.PUSH_PULL, sender=1, seq=0, **describe(torch.ones(1000)))
            dist.send(header.encode(), server, tag=TAG_REQUEST)
        elif when == "with its next header announced":
            # its next request is announced before the server asked for it (the server is busy
            # with its pull), then it dies: an announcement gloo's any-source receive kept,
            # failing every later any-source receive
            dist.send(Header(op=Op.PULL, sender=1, seq=0, **describe(None)).encode(), server,
                      tag=TAG_REQUEST)
            dist.isend(Header(op=Op.PULL, sender=1, seq=1, **describe(None)).encode(), server,
                       tag=TAG_REQUEST)
            time.sleep(0.2)
        else:
            threading.Thread(target=client.push_pull, args=(torch.ones(1000),),
                             daemon=True).start()
            time.sleep(0.3)
        os._exit(1)
    time.sleep(2.0)                 # rank 1 is dead by now; rank 0 is still served
    for _ in range(5):
        weights = client.push_pull(torch.ones(1000))
    client.close()
    return float(weights[0])


@pytest.mark.parametrize("when", ["before its payload", "before its reply",
                                  "with its next header announced"])
def test_a_worker_dying_mid_request_is_lost_and_the_others_are_served(when):
    w0, dead, server = run_ranks(_worker_dies_mid_request, 3, when, allow_failures=True,
                                 timeout=60)
    assert isinstance(dead, Exception)
    assert server["lost"] == [1], server
    assert server["per_worker"][0] == 6     # five pushes and the goodbye
    assert w0 == (6.0 if when == "before its reply" else 5.0)  # rank 1's push, if applied
