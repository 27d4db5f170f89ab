"""A lost worker's shard goes on being drawn by a member (runtime/shards.py), and the data
ledger counts each shard's batches whoever drew them."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch.distributed as dist

from processes import live_records, pid_of_rank
from hetsync.comm.errors import CommTimeoutError
from hetsync.data import ShardSampler
from hetsync.runtime import shards
from hetsync.runtime.membership import shared
from hetsync.telemetry.ledger import reached, run_ledger
from hetsync.telemetry.rundir import RunDir


def test_a_members_shard_is_its_own_and_the_others_are_spread_over_the_members():
    assert [shards.holder(s, [0, 1, 2, 3]) for s in range(4)] == [0, 1, 2, 3]
    assert [shards.holder(s, [0, 2, 3]) for s in range(4)] == [0, 2, 2, 3]
    assert [shards.holder(s, [3, 1]) for s in range(6)] == [1, 1, 1, 3, 1, 3]  # (in rank order)
    held = [shards.held_by(r, [1, 3], range(6)) for r in (1, 3)]
    assert sorted(held[0] + held[1]) == list(range(6))  # each shard drawn by one member


def _sampler(rank, batch=4):
    return ShardSampler(np.arange(100 * rank, 100 * rank + 40), batch, seed=rank)


def test_held_shards_are_drawn_in_turn_as_their_own_workers_would_draw_them():
    held = shards.HeldShards(0, _sampler(0), make=lambda r: _sampler(r, batch=2))
    held.hold(2, (0, 3))
    got = [held.draw() for _ in range(6)]
    assert [(s, e, b) for s, e, b, _ in got] == [(0, 0, 0), (2, 0, 3), (0, 0, 1), (2, 0, 4),
                                                  (0, 0, 2), (2, 0, 5)]
    own, other = _sampler(0).epoch(0), _sampler(2, batch=2).epoch(0)
    for shard, _, batch, idx in got:  # the very batches of worker 2's sampler
        np.testing.assert_array_equal(idx, (own if shard == 0 else other)[batch])
    assert held.positions() == {0: (0, 3), 2: (0, 6)} and held.epoch_batches == {0: 10, 2: 20}
    held.round_over()
    held.draw(), held.draw()
    held.redraw()  # a regroup dropped the round: its batches again
    assert held.positions() == {0: (0, 3), 2: (0, 6)}
    assert [held.draw()[:3] for _ in range(2)] == [(0, 0, 3), (2, 0, 6)]
    held.release(2)
    assert held.others() == [] and held.draw()[0] == 0


def test_positions_go_through_the_store_and_a_hand_over_is_waited_for():
    store = dist.HashStore()
    assert shards.published(store, 3) == (0, 0)  # never published: its start
    shards.publish(store, {0: (1, 7), 3: (2, 5)})
    assert shards.published(store, 3) == (2, 5)
    shards.hand_over(store, 4, 3, (2, 9))
    assert shards.taken_over(store, 4, 3, wait=1.0) == (2, 9)
    with pytest.raises(CommTimeoutError, match="shard 3: its last holder did not hand it over"):
        shards.taken_over(store, 5, 3, wait=0.2)


def test_an_asynchronous_runs_drawer_of_a_shard_is_claimed_from_a_lost_one_and_let_go():
    """Step 6: rank 2 draws its own shard; rank 0 may claim it only once rank 2 is lost, one
    claimant of two wins; rank 2's next process, back, lets go of what its lost one held
    and has its shard once its holder lets go, from where the holder published it."""
    store, lost, never = dist.HashStore(), set(), lambda: False
    r0, r1, r2, r2_again = (shards.drawer_of(r) for r in (0, 1, 2, 2))
    assert shards.claim(store, 2, r2, lost.__contains__)  # nobody draws it
    assert shards.claim(store, 1, r2, lambda r: True)  # (rank 1 lost: rank 2 holds it)
    shards.publish(store, {2: (3, 11)})
    assert not shards.claim(store, 2, r0, lost.__contains__)  # rank 2 draws it, alive
    lost.add(2)
    assert shards.claim(store, 2, r0, lost.__contains__)
    assert not shards.claim(store, 2, r1, lost.__contains__)  # rank 0 draws it now
    lost.discard(2)
    with pytest.raises(CommTimeoutError, match="shard 2: the worker that held it did not"):
        shards.claim_own(store, r2_again, range(3), 0.1, lost.__contains__, never)
    assert shards.claim(store, 1, r1, lost.__contains__)  # rank 2's lost process let go
    assert not shards.claim_own(store, r2_again, range(3), 5.0, lost.__contains__,
                                lambda: True)  # the run stopped meanwhile
    shards.publish(store, {2: (4, 5)})  # rank 0's last record of it
    shards.let_go(store, 2, r0)
    assert shards.claim_own(store, r2_again, range(3), 1.0, lost.__contains__, never)
    assert shards.published(store, 2) == (4, 5) and shards.published(store, 0, None) is None
    shards.let_go(store, 2, r1)  # (not its drawer: changes nothing)
    assert not shards.claim(store, 2, r1, lost.__contains__)


def _member(rank, members, store, generation, held_shards=()):
    """The parts of a TrainingLoop that hold shards (its own methods, on a real store): one
    worker of a run whose members are `members`, holding `held_shards` too; its mode's
    rounds are sync's (`mode.round`: the round under way)."""
    import types

    from hetsync.runtime.training import TrainingLoop

    me = types.SimpleNamespace(
        rank=rank, store=store, cfg=types.SimpleNamespace(timeout=2.0), run_ranks=range(4),
        membership=types.SimpleNamespace(members=members, generation=generation,
                                         alarm=lambda: False),
        mode=types.SimpleNamespace(round=1, rounds_all_or_none=True),
        held=shards.HeldShards(rank, _sampler(rank), make=_sampler), _lost_draws={})
    for name in ("_mine", "_hand_over_shards", "_retake_shards", "start_at",
                 "_publish_positions"):
        setattr(me, name, types.MethodType(getattr(TrainingLoop, name), me))
    for shard in held_shards:
        me.held.hold(shard, (0, 0))
    return me


