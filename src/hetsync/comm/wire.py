"""Wire format of the parameter server: a fixed int64 header, then raw payload tensors.

No pickle and no Python objects cross the wire. Every message is

1. a header: an int64 tensor of :data:`HEADER_LEN` = 14 fields (:data:`HEADER_BYTES` = 112
   bytes), laid out as :class:`Field`:

   ====  ==============  =========================================================
   idx   field           meaning
   ====  ==============  =========================================================
   0     magic_version   :data:`MAGIC` << 16 | :data:`VERSION`
   1     op              :class:`Op` (request: PULL, PUSH_PULL, SUM, BYE; reply:
                         REPLY, ERROR)
   2     sender          global rank of the sender
   3     seq             the client's request number (0, 1, 2, ...); a reply echoes it
   4     kind            :class:`Kind` of the payload: EMPTY, DENSE, SPARSE
   5     dtype           :data:`DTYPE_CODES` code of the (value) payload; 0 if EMPTY
   6     numel           length of the dense vector (a sparse one's dense length)
   7     nnz             number of values sent (= numel when DENSE, 0 when EMPTY)
   8     round           SUM: the client's synchronous-sum number (matches pushes)
   9     status          ERROR: an :class:`Status` code; else 0
   10    detail          ERROR: the :class:`Field` index blamed, or the round; else 0
   11    rate            PUSH_PULL: the worker's learning rate, the bits of a float64 in
                         [0, MAX_RATE] (all bits 0: none, the rule's own; a rate of 0
                         travels as -0.0); other ops: 0
   12    checksum        the CRC-32 of the payload's bytes + 1 (0: none); the server
                         sets it on its reply to a PULL (the whole model, which a
                         worker takes at its start, its join and its finish), and a
                         receiver checks any it gets
   13    time            on a virtual clock (`hetsync.clock`): the sender's time when
                         it sent (a request), or when the reply reaches the worker (a
                         reply), the bits of a finite float64 >= 0; else 0
   ====  ==============  =========================================================

2. the payload, on a separate tag: nothing (EMPTY); one tensor of ``numel`` elements of
   ``dtype`` (DENSE); or ``nnz`` int32 indices then ``nnz`` values of ``dtype`` (SPARSE).

Sizes travel in the header, so the receiver allocates exactly once and no side channel is
needed. :func:`decode` refuses a header it does not understand with a
:class:`~hetsync.comm.errors.ProtocolError` naming the sender and the field.
"""

from __future__ import annotations

import enum
import math
import struct
import zlib
from dataclasses import dataclass

import torch

from .errors import ProtocolError

MAGIC = 0x48535943  # "HSYC"
VERSION = 4  # 2: field 11 carries a push's learning rate; 3: field 12 a checksum; 4: 13 a time
MAGIC_VERSION = (MAGIC << 16) | VERSION
HEADER_LEN = 14
HEADER_BYTES = HEADER_LEN * 8
#: the fields a server's header receive has room for: a header longer than HEADER_LEN (a
#: version-skewed or hostile sender's) but within it is refused with an ERROR; gloo aborts
#: the receiving process on a message longer than the buffer posted for it
HEADER_ROOM = 64
#: what a header receive is filled with before it arrives: no header's last field is it (a
#: time's bits are those of a float >= 0), so the fields a short or long header filled show
HEADER_FILL = -1
#: how many times its announced length a server's payload receive has room for: a payload
#: longer than announced but within it (a float64 payload sent where the header said
#: float32, say) is refused with an ERROR; beyond it, gloo's abort as for a header
PAYLOAD_ROOM = 2
#: Upper bound on numel accepted from the wire (guards against absurd allocations).
MAX_NUMEL = 1 << 40
INDEX_DTYPE = torch.int32
#: Largest learning rate a push may carry (beyond it no SGD converges).
MAX_RATE = 1e6


class Field(enum.IntEnum):
    MAGIC_VERSION = 0
    OP = 1
    SENDER = 2
    SEQ = 3
    KIND = 4
    DTYPE = 5
    NUMEL = 6
    NNZ = 7
    ROUND = 8
    STATUS = 9
    DETAIL = 10
    RATE = 11
    CHECKSUM = 12
    TIME = 13


class Op(enum.IntEnum):
    PULL = 1        # request: "send me your view"            (EMPTY)
    PUSH_PULL = 2   # request: "apply this, send me your view" (DENSE or SPARSE)
    SUM = 3         # request: "add this to round `round`"     (DENSE)
    BYE = 4         # request: "I am done"                     (EMPTY)
    REPLY = 5       # reply to any request
    ERROR = 6       # reply: the request was refused (status, detail say why)


REQUESTS = (Op.PULL, Op.PUSH_PULL, Op.SUM, Op.BYE)


