"""A worker's connection to the state server: one keep-alive HTTP connection, JSON in and out.

`report_async` writes a report and returns at once; its answer is read when the worker needs it
(ESync's "delayed ACK": the worker computes while the answer travels). No thread is involved,
so the request leaves when it is written, not when a thread gets the interpreter lock."""

from __future__ import annotations

import http.client
import json
import os
import time
from typing import Callable

from hetsync.state.policy import Decision


class StateServerError(RuntimeError):
    pass


class StateServerUnreachable(StateServerError):
    """No answer within the retries (gone, restarting), as opposed to a refusal."""


def valid_token(token: str) -> bool:
    """A token travels in an HTTP header: printable ASCII, no spaces, at most 256."""
    return 0 < len(token) <= 256 and all(33 <= ord(c) <= 126 for c in token)


class StateClient:
    """Talks to `hetsync state-server` at host:port; every attempt is bounded by `timeout`
    seconds (its read by what is left of `retry_s`, at least `MIN_READ_S`). A server that
    cannot be reached (it died, it is restarting) is tried again with exponential backoff for
    `retry_s` seconds (default: `timeout`) before `StateServerError`: a restarted server
    rebuilds its records from the workers' next reports.
    `token`: the server's shared secret (default: `HETSYNC_TOKEN`, if set)."""

    #: the shortest wait for an answer, however little of `retry_s` is left: a server that
    #: is up answers well within it, even on a busy machine
    MIN_READ_S = 1.0

    def __init__(self, host: str = "127.0.0.1", port: int = 10010, timeout: float = 30.0,
                 token: str | None = None, retry_s: float | None = None):
        self.host, self.port, self.timeout = host, port, timeout
        self.run: str | None = None  # the run every report names (`init`, or set by a worker)
        self.lost: list[int] = []    # ranks that run went on without (`init`, or a worker)
        self.retry_s = timeout if retry_s is None else retry_s
        token = token if token is not None else os.environ.get("HETSYNC_TOKEN") or None
        if token is not None and not valid_token(token):
            raise StateServerError("the state server's token (--token / HETSYNC_TOKEN) must be "
                                   "1 to 256 printable ASCII characters without spaces")
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
        keep-alive connection may have been closed; the server may be restarting) with
        backoff for `retry_s` seconds."""
        end = time.monotonic() + (self.retry_s if retry_s is None else retry_s)
        pause = 0.05
        while True:
            try:
                if not sent:
                    self._send(method, path, body)
                sent = False
                # a server that accepts but does not answer (stopped) is waited for only as
                # long as the caller would try one that refuses, not the whole `timeout`
                self._conn.sock.settimeout(
                    min(self.timeout, max(end - time.monotonic(), self.MIN_READ_S)))
                response = self._conn.getresponse()
                data = json.loads(response.read() or b"{}")
            except (OSError, http.client.HTTPException, json.JSONDecodeError) as err:
                self.close()
                if time.monotonic() + pause > end:
                    raise StateServerUnreachable(
                        f"state server at {self.host}:{self.port} did not answer {method} "
                        f"{path} ({type(err).__name__}: {err}); is `hetsync state-server` "
                        f"running there (-ip/-port)?") from err
                self.retries += 1
                time.sleep(pause)
                pause = min(2 * pause, 1.0)
                continue
            if response.status >= 400:
                raise StateServerError(f"state server refused {method} {path}: "
                                       f"{data.get('error', response.status)}")
            return data

    def wait_until_up(self, deadline_s: float = 30.0) -> dict:
        """The server's `/healthz` answer (its process id among it), once it gives one."""
        return self._request("GET", "/healthz", retry_s=deadline_s)

    def init(self, workers: int, epsilon: float | None = None, run: str | None = None,
             lost: list[int] | None = None, retry_s: float | None = None) -> None:
        """Start afresh for `run` (then every report carries it), without the `lost` ranks;
        `epsilon` None: the server's own margin (by default `auto`); `retry_s`: as for
        `report_async`."""
        self.run = run
        self.lost = sorted(lost or [])
        self._request("POST", "/init", {"workers": workers, "epsilon": epsilon, "run": run,
                                        "lost": self.lost}, retry_s=retry_s)

    def report(self, rank: int, round: int, steps: int, step_time: float,
               device: str = "") -> Decision:
        return self.report_async(rank, round, steps, step_time, device)()

    def report_async(self, rank: int, round: int, steps: int, step_time: float,
                     device: str = "", retry_s: float | None = None) -> Callable[[], Decision]:
        """Write the report now; the returned function reads the answer (call it once),
        trying a server it cannot reach for `retry_s` seconds (default: the client's)."""
        body = {"rank": rank, "round": round, "steps": steps, "step_time": step_time,
                "device": device}
        if self.run is not None:
            body["run"] = self.run
        if self.lost:  # for a restarted server (see `hetsync.state.server`)
            body["lost"] = self.lost
        try:
            self._send("POST", "/report", body)
            sent = True
        except (OSError, http.client.HTTPException):
            self.close()  # the read sends it again, on a fresh connection
            sent = False
        return lambda: self._decision(self._request("POST", "/report", body, sent=sent,
                                                    retry_s=retry_s))

    @staticmethod
    def _decision(data: dict) -> Decision:
        time_left = data.get("time_left")
        return Decision(int(data["steps_left"]), str(data.get("reason", "")),
                        None if time_left is None else float(time_left),
                        float(data.get("epsilon", 0.0)))

    def progress(self, figures: dict) -> None:
        """Post a worker's figures for the live page (`telemetry.live.LivePoster`)."""
        self._request("POST", "/progress", figures)

    def status(self) -> dict:
        return self._request("GET", "/status")

    def traffic(self) -> dict | None:
        """The server's request and byte counts, the ranks its run goes on without, and the
        last round each other rank reported (a run's `state-server.json`); None if it cannot
        tell (gone)."""
        try:
            status = self._request("GET", "/status", retry_s=1.0)
        except StateServerError:
            return None
        return {**{k: status[k] for k in ("bytes_sent", "bytes_recv", "requests", "lost")},
                "last_round": {str(r["rank"]): r["round"] for r in status["records"]}}

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
