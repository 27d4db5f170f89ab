"""ESync's state server: an HTTP/JSON service around `ReadinessTracker`.

Endpoints (JSON bodies, keep-alive HTTP/1.1):

- `POST /init`   `{"workers": N, "epsilon": -0.2 | null}` → `{"ok": true}`; starts afresh
  (`epsilon` null or absent: the server's own, by default `auto`, see `policy.round_length`).
- `POST /report` `{"rank", "round", "steps", "step_time", "device"?}` →
  `{"ready": bool, "steps_left": int, "time_left": seconds | null, "epsilon": float (the
  caller's margin as a fraction of its step),
  "reason": str}`: ESync's `/apply/`, asked once per round (see `policy.py`).
- `GET /status` → the records as JSON, with request and byte counts; `GET /` → a status page
  that refreshes itself; `GET /healthz` → `{"ok": true}` (no token needed: it says nothing).

Hardening: anything else — an unknown path, a wrong method, a body that is not a JSON object or
larger than `MAX_BODY` (its head than `MAX_HEAD`), a missing or ill-typed field, a number out of its range (`LIMITS`; every
float finite), a rank out of range — is answered with a 4xx JSON `{"error": ...}` naming what was
wrong, and the server keeps serving; no request can make it allocate more than its bounds allow.
A request must arrive whole within `REQUEST_TIMEOUT` seconds of its first byte, and an idle
connection is closed after `KEEP_ALIVE` seconds, so half-sent requests do not hold connections.

Who may talk to it: it binds to 127.0.0.1 unless told otherwise; bound anywhere else it refuses
to start without a token (`--token` / `HETSYNC_TOKEN`), which every request but `/healthz` must
carry as `Authorization: Bearer TOKEN` (or `?token=` for the page in a browser), compared in
constant time.

It runs on uvicorn (httptools parser, uvloop where installed): one process and one event loop,
so the tracker needs no lock; a production ASGI server, where Flask's development server
answered 858 requests/s with a p99 of 28 ms (issue 17's measurement; `hetsync bench state`
measures this one).
"""

from __future__ import annotations

import asyncio
import hmac
import html
import ipaddress
import json
import math
import os
import socket
import threading
import time
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse
from starlette.routing import Route
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from hetsync.config import MAX_WORKERS
from hetsync.state.client import valid_token
from hetsync.state.policy import DEFAULT_EPSILON, ReadinessTracker

DEFAULT_PORT = 10010
MAX_BODY = 16 * 1024          # bytes: a report is ~100
MAX_HEAD = 16 * 1024          # bytes: request line and headers
REQUEST_TIMEOUT = 10.0        # seconds from a request's first byte to its last
KEEP_ALIVE = 120              # seconds an idle keep-alive connection stays open
MAX_CONNECTIONS = 2048
TOKEN_ENV = "HETSYNC_TOKEN"
#: The ranges of the numeric fields (inclusive): a step of an hour is already absurd, and
#: rounds or steps beyond 2^40 would take centuries.
LIMITS = {"workers": (1, MAX_WORKERS), "rank": (0, MAX_WORKERS - 1), "round": (1, 2 ** 40),
          "steps": (0, 2 ** 40), "step_time": (1e-7, 3600.0)}


class BadRequest(ValueError):
    pass


class ServerConfigError(ValueError):
    """The server cannot be started as asked (a bad host, a missing token)."""


