"""The parameter server on real gloo processes: synchronous sums, asynchronous
apply-and-serve (a slow worker never blocks a fast one), sparse messages, refused headers."""

from __future__ import annotations

import datetime
import functools
import time

import torch

from distributed import run_ranks

DIM = 8
LR = 0.1
FAST_STEPS = 20
SLOW_SLEEP = 2.0
SUM_CASES = ((torch.float32, 5), (torch.float64, 3000), (torch.float16, 7), (torch.float32, 1))


class SGDRule:
    """Test-only rule: w -= lr * update (dense or sparse); reply the new weights.

    Sparse pushes are answered sparsely with the weights at the pushed indices."""

    def __init__(self):
        self.w = torch.zeros(DIM, dtype=torch.float64)
        self.log: list[tuple[int, str, list]] = []

    def pull(self, worker):
        return self.w.clone()

    def push(self, worker, update):
        from hetsync.comm import SparseMessage
        if isinstance(update, SparseMessage):
            assert update.numel == DIM
            self.w.index_add_(0, update.indices.long(), -LR * update.values.double())
            self.log.append((worker, "sparse", [update.indices.tolist(),
                                                update.values.tolist()]))
            return SparseMessage(update.indices.clone(),
                                 self.w[update.indices.long()].float(), DIM)
        self.w.add_(update, alpha=-LR)
        self.log.append((worker, "dense", update.tolist()))
        return self.w.clone()


def update_of(worker: int, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 * worker + step)
    return torch.randn(DIM, generator=g, dtype=torch.float64)


def portable(t: torch.Tensor):
    """A tensor as picklable plain data (tensors through the result queue would share fds)."""
    return str(t.dtype), tuple(t.shape), t.double().numpy().copy()


def tensor(p) -> torch.Tensor:
    dtype, shape, arr = p
    return torch.from_numpy(arr).to(getattr(torch, dtype.split(".")[1])).view(shape)