def test_a_regroup_draws_a_shard_it_held_on_from_its_own_count_not_the_store():
    """Member 0 of [0, 1] holds lost rank 2's shard; rank 1 is lost too. Meanwhile rank 2,
    left out of the regroup while paused, published its last position (stale) over rank
    0's: rank 0 draws shard 2 on from its own count, and rank 1's from where it published."""
    store = dist.HashStore()
    zero = _member(0, [0, 1], store, 1, [2])
    for _ in range(4):
        zero.held.draw()  # own, held, own, held
    zero.held.round_over()
    zero.held.draw()      # own: the round in progress, dropped by the regroup
    shards.publish(shared(store), {1: (0, 3), 2: (0, 0)})  # (rank 1's; rank 2's, stale)
    zero.membership.members = [0]
    zero._retake_shards()
    zero.held.redraw()
    # (and rank 3's shard, a lost rank's too, from its start: never published)
    assert zero.held.positions() == {0: (0, 2), 1: (0, 3), 2: (0, 2), 3: (0, 0)}


@pytest.mark.parametrize("completed", [True, False])
def test_a_lost_workers_shard_is_taken_on_after_the_rounds_the_survivors_completed(completed):
    """sync, members [0, 1, 2]: rank 2 draws round 1 and records it, draws round 2 and is
    stopped after the round's sum, before its record (`results/chaos.md`, 2026-11-30: its
    batch was drawn again). Rank 0, the holder of shard 2 once [0, 1] go on, takes it on
    after round 2's batch where the survivors completed round 2, from it where its sum
    failed (the survivors' next round is 2 again). Completed, round 2's batch is in the
    global model and in none of rank 2's records: rank 0's next record names it."""
    store = dist.HashStore()
    two = _member(2, [0, 1, 2], store, 1)
    for round_ in (1, 2):
        two.mode.round = round_
        two.held.draw()
        two._publish_positions(drawing=True)  # (as the loop does: before the round's sum)
        if round_ == 1:
            two.held.round_over()  # (its record of round 1)
    zero = _member(0, [0, 1], store, 2)
    zero.mode.round = 3 if completed else 2
    zero._retake_shards()
    assert zero.held.positions()[2] == ((0, 2) if completed else (0, 1))
    assert zero._lost_draws == ({2: [[0, 1, 2]]} if completed else {})
    assert shards.ranges((0, 1), (0, 2), 7) == [[0, 1, 2]]
    assert shards.ranges((0, 6), (1, 1), 7) == [[0, 6, 7], [1, 0, 1]]
    # a position published after a record names no round: its draws were all recorded
    shards.publish(store, {2: (0, 2)})
    assert shards.published(store, 2, next_round=3) == (0, 2)
    assert shards.unrecorded(store, 2, next_round=3) is None


