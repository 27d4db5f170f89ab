"""A live page of a run, for every mode: what each worker is doing, and the curves so far.

`launch` serves it on loopback while the run goes on (`LivePage`, on `hetsync.serving`), from
the run directory (`RunWatcher`). Across machines no directory holds every worker's records:
workers started with `--live-report` post their own (`LivePoster`, reading the worker's own
records) to a live board (`LiveBoard`; `hetsync state-server` holds one), which serves the
same page at `/live/`.

- `GET /data` → JSON read from the run directory as it grows (only the new lines of each
  record file are read per request): per worker its device, rounds, local steps of its last
  round, step time (compute ÷ local steps of its last round), computing time ratio and wait so
  far, samples, its measured speed over its last `RECENT` rounds (samples per second of
  computing) beside its emulated device's nominal speed (`run.json`); rank 0's training loss
  per round; the evaluations' accuracy (validation loss for text) so far, in training-time
  order (deferred evaluation: as the evaluator process evaluates the snapshots, or at the end
  without one).
- `GET /` → one HTML page whose script fetches `/data` every second and redraws its table,
  a line for each device running below `HELD` of its nominal speed, and the curves in place
  (canvases with labelled, ticked axes; no front-end framework, no reload).
"""

from __future__ import annotations

import json
import math
import sys
import threading
from collections import deque
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse
from starlette.routing import Route

from hetsync.serving import Service
from hetsync.telemetry.metric import ACCURACY, LOSS, Metric, metric_of
from hetsync.telemetry.summarize import HELD
from hetsync.telemetry.rundir import RunDir

#: rounds over which the page measures a worker's speed
RECENT = 32


class _Tail:
    """The records appended to a JSON-lines file since the last call (whole lines only)."""

    def __init__(self, path: Path):
        self.path, self.offset = path, 0

    def new(self) -> list[dict]:
        if not self.path.exists():
            return []
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            chunk = f.read()
        end = chunk.rfind(b"\n") + 1  # a partial last line waits for its end
        self.offset += end
        out = []
        for line in chunk[:end].splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out


def new_worker(rank: int) -> dict[str, Any]:
    """A worker's figures before its first record."""
    return {"rank": rank, "device": "?", "rounds": 0, "samples": 0, "compute_s": 0.0,
            "wait_s": 0.0, "eval_s": 0.0, "t_end": 0.0, "local_steps": 0, "step_ms": None,
            "speed": None, "nominal_speed": None}


def accumulate(w: dict[str, Any], record: dict[str, Any], recent: deque) -> None:
    """Add one round's record (`worker-N.jsonl`) to worker figures `w`; `recent`: the
    worker's last rounds' (samples, compute_s), of which `w["speed"]` is measured."""
    w["device"] = record.get("device", w["device"])
    w["rounds"] += 1
    w["samples"] += record.get("samples", 0)
    for key in ("compute_s", "wait_s", "eval_s"):
        w[key] += record.get(key) or 0.0
    w["t_end"] = record.get("t_end", w["t_end"])
    w["local_steps"] = record.get("local_steps", 0)
    if w["local_steps"]:
        w["step_ms"] = 1000 * (record.get("compute_s") or 0.0) / w["local_steps"]
    recent.append((record.get("samples", 0), record.get("compute_s") or 0.0))
    computing = sum(c for _, c in recent)
    w["speed"] = sum(n for n, _ in recent) / computing if computing > 0 else None


def page_data(run: str, mode: str | None, deferred: bool, workers: dict[int, dict],
              evaluated: list, loss: list, metric: str = ACCURACY.key) -> dict[str, Any]:
    """What `/data` answers (the page draws it): each worker's figures with its computing
    time ratio (compute ÷ time not spent evaluating) and a line if its device runs below
    HELD of its nominal speed, and the curves so far: the training loss, and the evaluations'
    figure of merit (`metric`: the record's key, test accuracy or validation loss) in
    training-time order."""
    shown, slow = [], []
    for rank in sorted(workers):
        w = dict(workers[rank])
        busy = w["t_end"] - w.pop("eval_s")
        w["compute_ratio"] = w["compute_s"] / busy if busy > 0 else None
        if w.get("speed") and w.get("nominal_speed") and w["speed"] < HELD * w["nominal_speed"]:
            slow.append(f"rank {rank} runs at {w['speed'] / w['nominal_speed']:.0%} of its "
                        f"nominal speed ({w['speed']:,.0f} of {w['nominal_speed']:,.0f} "
                        f"samples per second of computing, its last rounds)")
        shown.append(w)
    return {"run": run, "mode": mode, "deferred": deferred, "workers": shown, "slow": slow,
            "evaluated": sorted(evaluated)[-MAX_POINTS:], "loss": list(loss)[-MAX_POINTS:],
            "label": (LOSS if metric == LOSS.key else ACCURACY).label}


