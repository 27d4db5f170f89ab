"""A live page of a run, for every mode: what each worker is doing, and the curves so far.

`launch` serves it on loopback while the run goes on (`LivePage`, on `hetsync.serving`):

- `GET /data` → JSON read from the run directory as it grows (only the new lines of each
  record file are read per request): per worker its device, rounds, local steps of its last
  round, step time (compute ÷ local steps of its last round), computing time ratio and wait so
  far, samples; rank 0's training loss per round; the accuracy curve so far (with deferred
  evaluation, the snapshots are evaluated after training: the curve comes at the end).
- `GET /` → one HTML page whose script fetches `/data` every second and redraws its table and
  curves in place (a canvas; no front-end framework, no reload).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse
from starlette.routing import Route

from hetsync.serving import Service


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


class RunWatcher:
    """A run directory's figures so far, kept up to date from its record files."""

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        self._tails: dict[int, _Tail] = {}
        self._workers: dict[int, dict[str, Any]] = {}
        self._evals = _Tail(self.run_dir / "eval.jsonl")
        self.accuracy: list[tuple[float, float]] = []
        self.loss: list[tuple[float, float]] = []

    def _update(self) -> None:
        for path in self.run_dir.glob("worker-*.jsonl"):
            rank = int(path.stem.split("-")[1])
            tail = self._tails.setdefault(rank, _Tail(path))
            w = self._workers.setdefault(rank, {"rank": rank, "device": "?", "rounds": 0,
                                                "samples": 0, "compute_s": 0.0, "wait_s": 0.0,
                                                "eval_s": 0.0, "t_end": 0.0,
                                                "local_steps": 0, "step_ms": None})
            for r in tail.new():
                w["device"] = r.get("device", w["device"])
                w["rounds"] += 1
                w["samples"] += r.get("samples", 0)
                for key in ("compute_s", "wait_s", "eval_s"):
                    w[key] += r.get(key) or 0.0
                w["t_end"] = r.get("t_end", w["t_end"])
                w["local_steps"] = r.get("local_steps", 0)
                if w["local_steps"]:
                    w["step_ms"] = 1000 * (r.get("compute_s") or 0.0) / w["local_steps"]
                if rank == 0 and r.get("loss") is not None:
                    self.loss.append((r["t_end"], r["loss"]))
        for e in self._evals.new():
            if e.get("test_acc") is not None:
                self.accuracy.append((e.get("train_time") or 0.0, e["test_acc"]))

    def snapshot(self) -> dict[str, Any]:
        self._update()
        run = {}
        if (self.run_dir / "run.json").exists():
            try:
                run = json.loads((self.run_dir / "run.json").read_text())
            except ValueError:  # being replaced this instant
                run = {}
        workers = []
        for rank in sorted(self._workers):
            w = dict(self._workers[rank])
            busy = w["t_end"] - w.pop("eval_s")
            w["compute_ratio"] = w["compute_s"] / busy if busy > 0 else None
            workers.append(w)
        config = run.get("config") or {}
        return {"run": run.get("run_name", self.run_dir.name), "mode": run.get("mode"),
                "deferred": bool(config.get("deferred_eval")) and not config.get("target_acc"),
                "workers": workers, "accuracy": self.accuracy[-2000:],
                "loss": self.loss[-2000:]}


PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>hetsync live</title>
<style>body{font-family:sans-serif;margin:1em}td,th{padding:2px 10px;text-align:right}
canvas{border:1px solid #ccc;margin:4px}</style></head><body>
<h2 id="title">hetsync</h2>
<table id="workers"><thead><tr><th>rank</th><th>device</th><th>rounds</th>
<th>local steps (last round)</th><th>step time</th><th>computing time ratio</th>
<th>wait so far</th><th>samples</th></tr></thead><tbody></tbody></table>
<div><canvas id="acc" width="480" height="240"></canvas>
<canvas id="loss" width="480" height="240"></canvas></div>
<p id="updated"></p>
<script>
function draw(id, points, label) {
  const c = document.getElementById(id), g = c.getContext("2d");
  g.clearRect(0, 0, c.width, c.height);
  g.fillText(label + (points.length ? "" : " (none yet)"), 8, 14);
  if (points.length < 1) return;
  const xs = points.map(p => p[0]), ys = points.map(p => p[1]);
  const x0 = Math.min(...xs), x1 = Math.max(...xs) || 1, y0 = Math.min(...ys), y1 = Math.max(...ys);
  const X = x => 30 + (c.width - 40) * (x - x0) / ((x1 - x0) || 1);
  const Y = y => c.height - 20 - (c.height - 40) * (y - y0) / ((y1 - y0) || 1);
  g.beginPath(); points.forEach((p, i) => i ? g.lineTo(X(p[0]), Y(p[1])) : g.moveTo(X(p[0]), Y(p[1])));
  g.stroke();
  g.fillText(y1.toFixed(3), 2, 28); g.fillText(y0.toFixed(3), 2, c.height - 22);
}
function fmt(v, digits, unit) { return v === null || v === undefined ? "?" : v.toFixed(digits) + unit; }
async function refresh() {
  try {
    const d = await (await fetch("data" + location.search)).json();
    document.getElementById("title").textContent = "hetsync: " + d.run + " (" + d.mode + ")";
    document.querySelector("#workers tbody").innerHTML = d.workers.map(w =>
      "<tr><td>" + w.rank + "</td><td>" + w.device + "</td><td>" + w.rounds + "</td><td>" +
      w.local_steps + "</td><td>" + fmt(w.step_ms, 1, " ms") + "</td><td>" +
      fmt(w.compute_ratio, 2, "") + "</td><td>" + fmt(w.wait_s, 1, " s") + "</td><td>" +
      w.samples + "</td></tr>").join("");
    draw("acc", d.accuracy, "test accuracy / training time (s)" +
         (d.deferred ? " - deferred evaluation: drawn after training" : ""));
    draw("loss", d.loss, "rank 0 training loss / time (s)");
    document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
  } catch (e) {
    document.getElementById("updated").textContent = "run over, or not reachable";
  }
}
refresh(); setInterval(refresh, 1000);
</script></body></html>"""


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
