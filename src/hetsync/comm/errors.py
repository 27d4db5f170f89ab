"""Errors raised by :mod:`hetsync.comm`.

Every failure of a point-to-point transfer is reported as a :class:`CommError` that names the
operation (the byte meter's name for it, e.g. ``"all_reduce/ring"``) and the peer's global
rank; a wait that ran out of time is the subclass :class:`CommTimeoutError`, which also names
the seconds waited. Both derive from :class:`RuntimeError`, like the errors torch.distributed
raises itself, so code that already catches ``RuntimeError`` keeps working.
"""

from __future__ import annotations


class CommError(RuntimeError):
    """A transfer failed (typically: the peer's connection dropped because it died).

    Attributes:
        op: name of the operation, as counted by the byte meter.
        peer: global rank of the peer, or ``None`` where the peer is unknown (a wait on several).
    """

    def __init__(self, message: str, *, op: str | None = None, peer: int | None = None):
        super().__init__(message)
        self.op = op
        self.peer = peer


class CommTimeoutError(CommError):
    """A wait on a peer did not complete within its timeout.

    Attributes:
        seconds: the timeout that expired.
    """

    def __init__(self, message: str, *, op: str | None = None, peer: int | None = None,
                 seconds: float | None = None):
        super().__init__(message, op=op, peer=peer)
        self.seconds = seconds


class ProtocolError(CommError):
    """A parameter-server message header that the receiver does not understand.

    Attributes:
        field: name of the offending header field (e.g. ``"magic_version"``, ``"op"``).
        value: the value found there.
    """

    def __init__(self, message: str, *, peer: int | None = None, field: str | None = None,
                 value: int | None = None, op: str | None = None):
        super().__init__(message, op=op, peer=peer)
        self.field = field
        self.value = value