def sum_data(rank: int, dtype, n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(10 * rank + n)
    return torch.randn(n, generator=g, dtype=torch.float64).to(dtype)


def _ps_ranks(rank: int, world_size: int) -> dict:
    from hetsync.comm import (HEADER_BYTES, ParameterServer, PSClient, SparseMessage, meter)
    server = world_size - 1
    if rank == server:
        rule = SGDRule()
        stats = ParameterServer(range(server), rule, timeout=60).serve()
        return {"stats": stats, "log": rule.log, "w": portable(rule.w),
                "bytes": meter.snapshot()}
    out: dict = {}
    with PSClient(server, timeout=60) as ps:
        # 1. synchronous sums (they also line the workers up for the timing below)
        for dtype, n in SUM_CASES:
            x = sum_data(rank, dtype, n).view(-1, 1) if n > 1 else sum_data(rank, dtype, n)
            out[("sum", str(dtype), n)] = portable(ps.sum(x))
        out["sum_bytes"] = meter.snapshot()["ps/sum"]
        # 2. asynchronous: worker 0 is fast, worker 1 sleeps between its two pushes
        t0 = time.monotonic()
        if rank == 0:
            replies = [ps.push_pull(update_of(0, i)) for i in range(FAST_STEPS)]
            out["fast_elapsed"] = time.monotonic() - t0
            out["replies"] = [portable(r) for r in replies]
        else:
            ps.push_pull(update_of(1, 0))
            time.sleep(SLOW_SLEEP)
            ps.push_pull(update_of(1, 1))
            out["slow_elapsed"] = time.monotonic() - t0
        # 3. sparse push, sparse reply (and an empty sparse push)
        ps.sum(torch.zeros(1))   # line up again: the sparse phase starts after the async one
        idx = torch.tensor([rank, 5], dtype=torch.int32)
        val = torch.tensor([1.0, -2.0])
        reply = ps.push_pull(SparseMessage(idx, val, DIM))
        out["sparse_reply"] = (type(reply).__name__, reply.indices.tolist(), reply.numel)
        empty = ps.push_pull(SparseMessage(torch.empty(0, dtype=torch.int32),
                                           torch.empty(0), DIM))
        out["empty_reply_nnz"] = empty.nnz
        ps.sum(torch.zeros(1))   # line up: both sparse pushes are in before either pulls
        out["pull"] = portable(ps.pull())
        out["header_bytes"] = HEADER_BYTES
    return out


@functools.lru_cache(maxsize=None)
def ps_results():
    return run_ranks(_ps_ranks, 3, timeout=120)


def test_synchronous_sum_equals_the_sum_of_pushes():
    res = ps_results()
    for dtype, n in SUM_CASES:
        expected = sum_data(0, dtype, n) + sum_data(1, dtype, n)
        for rank in (0, 1):
            got = tensor(res[rank][("sum", str(dtype), n)])
            assert got.dtype == dtype and got.shape == ((n, 1) if n > 1 else (n,))
            torch.testing.assert_close(got.view(-1), expected)


def test_sum_bytes_are_payload_plus_header_each_way():
    res = ps_results()
    h = res[0]["header_bytes"]
    per = sum(h + n * torch.empty((), dtype=d).element_size() for d, n in SUM_CASES)
    for rank in (0, 1):
        assert res[rank]["sum_bytes"] == (per, per)
    server = res[2]["bytes"]["ps/sum"]
    extra = 2 * 2 * (h + 4)  # the two one-element "line up" sums of both workers
    assert server == (2 * per + extra, 2 * per + extra)


def test_slow_worker_does_not_block_fast_one():
    res = ps_results()
    assert res[0]["fast_elapsed"] < SLOW_SLEEP / 2, res[0]["fast_elapsed"]
    assert res[1]["slow_elapsed"] >= SLOW_SLEEP
    dense = [(w, u) for w, kind, u in res[2]["log"] if kind == "dense"]
    order = [w for w, _ in dense]
    # the slow worker's second push came after all the fast worker's pushes
    assert order.index(1, order.index(1) + 1) == len(order) - 1
    assert order.count(0) == FAST_STEPS and order.count(1) == 2
    # each worker's updates arrived in its own order, whole
    assert [u for w, u in dense if w == 0] == [update_of(0, i).tolist() for i in range(FAST_STEPS)]
    # every reply is the weights right after that update; the final weights equal the
    # sequential application of all updates in the server's order
    w = torch.zeros(DIM, dtype=torch.float64)
    after: dict[int, list] = {0: [], 1: []}
    for worker, u in dense:
        w.add_(torch.tensor(u, dtype=torch.float64), alpha=-LR)
        after[worker].append(w.clone())
    for got, want in zip(res[0]["replies"], after[0]):
        assert torch.equal(tensor(got), want)


def test_sparse_push_and_reply_round_trip():
    res = ps_results()
    for rank in (0, 1):
        kind, indices, numel = res[rank]["sparse_reply"]
        assert (kind, indices, numel) == ("SparseMessage", [rank, 5], DIM)
        assert res[rank]["empty_reply_nnz"] == 0
    final = tensor(res[2]["w"])
    for rank in (0, 1):
        torch.testing.assert_close(tensor(res[rank]["pull"]), final)   # pulled after every push
    stats = res[2]["stats"]
    assert stats.requests == {"pull": 2, "push_pull": 2 * 2 + FAST_STEPS + 2,
                              "sum": 2 * (len(SUM_CASES) + 2), "bye": 2}
    assert stats.sum_rounds == len(SUM_CASES) + 2
    assert stats.bytes_sent == sum(s for s, _ in res[2]["bytes"].values())
    assert stats.bytes_recv == sum(r for _, r in res[2]["bytes"].values())


# -- malformed headers ------------------------------------------------------------------------
BAD_CASES = ("magic_version", "op", "dtype", "nnz", "seq")


def _bad_header_ranks(rank: int, world_size: int):
    """Rank 0 sends hand-made bad headers; rank 1 serves them, one server per case."""
    import torch.distributed as dist
    from hetsync.comm import ParameterServer, wire
    from hetsync.comm.ps import TAG_REPLY, TAG_REQUEST, TAG_REQUEST_PAYLOAD
    from hetsync.comm.wire import Field, Header, Kind, Op

    if rank == 1:  # the refused worker is dropped: with no other worker, serve() returns
        return [ParameterServer([0], timeout=30).serve().refused[0] for _ in BAD_CASES]
    replies = []
    for field in BAD_CASES:
        raw = Header(op=Op.PUSH_PULL, sender=0, seq=0, kind=Kind.DENSE, dtype=1, numel=4,
                     nnz=4).encode()
        if field == "magic_version":
            raw[Field.MAGIC_VERSION] = 0xDEADBEEF
        elif field == "op":
            raw[Field.OP] = 99
        elif field == "dtype":
            raw[Field.DTYPE] = 42
        elif field == "nnz":
            raw[Field.NNZ] = 5          # sizes inconsistent: dense with nnz != numel
        else:
            raw[Field.SEQ] = 3          # out of sequence (expected 0)
        reply = torch.empty(wire.HEADER_LEN, dtype=torch.int64)
        dist.send(raw, 1, tag=TAG_REQUEST)
        if field == "seq":  # a sane header: its payload follows, as from a real client
            dist.send(torch.ones(4), 1, tag=TAG_REQUEST_PAYLOAD)
        dist.recv(reply, 1, tag=TAG_REPLY)
        h = wire.decode(reply, 1, expect=(Op.ERROR,))
        replies.append((h.status, Field(h.detail).name.lower()))
    return replies


def test_malformed_header_is_refused_naming_sender_and_field():
    from hetsync.comm.wire import Status
    replies, refused = run_ranks(_bad_header_ranks, 2, timeout=60)
    for field, refusal, (status, detail) in zip(BAD_CASES, refused, replies):
        assert (refusal["rank"], refusal["field"]) == (0, field)
        assert "rank 0" in refusal["error"] and f"'{field}'" in refusal["error"]
        assert (status, detail) == (Status.BAD_HEADER, field)


# -- untrusted payloads: refused, the refused worker dropped, the others served ----------------
# (A header is received into room for wire.HEADER_ROOM fields and a payload into room for
# wire.PAYLOAD_ROOM times its announced length, so a longer one is refused; beyond the room
# gloo aborts the receiving process in C++: docs/design.md, "Trust".)
UNTRUSTED = ("short", "nan", "inf", "huge_numel", "wrong_numel", "sparse_index", "altered",
             "pull_payload", "long_header", "short_header", "rule_fails", "long_payload",
             "float64_as_float32", "long_sparse")
#: the field each case is refused on
REFUSED_ON = {"huge_numel": "numel", "wrong_numel": "numel", "pull_payload": "kind",
              "long_header": "magic_version", "short_header": "magic_version",
              "rule_fails": "rule"}


def _untrusted_ranks(rank: int, world_size: int):
    import torch.distributed as dist
    from hetsync.comm import ParameterServer, PSClient, wire
    from hetsync.comm.ps import TAG_REPLY, TAG_REQUEST, TAG_REQUEST_PAYLOAD
    from hetsync.comm.wire import Header, Kind, Op

    if rank == 2:
        out = []
        for _ in UNTRUSTED:
            rule = SGDRule()
            rule.w = torch.zeros(16, dtype=torch.float64)
            stats = ParameterServer([0, 1], rule, timeout=30, numel=16).serve()
            out.append((stats.refused, portable(rule.w), dict(stats.per_worker)))
        return out
    if rank == 0:  # the honest worker: one push per case, after the bad one was refused
        for _ in UNTRUSTED:
            dist.recv(torch.zeros(1), 1, tag=7)
            with PSClient(2, timeout=30) as ps:
                ps.push_pull(torch.ones(16))
            dist.send(torch.zeros(1), 1, tag=8)  # this server is done: the next case may start
        return None
    replies = []
    for case in UNTRUSTED:
        numel, payload = 16, torch.ones(16)
        kind, nnz = Kind.DENSE, 16
        if case == "short":
            payload = torch.ones(4)
        elif case == "nan":
            payload[3] = float("nan")
        elif case == "inf":
            payload[0] = float("inf")
        elif case == "huge_numel":
            numel = nnz = 1 << 36
        elif case == "wrong_numel":
            numel = nnz = payload.numel() - 1
            payload = payload[:-1]
        elif case == "long_payload":  # a header of 16 values, 24 sent
            payload = torch.ones(24)
        elif case == "float64_as_float32":  # the header says float32 (dtype 1)
            payload = torch.ones(16, dtype=torch.float64)
        raw = Header(op=Op.PUSH_PULL, sender=1, seq=0, kind=kind, dtype=1, numel=numel,
                     nnz=nnz, checksum=wire.checksum(payload) if case == "altered" else 0
                     ).encode()
        if case == "altered":  # the checksum of the ones; one value changed on the way
            payload[5] = 1.5
        if case == "sparse_index":
            raw = Header(op=Op.PUSH_PULL, sender=1, seq=0, kind=Kind.SPARSE, dtype=1,
                         numel=16, nnz=2).encode()
            dist.send(raw, 2, tag=TAG_REQUEST)
            dist.send(torch.tensor([3, 99], dtype=torch.int32), 2, tag=TAG_REQUEST_PAYLOAD)
            dist.send(torch.ones(2), 2, tag=TAG_REQUEST_PAYLOAD)
        elif case == "rule_fails":  # sane on the wire; SGDRule asserts a sparse push is DIM long
            dist.send(Header(op=Op.PUSH_PULL, sender=1, seq=0, kind=Kind.SPARSE, dtype=1,
                             numel=16, nnz=1).encode(), 2, tag=TAG_REQUEST)
            dist.send(torch.tensor([3], dtype=torch.int32), 2, tag=TAG_REQUEST_PAYLOAD)
            dist.send(torch.ones(1), 2, tag=TAG_REQUEST_PAYLOAD)
        elif case == "long_sparse":  # 2 announced, 3 indices and 3 values sent
            dist.send(Header(op=Op.PUSH_PULL, sender=1, seq=0, kind=Kind.SPARSE, dtype=1,
                             numel=16, nnz=2).encode(), 2, tag=TAG_REQUEST)
            dist.send(torch.tensor([3, 4, 5], dtype=torch.int32), 2, tag=TAG_REQUEST_PAYLOAD)
            dist.send(torch.ones(3), 2, tag=TAG_REQUEST_PAYLOAD)
        elif case == "pull_payload":  # a PULL carries nothing: its payload is never taken
            dist.send(Header(op=Op.PULL, sender=1, seq=0, kind=Kind.DENSE, dtype=1, numel=16,
                             nnz=16).encode(), 2, tag=TAG_REQUEST)
            dist.send(payload, 2, tag=TAG_REQUEST_PAYLOAD)
        elif case in ("long_header", "short_header"):  # a version-skewed sender's header
            raw = torch.cat([raw, torch.zeros(20, dtype=torch.int64)]) if case == \
                "long_header" else raw[:9]
            dist.send(raw, 2, tag=TAG_REQUEST)
        else:
            dist.send(raw, 2, tag=TAG_REQUEST)
            if case != "huge_numel":  # (refused on its header alone, and not drained)
                dist.send(payload, 2, tag=TAG_REQUEST_PAYLOAD)
        reply = torch.empty(wire.HEADER_LEN, dtype=torch.int64)
        dist.recv(reply, 2, tag=TAG_REPLY)
        replies.append(wire.decode(reply, 2, expect=(Op.ERROR,)).status)
        dist.send(torch.zeros(1), 0, tag=7)  # now the honest worker may push
        dist.recv(torch.zeros(1), 0, tag=8)
    return replies


def test_untrusted_payloads_are_refused_and_the_others_are_served():
    from hetsync.comm.wire import Status

    _, replies, served = run_ranks(_untrusted_ranks, 3, timeout=120)
    for case, status, (refused, w, per_worker) in zip(UNTRUSTED, replies, served):
        assert [r["rank"] for r in refused] == [1], case
        field = refused[0]["field"]
        assert field == REFUSED_ON.get(case, "payload"), (case, refused)
        assert status == {"payload": Status.BAD_PAYLOAD, "rule": Status.RULE_FAILED}.get(
            field, Status.BAD_HEADER), case
        # only the honest push was applied: w = -LR * ones, nothing of the bad one
        torch.testing.assert_close(tensor(w), torch.full((16,), -LR, dtype=torch.float64))
        # push + bye; the refused request not counted unless it reached the rule
        assert per_worker == {0: 2, 1: int(case == "rule_fails")}, case


def _pull_ranks(rank: int, world_size: int):
    import torch.distributed as dist
    from hetsync.comm import ParameterServer, wire
    from hetsync.comm.ps import TAG_REPLY, TAG_REPLY_PAYLOAD, TAG_REQUEST
    from hetsync.comm.wire import Header, Op

    if rank == 1:
        rule = SGDRule()
        rule.w = torch.linspace(-1, 1, DIM, dtype=torch.float64)
        ParameterServer([0], rule, timeout=30).serve()
        return None
    heads = []
    for seq, op in enumerate((Op.PULL, Op.BYE)):  # (raw, to read the reply's header)
        dist.send(Header(op=op, sender=0, seq=seq).encode(), 1, tag=TAG_REQUEST)
        raw = torch.empty(wire.HEADER_LEN, dtype=torch.int64)
        dist.recv(raw, 1, tag=TAG_REPLY)
        head = wire.decode(raw, 1, expect=(Op.REPLY,))
        bufs, payload = wire.receive_buffers(head)
        for buf in bufs:
            dist.recv(buf, 1, tag=TAG_REPLY_PAYLOAD)
        heads.append((head.checksum, payload is not None and wire.checksum(payload),
                      None if payload is None else portable(payload)))
    return heads


def test_a_pull_reply_carries_its_checksum():
    """A PULL (the whole model, which a worker takes at its start, its join and its
    finish) is answered with the CRC-32 of the model's bytes in wire field 12; a BYE's empty reply
    with none."""
    heads = run_ranks(_pull_ranks, 2, timeout=60)[0]
    (carried, computed, model), (bye, _, _) = heads
    assert carried == computed and carried > 0 and bye == 0
    torch.testing.assert_close(tensor(model), torch.linspace(-1, 1, DIM, dtype=torch.float64))


def _sum_bound_ranks(rank: int, world_size: int):
    from hetsync.comm import CommError, ParameterServer, PSClient

    if rank == 2:  # a model of 8 parameters with 2 BatchNorm statistics: sums of up to 10
        stats = ParameterServer([0, 1], timeout=30, numel=8, sum_numel=10).serve()
        return stats.refused
    with PSClient(2, timeout=30) as ps:
        total = ps.sum(torch.ones(10)).tolist()
        try:
            ps.sum(torch.ones(11))
            return total, None
        except CommError as err:
            return total, str(err)


def test_sums_may_carry_batchnorm_statistics_but_no_more():
    first, second, refused = run_ranks(_sum_bound_ranks, 3, timeout=60)
    assert first[0] == [2.0] * 10 and second[0] == [2.0] * 10
    assert "numel" in first[1] and "numel" in second[1]
    assert sorted(r["rank"] for r in refused) == [0, 1]


def _known_lost_ranks(rank: int, world_size: int):
    from hetsync.comm import ParameterServer, PSClient

    if rank == 2:  # rank 1 is known dead (as launch marks it): no lingering for it
        start = time.monotonic()
        stats = ParameterServer([0, 1], SGDRule(), timeout=60, linger=30.0,
                                known_lost=lambda: [1]).serve()
        return stats.lost, time.monotonic() - start
    if rank == 0:
        with PSClient(2, timeout=30) as ps:
            ps.push_pull(torch.ones(DIM))
        return None
    time.sleep(12)  # rank 1 says nothing (dead); it outlives the server's return
    return None


def test_a_worker_known_dead_is_not_waited_for_after_the_others_finish():
    _, _, (lost, seconds) = run_ranks(_known_lost_ranks, 3, timeout=90)
    assert lost == [1]
    assert seconds < 10  # not the 30 s linger


def _rejoin_ranks(rank: int, world_size: int):
    """Rank 1 pushes twice and is lost (its process group destroyed: its connections
    close, as a dead process's do); its "new process" links to the server through the store
    (`runtime/server_link.py`) and pushes twice more, while rank 0 pushes throughout."""
    import os

    import torch.distributed as dist

    from hetsync.comm import ParameterServer, PSClient
    from hetsync.runtime import server_link
    from hetsync.runtime.membership import shared

    store = shared(dist.distributed_c10d._get_default_store())  # (rank 1's, once lost)
    if rank == 2:
        stats = ParameterServer([0, 1], SGDRule(), timeout=30,
                                joins=server_link.Joins(store, 2)).serve()
        return stats.lost, stats.rejoined, stats.per_worker
    ps = PSClient(2, timeout=30)
    if rank == 0:
        pushes = 0
        while not store.check(["test/rejoined-done"]):
            ps.push_pull(torch.ones(DIM))
            pushes += 1
            time.sleep(0.02)
        last = ps.push_pull(torch.ones(DIM))
        ps.close()
        return pushes + 1, last
    for _ in range(2):
        ps.push_pull(torch.ones(DIM))
    dist.destroy_process_group()  # lost
    store = dist.TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=datetime.timedelta(seconds=30))
    asked = time.monotonic()
    ps.use_link(server_link.ask(store, 1, 2, wait=30, stopped=lambda: False))
    linked = time.monotonic() - asked
    replies = [ps.push_pull(torch.ones(DIM)) for _ in range(2)]
    ps.close()
    store.set("test/rejoined-done", "1")
    return linked, replies


def test_a_lost_worker_is_served_again_on_a_link_of_its_own():
    """Its new process's pushes are applied like any (ASGD: the weights go down by lr per
    push of ones, the others' included), the other worker is served throughout, and the
    server names it lost, then served again."""
    (pushes0, last0), (linked, replies), (lost, rejoined, per_worker) = run_ranks(
        _rejoin_ranks, 3, timeout=90, agent_store=True)
    assert lost == [1] and rejoined == [1], (lost, rejoined)
    assert linked < 5.0, linked  # the server asks every 0.5 s between requests
    assert per_worker == {0: pushes0 + 1, 1: 2 + 2 + 1}, per_worker  # (+1: goodbye)
    # every push applied once: 4 of rank 1's and all of rank 0's
    torch.testing.assert_close(last0, torch.full((DIM,), -LR * (pushes0 + 4), dtype=torch.float64))
    assert replies[1][0] - replies[0][0] <= -LR + 1e-12  # its second push applied after its first
