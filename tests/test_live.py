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

from hetsync.telemetry.live import RunWatcher


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


def _cells(dom: str) -> list[list[str]]:
    """The rows of the page's worker table, as lists of cell texts."""
    import re

    body = dom.split("<tbody>", 1)[1].split("</tbody>", 1)[0]
    return [re.findall(r"<td>(.*?)</td>", row) for row in body.split("<tr>")[1:]]


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="no chromium here (scripts/setup.sh installs "
                    "Debian's when run as root)")
def test_the_page_of_a_launch_lists_every_worker_and_changes_as_it_goes_on(tmp_path):
    import re
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-m", "hetsync", "launch", "-m", "esync", "--workers", "2",
         "--slowdowns", "1,2", "--time-budget", "12", "-ld", str(tmp_path), "--run-name", "demo",
         "--no-figures", "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = re.search(r"live page: (http://127\.0\.0\.1:\d+/)", proc.stdout.readline()).group(1)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:  # until both workers have records
            data = json.loads(urllib.request.urlopen(url + "data", timeout=5).read())
            if len(data["workers"]) == 2 and min(w["rounds"] for w in data["workers"]) > 5:
                break
            time.sleep(0.5)
        before = _cells(_render(url))
        time.sleep(2)
        after = _cells(_render(url))
    finally:
        proc.communicate(timeout=120)
    assert [row[0] for row in before] == ["0", "1"] == [row[0] for row in after]
    assert all(row[1] == "cpu" for row in before)
    assert int(after[0][2]) > int(before[0][2])  # rounds went on between the two looks
    assert int(after[0][7]) > int(before[0][7])  # and so did the samples
    assert proc.returncode == 0
