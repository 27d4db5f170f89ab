"""The services of a run besides its workers: what a mode declares of its own (`RunService`,
in `ModeSpec.service`: ESync's state server is one) and a worker's connection to such a
service or to the live board of `--live-report` (`JsonClient`: one keep-alive connection, JSON
in and out, a bearer token, a bounded retry of a service that is restarting;
`hetsync.state.StateClient` adds ESync's requests to it)."""

from __future__ import annotations

import http.client
import json
import os
import time
from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class RunService:
    """A process a mode's workers talk to besides one another (ESync's state server), declared
    in the mode's spec (`ModeSpec.service`): `launch` starts it as a process of its own and
    restarts it when it dies, `hetsync.wrap` serves it on a thread of rank 0, and the assembly
    connects each worker to it, all from this declaration (no generic layer names it).

    Attributes:
        name: its process's and log's name in `launch` (``logs/NAME.log``).
        title: how messages name it.
        command: ``(host, port, workers, options, instance) -> argv``: the service as its
            own process, on ``host:port`` for ``workers`` workers with the mode's ``options``;
            its ``GET /healthz`` answers ``{"instance": instance, ...}`` (so that `launch`
            knows it from another run's on the same port).
        serve: ``(workers, host, token) -> server``: started on a thread on a free port, with
            ``port`` and ``stop()``.
        connect: ``(host, port, timeout, token) -> client``: a :class:`JsonClient` (the mode
            reads it as ``comm.service``), with ``traffic()`` if the service counts what it
            serves: a dict for the run's ``service.json`` (None if it cannot tell).
        restarts: how many times `launch` starts it again after it died.
        virtual_clock: its answers do not depend on the real order of the workers' requests
            (ESync's state server holds a round's reports until every worker's is in), so a
            run on the virtual clock (`hetsync.clock`) stays deterministic with it.
    """

    name: str
    title: str
    command: Callable[[str, int, int, Any, str], list[str]]
    serve: Callable[[int, str, str | None], Any]
    connect: Callable[[str, int, float, str | None], Any]
    restarts: int = 5
    virtual_clock: bool = False


class ServiceError(RuntimeError):
    pass


class ServiceUnreachable(ServiceError):
    """No answer within the retries (gone, restarting), as opposed to a refusal."""


def valid_token(token: str) -> bool:
    """A token travels in an HTTP header: printable ASCII, no spaces, at most 256."""
    return 0 < len(token) <= 256 and all(33 <= ord(c) <= 126 for c in token)


class JsonClient:
    """Talks to the service `what` (its name in errors) at host:port; every attempt is bounded
    by `timeout` seconds (its read by what is left of `retry_s`, at least `MIN_READ_S`). A
    service that cannot be reached (it died, it is restarting) is tried again with exponential
    backoff for `retry_s` seconds (default: `timeout`) before `ServiceUnreachable`.
    `token`: the service's shared secret (default: `HETSYNC_TOKEN`, if set)."""

    #: the shortest wait for an answer, however little of `retry_s` is left: a service that
    #: is up answers well within it, even on a busy machine
    MIN_READ_S = 1.0

    def __init__(self, host: str = "127.0.0.1", port: int = 10010, timeout: float = 30.0,
                 token: str | None = None, retry_s: float | None = None,
                 what: str = "service"):
        self.host, self.port, self.timeout, self.what = host, port, timeout, what
        self.retry_s = timeout if retry_s is None else retry_s
        token = token if token is not None else os.environ.get("HETSYNC_TOKEN") or None
        if token is not None and not valid_token(token):
            raise ServiceError(f"the {what}'s token (--token / HETSYNC_TOKEN) must be 1 to 256 "
                               f"printable ASCII characters without spaces")
        self._auth = {} if token is None else {"Authorization": f"Bearer {token}"}
        self._conn: http.client.HTTPConnection | None = None
        #: how many times a request had to be tried again (a lost connection, a restart)
        self.retries = 0

    def _send(self, method: str, path: str, body: dict | None) -> None:
        payload = None if body is None else json.dumps(body).encode()
        headers = dict(self._auth)
        if payload is not None:
            headers["Content-Type"] = "application/json"
        if self._conn is None:
            self._conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        self._conn.request(method, path, body=payload, headers=headers)

    def _request(self, method: str, path: str, body: dict | None = None, *,
                 sent: bool = False, retry_s: float | None = None) -> dict:
        """Send (unless `sent`) and read the answer; on a lost connection, send again (a
        keep-alive connection may have been closed; the service may be restarting) with
        backoff for `retry_s` seconds."""
        end = time.monotonic() + (self.retry_s if retry_s is None else retry_s)
        pause = 0.05
        while True:
            try:
                if not sent:
                    self._send(method, path, body)
                sent = False
                # a service that accepts but does not answer (stopped) is waited for only as
                # long as the caller would try one that refuses, not the whole `timeout`
                self._conn.sock.settimeout(
                    min(self.timeout, max(end - time.monotonic(), self.MIN_READ_S)))
                response = self._conn.getresponse()
                data = json.loads(response.read() or b"{}")
            except (OSError, http.client.HTTPException, json.JSONDecodeError) as err:
                self.close()
                if time.monotonic() + pause > end:
                    raise ServiceUnreachable(
                        f"{self.what} at {self.host}:{self.port} did not answer {method} "
                        f"{path} ({type(err).__name__}: {err}); is it running there "
                        f"(-ip/-port)?") from err
                self.retries += 1
                time.sleep(pause)
                pause = min(2 * pause, 1.0)
                continue
            if response.status >= 400:
                raise ServiceError(f"{self.what} refused {method} {path}: "
                                   f"{data.get('error', response.status)}")
            return data

    def get(self, path: str, retry_s: float | None = None) -> dict:
        return self._request("GET", path, retry_s=retry_s)

    def post(self, path: str, body: dict, retry_s: float | None = None) -> dict:
        return self._request("POST", path, body, retry_s=retry_s)

    def wait_until_up(self, deadline_s: float = 30.0) -> dict:
        """The service's `/healthz` answer (its process id among it), once it gives one."""
        return self.get("/healthz", retry_s=deadline_s)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