#: points of each curve a page shows (the latest)
MAX_POINTS = 2000


class RunWatcher:
    """A run directory's figures so far, kept up to date from its record files (`ranks`:
    only these workers' records, e.g. a worker's own for `LivePoster`)."""

    def __init__(self, run_dir: str | Path, ranks: set[int] | None = None,
                 nominal: dict[int, float | None] | None = None):
        self.run_dir, self.ranks = Path(run_dir), ranks
        self._tails: dict[int, _Tail] = {}
        self._recent: dict[int, deque] = {}
        self.workers: dict[int, dict[str, Any]] = {}
        #: each worker's nominal speed: given, or from run.json
        self._nominal: dict[int, float | None] = dict(nominal or {})
        self._given = set(self._nominal)
        self._evals = _Tail(RunDir(self.run_dir).eval)
        self.evaluated: list[tuple[float, float]] = []
        self.loss: list[tuple[float, float]] = []
        self.metric: Metric | None = None  # (from run.json's config)

    def update(self) -> None:
        """Read what was appended since the last call."""
        for path in RunDir(self.run_dir).worker_files():
            rank = int(path.stem.split("-")[1])
            if self.ranks is not None and rank not in self.ranks:
                continue
            tail = self._tails.setdefault(rank, _Tail(path))
            w = self.workers.setdefault(rank, new_worker(rank))
            recent = self._recent.setdefault(rank, deque(maxlen=RECENT))
            w["nominal_speed"] = self._nominal.get(rank)
            for r in tail.new():
                accumulate(w, r, recent)
                if rank == 0 and r.get("loss") is not None:
                    self.loss.append((r["t_end"], r["loss"]))
        if self.metric is None:
            self.run_info()
        if (self.ranks is None or 0 in self.ranks) and self.metric is not None:
            for e in self._evals.new():
                if self.metric.of(e) is not None:
                    self.evaluated.append((e.get("train_time") or 0.0, self.metric.of(e)))

    def run_info(self) -> dict[str, Any]:
        """The run's name, mode, whether its evaluation is deferred and the key of its figure
        of merit (from `run.json`)."""
        run = {}
        if RunDir(self.run_dir).run.exists():
            try:
                run = json.loads(RunDir(self.run_dir).run.read_text())
            except ValueError:  # being replaced this instant
                run = {}
        config = run.get("config") or {}
        if run:
            self.metric = metric_of(config.get("dataset"))
        for entry in run.get("ranks") or []:  # each emulated device's nominal speed
            if (isinstance(entry, dict) and isinstance(entry.get("rank"), int)
                    and entry["rank"] not in self._given):
                self._nominal[entry["rank"]] = entry.get("nominal_speed")
        return {"run": run.get("run_name", self.run_dir.name), "mode": run.get("mode"),
                "deferred": bool(config.get("deferred_eval")) and not config.get("target_acc")
                             and not config.get("target_loss"),
                "metric": (self.metric or ACCURACY).key}

    def snapshot(self) -> dict[str, Any]:
        info = self.run_info()
        self.update()
        return page_data(**info, workers=self.workers, evaluated=self.evaluated, loss=self.loss)


PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>hetsync live</title>
<style>body{font-family:sans-serif;margin:1em}td,th{padding:2px 10px;text-align:right}
canvas{border:1px solid #ccc;margin:4px}#slow{color:#b00}</style></head><body>
<h2 id="title">hetsync</h2>
<table id="workers"><thead><tr><th>rank</th><th>device</th><th>rounds</th>
<th>local steps (last round)</th><th>step time</th><th>computing time ratio</th>
<th>wait so far</th><th>samples</th><th>speed (samples per computing s, last rounds)</th>
<th>nominal speed</th></tr></thead><tbody></tbody></table>
<ul id="slow"></ul>
<div><canvas id="acc" width="520" height="280"></canvas>
<canvas id="loss" width="520" height="280"></canvas></div>
<p id="updated"></p>
<script>
function ticks(lo, hi, n) {  // round numbers from lo to hi, about n of them
  const raw = (hi - lo) / n || 1, p = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map(m => m * p).find(s => s >= raw);
  const out = [];
  for (let t = Math.ceil(lo / step) * step; t <= hi + 1e-9 * step; t += step) out.push(t);
  return [out, step];
}
function label(v, step) { return step >= 1 ? v.toFixed(0) : v.toFixed(Math.min(4, -Math.floor(Math.log10(step)))); }
function draw(id, points, title, xlabel) {
  const c = document.getElementById(id), g = c.getContext("2d");
  const L = 56, R = 12, T = 24, B = 40, W = c.width - L - R, H = c.height - T - B;
  g.clearRect(0, 0, c.width, c.height); g.fillStyle = "#000"; g.strokeStyle = "#000";
  g.textAlign = "left"; g.fillText(title + (points.length ? "" : " (none yet)"), L, 14);
  g.strokeRect(L, T, W, H);
  g.textAlign = "center"; g.fillText(xlabel, L + W / 2, c.height - 6);
  if (points.length < 1) return;
  const xs = points.map(p => p[0]), ys = points.map(p => p[1]);
  let x0 = 0, x1 = Math.max(...xs), y0 = Math.min(...ys), y1 = Math.max(...ys);
  if (x1 <= x0) x1 = x0 + 1;
  if (y1 - y0 < 1e-6) { y0 -= 0.01; y1 += 0.01; }
  const X = x => L + W * (x - x0) / (x1 - x0), Y = y => T + H - H * (y - y0) / (y1 - y0);
  const [xt, xs_] = ticks(x0, x1, 6), [yt, ys_] = ticks(y0, y1, 5);
  g.strokeStyle = "#ddd";
  xt.forEach(t => { g.beginPath(); g.moveTo(X(t), T); g.lineTo(X(t), T + H); g.stroke();
                    g.fillText(label(t, xs_), X(t), T + H + 14); });
  g.textAlign = "right";
  yt.forEach(t => { g.beginPath(); g.moveTo(L, Y(t)); g.lineTo(L + W, Y(t)); g.stroke();
                    g.fillText(label(t, ys_), L - 4, Y(t) + 4); });
  g.strokeStyle = "#1f77b4"; g.beginPath();
  points.forEach((p, i) => i ? g.lineTo(X(p[0]), Y(p[1])) : g.moveTo(X(p[0]), Y(p[1])));
  g.stroke();
  if (points.length < 60) points.forEach(p => g.fillRect(X(p[0]) - 2, Y(p[1]) - 2, 4, 4));
}
function fmt(v, digits, unit) { return v === null || v === undefined ? "?" : v.toFixed(digits) + unit; }
function num(v) { return v === null || v === undefined ? "—" : Math.round(v).toLocaleString("en"); }
async function refresh() {
  try {
    const d = await (await fetch("data" + location.search)).json();
    document.getElementById("title").textContent = "hetsync: " + d.run + " (" + d.mode + ")";
    document.querySelector("#workers tbody").innerHTML = d.workers.map(w =>
      "<tr><td>" + w.rank + "</td><td>" + w.device + "</td><td>" + w.rounds + "</td><td>" +
      w.local_steps + "</td><td>" + fmt(w.step_ms, 1, " ms") + "</td><td>" +
      fmt(w.compute_ratio, 2, "") + "</td><td>" + fmt(w.wait_s, 1, " s") + "</td><td>" +
      w.samples + "</td><td>" + num(w.speed) + "</td><td>" + num(w.nominal_speed) +
      "</td></tr>").join("");
    document.getElementById("slow").innerHTML = (d.slow || []).map(t => "<li>" + t + "</li>").join("");
    const last = d.evaluated.length ? d.evaluated[d.evaluated.length - 1] : null;
    draw("acc", d.evaluated, d.label + (last ? " (" + last[1].toFixed(4) + " at " +
         last[0].toFixed(0) + " s)" : "") + (d.deferred ? ", as the snapshots are evaluated" : ""),
         "training time (s)");
    draw("loss", d.loss, "rank 0's training loss per round", "time since the start (s)");
    document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
  } catch (e) {
    document.getElementById("updated").textContent = "run over, or not reachable";
  }
}
refresh(); setInterval(refresh, 1000);
</script></body></html>"""


class LiveBoard:
    """The page's figures as workers post them (`POST /progress` of the server holding it), for a
    run across machines, where no one directory holds every worker's records.

    A post (`LivePoster`'s) carries the run's name, the worker's figures and its new curve
    points. Every field is checked (`ValueError`, one line) and the board is bounded: at most
    `workers` ranks and `MAX_POINTS` points per curve. A post of another run while the
    board's run is still posting is refused (`RunConflict`); after `IDLE_S` of silence the
    new run takes the board."""

    IDLE_S = 10.0
    NUMBERS = {"rounds": int, "samples": int, "local_steps": int, "compute_s": float,
               "wait_s": float, "eval_s": float, "t_end": float, "step_ms": float,
               "speed": float, "nominal_speed": float}
    #: figures a worker may not know yet (null)
    OPTIONAL = {"step_ms", "speed", "nominal_speed"}
    MAX_NUMBER = 2.0 ** 50
    MAX_POST_POINTS = 256

    class RunConflict(ValueError):
        pass

    def __init__(self):
        self.run: str | None = None
        self.mode: str | None = None
        self.deferred = False
        self.workers: dict[int, dict[str, Any]] = {}
        self.evaluated: deque = deque(maxlen=MAX_POINTS)
        self.loss: deque = deque(maxlen=MAX_POINTS)
        self.metric = ACCURACY.key
        self.last_post = -math.inf

    def post(self, body: dict, workers: int, now: float) -> None:
        run, rank = body.get("run"), body.get("rank")
        if not (isinstance(run, str) and 0 < len(run) <= 128):
            raise ValueError("field 'run' must be the run's name (1 to 128 characters)")
        if not (type(rank) is int and 0 <= rank < workers):
            raise ValueError(f"field 'rank' must be an integer in 0..{workers - 1}, got "
                             f"{str(rank)[:40]}")
        figures = _checked_figures(body.get("worker"), rank, self.NUMBERS, self.MAX_NUMBER,
                                   self.OPTIONAL)
        points = {name: _checked_points(body.get(name, []), name, self.MAX_POST_POINTS)
                  for name in ("loss", "evaluated")}
        mode, deferred = body.get("mode"), body.get("deferred", False)
        if mode is not None and not (isinstance(mode, str) and len(mode) <= 64):
            raise ValueError("field 'mode' must be a mode's name")
        if not isinstance(deferred, bool):
            raise ValueError("field 'deferred' must be true or false")
        metric = body.get("metric", ACCURACY.key)
        if metric not in (ACCURACY.key, LOSS.key):
            raise ValueError(f"field 'metric' must be {ACCURACY.key!r} or {LOSS.key!r}")
        if run != self.run:
            if now - self.last_post < self.IDLE_S:
                raise self.RunConflict(
                    f"this live board shows run {self.run!r}, which is still posting, not "
                    f"run {run!r}: give every run its own (-ip/-port)")
            self.__init__()
            self.run = run
        self.last_post = now
        self.workers[rank] = figures
        if rank == 0:
            self.mode, self.deferred, self.metric = mode, deferred, metric
        self.loss.extend(points["loss"])
        self.evaluated.extend(points["evaluated"])

    def snapshot(self) -> dict[str, Any]:
        return page_data(self.run or "(no run has posted yet)", self.mode, self.deferred,
                         self.workers, self.evaluated, self.loss, self.metric)


def _checked_figures(figures: Any, rank: int, numbers: dict, bound: float,
                     optional: set[str]) -> dict[str, Any]:
    if not isinstance(figures, dict):
        raise ValueError("field 'worker' must be an object of the worker's figures")
    out = new_worker(rank)
    device = figures.get("device", "?")
    if not (isinstance(device, str) and len(device) <= 64):
        raise ValueError("field 'worker.device' must be a string of at most 64 characters")
    out["device"] = device
    for name, kind in numbers.items():
        value = figures.get(name, out[name])
        if value is None and name in optional:
            continue
        ok = (type(value) is int if kind is int
              else isinstance(value, (int, float)) and not isinstance(value, bool))
        if not (ok and math.isfinite(value) and 0 <= value <= bound):
            raise ValueError(f"field 'worker.{name}' must be a finite number in [0, "
                             f"{bound:g}], got {str(value)[:40]}")
        out[name] = value
    return out


def _checked_points(points: Any, name: str, most: int) -> list[tuple[float, float]]:
    if not isinstance(points, list) or len(points) > most:
        raise ValueError(f"field {name!r} must be a list of at most {most} [time, value] pairs")
    out = []
    for p in points:
        if not (isinstance(p, list) and len(p) == 2
                and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                        and math.isfinite(v) and abs(v) <= 1e12 for v in p)):
            raise ValueError(f"field {name!r}: each point must be [time, value] of finite "
                             f"numbers, got {str(p)[:40]}")
        out.append((float(p[0]), float(p[1])))
    return out


class LivePoster:
    """Posts this worker's figures to a live board's page (`--live-report`) every
    `interval` seconds, from a daemon thread that reads the worker's own records as they are
    written: training never waits for it. A server that does not answer costs a warning
    (once) and the figures of that post, not the run."""

    POINTS_PER_POST = 128

    def __init__(self, run_dir: str | Path, rank: int, client, run: str, interval: float = 1.0,
                 stream=sys.stderr, nominal_speed: float | None = None):
        self.watcher = RunWatcher(run_dir, ranks={rank}, nominal={rank: nominal_speed})
        self.rank, self.client, self.run, self.interval = rank, client, run, interval
        self.stream = stream
        self._sent = {"loss": 0, "evaluated": 0}
        self._stop = threading.Event()
        self._warned = False
        self._thread = threading.Thread(target=self._loop, daemon=True,
                                        name=f"hetsync-live-{rank}")

    def start(self) -> "LivePoster":
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.post()

    def post(self) -> bool:
        """One post of the figures and of up to POINTS_PER_POST new points of each curve;
        whether points are left for the next."""
        from hetsync.services import ServiceError

        self.watcher.update()
        info = self.watcher.run_info()
        body = {"run": self.run, "rank": self.rank, "mode": info["mode"],
                "deferred": info["deferred"], "metric": info["metric"],
                "worker": dict(self.watcher.workers.get(self.rank, new_worker(self.rank)))}
        # every evaluation, in chunks; the loss thinned when it comes faster than posts
        loss = self.watcher.loss[self._sent["loss"]:]
        loss = loss[::math.ceil(len(loss) / self.POINTS_PER_POST)] if loss else []
        evaluated = self.watcher.evaluated[self._sent["evaluated"]:][:self.POINTS_PER_POST]
        body["loss"] = [[round(t, 3), round(v, 5)] for t, v in loss]
        body["evaluated"] = [[round(t, 3), round(v, 5)] for t, v in evaluated]
        sent = {"loss": len(self.watcher.loss),
                "evaluated": self._sent["evaluated"] + len(evaluated)}
        try:
            self.client.post("/progress", body)
        except ServiceError as err:
            if not self._warned:
                print(f"rank {self.rank}: live figures not posted ({err}); training goes on",
                      file=self.stream, flush=True)
                self._warned = True
            return False
        self._sent = sent
        return sent["evaluated"] < len(self.watcher.evaluated)

    def close(self, final: bool = True) -> None:
        """Stop; `final`: post what is left first (e.g. the deferred evaluations)."""
        self._stop.set()
        self._thread.join(timeout=30)
        while final and self.post():
            pass
        self.client.close()


def live_app(run_dir: str | Path) -> Starlette:
    watcher = RunWatcher(run_dir)

    async def page(request: Request):
        return HTMLResponse(PAGE)

    async def data(request: Request):
        return JSONResponse(watcher.snapshot())

    return Starlette(routes=[Route("/", page, methods=["GET"]),
                             Route("/data", data, methods=["GET"])])


class LivePage(Service):
    """The live page of `run_dir` on loopback (port 0: any free one)."""

    def __init__(self, run_dir: str | Path, host: str = "127.0.0.1", port: int = 0):
        super().__init__(live_app(run_dir), host, port)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/"
