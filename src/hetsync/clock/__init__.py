"""hetsync.clock: the clock a run is timed by — the wall clock, or a virtual clock whose time
comes from a device and network model while the gradients stay real (`clocks.py`), the
network model's cost of each collective (`network.py`), and the profile file that gives a
cluster's devices and links (`profile.py`)."""

from .clocks import VirtualClock, VirtualFuture, WallClock
from .network import (DEFAULT_BANDWIDTH_BPS, DEFAULT_LATENCY_S, Link, all_reduce_seconds,
                      broadcast_seconds, format_rate, parse_rate)

CLOCKS = ("wall", "virtual")

__all__ = ["CLOCKS", "DEFAULT_BANDWIDTH_BPS", "DEFAULT_LATENCY_S", "Link", "VirtualClock",
           "VirtualFuture", "WallClock", "all_reduce_seconds", "broadcast_seconds",
           "format_rate", "parse_rate"]