def test_an_admission_moves_a_shard_between_members_as_far_as_its_draws_went():
    """Members 0 and 1 hold lost ranks 2 and 3's shards (holder: 2 -> 0, 3 -> 1); rank 2
    joins: shard 2 goes back to it and shard 3, now members[3 mod 3], from rank 1 to rank 0,
    each from where its holder's draws are (none of the round in progress is dropped)."""
    store = dist.HashStore()
    zero, one = _member(0, [0, 1], store, 1, [2]), _member(1, [0, 1], store, 1, [3])
    for member in (zero, one):
        for _ in range(5):
            member.held.draw()  # own, held, own, held, own
    assert zero.held.positions() == {0: (0, 3), 2: (0, 2)}
    assert one.held.positions() == {1: (0, 3), 3: (0, 2)}
    joiner = _member(2, [0, 1, 2], store, 2)
    for member in (zero, one):  # (admitted: generation 2, members 0, 1, 2)
        member.membership.members, member.membership.generation = [0, 1, 2], 2
    one._hand_over_shards(joined=False)   # hands shard 3 on (it waits for nothing)
    zero._hand_over_shards(joined=False)  # hands shard 2 on, takes shard 3
    joiner._hand_over_shards(joined=True)
    assert one.held.positions() == {1: (0, 3)}
    assert zero.held.positions() == {0: (0, 3), 3: (0, 2)}
    assert joiner.held.positions() == {2: (0, 2)}
    assert sorted(zero.held.draw()[:3] for _ in range(2)) == [(0, 0, 3), (3, 0, 2)]
    assert joiner.held.draw()[:3] == (2, 0, 2)
    # a regroup later draws a handed-on shard from there too (published as handed over)
    assert shards.published(store, 3) == (0, 2) and shards.published(store, 2) == (0, 2)


def test_the_ledger_counts_a_shard_drawn_by_its_worker_then_a_holder_as_one():
    worker_2 = [{"rank": 2, "drawn": [[0, 0, 5]], "epoch_batches": 8}]
    holder = [{"rank": 0, "drawn": [[0, 0, 3]], "epoch_batches": 8,
               "held": [{"shard": 2, "drawn": [[0, 5, 8], [1, 0, 2]], "epoch_batches": 8}]},
              {"rank": 0, "drawn": [[0, 3, 6]], "epoch_batches": 8}]
    back = [{"rank": 2, "drawn": [[1, 2, 4]], "epoch_batches": 8}]  # it joined again
    led = run_ledger({0: holder, 2: worker_2 + back})
    assert (led["batches_twice"], led["batches_skipped"]) == (0, 0)
    assert led["per_worker"]["2"]["drawn_by"] == [0, 2]
    assert led["per_worker"]["2"]["epochs"] == 2
    assert reached(holder + worker_2, shard=2) == {"epoch": 1, "batch": 2}
    twice = run_ledger({0: holder, 2: worker_2 + [{"rank": 2, "drawn": [[1, 1, 3]]}]})
    assert twice["batches_twice"] == 1  # batch 1 of epoch 1: the holder's and its own


def _after(drawn, epoch_batches):
    """Where draws that ended at `drawn`'s last range go on: [epoch, batch] (the next
    epoch's first batch after its last)."""
    epoch, _, end = drawn[-1]
    return [epoch + 1, 0] if end == epoch_batches else [epoch, end]


def _records(run, rank):
    return live_records(run / f"worker-{rank}.jsonl")


