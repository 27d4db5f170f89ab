"""ESync's state server: an HTTP/JSON service around `ReadinessTracker`.

Endpoints (JSON bodies, keep-alive HTTP/1.1):

- `POST /init`   `{"workers": N, "epsilon": -0.2 | null}` → `{"ok": true}`; starts afresh
  (`epsilon` null or absent: the server's own, by default `auto`, see `policy.round_length`).
- `POST /report` `{"rank", "round", "steps", "step_time", "device"?}` →
  `{"ready": bool, "steps_left": int, "time_left": seconds | null, "epsilon": float (the
  caller's margin as a fraction of its step),
  "reason": str}`: ESync's `/apply/`, asked once per round (see `policy.py`).
- `GET /status` → the records as JSON, with request and byte counts; `GET /` → a status page
  that refreshes itself; `GET /healthz` → `{"ok": true}`.

Anything else — an unknown path, a wrong method, a body that is not a JSON object, a missing or
ill-typed field, a rank out of range — is answered with a 4xx JSON `{"error": ...}` naming what
was wrong, and the server keeps serving. It binds to 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import html
import math
import threading
import time
from typing import Any

from flask import Flask, Response, jsonify, request
from werkzeug.exceptions import HTTPException
from werkzeug.serving import WSGIRequestHandler, make_server

from hetsync.state.policy import DEFAULT_EPSILON, ReadinessTracker

DEFAULT_PORT = 10010


class BadRequest(ValueError):
    pass


def _field(body: dict, name: str, kind: type, *, minimum: float | None = None,
           required: bool = True, default: Any = None) -> Any:
    if name not in body:
        if required:
            raise BadRequest(f"missing field {name!r}")
        return default
    value = body[name]
    ok = isinstance(value, kind) and not isinstance(value, bool)
    if kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok:
        raise BadRequest(f"field {name!r} must be {kind.__name__}, got {value!r}")
    if minimum is not None and value < minimum:
        raise BadRequest(f"field {name!r} must be >= {minimum}, got {value!r}")
    return float(value) if kind is float else value


def create_app(workers: int, epsilon: float | None = DEFAULT_EPSILON,
               clock=time.monotonic) -> Flask:
    """The Flask app; the tracker's times come from `clock` (the server's own)."""
    app = Flask("hetsync-state-server")
    lock = threading.Lock()
    state = {"tracker": ReadinessTracker(workers, epsilon), "requests": 0,
             "bytes_recv": 0, "bytes_sent": 0, "started": clock()}

    def body() -> dict:
        data = request.get_json(silent=True)
        if not isinstance(data, dict):
            raise BadRequest("body must be a JSON object (Content-Type: application/json)")
        return data

    @app.errorhandler(BadRequest)
    def bad_request(err):
        return jsonify(error=str(err)), 400

    @app.errorhandler(HTTPException)
    def http_error(err):
        return jsonify(error=f"{err.code} {err.name}: {request.method} {request.path}"), err.code

    @app.after_request
    def count(response: Response):
        with lock:
            state["requests"] += 1
            state["bytes_recv"] += request.content_length or 0
            state["bytes_sent"] += response.calculate_content_length() or 0
        return response

    @app.post("/init")
    def init():
        data = body()
        n = _field(data, "workers", int, minimum=1)
        eps = epsilon if data.get("epsilon") is None else _field(data, "epsilon", float)
        if eps is not None and not -1 < eps < 1:
            raise BadRequest(f"field 'epsilon' must be a fraction in (-1, 1), got {eps}")
        with lock:
            state["tracker"] = ReadinessTracker(n, eps)
        return jsonify(ok=True)

    @app.post("/report")
    def report():
        data = body()
        rank = _field(data, "rank", int, minimum=0)
        rnd = _field(data, "round", int, minimum=1)
        steps = _field(data, "steps", int, minimum=0)
        step_time = _field(data, "step_time", float)
        if step_time <= 0:
            raise BadRequest(f"field 'step_time' must be > 0 seconds, got {step_time}")
        device = _field(data, "device", str, required=False, default="")
        with lock:
            tracker = state["tracker"]
            if rank >= tracker.workers:
                raise BadRequest(f"rank {rank} out of range 0..{tracker.workers - 1}")
            decision = tracker.report(rank, rnd, steps, step_time, clock(), device[:64])
        return jsonify(ready=decision.ready, steps_left=decision.steps_left,
                       time_left=decision.time_left, epsilon=decision.epsilon,
                       reason=decision.reason)

    @app.get("/healthz")
    def healthz():
        return jsonify(ok=True)

    @app.get("/status")
    def status():
        with lock:
            now = clock()
            out = state["tracker"].status()
            for rec in out["records"]:
                seen = rec.pop("last_seen")
                rec["seconds_since_seen"] = None if seen is None else now - seen
                rec.pop("step_started")
            out.update(requests=state["requests"], bytes_recv=state["bytes_recv"],
                       bytes_sent=state["bytes_sent"], uptime_s=now - state["started"])
        return jsonify(out)

    @app.get("/")
    def page():
        with lock:
            now = clock()
            tracker = state["tracker"]
            rows = "".join(
                "<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in (
                    r.rank, r.device or "?",
                    "?" if r.step_time is None else f"{r.step_time * 1000:.1f} ms",
                    r.planned, r.round,
                    "never" if r.last_seen is None else f"{now - r.last_seen:.1f} s ago",
                    r.queries)) + "</tr>"
                for r in tracker.records.values())
            eps = "auto" if tracker.epsilon is None else tracker.epsilon
            head = f"round {tracker.round} · {tracker.workers} workers · ε = {eps}"
            if tracker.length is not None:
                head += f" · round length {tracker.length * 1000:.1f} ms"
        return Response(
            "<!doctype html><html><head><meta charset='utf-8'>"
            "<meta http-equiv='refresh' content='1'><title>hetsync state server</title>"
            "<style>body{font-family:sans-serif}td,th{padding:2px 10px;text-align:right}"
            "</style></head><body>"
            f"<h2>hetsync state server</h2><p>{html.escape(head)}</p><table>"
            "<tr><th>rank</th><th>device</th><th>step time</th><th>local steps this round (planned)</th>"
            "<th>round</th><th>last seen</th><th>queries</th></tr>"
            f"{rows}</table></body></html>", mimetype="text/html")

    return app


class _KeepAliveHandler(WSGIRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: one TCP connection per worker, not per query

    def log_request(self, *args, **kwargs):  # one line per query would flood the terminal
        pass


class StateServer:
    """The service on a background thread (tests, `launch`) or in the foreground (CLI)."""

    def __init__(self, workers: int, epsilon: float | None = DEFAULT_EPSILON,
                 host: str = "127.0.0.1",
                 port: int = DEFAULT_PORT):
        self.app = create_app(workers, epsilon)
        self._server = make_server(host, port, self.app, threaded=True,
                                   request_handler=_KeepAliveHandler)
        self.host, self.port = host, self._server.server_port
        self._thread: threading.Thread | None = None

    def start(self) -> "StateServer":
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self._server.serve_forever()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