def _field(body: dict, name: str, kind: type, *, required: bool = True,
           default: Any = None) -> Any:
    if name not in body:
        if required:
            raise BadRequest(f"missing field {name!r}")
        return default
    value = body[name]
    if kind is float:
        ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
              and math.isfinite(value))
    else:
        ok = isinstance(value, kind) and not isinstance(value, bool)
    if not ok:
        raise BadRequest(f"field {name!r} must be {kind.__name__}, got {str(value)[:40]!r}")
    if name in LIMITS:
        low, high = LIMITS[name]
        if not low <= value <= high:
            raise BadRequest(f"field {name!r} must be in [{low}, {high}], got {str(value)[:40]}")
    return float(value) if kind is float else value


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def create_app(workers: int, epsilon: float | None = DEFAULT_EPSILON,
               clock=time.monotonic, token: str | None = None) -> Starlette:
    """The ASGI app; the tracker's times come from `clock` (the server's own)."""
    state = {"tracker": ReadinessTracker(workers, epsilon), "requests": 0,
             "bytes_recv": 0, "bytes_sent": 0, "started": clock()}
    expected = None if token is None else token.encode()

    async def body(request: Request) -> dict:
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > MAX_BODY):
            raise HTTPException(413, f"body of {declared[:20]} bytes: at most {MAX_BODY}")
        raw = b""
        async for chunk in request.stream():  # chunked bodies are bounded here
            raw += chunk
            if len(raw) > MAX_BODY:
                raise HTTPException(413, f"body over {MAX_BODY} bytes")
        state["bytes_recv"] += len(raw)
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError):
            data = None
        if not isinstance(data, dict):
            raise BadRequest("body must be a JSON object")
        return data

    def reply(payload: dict, status: int = 200) -> JSONResponse:
        response = JSONResponse(payload, status_code=status)
        state["requests"] += 1
        state["bytes_sent"] += len(response.body)
        return response

    async def init(request: Request):
        data = await body(request)
        n = _field(data, "workers", int)
        eps = epsilon if data.get("epsilon") is None else _field(data, "epsilon", float)
        if eps is not None and not -1 < eps < 1:
            raise BadRequest(f"field 'epsilon' must be a fraction in (-1, 1), got {eps}")
        state["tracker"] = ReadinessTracker(n, eps)
        return reply({"ok": True})

    async def report(request: Request):
        data = await body(request)
        rank = _field(data, "rank", int)
        rnd = _field(data, "round", int)
        steps = _field(data, "steps", int)
        step_time = _field(data, "step_time", float)
        device = _field(data, "device", str, required=False, default="")
        tracker = state["tracker"]
        if rank >= tracker.workers:
            raise BadRequest(f"rank {rank} out of range 0..{tracker.workers - 1}")
        decision = tracker.report(rank, rnd, steps, step_time, clock(), device[:64])
        return reply({"ready": decision.ready, "steps_left": decision.steps_left,
                      "time_left": decision.time_left, "epsilon": decision.epsilon,
                      "reason": decision.reason})

    async def healthz(request: Request):
        return reply({"ok": True})

    async def status(request: Request):
        now = clock()
        out = state["tracker"].status()
        for rec in out["records"]:
            seen = rec.pop("last_seen")
            rec["seconds_since_seen"] = None if seen is None else now - seen
            rec.pop("step_started")
        out.update(requests=state["requests"], bytes_recv=state["bytes_recv"],
                   bytes_sent=state["bytes_sent"], uptime_s=now - state["started"])
        return reply(out)

    async def page(request: Request):
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
        state["requests"] += 1
        return HTMLResponse(
            "<!doctype html><html><head><meta charset='utf-8'>"
            "<meta http-equiv='refresh' content='1'><title>hetsync state server</title>"
            "<style>body{font-family:sans-serif}td,th{padding:2px 10px;text-align:right}"
            "</style></head><body>"
            f"<h2>hetsync state server</h2><p>{html.escape(head)}</p><table>"
            "<tr><th>rank</th><th>device</th><th>step time</th>"
            "<th>local steps this round (planned)</th>"
            "<th>round</th><th>last seen</th><th>queries</th></tr>"
            f"{rows}</table></body></html>")

    async def bad_request(request: Request, err: Exception):
        return reply({"error": str(err)}, 400)

    async def http_error(request: Request, err: HTTPException):
        detail = err.detail if err.status_code == 413 else f"{request.method} {request.url.path}"
        return reply({"error": f"{err.status_code}: {detail}"}, err.status_code)

    app = Starlette(routes=[Route("/init", init, methods=["POST"]),
                            Route("/report", report, methods=["POST"]),
                            Route("/healthz", healthz, methods=["GET"]),
                            Route("/status", status, methods=["GET"]),
                            Route("/", page, methods=["GET"])],
                    exception_handlers={BadRequest: bad_request, HTTPException: http_error})
    if expected is None:
        return app

    async def guarded(scope, receive, send):
        """Every request but /healthz carries the token (header, or ?token= for a browser)."""
        if scope["type"] == "http" and scope["path"] != "/healthz":
            request = Request(scope)
            given = request.headers.get("authorization", "")
            given = given[7:] if given.startswith("Bearer ") else request.query_params.get("token", "")
            if not hmac.compare_digest(given.encode(), expected):
                await JSONResponse({"error": "401: missing or wrong token (Authorization: "
                                             "Bearer TOKEN; see --token)"}, 401)(scope, receive, send)
                return
        await app(scope, receive, send)
    return guarded