class Kind(enum.IntEnum):
    EMPTY = 0
    DENSE = 1
    SPARSE = 2


class Status(enum.IntEnum):
    OK = 0
    BAD_HEADER = 1      # detail = Field index
    RULE_FAILED = 2     # the server's rule raised
    ROUND_ABORTED = 3   # a worker closed before a SUM round completed; detail = round
    BAD_PAYLOAD = 4     # non-finite values, not the size its header announced, or altered


DTYPE_CODES: dict[int, torch.dtype] = {
    1: torch.float32,
    2: torch.float64,
    3: torch.float16,
    4: torch.bfloat16,
}
CODE_OF_DTYPE = {dt: code for code, dt in DTYPE_CODES.items()}


@dataclass
class SparseMessage:
    """A sparse vector: ``values[j]`` sits at flat position ``indices[j]`` of ``numel``.

    ``indices`` is a 1-D int32 tensor, ``values`` a 1-D floating tensor (float32 by
    convention) of the same length. Only a container: selecting the entries is the
    compression part's job.
    """

    indices: torch.Tensor
    values: torch.Tensor
    numel: int

    def __post_init__(self) -> None:
        if self.indices.dtype != INDEX_DTYPE:
            raise ValueError(f"SparseMessage indices must be int32, got {self.indices.dtype}")
        if self.indices.dim() != 1 or self.values.dim() != 1:
            raise ValueError("SparseMessage indices and values must be 1-D, got shapes "
                             f"{tuple(self.indices.shape)} and {tuple(self.values.shape)}")
        if self.indices.numel() != self.values.numel():
            raise ValueError(f"SparseMessage has {self.indices.numel()} indices but "
                             f"{self.values.numel()} values")
        if self.values.dtype not in CODE_OF_DTYPE:
            raise ValueError(f"SparseMessage values dtype {self.values.dtype} is not one of "
                             f"{list(CODE_OF_DTYPE)}")
        if not 0 <= self.indices.numel() <= int(self.numel):
            raise ValueError(f"SparseMessage numel={self.numel} is smaller than its "
                             f"{self.indices.numel()} entries")
        self.numel = int(self.numel)

    @property
    def nnz(self) -> int:
        return self.indices.numel()


Payload = torch.Tensor | SparseMessage | None


@dataclass(frozen=True)
class Header:
    """A decoded header (see the module docstring for the layout)."""

    op: int
    sender: int
    seq: int
    kind: int = Kind.EMPTY
    dtype: int = 0
    numel: int = 0
    nnz: int = 0
    round: int = 0
    status: int = 0
    detail: int = 0
    rate: float | None = None
    checksum: int = 0
    time: float = 0.0

    def encode(self) -> torch.Tensor:
        return torch.tensor([MAGIC_VERSION, self.op, self.sender, self.seq, self.kind,
                             self.dtype, self.numel, self.nnz, self.round, self.status,
                             self.detail, rate_field(self.rate), self.checksum,
                             rate_bits(float(self.time)) if self.time else 0],
                            dtype=torch.int64)

    @property
    def payload_bytes(self) -> int:
        if self.kind == Kind.EMPTY:
            return 0
        size = torch.empty((), dtype=DTYPE_CODES[self.dtype]).element_size()
        index = INDEX_DTYPE.itemsize if self.kind == Kind.SPARSE else 0
        return self.nnz * (size + index)


def rate_bits(rate: float) -> int:
    """A float64's bits as the int64 a header field holds."""
    return struct.unpack("<q", struct.pack("<d", rate))[0]


def rate_field(rate: float | None) -> int:
    """Field 11 of a push: no rate is 0; a rate of 0 is -0.0's bits (so it is one)."""
    if rate is None:
        return 0
    return rate_bits(-0.0 if rate == 0 else float(rate))


def bits_rate(bits: int) -> float:
    return struct.unpack("<d", struct.pack("<q", bits))[0]


def describe(payload: Payload) -> dict[str, int]:
    """Header fields kind/dtype/numel/nnz for ``payload`` (ValueError if it cannot travel)."""
    if payload is None:
        return {"kind": Kind.EMPTY}
    if isinstance(payload, SparseMessage):
        return {"kind": Kind.SPARSE, "dtype": CODE_OF_DTYPE[payload.values.dtype],
                "numel": payload.numel, "nnz": payload.nnz}
    if isinstance(payload, torch.Tensor):
        if payload.dtype not in CODE_OF_DTYPE:
            raise ValueError(f"dtype {payload.dtype} cannot travel to the parameter server; "
                             f"supported: {list(CODE_OF_DTYPE)}")
        return {"kind": Kind.DENSE, "dtype": CODE_OF_DTYPE[payload.dtype],
                "numel": payload.numel(), "nnz": payload.numel()}
    raise ValueError(f"payload must be a Tensor, SparseMessage or None, got "
                     f"{type(payload).__name__}")


