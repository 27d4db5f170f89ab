"""hetsync.comm pieces that need no processes: chunking, fold, wire format, meter, timeouts."""

from __future__ import annotations

import dataclasses
import threading

import pytest
import torch

from hetsync import comm
from hetsync.comm import meter, wire
from hetsync.comm.topology import Fold, chunk_bounds, largest_power_of_two
from hetsync.comm.wire import Field, Header, Kind, Op, SparseMessage


@pytest.mark.parametrize("n,p", [(0, 3), (1, 4), (3, 4), (10, 3), (3000, 5), (12, 4)])
def test_chunk_bounds_nearly_equal(n, p):
    b = chunk_bounds(n, p)
    sizes = [b[i + 1] - b[i] for i in range(p)]
    assert b[0] == 0 and b[-1] == n and len(sizes) == p
    assert sizes == [n // p + (1 if i < n % p else 0) for i in range(p)]


def test_chunk_bounds_rejects_bad_values():
    with pytest.raises(ValueError, match="parts"):
        chunk_bounds(10, 0)
    with pytest.raises(ValueError, match="numel"):
        chunk_bounds(-1, 2)


def test_fold_pairs_extras_with_low_ranks():
    assert largest_power_of_two(5) == 4 and largest_power_of_two(8) == 8
    folds = [Fold.of(r, 7) for r in range(7)]
    assert [f.inner for f in folds] == [0, 1, 2, 3, None, None, None]
    assert [f.partner for f in folds] == [4, 5, 6, None, 0, 1, 2]
    assert all(f.size == 4 for f in folds)


def test_header_round_trip():
    h = Header(op=Op.PUSH_PULL, sender=3, seq=7, kind=Kind.SPARSE, dtype=1, numel=100, nnz=5)
    raw = h.encode()
    assert raw.dtype == torch.int64 and raw.numel() == wire.HEADER_LEN == 14
    assert wire.HEADER_BYTES == 112
    assert wire.decode(raw, 3) == h
    assert h.payload_bytes == 5 * (4 + 4)


def test_only_a_push_carries_a_learning_rate():
    h = Header(op=Op.PUSH_PULL, sender=1, seq=0, kind=Kind.DENSE, dtype=1, numel=4, nnz=4,
               rate=0.025)
    assert wire.decode(h.encode(), 1).rate == 0.025
    warm_up = dataclasses.replace(h, rate=0.0)   # a schedule's first step may be at rate 0
    assert wire.decode(warm_up.encode(), 1).rate == 0.0
    assert wire.decode(dataclasses.replace(h, rate=None).encode(), 1).rate is None
    pull = Header(op=Op.PULL, sender=1, seq=0).encode()
    pull[Field.RATE] = wire.rate_bits(0.025)
    with pytest.raises(comm.ProtocolError, match="only PUSH_PULL carries a rate"):
        wire.decode(pull, 1)


def test_a_header_carries_its_senders_virtual_time_to_the_bit():
    h = Header(op=Op.PULL, sender=2, seq=4, time=12.345678901234567)
    assert wire.decode(h.encode(), 2).time == 12.345678901234567
    assert wire.decode(Header(op=Op.PULL, sender=2, seq=4).encode(), 2).time == 0.0


def _bad(field: Field, value: int, **kw) -> torch.Tensor:
    raw = Header(**{"op": Op.PUSH_PULL, "sender": 1, "seq": 0, "kind": Kind.DENSE, "dtype": 1,
                    "numel": 4, "nnz": 4, **kw}).encode()
    raw[field] = value
    return raw


@pytest.mark.parametrize("field,value,needle", [
    (Field.MAGIC_VERSION, 12345, "bad magic"),
    (Field.MAGIC_VERSION, (wire.MAGIC << 16) | 9, "unsupported version"),
    (Field.OP, 42, "unknown or unexpected op"),
    (Field.SENDER, 0, "does not match the source rank 1"),
    (Field.KIND, 7, "unknown payload kind"),
    (Field.DTYPE, 99, "unknown dtype code"),
    (Field.NUMEL, -1, "not in"),
    (Field.NNZ, 3, "must equal numel=4 when dense"),
    (Field.RATE, wire.rate_bits(float("nan")), "not a finite number"),
    (Field.RATE, wire.rate_bits(-0.25), "not a finite number"),
    (Field.RATE, wire.rate_bits(1e300), "not a finite number"),
    (Field.CHECKSUM, -1, "not a CRC-32"),
    (Field.CHECKSUM, (1 << 32) + 1, "not a CRC-32"),
    (Field.TIME, wire.rate_bits(float("inf")), "not a finite number of seconds"),
    (Field.TIME, wire.rate_bits(-1.5), "not a finite number of seconds"),
])
def test_decode_refuses_with_sender_and_field(field, value, needle):
    with pytest.raises(comm.ProtocolError, match=needle) as info:
        wire.decode(_bad(field, value), 1)
    err = info.value
    assert err.peer == 1 and err.field == field.name.lower()
    assert "rank 1" in str(err) and f"'{field.name.lower()}'" in str(err)


def test_decode_refuses_inconsistent_op_and_kind():
    raw = Header(op=Op.PULL, sender=1, seq=0, kind=Kind.DENSE, dtype=1, numel=2,
                 nnz=2).encode()
    with pytest.raises(comm.ProtocolError, match="PULL carries no payload"):
        wire.decode(raw, 1)
    raw = Header(op=Op.SUM, sender=1, seq=0, kind=Kind.SPARSE, dtype=1, numel=4,
                 nnz=2).encode()
    with pytest.raises(comm.ProtocolError, match="SUM needs a dense payload"):
        wire.decode(raw, 1)
    raw = Header(op=Op.REPLY, sender=1, seq=0).encode()
    with pytest.raises(comm.ProtocolError, match="'op'"):
        wire.decode(raw, 1)   # a reply where a request is expected


@pytest.mark.parametrize("payload", [
    torch.linspace(-1, 1, 1000),
    torch.linspace(-1, 1, 9).to(torch.bfloat16),
    SparseMessage(torch.tensor([0, 7], dtype=torch.int32), torch.tensor([1.5, -2.0]), 9),
])
def test_a_checked_payload_altered_on_the_way_is_refused(payload):
    """Field 12: the CRC-32 of the payload's bytes; one flipped bit in the values no
    longer matches, and the receiver names the sender."""
    header = Header(op=Op.REPLY, sender=2, seq=0, **wire.describe(payload),
                    checksum=wire.checksum(payload))
    header = wire.decode(header.encode(), 2, expect=(Op.REPLY,))
    wire.verify(header, payload, 2)  # as sent: accepted
    values = payload.values if isinstance(payload, SparseMessage) else payload
    values.view(torch.uint8)[3] ^= 1
    with pytest.raises(comm.ProtocolError, match="refused payload from rank 2: its CRC-32"):
        wire.verify(header, payload, 2)
    wire.verify(dataclasses.replace(header, checksum=0), payload, 2)  # none carried
    empty = Header(op=Op.REPLY, sender=2, seq=0).encode()
    empty[Field.CHECKSUM] = 5
    with pytest.raises(comm.ProtocolError, match="'checksum'"):
        wire.decode(empty, 2, expect=(Op.REPLY,))


def test_sparse_message_validates():
    m = SparseMessage(torch.tensor([0, 3], dtype=torch.int32), torch.tensor([1.0, 2.0]), 5)
    assert m.nnz == 2 and wire.describe(m) == {"kind": Kind.SPARSE, "dtype": 1, "numel": 5,
                                               "nnz": 2}
    with pytest.raises(ValueError, match="int32"):
        SparseMessage(torch.tensor([0, 3]), torch.tensor([1.0, 2.0]), 5)
    with pytest.raises(ValueError, match="2 indices but 1 values"):
        SparseMessage(torch.tensor([0, 3], dtype=torch.int32), torch.tensor([1.0]), 5)
    with pytest.raises(ValueError, match="numel=1"):
        SparseMessage(torch.tensor([0, 3], dtype=torch.int32), torch.tensor([1.0, 2.0]), 1)
    with pytest.raises(ValueError, match="cannot travel"):
        wire.describe(torch.zeros(3, dtype=torch.int64))


def test_meter_counts_per_op_and_is_thread_safe():
    m = meter.ByteMeter()

    def work():
        for _ in range(1000):
            m.add("a/x", 3, 5)
            m.add("b/y", sent=1)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert m.snapshot() == {"a/x": (24000, 40000), "b/y": (8000, 0)}
    assert m.totals() == (32000, 40000)
    m.reset()
    assert m.snapshot() == {} and m.totals() == (0, 0)
    with pytest.raises(ValueError, match="sent=-1"):
        m.add("a", -1, 0)


def test_ring_bytes_formula():
    # P divides n: 2(P-1)/P n elements each way.
    assert meter.ring_bytes(12, 4, 1, 4) == (2 * 3 * 12 // 4 * 4,) * 2
    # uneven: chunks of 13 over 4 ranks are [4, 3, 3, 3]; rank 0 sends 2n - c0 - c1.
    assert meter.ring_bytes(13, 4, 0, 1) == (26 - 4 - 3, 26 - 3 - 4)
    assert meter.ring_bytes(13, 4, 1, 1) == (26 - 3 - 3, 26 - 4 - 3)
    assert meter.ring_bytes(5, 1, 0, 4) == (0, 0)


def test_timeouts_validated_and_settable():
    assert comm.get_default_timeout() == comm.DEFAULT_TIMEOUT_S == 300.0
    comm.set_default_timeout(12.5)
    try:
        assert comm.get_default_timeout() == 12.5
    finally:
        comm.set_default_timeout(300)
    for bad in (0, -1, float("nan"), "5", True):
        with pytest.raises(ValueError, match="timeout"):
            comm.set_default_timeout(bad)


def test_all_reduce_rejects_unknown_algorithm_naming_valid_ones():
    with pytest.raises(ValueError,
                       match=r"'rabbit'.*native, ring, butterfly, binary-blocks, star, ps"):
        comm.all_reduce(torch.ones(3), "rabbit")


def test_ps_all_reduce_without_client_says_how_to_connect():
    assert comm.default_client() is None
    with pytest.raises(RuntimeError, match=r"connect\(server_rank\)"):
        comm.all_reduce(torch.ones(3), "ps")


def test_parameter_server_rejects_bad_arguments():
    with pytest.raises(ValueError, match="at least one worker"):
        comm.ParameterServer([])
    with pytest.raises(ValueError, match="duplicates"):
        comm.ParameterServer([0, 0])
    with pytest.raises(ValueError, match="rule must have"):
        comm.ParameterServer([0], rule=object())
