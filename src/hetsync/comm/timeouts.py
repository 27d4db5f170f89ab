"""The process-wide default timeout of :mod:`hetsync.comm`.

Every wait in this package is bounded: by the ``timeout`` argument of the call when one is
given, else by the default set here (initially 300 s). Timeouts are in seconds.
"""

from __future__ import annotations

import datetime
import math
import threading

DEFAULT_TIMEOUT_S = 300.0

_lock = threading.Lock()
_default = DEFAULT_TIMEOUT_S


def _check(seconds: float | datetime.timedelta, name: str = "timeout") -> float:
    if isinstance(seconds, datetime.timedelta):
        seconds = seconds.total_seconds()
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise ValueError(f"{name} must be a number of seconds, got {seconds!r}")
    seconds = float(seconds)
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"{name} must be a positive finite number of seconds, got {seconds!r}")
    return seconds


def set_default_timeout(seconds: float | datetime.timedelta) -> None:
    """Set the timeout used by every wait that was not given one (seconds, > 0)."""
    global _default
    value = _check(seconds)
    with _lock:
        _default = value


def get_default_timeout() -> float:
    """The timeout, in seconds, used by every wait that was not given one."""
    with _lock:
        return _default


def resolve_timeout(timeout: float | datetime.timedelta | None) -> float:
    """``timeout`` checked and in seconds, or the process-wide default when it is ``None``."""
    return get_default_timeout() if timeout is None else _check(timeout)
