"""The survivors' agreement after a lost worker (`runtime/membership.py`), on a real
key-value store shared by threads that play the ranks (the groups and the whole run are
tested with processes in test_checkpoint.py)."""

import threading

import torch.distributed as dist

from hetsync.comm.errors import CommError
from hetsync.runtime.membership import Membership


def _regroup_all(store, ranks, members, grace=0.5, late=()):
    """Every rank of `ranks` regroups (those in `late` after rank 0 has decided); returns
    {rank: members or the exception}."""
    out = {}
    decided = threading.Event()

    def one(rank):
        m = Membership(store, rank, members, timeout=5.0, grace=grace)
        if rank in late:
            decided.wait(5.0)
        try:
            out[rank] = (m.regroup(RuntimeError("the collective's own error")), m)
        except Exception as err:  # noqa: BLE001 - what the test looks at
            out[rank] = (err, m)
        if rank == 0:
            decided.set()

    threads = [threading.Thread(target=one, args=(r,)) for r in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return out


def test_the_survivors_agree_on_themselves_and_the_lost_rank_is_named():
    store = dist.HashStore()
    watcher = Membership(store, 2, [0, 1, 2, 3], timeout=5.0)
    assert not watcher.alarm()
    out = _regroup_all(store, [0, 2, 3], [0, 1, 2, 3])  # rank 1 is dead: it never registers
    assert watcher.alarm()  # raised by the first survivor that regrouped
    for rank in (0, 2, 3):
        members, m = out[rank]
        assert members == [0, 2, 3] and m.lost == [1] and m.generation == 1
        assert not m.alarm()  # the next regroup's alarm is not raised yet


def test_a_failure_where_every_member_is_alive_is_not_a_lost_worker():
    out = _regroup_all(dist.HashStore(), [0, 1], [0, 1])
    for rank in (0, 1):
        err, _ = out[rank]
        assert isinstance(err, RuntimeError) and "own error" in str(err)


def test_a_rank_that_registers_after_the_decision_is_left_out_with_an_error():
    out = _regroup_all(dist.HashStore(), [0, 1], [0, 1, 2], grace=0.2, late=(1,))
    assert out[0][0] == [0]
    err, _ = out[1]
    assert isinstance(err, CommError) and "registered too late" in str(err)


def test_an_unreachable_store_raises_no_alarm():
    class Gone:
        def check(self, keys):
            raise RuntimeError("connection refused")

    assert Membership(Gone(), 1, [0, 1], timeout=1.0).alarm() is False


def test_rank_0_goes_on_alone_when_every_other_worker_is_lost():
    members, m = _regroup_all(dist.HashStore(), [0], [0, 1, 2], grace=0.1)[0]
    assert members == [0] and m.lost == [1, 2]
    assert m.groups() == (None, None)  # a worker alone needs no group


def test_rank_0_may_be_the_lost_one_and_the_lowest_survivor_leads():
    out = _regroup_all(dist.HashStore(), [1, 2, 3], [0, 1, 2, 3])  # rank 0 never registers
    for rank in (1, 2, 3):
        members, m = out[rank]
        assert members == [1, 2, 3] and m.lost == [0] and m.leader == 1
