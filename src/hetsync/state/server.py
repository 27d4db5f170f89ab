"""ESync's state server: an HTTP/JSON service around `ReadinessTracker`.

Endpoints (JSON bodies, keep-alive HTTP/1.1):

- `POST /init`   `{"workers": N, "epsilon": -0.2 | null, "run": ID?, "lost": [RANK...]?,
  "hold": SECONDS?}` → `{"ok": true}`; starts afresh (`epsilon` null or absent: the server's
  own, by default `auto`, see `policy.round_length`) for run ID (a string drawn by the run's
  rank 0), without the `lost` ranks (workers the run went on without: never the slowest, their
  reports refused). With `hold` > 0 (a run on the virtual clock, `hetsync.clock`) a report of
  a round is answered once every worker's report of that round is in (or `hold` seconds
  after the first came, for those then in), all of them decided together in rank order: the
  plan then depends on what the workers reported, not on the real order their requests
  arrived in;
- `POST /report` `{"rank", "round", "steps", "step_time", "device"?, "run"?, "lost"?}` →
  `{"ready": bool, "steps_left": int, "time_left": seconds | null, "epsilon": float (the
  caller's margin as a fraction of its step),
  "reason": str}`: ESync's `/apply/`, asked once per round (see `policy.py`). A report of
  another run than the server's is refused (409, naming both): two runs sharing one server
  would plan each other's rounds. A server that has no run yet (restarted) takes the first
  report's, and its `lost` ranks (a run that went on without a worker names them in every
  report, so that a restarted server does not plan for them again).
- `POST /progress` `{"run", "rank", "worker": {figures}, "loss": [[t, v]...], "evaluated":
  [[t, accuracy or loss]...], "mode"?, "deferred"?, "metric"? ("test_acc" or "test_loss")}` → `{"ok": true}`: a worker's figures for the live page
  (`--live-report`, any mode; `telemetry.live.LiveBoard` checks and bounds them);
- `GET /live/` → the live page of every mode (`telemetry/live.py`'s, as `launch` serves it),
  drawn from `GET /live/data`: for runs across machines;
- `GET /status` → the records as JSON, with request and byte counts; `GET /` → a status page
  that refreshes itself; `GET /healthz` → `{"ok": true}`, with `"instance": ID` where it was
  started with `--instance ID` (no token needed: it says no more; `launch` tells its own
  server from another run's on the same port by the random id it gave it).

Hardening: anything else — an unknown path, a wrong method, a body that is not a JSON object or
larger than `MAX_BODY`, a missing or ill-typed field, a number out of its range (`LIMITS`; every
float finite), a rank out of range — is answered with a 4xx JSON `{"error": ...}` naming what was
wrong, and the server keeps serving; no request can make it allocate more than its bounds allow.
Heads, half-sent requests and idle connections are bounded by `hetsync.serving`.

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
import json
import math
import os
import time
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse
from starlette.routing import Route
from hetsync.options import MAX_WAIT_S, MAX_WORKERS
from hetsync.serving import ServerConfigError, Service, is_loopback
from hetsync.services import valid_token
from hetsync.state.policy import DEFAULT_EPSILON, ReadinessTracker
from hetsync.telemetry.live import PAGE, LiveBoard

DEFAULT_PORT = 10010
MAX_BODY = 16 * 1024          # bytes: a report is ~100
MAX_HOLD_S = MAX_WAIT_S       # /init's hold: at most as long as a worker's --timeout
TOKEN_ENV = "HETSYNC_TOKEN"
#: The ranges of the numeric fields (inclusive): a step of an hour is already absurd, and
#: rounds or steps beyond 2^40 would take centuries.
LIMITS = {"workers": (1, MAX_WORKERS), "rank": (0, MAX_WORKERS - 1), "round": (1, 2 ** 40),
          "steps": (0, 2 ** 40), "step_time": (1e-7, 3600.0)}


class BadRequest(ValueError):
    pass


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


def _lost_ranks(body: dict, workers: int) -> frozenset[int]:
    """The optional field 'lost': some, not all, of the ranks 0..workers-1."""
    lost = body.get("lost") or []
    if (not isinstance(lost, list) or len(lost) >= workers
            or not all(type(r) is int and 0 <= r < workers for r in lost)):
        raise BadRequest(f"field 'lost' must be a list of fewer than {workers} ranks in "
                         f"0..{workers - 1}, got {str(lost)[:40]}")
    return frozenset(lost)


def create_app(workers: int, epsilon: float | None = DEFAULT_EPSILON,
               clock=time.monotonic, token: str | None = None,
               instance: str | None = None) -> Starlette:
    """The ASGI app; the tracker's times come from `clock` (the server's own); `instance`:
    what `/healthz` names it by."""
    state = {"tracker": ReadinessTracker(workers, epsilon), "run": None, "requests": 0,
             "hold": 0.0, "held": {}, "decided": {},
             "board": LiveBoard(),
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
        run = None if data.get("run") is None else _field(data, "run", str)
        if run is not None and not 0 < len(run) <= 64:
            raise BadRequest("field 'run' must be 1 to 64 characters")
        hold = 0.0 if data.get("hold") is None else _field(data, "hold", float)
        if not 0 <= hold <= MAX_HOLD_S:
            raise BadRequest(f"field 'hold' must be seconds in [0, {MAX_HOLD_S:g}], got {hold}")
        state["tracker"] = ReadinessTracker(n, eps, lost=_lost_ranks(data, n))
        state["run"], state["hold"] = run, hold
        state["held"], state["decided"] = {}, {}
        return reply({"ok": True})

    async def held_decision(tracker: ReadinessTracker, rank: int, rnd: int, report: tuple):
        """`hold`: answer once every worker's report of round `rnd` is in (or the hold is
        over), all of them decided in rank order."""
        held, decided = state["held"], state["decided"]
        if rnd in decided and rank not in decided[rnd]:  # late: the others' did not wait
            return tracker.report(rank, rnd, *report[:2], clock(), report[2])
        reports, event = held.setdefault(rnd, ({}, asyncio.Event()))
        reports[rank] = report

        def decide_all() -> None:
            held.pop(rnd, None)
            decided[rnd] = {r: tracker.report(r, rnd, steps, step_time, clock(), device)
                            for r, (steps, step_time, device) in sorted(reports.items())}
            for old in [r for r in decided if r < rnd - 2]:  # (a bounded memory)
                del decided[old]
            event.set()

        if set(tracker.records) <= set(reports):
            decide_all()
        else:
            try:
                await asyncio.wait_for(event.wait(), state["hold"])
            except asyncio.TimeoutError:
                if not event.is_set():
                    decide_all()
        return decided[rnd].pop(rank)

    async def report(request: Request):
        data = await body(request)
        rank = _field(data, "rank", int)
        rnd = _field(data, "round", int)
        steps = _field(data, "steps", int)
        step_time = _field(data, "step_time", float)
        device = _field(data, "device", str, required=False, default="")
        run = _field(data, "run", str, required=False)
        tracker = state["tracker"]
        lost = _lost_ranks(data, tracker.workers)
        if run is not None and state["run"] is None:  # restarted: the run goes on here,
            state["run"] = run[:64]                   # without the ranks it lost
            if lost:
                tracker = state["tracker"] = ReadinessTracker(tracker.workers,
                                                              tracker.epsilon, lost=lost)
        elif run is not None and run != state["run"]:
            return reply({"error": f"this state server serves run {state['run']} (since its "
                                   f"/init), not run {run[:64]}: give every run its own "
                                   f"state server"}, 409)
        if rank >= tracker.workers:
            raise BadRequest(f"rank {rank} out of range 0..{tracker.workers - 1}")
        if rank in tracker.lost:
            return reply({"error": f"rank {rank} was lost: run {state['run']} went on "
                                   f"without it"}, 409)
        if state["hold"] and rnd >= tracker.round:
            decision = await held_decision(tracker, rank, rnd, (steps, step_time, device[:64]))
        else:
            decision = tracker.report(rank, rnd, steps, step_time, clock(), device[:64])
        return reply({"ready": decision.ready, "steps_left": decision.steps_left,
                      "time_left": decision.time_left, "epsilon": decision.epsilon,
                      "reason": decision.reason})

    async def progress(request: Request):
        data = await body(request)
        try:
            state["board"].post(data, state["tracker"].workers, clock())
        except LiveBoard.RunConflict as err:
            return reply({"error": str(err)}, 409)
        except ValueError as err:
            raise BadRequest(str(err)) from None
        return reply({"ok": True})

    async def live_redirect(request: Request):
        query = f"?{request.url.query}" if request.url.query else ""
        return RedirectResponse(f"/live/{query}", 307)

    async def live_page(request: Request):
        return HTMLResponse(PAGE)

    async def live_data(request: Request):
        return reply(state["board"].snapshot())

    async def healthz(request: Request):
        return reply({"ok": True, **({"instance": instance} if instance else {})})

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
        head = f"round {tracker.round} · {len(tracker.records)} workers · ε = {eps}"
        if tracker.lost:
            head += f" · lost: rank {', '.join(map(str, sorted(tracker.lost)))}"
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
                            Route("/progress", progress, methods=["POST"]),
                            Route("/live", live_redirect, methods=["GET"]),
                            Route("/live/", live_page, methods=["GET"]),
                            Route("/live/data", live_data, methods=["GET"]),
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


class StateServer(Service):
    """The service on a background thread (tests, `launch`) or in the foreground (CLI).

    `token`: required when `host` is not a loopback address (default: `HETSYNC_TOKEN`)."""

    def __init__(self, workers: int, epsilon: float | None = DEFAULT_EPSILON,
                 host: str = "127.0.0.1", port: int = DEFAULT_PORT,
                 token: str | None = None, instance: str | None = None):
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
        super().__init__(create_app(workers, epsilon, token=token, instance=instance),
                         host, port)
