"""The virtual clock's network: what a message and each collective cost on the links it crosses.

The α-β model (Hockney; Thakur, Rabenseifner & Gropp 2005, section 2): a message of S bytes
between two workers costs α + S/β, α the link's latency and β its bandwidth (bytes per second).
Every worker has one full-duplex link of its own to a switch (`Link`), so a worker sends and
receives at β at once, and a message between two workers crosses two such links at the rate
of the slower. A collective over P workers costs what its message pattern costs, each step
waiting for the slowest link it uses (`all_reduce_seconds`):

=================  =====================================================================
algorithm          seconds to sum S bytes over P workers (p' = largest power of two <= P)
=================  =====================================================================
``native``         as ``ring`` (gloo's ring all-reduce on CPU, NCCL's on GPU)
``ring``           2(P − 1) α + 2 (P − 1)/P · S/β
``butterfly``      log2(p') (α + S/β), plus 2 (α + S/β) when P is not p' (the fold)
``binary-blocks``  2 log2(p') α + 2 (p' − 1)/p' · S/β, plus the fold's 2 (α + S/β)
``star``           2 α + 2 (P − 1) S/β: the first worker receives P − 1 vectors, then sends
                   P − 1 sums, all through its own link
``ps``             2 α + 2 P · S/β + 2 P · S · w: the parameter server (a rank of its own)
                   receives P vectors and sends P sums through its link, and works w
                   seconds per byte of each (``--server-work``, as it does for the
                   asynchronous modes' requests; 0 by default)
=================  =====================================================================

A broadcast is a binomial tree: ⌈log2 P⌉ (α + S/β). Computation inside a collective (the
additions) is taken as free: at 10 Gbit/s a float's transfer costs ~3 ns, its addition on a
CPU core well under 1 ns.

Where hetsync departs from a real network: no congestion between pairs beyond each worker's
own link, no protocol overhead beyond α, no slow start; `hetsync bench comm` measures the real
thing on the machine at hand, against which α and β can be fitted.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

_RATE = re.compile(r"^(\d+(?:\.\d+)?)(kbit|mbit|gbit)$")
_UNIT = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}

#: the default link: 10 Gbit/s and 20 µs, a data centre's Ethernet between two servers
DEFAULT_BANDWIDTH_BPS = 10e9
DEFAULT_LATENCY_S = 20e-6


def parse_rate(text: str) -> float:
    """Bits per second of a rate written as tc writes it (`100mbit`, `1gbit`, `500kbit`);
    ValueError naming what is valid."""
    match = _RATE.match(str(text).strip().lower())
    if not match or float(match.group(1)) <= 0:
        raise ValueError(f"invalid rate {text!r}; expected a number > 0 followed by kbit, mbit "
                         f"or gbit (e.g. 100mbit)")
    return float(match.group(1)) * _UNIT[match.group(2)]


def format_rate(bps: float) -> str:
    """A rate in bits per second as `parse_rate` reads it (1e10 -> '10gbit')."""
    for unit in ("gbit", "mbit", "kbit"):
        if bps >= _UNIT[unit] or unit == "kbit":
            return f"{bps / _UNIT[unit]:.6f}".rstrip("0").rstrip(".") + unit
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class Link:
    """One worker's link: `latency_s` (α) and `bandwidth_bps` (bits per second)."""

    latency_s: float = DEFAULT_LATENCY_S
    bandwidth_bps: float = DEFAULT_BANDWIDTH_BPS

    def __post_init__(self) -> None:
        if not 0 <= self.latency_s < math.inf:
            raise ValueError(f"a link's latency must be >= 0 s, got {self.latency_s}")
        if not 0 < self.bandwidth_bps < math.inf:
            raise ValueError(f"a link's bandwidth must be > 0 bit/s, got {self.bandwidth_bps}")

    @property
    def bytes_per_s(self) -> float:
        return self.bandwidth_bps / 8

    def message_seconds(self, nbytes: float) -> float:
        """α + S/β: one message of `nbytes` over this link."""
        return self.latency_s + nbytes / self.bytes_per_s

    def describe(self) -> str:
        return f"{_rate(self.bandwidth_bps)}, {self.latency_s * 1e6:g} µs"


def _rate(bps: float) -> str:
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bps >= scale:
            return f"{bps / scale:g} {unit}"
    return f"{bps:g} bit/s"


def _fold(workers: int) -> tuple[int, int]:
    """(p', whether P is folded onto it): the largest power of two <= P."""
    power = 1 << (workers.bit_length() - 1)
    return power, power != workers


def all_reduce_seconds(algorithm: str, workers: int, nbytes: float, link: Link,
                       server_s_per_byte: float = 0.0) -> float:
    """Seconds for `workers` to sum `nbytes` each with `algorithm` (the module's table);
    `server_s_per_byte`: the parameter server's work (``ps`` only)."""
    if workers <= 1:
        return 0.0
    alpha, per_byte = link.latency_s, 1.0 / link.bytes_per_s
    whole = alpha + nbytes * per_byte  # one whole vector, one hop
    if algorithm in ("native", "ring"):
        return 2 * (workers - 1) * alpha + 2 * (workers - 1) / workers * nbytes * per_byte
    if algorithm == "butterfly":
        power, folded = _fold(workers)
        return math.log2(power) * whole + (2 * whole if folded else 0.0)
    if algorithm == "binary-blocks":
        power, folded = _fold(workers)
        steps = 2 * math.log2(power) * alpha + 2 * (power - 1) / power * nbytes * per_byte
        return steps + (2 * whole if folded else 0.0)
    if algorithm == "star":
        return 2 * alpha + 2 * (workers - 1) * nbytes * per_byte
    if algorithm == "ps":
        return 2 * alpha + 2 * workers * nbytes * (per_byte + server_s_per_byte)
    raise ValueError(f"the virtual clock has no cost for all-reduce {algorithm!r}")


def broadcast_seconds(workers: int, nbytes: float, link: Link) -> float:
    """A binomial tree's ⌈log2 P⌉ hops of the whole vector."""
    if workers <= 1:
        return 0.0
    return math.ceil(math.log2(workers)) * link.message_seconds(nbytes)
