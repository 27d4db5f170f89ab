"""The synchronisation modes: one module per mode, each registered in `registry`."""

from __future__ import annotations

from hetsync.algorithms import registry
from hetsync.algorithms.base import (Action, CommContext, ControlPath, Mode, PhaseClock, Step)
from hetsync.algorithms.registry import ModeSpec, register

__all__ = ["Action", "CommContext", "ControlPath", "Mode", "ModeSpec", "PhaseClock", "Step",
           "register", "registry"]
