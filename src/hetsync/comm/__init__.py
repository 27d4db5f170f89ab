"""hetsync.comm: all-reduce algorithms, a parameter server, a byte meter and timeouts.

- :func:`all_reduce` (``native``, ``ring``, ``butterfly``, ``binary-blocks``, ``star``,
  ``ps``): in-place sum across a group, any world size and length, every wait bounded by a
  timeout.
- :class:`ParameterServer` / :class:`PSClient`: synchronous sums and asynchronous
  apply-and-serve over a fixed binary header (:mod:`hetsync.comm.wire`), dense or sparse.
- :mod:`hetsync.comm.meter`: bytes sent and received per operation, counted at the transport.
- :class:`CommError` / :class:`CommTimeoutError`: a dead or silent peer, named.
"""

from . import meter, wire
from .collectives import ALGORITHMS, all_reduce
from .errors import CommError, CommTimeoutError, ProtocolError
from .ps import (OP_NAMES, ParameterServer, PSClient, ServerRule, ServerStats, connect,
                 default_client, disconnect)
from .timeouts import DEFAULT_TIMEOUT_S, get_default_timeout, set_default_timeout
from .topology import chunk_bounds
from .wire import HEADER_BYTES, HEADER_LEN, SparseMessage

__all__ = [
    "ALGORITHMS", "all_reduce",
    "CommError", "CommTimeoutError", "ProtocolError",
    "ParameterServer", "PSClient", "ServerRule", "ServerStats", "OP_NAMES",
    "connect", "default_client", "disconnect",
    "DEFAULT_TIMEOUT_S", "get_default_timeout", "set_default_timeout",
    "meter", "wire", "chunk_bounds", "SparseMessage", "HEADER_BYTES", "HEADER_LEN",
]