def payload_tensors(payload: Payload) -> list[torch.Tensor]:
    """The CPU tensors to send for ``payload``, in wire order."""
    if payload is None:
        return []
    if isinstance(payload, SparseMessage):
        return [payload.indices.detach().cpu().contiguous(),
                payload.values.detach().cpu().contiguous()]
    return [payload.detach().cpu().contiguous().view(-1)]


def checksum(payload: Payload) -> int:
    """Field 12 for ``payload``: the CRC-32 of its bytes in wire order, + 1."""
    crc = 0
    for t in payload_tensors(payload):
        crc = zlib.crc32(t.view(torch.uint8).numpy(), crc)
    return crc + 1


def verify(header: Header, payload: Payload, source: int) -> None:
    """ProtocolError naming ``source`` where ``payload`` does not match the checksum its
    ``header`` carries (none carried: nothing to check)."""
    if header.checksum and checksum(payload) != header.checksum:
        raise ProtocolError(f"refused payload from rank {source}: its CRC-32 is "
                            f"{checksum(payload) - 1:08x}, its header says "
                            f"{header.checksum - 1:08x} (altered on the way)", peer=source,
                            field="payload", value=header.checksum)


def receive_buffers(header: Header, room: int = 1) -> tuple[list[torch.Tensor], Payload]:
    """Buffers to receive ``header``'s payload into, and the payload they will form.

    Values start as NaN and indices as -1, so a payload shorter than its header announced
    (gloo accepts one) shows as non-finite values or a negative index, never as leftover
    memory. With ``room`` > 1 each buffer has room for ``room`` times its announced length
    and the payload is its head: a longer message writes past the head (:func:`overran`)
    instead of aborting the receiver (gloo's abort on a message longer than the buffer
    posted)."""
    if header.kind == Kind.EMPTY:
        return [], None
    dtype = DTYPE_CODES[header.dtype]
    if header.kind == Kind.DENSE:
        t = _filled(header.numel, room, float("nan"), dtype)
        return [t], t[:header.numel]
    idx = _filled(header.nnz, room, -1, INDEX_DTYPE)
    val = _filled(header.nnz, room, float("nan"), dtype)
    return [idx, val], SparseMessage(idx[:header.nnz], val[:header.nnz], header.numel)


def _filled(n: int, room: int, fill, dtype: torch.dtype) -> torch.Tensor:
    """Room for `room` times `n` elements; the first `n`, and the one after them where there
    is room, hold `fill` (a message fills the buffer from its start: one longer than `n`
    writes that one)."""
    if room == 1:
        return torch.full((n,), fill, dtype=dtype)
    buf = torch.empty(n * room, dtype=dtype)
    buf[:n + 1].fill_(fill)
    return buf


def overran(bufs: list[torch.Tensor], header: Header) -> bool:
    """Whether a message longer than ``header`` announced wrote past the head of
    :func:`receive_buffers`' ``bufs``: the element after it no longer NaN (values) or -1
    (indices). (A message whose element there is that fill cannot be told from none; the
    head alone is used.)"""
    n = header.numel if header.kind == Kind.DENSE else header.nnz
    for buf in bufs:
        if buf.numel() > n:
            after = buf[n]
            if not bool(after == -1 if buf.dtype == INDEX_DTYPE else torch.isnan(after)):
                return True
    return False


def _refuse(source: int, field: Field, value: int, why: str) -> ProtocolError:
    return ProtocolError(
        f"refused header from rank {source}: field '{field.name.lower()}' "
        f"(index {int(field)}) = {value}: {why}",
        peer=source, field=field.name.lower(), value=value)


def received_fields(raw: torch.Tensor) -> torch.Tensor:
    """The fields a header receive of :data:`HEADER_ROOM` filled with :data:`HEADER_FILL`
    got: ``raw`` without its untouched tail (for :func:`decode` to count)."""
    filled = (raw != HEADER_FILL).nonzero()
    return raw[:int(filled[-1]) + 1] if filled.numel() else raw[:0]


