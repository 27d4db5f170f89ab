"""The live page of a run: its JSON from a growing run directory, and the page itself in
headless Chromium, listing every worker and changing as the run goes on."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
import urllib.request

import pytest

from hetsync.telemetry.live import LivePage, RunWatcher


def _append(path, records):
    with open(path, "a") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


def _round(rank, n, steps):
    return {"rank": rank, "device": "cpu" if rank else "gpu0", "round": n,
            "local_steps": steps, "samples": 64 * steps, "t_end": 0.1 * n,
            "compute_s": 0.01 * steps, "wait_s": 0.002, "eval_s": 0.0, "loss": 2.0 / n}


def _grow(run, start, stop):
    for n in range(start, stop):
        _append(run / "worker-0.jsonl", [_round(0, n, 4)])
        _append(run / "worker-1.jsonl", [_round(1, n, 1)])
    _append(run / "eval.jsonl", [{"train_time": 0.1 * stop, "test_acc": 0.5 + stop / 100}])


def test_the_watcher_reads_only_whole_new_lines(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps({"run_name": "r", "mode": "esync"}))
    _grow(tmp_path, 1, 4)
    with open(tmp_path / "worker-1.jsonl", "a") as f:
        f.write('{"rank": 1, "round": 4, "local_st')  # being written this instant
    watcher = RunWatcher(tmp_path)
    first = watcher.snapshot()
    assert [w["rounds"] for w in first["workers"]] == [3, 3]
    w0 = first["workers"][0]
    assert (w0["device"], w0["local_steps"], w0["samples"]) == ("gpu0", 4, 3 * 256)
    assert w0["step_ms"] == pytest.approx(10.0) and w0["compute_ratio"] == pytest.approx(0.4)
    with open(tmp_path / "worker-1.jsonl", "a") as f:
        f.write('eps": 1, "samples": 64, "t_end": 0.4, "compute_s": 0.01}\n')
    assert [w["rounds"] for w in watcher.snapshot()["workers"]] == [3, 4]
    assert first["accuracy"] == [(0.4, 0.54)] and len(first["loss"]) == 3


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _render(url: str) -> str:
    """The page's DOM after its script ran for a few seconds of virtual time."""
    with tempfile.TemporaryDirectory() as profile:
        out = subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--no-first-run", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", f"--user-data-dir={profile}", "--virtual-time-budget=3000",
             "--dump-dom", url], capture_output=True, text=True, timeout=60)
    return out.stdout


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="no chromium here (scripts/setup.sh installs "
                    "Debian's when run as root)")
def test_the_page_lists_every_worker_and_changes_as_the_run_goes_on(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps({"run_name": "demo", "mode": "esync"}))
    _grow(tmp_path, 1, 5)
    page = LivePage(tmp_path).start()
    try:
        data = json.loads(urllib.request.urlopen(page.url + "data", timeout=5).read())
        assert len(data["workers"]) == 2
        before = _render(page.url)
        _grow(tmp_path, 5, 30)
        time.sleep(0.1)
        after = _render(page.url)
    finally:
        page.stop()
    for dom in (before, after):
        assert "hetsync: demo (esync)" in dom
        assert "<td>gpu0</td>" in dom and "<td>cpu</td>" in dom  # every worker listed
    assert "<td>4</td><td>4</td>" in before  # rank 0: 4 rounds, 4 local steps
    assert "<td>29</td><td>4</td>" in after  # ... and 29 rounds later on
