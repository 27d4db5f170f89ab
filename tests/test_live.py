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
    assert first["evaluated"] == [(0.4, 0.54)] and len(first["loss"]) == 3


def test_a_text_run_shows_its_validation_loss(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps(
        {"run_name": "r", "mode": "esync-outer", "config": {"dataset": "shakespeare"}}))
    _grow(tmp_path, 1, 4)
    _append(tmp_path / "eval.jsonl", [{"train_time": 0.5, "test_acc": 0.3, "test_loss": 2.1}])
    page = RunWatcher(tmp_path).snapshot()
    assert page["evaluated"] == [(0.5, 2.1)]  # the loss; the record without one is skipped
    assert page["label"].startswith("validation loss")


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
        for line in proc.stdout:  # (after the lines on the emulated devices)
            found = re.search(r"live page: (http://127\.0\.0\.1:\d+/)", line)
            if found:
                break
        url = found.group(1)
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
    for row in after:  # each device's measured speed beside its nominal one
        speed, nominal = (float(x.replace(",", "")) for x in row[8:10])
        assert 0 < speed and 0 < nominal
    assert proc.returncode == 0


# ---------------------------------------------------------------- the state server's board
from hetsync.telemetry.live import LiveBoard  # noqa: E402


def _post(rank, rounds=3, run="exp", **extra):
    figures = {"device": "cpu", "rounds": rounds, "samples": 64 * rounds, "local_steps": 2,
               "compute_s": 0.3, "wait_s": 0.1, "eval_s": 0.0, "t_end": 0.5, "step_ms": 12.5}
    return {"run": run, "rank": rank, "mode": "sync", "deferred": True, "worker": figures,
            "loss": [[0.1 * rounds, 2.0]], "evaluated": [], **extra}


def test_the_board_shows_what_each_worker_posted():
    board = LiveBoard()
    board.post(_post(1, rounds=4), workers=2, now=0.0)
    board.post(_post(0, rounds=5), workers=2, now=0.1)
    board.post(_post(0, rounds=6, evaluated=[[1.0, 0.7]]), workers=2, now=0.2)
    data = board.snapshot()
    assert (data["run"], data["mode"], data["deferred"]) == ("exp", "sync", True)
    assert [(w["rank"], w["rounds"]) for w in data["workers"]] == [(0, 6), (1, 4)]
    assert data["workers"][0]["compute_ratio"] == pytest.approx(0.6)
    assert data["evaluated"] == [(1.0, 0.7)] and len(data["loss"]) == 3


@pytest.mark.parametrize("change,needle", [
    ({"rank": 2}, "'rank' must be an integer in 0..1"),
    ({"rank": True}, "'rank'"),
    ({"run": ""}, "'run'"),
    ({"run": 7}, "'run'"),
    ({"worker": [1]}, "'worker' must be an object"),
    ({"worker": {"rounds": -1}}, "'worker.rounds'"),
    ({"worker": {"rounds": 2.5}}, "'worker.rounds'"),
    ({"worker": {"wait_s": float("nan")}}, "'worker.wait_s'"),
    ({"worker": {"compute_s": 1e300}}, "'worker.compute_s'"),
    ({"worker": {"device": "x" * 65}}, "'worker.device'"),
    ({"loss": [[0.0, float("inf")]]}, "'loss'"),
    ({"loss": [[0.0]]}, "'loss'"),
    ({"evaluated": [[0, 0.5]] * 257}, "at most 256"),
    ({"evaluated": "0.5"}, "'evaluated'"),
    ({"deferred": "yes"}, "'deferred'"),
    ({"mode": ["sync"]}, "'mode'"),
])
def test_the_board_refuses_a_malformed_post_and_keeps_what_it_had(change, needle):
    board = LiveBoard()
    board.post(_post(0), workers=2, now=0.0)
    before = board.snapshot()
    with pytest.raises(ValueError, match=needle.replace("(", r"\(")):
        board.post({**_post(1), **change}, workers=2, now=0.1)
    assert board.snapshot() == before


def test_a_second_run_is_refused_while_the_first_posts_and_takes_the_board_after():
    board = LiveBoard()
    board.post(_post(0, run="first"), workers=2, now=0.0)
    with pytest.raises(LiveBoard.RunConflict, match="'first'.*'second'"):
        board.post(_post(0, run="second"), workers=2, now=LiveBoard.IDLE_S / 2)
    board.post(_post(1, run="second"), workers=2, now=LiveBoard.IDLE_S + 1)
    data = board.snapshot()
    assert data["run"] == "second" and [w["rank"] for w in data["workers"]] == [1]


def test_the_curves_are_bounded():
    board = LiveBoard()
    for k in range(20):
        points = [[k * 256 + i, 0.5] for i in range(256)]
        board.post(_post(0, loss=points, evaluated=points), workers=1, now=float(k))
    data = board.snapshot()
    assert len(data["loss"]) == len(data["evaluated"]) == 2000
    assert data["loss"][-1][0] == 20 * 256 - 1


@pytest.mark.slow
def test_the_state_server_shows_a_sync_run_posted_by_its_workers(tmp_path):
    """`--live-report`: a run's workers (here a 2-worker `sync` launch, which starts no state
    server of its own) post to a state server, whose page lists both and whose figures grow;
    the deferred evaluations' accuracy comes at the end."""
    import sys

    from hetsync.state import StateServer

    server = StateServer(workers=2, port=0).start()
    base = f"http://127.0.0.1:{server.port}/live/"
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "hetsync", "launch", "-m", "sync", "--workers", "2",
             "--slowdowns", "1,2", "--time-budget", "10", "--eval-interval", "2",
             "-ld", str(tmp_path), "--run-name", "shown", "--no-figures", "--quiet", "--no-live",
             "--live-report", "1", "-port", str(server.port)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        seen = []
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            data = json.loads(urllib.request.urlopen(base + "data", timeout=5).read())
            if len(data["workers"]) == 2:
                seen.append(data)
            time.sleep(0.5)
        out = proc.communicate(timeout=60)[0]
        assert proc.returncode == 0, out[-3000:]
        final = json.loads(urllib.request.urlopen(base + "data", timeout=5).read())
        rows = _cells(_render(base)) if CHROMIUM is not None else None
    finally:
        server.stop()
    assert len(seen) >= 3, out[-2000:]
    assert seen[0]["run"] == "shown" and seen[0]["mode"] == "sync"
    assert seen[-1]["workers"][0]["rounds"] > seen[0]["workers"][0]["rounds"]
    records = [(tmp_path / "shown" / f"worker-{r}.jsonl").read_text().count("\n")
               for r in (0, 1)]
    assert [w["rounds"] for w in final["workers"]] == records  # all of them, in the end
    evaluations = (tmp_path / "shown" / "eval.jsonl").read_text().count("\n")
    assert len(final["evaluated"]) == evaluations
    if rows is not None:
        assert [row[0] for row in rows] == ["0", "1"] and int(rows[0][2]) == records[0]
