"""A worker's connection to ESync's state server (`hetsync.services.JsonClient`).

`report_async` writes a report and returns at once; its answer is read when the worker needs it
(ESync's "delayed ACK": the worker computes while the answer travels). No thread is involved,
so the request leaves when it is written, not when a thread gets the interpreter lock."""

from __future__ import annotations

import http.client
from typing import Callable

from hetsync.services import JsonClient, ServiceError, ServiceUnreachable
from hetsync.state.policy import Decision


#: ESync's names for the service errors (a refusal; no answer within the retries)
StateServerError, StateServerUnreachable = ServiceError, ServiceUnreachable


class StateClient(JsonClient):
    """Talks to `hetsync state-server` at host:port (`JsonClient`: timeouts, retries and the
    token): a restarted server rebuilds its records from the workers' next reports."""

    def __init__(self, host: str = "127.0.0.1", port: int = 10010, timeout: float = 30.0,
                 token: str | None = None, retry_s: float | None = None):
        super().__init__(host, port, timeout, token, retry_s, what="state server")
        self.run: str | None = None  # the run every report names (`init`, or set by a worker)
        self.lost: list[int] = []    # ranks that run went on without (`init`, or a worker)

    def init(self, workers: int, epsilon: float | None = None, run: str | None = None,
             lost: list[int] | None = None, retry_s: float | None = None,
             hold: float = 0.0) -> None:
        """Start afresh for `run` (then every report carries it), without the `lost` ranks;
        `epsilon` None: the server's own margin (by default `auto`); `retry_s`: as for
        `report_async`; `hold` > 0: answer a round's reports together once all are in (a run
        on the virtual clock, `hetsync.state.server`)."""
        self.run = run
        self.lost = sorted(lost or [])
        body = {"workers": workers, "epsilon": epsilon, "run": run, "lost": self.lost}
        if hold:
            body["hold"] = hold
        self._request("POST", "/init", body, retry_s=retry_s)

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

    def status(self) -> dict:
        return self._request("GET", "/status")

    def traffic(self) -> dict | None:
        """The server's request and byte counts, the ranks its run goes on without, and the
        last round each other rank reported (a run's `service.json`); None if it cannot
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