def decode(raw: torch.Tensor, source: int, *, expect: tuple[int, ...] = REQUESTS) -> Header:
    """Parse and validate a received header tensor; ``source`` is the rank it came from.

    Raises :class:`ProtocolError` naming ``source`` and the first field it does not
    understand: bad magic or version, an op not in ``expect``, a sender that is not
    ``source``, an unknown kind or dtype, or sizes inconsistent with the kind.
    """
    v = [int(x) for x in raw.tolist()]
    if len(v) != HEADER_LEN:
        raise _refuse(source, Field.MAGIC_VERSION, len(v), f"header has {len(v)} fields, "
                      f"expected {HEADER_LEN}")
    if v[Field.MAGIC_VERSION] >> 16 != MAGIC:
        raise _refuse(source, Field.MAGIC_VERSION, v[Field.MAGIC_VERSION],
                      f"bad magic (expected {MAGIC:#x} << 16 | version)")
    if v[Field.MAGIC_VERSION] & 0xFFFF != VERSION:
        raise _refuse(source, Field.MAGIC_VERSION, v[Field.MAGIC_VERSION],
                      f"unsupported version {v[Field.MAGIC_VERSION] & 0xFFFF} "
                      f"(this side speaks {VERSION})")
    op = v[Field.OP]
    if op not in expect:
        names = ", ".join(f"{Op(o).name}={int(o)}" for o in expect)
        raise _refuse(source, Field.OP, op, f"unknown or unexpected op (expected {names})")
    if v[Field.SENDER] != source:
        raise _refuse(source, Field.SENDER, v[Field.SENDER],
                      f"sender field does not match the source rank {source}")
    if v[Field.SEQ] < 0:
        raise _refuse(source, Field.SEQ, v[Field.SEQ], "negative sequence number")
    kind = v[Field.KIND]
    if kind not in Kind._value2member_map_:
        raise _refuse(source, Field.KIND, kind, "unknown payload kind (0 empty, 1 dense, "
                      "2 sparse)")
    dtype, numel, nnz = v[Field.DTYPE], v[Field.NUMEL], v[Field.NNZ]
    if kind == Kind.EMPTY:
        for f in (Field.DTYPE, Field.NUMEL, Field.NNZ):
            if v[f] != 0:
                raise _refuse(source, f, v[f], "must be 0 for an empty payload")
    else:
        if dtype not in DTYPE_CODES:
            raise _refuse(source, Field.DTYPE, dtype,
                          f"unknown dtype code (known: {sorted(DTYPE_CODES)})")
        if not 0 <= numel <= MAX_NUMEL:
            raise _refuse(source, Field.NUMEL, numel, f"not in [0, {MAX_NUMEL}]")
        if kind == Kind.DENSE and nnz != numel:
            raise _refuse(source, Field.NNZ, nnz, f"must equal numel={numel} when dense")
        if kind == Kind.SPARSE and not 0 <= nnz <= numel:
            raise _refuse(source, Field.NNZ, nnz, f"not in [0, numel={numel}] for sparse")
    if op in (Op.PULL, Op.BYE) and kind != Kind.EMPTY:
        raise _refuse(source, Field.KIND, kind, f"{Op(op).name} carries no payload")
    if op == Op.SUM and kind != Kind.DENSE:
        raise _refuse(source, Field.KIND, kind, "SUM needs a dense payload")
    if op == Op.PUSH_PULL and kind == Kind.EMPTY:
        raise _refuse(source, Field.KIND, kind, "PUSH_PULL needs a payload")
    if v[Field.ROUND] < 0 or (op != Op.SUM and op != Op.ERROR and v[Field.ROUND] != 0):
        raise _refuse(source, Field.ROUND, v[Field.ROUND], "round is only set by SUM (>= 0)")
    if op != Op.ERROR:
        for f in (Field.STATUS, Field.DETAIL):
            if v[f] != 0:
                raise _refuse(source, f, v[f], "must be 0 outside ERROR replies")
    rate = bits_rate(v[Field.RATE])
    if op != Op.PUSH_PULL and v[Field.RATE] != 0:
        raise _refuse(source, Field.RATE, v[Field.RATE], "only PUSH_PULL carries a rate")
    if v[Field.RATE] != 0 and not (0 <= rate <= MAX_RATE and math.isfinite(rate)):
        raise _refuse(source, Field.RATE, v[Field.RATE],
                      f"the rate {rate!r} is not a finite number in [0, {MAX_RATE:g}]")
    if not 0 <= v[Field.CHECKSUM] <= 1 << 32 or (kind == Kind.EMPTY and v[Field.CHECKSUM]):
        raise _refuse(source, Field.CHECKSUM, v[Field.CHECKSUM],
                      "not a CRC-32 + 1 in [1, 2^32] of a payload, or 0 (none)")
    time = bits_rate(v[Field.TIME])
    if not (math.isfinite(time) and time >= 0):
        raise _refuse(source, Field.TIME, v[Field.TIME],
                      f"the time {time!r} is not a finite number of seconds >= 0")
    return Header(op=op, sender=source, seq=v[Field.SEQ], kind=kind, dtype=dtype,
                  numel=numel, nnz=nnz, round=v[Field.ROUND], status=v[Field.STATUS],
                  detail=v[Field.DETAIL], rate=abs(rate) if v[Field.RATE] != 0 else None,
                  checksum=v[Field.CHECKSUM], time=abs(time))
