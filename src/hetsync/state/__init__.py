"""ESync's state server: the readiness policy, the HTTP service and the worker's client."""

from hetsync.state.client import StateClient, StateServerError
from hetsync.state.policy import Decision, ReadinessTracker, decide, steps_until_overrun
from hetsync.state.server import DEFAULT_PORT, StateServer, create_app

__all__ = ["DEFAULT_PORT", "Decision", "ReadinessTracker", "StateClient", "StateServer",
           "StateServerError", "create_app", "decide", "steps_until_overrun"]