class _TimedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a deadline per request and a bound on its head:
    uvicorn closes idle keep-alive connections, but not one that sends half a request and
    stops (or never sends one), and httptools accepts headers of any length."""

    _deadline: asyncio.TimerHandle | None = None
    _head = -1  # bytes received while a request's head is incomplete (-1: not in a head)

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._deadline is None:  # a request begins: it has REQUEST_TIMEOUT to arrive whole
            self._arm()
        super().data_received(data)
        if self._head >= 0 and not self.transport.is_closing():  # the head is still coming
            self._head += len(data)
            if self._head > MAX_HEAD:
                self.send_400_response(f"request head over {MAX_HEAD} bytes")

    def on_message_begin(self) -> None:
        self._head = 0
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._head = -1
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def connection_lost(self, exc) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._deadline = self.loop.call_later(REQUEST_TIMEOUT, self._expire)

    def _expire(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            self.transport.close()


class StateServer:
    """The service on a background thread (tests, `launch`) or in the foreground (CLI).

    `token`: required when `host` is not a loopback address (default: `HETSYNC_TOKEN`)."""

    def __init__(self, workers: int, epsilon: float | None = DEFAULT_EPSILON,
                 host: str = "127.0.0.1", port: int = DEFAULT_PORT,
                 token: str | None = None):
        if not 1 <= workers <= MAX_WORKERS:
            raise ServerConfigError(f"--workers {workers}: must be in 1..{MAX_WORKERS}")
        if epsilon is not None and not -1 < epsilon < 1:
            raise ServerConfigError(f"--epsilon {epsilon}: must be 'auto' or a fraction in (-1, 1)")
        token = token if token is not None else os.environ.get(TOKEN_ENV) or None
        if token is not None and not valid_token(token):
            raise ServerConfigError("--token: invalid value; expected 1 to 256 printable "
                                    "ASCII characters without spaces")
        if token is None and not is_loopback(host):
            raise ServerConfigError(
                f"--host {host} is reachable from other machines: give a shared secret with "
                f"--token or {TOKEN_ENV} (every worker needs the same), or bind to 127.0.0.1")
        try:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            self._socket = socket.socket(family, socket.SOCK_STREAM)
            self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._socket.bind((host, port))
            self._socket.listen(1024)
        except (OSError, OverflowError) as err:
            self._socket.close()
            why = err.strerror if isinstance(err, OSError) and err.strerror else err
            raise ServerConfigError(f"--port: invalid value {port}; cannot listen on "
                                    f"{host}:{port} ({why})") from None
        self.host, self.port = host, self._socket.getsockname()[1]
        self.app = create_app(workers, epsilon, token=token)
        config = uvicorn.Config(self.app, http=_TimedProtocol, loop="auto",
                                lifespan="off", log_level="warning", access_log=False,
                                timeout_keep_alive=KEEP_ALIVE,
                                limit_concurrency=MAX_CONNECTIONS,
                                proxy_headers=False)  # no proxy in front: trust no header
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    def start(self) -> "StateServer":
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)
        self._thread.start()
        end = time.monotonic() + 10
        while not self._server.started and self._thread.is_alive() and time.monotonic() < end:
            time.sleep(0.01)
        return self

    def serve_forever(self) -> None:
        self._server.run(sockets=[self._socket])

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._socket.close()
