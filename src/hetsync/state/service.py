"""ESync's state server as the service its modes declare (`ModeSpec.service`)."""

from __future__ import annotations

import sys
from typing import Any

from hetsync.services import RunService


def _command(host: str, port: int, workers: int, options: Any, instance: str) -> list[str]:
    # The workers' rank 0 starts the run on it with the mode's own options (`/init`); a
    # restarted one is given them here, and rebuilds its records from the next reports.
    epsilon = getattr(options, "epsilon", None)
    return [sys.executable, "-m", "hetsync", "state-server", "--host", host, "--port", str(port),
            "--workers", str(workers), "--epsilon", "auto" if epsilon is None else str(epsilon),
            "--instance", instance]


def _serve(workers: int, host: str, token: str | None):
    from hetsync.state.server import StateServer

    return StateServer(workers, host=host, port=0, token=token).start()


def _connect(host: str, port: int, timeout: float, token: str | None):
    from hetsync.state.client import StateClient

    return StateClient(host, port, timeout=timeout, token=token)


STATE_SERVER = RunService("state-server", "state server", command=_command, serve=_serve,
                          connect=_connect, restarts=5, virtual_clock=True)
