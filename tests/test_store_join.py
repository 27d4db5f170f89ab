"""`hetsync.wrap`'s agreed stop for the asynchronous modes (`runtime/control.StoreJoin`), on a
real key-value store shared by threads that play the workers (whole wrapped runs are tested
with processes in test_modes.py and test_wrap.py)."""

import threading
import time

import pytest
import torch.distributed as dist

from hetsync.comm.errors import CommTimeoutError
from hetsync.runtime.control import StoreJoin


class _Logged:
    """The store as one worker sees it: each operation stamped; `slow` seconds per check (a
    worker descheduled between its polls)."""

    def __init__(self, store, stamps: list, slow: float = 0.0):
        self.store, self.stamps, self.slow = store, stamps, slow

    def __getattr__(self, name):
        def op(*args):
            if name == "check":
                time.sleep(self.slow)
            self.stamps.append(time.monotonic())
            return getattr(self.store, name)(*args)
        return op


def _join_all(workers: int, delays: dict, slow: dict, timeout: float = 5.0):
    """Each worker of `delays` joins after its delay (the others never do); returns {rank:
    (when it returned, its store operations' stamps, the exception or None)}."""
    store, out = dist.HashStore(), {}

    def one(rank):
        stamps = []
        join = StoreJoin(_Logged(store, stamps, slow.get(rank, 0.0)), "t", rank, workers, timeout)
        time.sleep(delays[rank])
        try:
            join.wait_for_all()
            out[rank] = (time.monotonic(), stamps, None)
        except Exception as err:  # noqa: BLE001 - what the test looks at
            out[rank] = (time.monotonic(), stamps, err)

    threads = [threading.Thread(target=one, args=(r,)) for r in delays]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    return out


def test_worker_0_which_holds_the_store_leaves_after_every_worker_has_read_it_for_the_last_time():
    # worker 1 is between two polls when worker 2 joins; worker 0 sees everyone joined at once
    out = _join_all(3, {0: 0.0, 1: 0.0, 2: 0.3}, slow={1: 0.2})
    assert all(err is None for _, _, err in out.values()), out
    left = out[0][0]
    assert all(max(stamps) <= left for _, stamps, _ in out.values())


def test_a_worker_that_never_joins_nor_steps_is_named_within_the_timeout():
    started = time.monotonic()
    out = _join_all(3, {0: 0.0, 1: 0.0}, slow={}, timeout=1.0)
    for rank in (0, 1):
        _, _, err = out[rank]
        assert isinstance(err, CommTimeoutError) and "worker 2" in str(err)
    assert out[0][0] - started < 5.0


def test_worker_0_names_a_worker_that_joined_but_died_before_reading_the_end():
    store = dist.HashStore()
    store.set("t/joined/2", "1")  # worker 2 joined, then died
    store.add("t/joined", 1)
    other = threading.Thread(target=StoreJoin(store, "t", 1, 3, 1.0).wait_for_all)
    other.start()
    with pytest.warns(RuntimeWarning, match=r"worker\(s\) \[2\] joined .* within 1 s"):
        StoreJoin(store, "t", 0, 3, 1.0).wait_for_all()
    other.join(5)
    assert not other.is_alive()