@pytest.mark.slow
def test_a_lost_workers_shard_is_drawn_by_a_member_until_it_joins_again(tmp_path):
    """esync-outer, 3 workers: kill -9 of rank 2; rank 0 (holder(2, [0, 1])) draws its shard
    on from where its last record ended; launch starts rank 2 again, and it joins and goes on
    from where rank 0 got to. Every batch of every shard once (the ledger's 0 and 0)."""
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "hetsync", "launch", "-m", "esync-outer", "--workers", "3",
         "--slowdowns", "1,2,2", "--dataset", "synthetic", "--network", "mlp",
         "--time-budget", "20", "--eval-interval", "1", "-ld", str(tmp_path), "--run-name",
         "run", "--quiet", "--no-figures", "--timeout", "20", "--regroup-grace", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while not ((run / "worker-2.jsonl").exists() and len(_records(run, 2)) >= 10):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
        time.sleep(0.1)
    os.kill(pid_of_rank(run, 2), signal.SIGKILL)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    lost, held, back = [], [], []
    for r in _records(run, 2):
        (back if back or (lost and r["round"] > lost[-1]["round"] + 1) else lost).append(r)
    assert back, f"rank 2 did not join again: {out}"
    for r in _records(run, 0):
        held += [(r["round"], h["drawn"]) for h in r.get("held", ()) if h["shard"] == 2]
    # rank 0 drew shard 2 between the loss and the join, from where rank 2's records end
    assert held and lost[-1]["round"] < held[0][0] <= back[0]["round"], (held[:3], out)
    batches = lost[-1]["epoch_batches"]
    assert held[0][1][0][:2] == _after(lost[-1]["drawn"], batches)
    # and rank 2 went on from where rank 0 got to
    assert back[0]["drawn"][0][:2] == _after(held[-1][1], batches), (held[-1], back[0])
    summary = json.loads((run / "summary.json").read_text())
    ledger = summary["ledger"]
    assert ledger["batches_twice"] == ledger["batches_skipped"] == 0, ledger
    assert ledger["per_worker"]["2"]["drawn_by"] == [0, 2], ledger


@pytest.mark.slow
def test_an_asynchronous_runs_lost_worker_has_its_shard_drawn_until_it_joins_again(tmp_path):
    """async, 3 workers: kill -9 of rank 2; rank 0 claims its shard (`shards.py` step 6)
    and draws it on from where rank 2's records end; launch starts rank 2 again, which links
    to the parameter server and goes on from where rank 0 got to. 0 batches twice, 0
    skipped."""
    run = tmp_path / "run"
    # 30 s: the restarted worker imports torch beside three busy ones on two cores (about
    # 15 s here) and must join before the end.
    proc = subprocess.Popen(
        [sys.executable, "-m", "hetsync", "launch", "-m", "async", "--workers", "3",
         "--slowdowns", "1,2,2", "--dataset", "synthetic", "--network", "mlp",
         "--time-budget", "30", "--eval-interval", "1", "-ld", str(tmp_path), "--run-name",
         "run", "--quiet", "--no-figures", "--timeout", "20"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while not ((run / "worker-2.jsonl").exists() and len(_records(run, 2)) >= 30):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
        time.sleep(0.1)
    os.kill(pid_of_rank(run, 2), signal.SIGKILL)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    joined, = RunDir(run).read_events("joined")
    assert joined["rank"] == 2, joined
    records = _records(run, 2)
    lost = [r for r in records if r["round"] < joined["round"]]
    back = [r for r in records if r["round"] >= joined["round"]]
    held = [(r["round"], h["drawn"]) for r in _records(run, 0) for h in r.get("held", ())
            if h["shard"] == 2]
    assert held and back, (held[:2], back[:2], out)
    batches = lost[-1]["epoch_batches"]
    assert held[0][1][0][:2] == _after(lost[-1]["drawn"], batches)  # from rank 2's last record
    assert back[0]["drawn"][0][:2] == _after(held[-1][1], batches), (held[-1], back[0])
    ledger = json.loads((run / "summary.json").read_text())["ledger"]
    assert ledger["batches_twice"] == ledger["batches_skipped"] == 0, ledger
    assert ledger["per_worker"]["2"]["drawn_by"] == [0, 2], ledger


def test_a_pass_of_held_shards_ends_where_each_reaches_the_epochs_end():
    """`HeldShards.draw(before)`: a worker's own shard (10 batches an epoch) and a held one
    behind it draw in turn until each has reached epoch 1; a regroup's `take` with `keep`
    False holds the other shard again from where its last holder published."""
    store = dist.HashStore()
    held = shards.HeldShards(0, _sampler(0), make=_sampler)
    held.hold(2, (0, 1))
    batches = held.epoch_batches[0]
    got = []
    while (drawn := held.draw(1)) is not None:
        got.append(drawn[:3])
    assert sorted(got) == sorted([(0, 0, b) for b in range(batches)]
                                 + [(2, 0, b) for b in range(1, held.epoch_batches[2])])
    assert held.at(0) == held.at(2) == (1, 0) and held.draw(1) is None
    shards.publish(store, {2: (0, 2)})
    held.take([0, 2], lambda shard: shards.published(store, shard), keep=False)
    assert held.positions()[2] == (0, 2) and held.draw(1)[:3] == (2, 0, 2)
