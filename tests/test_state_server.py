"""The state server over real HTTP on loopback: good requests, malformed ones, the status page."""

import http.client
import json
import os
import socket
import statistics
import time

import pytest

from hetsync.state import StateClient, StateServer, StateServerError


@pytest.fixture()
def server():
    s = StateServer(workers=2, epsilon=0.0, port=0).start()
    yield s
    s.stop()


def _raw(server, method, path, body=None, headers=None):
    conn = http.client.HTTPConnection(server.host, server.port, timeout=5)
    conn.request(method, path, body=body, headers=headers or {})
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, data


def test_a_state_server_serves_one_run_and_refuses_another(server):
    first = StateClient(server.host, server.port)
    first.init(workers=2, epsilon=0.0, run="run-a")
    assert first.report(0, 1, 1, 0.01).ready
    second = StateClient(server.host, server.port)
    second.run = "run-b"   # a second run pointed at the same server
    with pytest.raises(StateServerError, match="serves run run-a .* not run run-b"):
        second.report(1, 1, 1, 0.05)
    assert first.report(1, 1, 1, 0.05).ready   # the first run goes on
    first.close()
    second.close()


def test_a_restarted_state_server_takes_the_run_of_the_first_report(server):
    c = StateClient(server.host, server.port)
    c.run = "run-a"        # no /init since the (re)start
    assert c.report(0, 5, 1, 0.01).ready
    other = StateClient(server.host, server.port)
    other.run = "run-b"
    with pytest.raises(StateServerError, match="serves run run-a"):
        other.report(1, 5, 1, 0.01)
    c.close()
    other.close()


def test_a_run_that_lost_a_worker_is_planned_without_it(server):
    c = StateClient(server.host, server.port)
    c.init(workers=2, epsilon=0.0, run="run-a")
    c.report(0, 1, 1, 0.01), c.report(1, 1, 1, 0.08)
    assert c.report(0, 2, 1, 0.01).steps_left == 7  # the slow rank 1 sets the round
    c.init(workers=2, epsilon=0.0, run="run-a/1", lost=[1])  # the survivors go on
    c.report(0, 3, 1, 0.01)  # (a warm-up round: nobody to wait for)
    assert c.report(0, 4, 1, 0.01).ready  # rank 0 alone is the slowest now
    with pytest.raises(StateServerError, match="rank 1 was lost"):
        c.report(1, 4, 1, 0.08)
    assert json.loads(_raw(server, "GET", "/status")[1])["lost"] == [1]
    c.close()


def test_a_restarted_state_server_plans_without_the_ranks_the_reports_name_lost(server):
    c = StateClient(server.host, server.port)
    c.run, c.lost = "run-a/1", [1]  # no /init since the (re)start; rank 1 was lost before
    c.report(0, 7, 1, 0.01)  # (a warm-up round: nobody to wait for)
    assert c.report(0, 8, 1, 0.01).ready  # not held back for rank 1
    with pytest.raises(StateServerError, match="rank 1 was lost"):
        c.report(1, 8, 1, 0.08)
    assert json.loads(_raw(server, "GET", "/status")[1])["lost"] == [1]
    c.close()


def test_binds_to_loopback_by_default(server):
    assert server.host == "127.0.0.1"


def test_a_round_over_http(server):
    c = StateClient(server.host, server.port)
    c.init(workers=2, epsilon=0.0)
    assert c.report(0, 1, 1, 0.01).ready  # warm-up round
    assert c.report(1, 1, 1, 0.05).ready
    d = c.report(0, 2, 1, 0.01)
    assert not d.ready and d.steps_left >= 1
    assert c.report(1, 2, 1, 0.05).ready  # the slowest
    status = c.status()
    assert status["round"] == 2 and status["workers"] == 2
    assert [r["rank"] for r in status["records"]] == [0, 1]
    assert status["requests"] >= 5 and status["bytes_sent"] > 0
    c.close()


@pytest.mark.parametrize("body, needle", [
    (b"not json", "JSON object"),
    (b"[1, 2]", "JSON object"),
    (json.dumps({"round": 1, "steps": 1, "step_time": 0.1}).encode(), "'rank'"),
    (json.dumps({"rank": "0", "round": 1, "steps": 1, "step_time": 0.1}).encode(), "'rank'"),
    (json.dumps({"rank": 7, "round": 1, "steps": 1, "step_time": 0.1}).encode(), "rank 7"),
    (json.dumps({"rank": 0, "round": 0, "steps": 1, "step_time": 0.1}).encode(), "'round'"),
    (json.dumps({"rank": 0, "round": 1, "steps": 1, "step_time": -1}).encode(), "step_time"),
    (b'{"rank": 0, "round": 1, "steps": 1, "step_time": NaN}', "step_time"),
])
def test_malformed_reports_get_a_4xx_json_error_and_the_server_keeps_serving(server, body, needle):
    status, data = _raw(server, "POST", "/report", body, {"Content-Type": "application/json"})
    assert 400 <= status < 500
    assert needle in json.loads(data)["error"]
    status, data = _raw(server, "GET", "/healthz")
    assert status == 200 and json.loads(data) == {"ok": True}


def test_unknown_paths_and_methods_are_refused_as_json(server):
    status, data = _raw(server, "GET", "/admin")
    assert status == 404 and "error" in json.loads(data)
    status, data = _raw(server, "GET", "/report")
    assert status == 405 and "error" in json.loads(data)


def test_status_page_refreshes_itself(server):
    StateClient(server.host, server.port).report(0, 1, 1, 0.02, device="gpu0")
    status, data = _raw(server, "GET", "/")
    page = data.decode()
    assert status == 200 and "http-equiv='refresh'" in page
    assert "gpu0" in page and "20.0 ms" in page


def test_client_names_the_server_when_it_is_not_there():
    c = StateClient("127.0.0.1", 1, timeout=1)  # nothing listens on port 1
    with pytest.raises(StateServerError, match="127.0.0.1:1"):
        c.report(0, 1, 1, 0.1)


def test_a_server_that_accepts_but_never_answers_is_waited_for_as_briefly_as_one_that_is_gone():
    """A stopped (SIGSTOP) server: the kernel accepts the connection and the report, but no
    answer comes. A read that would try a gone server for 0.25 s (ESync's, once it has a
    plan) gives up within seconds, not after the client's 30 s timeout."""
    from hetsync.state.client import StateServerUnreachable

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # (never accepts: connections wait in its backlog)
        client = StateClient("127.0.0.1", silent.getsockname()[1], timeout=30)
        started = time.monotonic()
        with pytest.raises(StateServerUnreachable, match="did not answer"):
            client.report_async(0, 1, 0, 0.01, retry_s=0.25)()
        assert time.monotonic() - started < 10.0
        client.close()


def test_client_reports_a_refusal_with_the_servers_reason(server):
    c = StateClient(server.host, server.port)
    with pytest.raises(StateServerError, match="rank 9"):
        c.report(9, 1, 1, 0.1)


# --- hardening (issue 17): no request makes it answer 500, hang, die or allocate unboundedly ---

def _report(**fields):
    body = {"rank": 0, "round": 1, "steps": 1, "step_time": 0.01, **fields}
    return json.dumps(body).encode()


BAD_REQUESTS = [
    ("POST", "/report", _report(step_time=1e300), "step_time"),
    ("POST", "/report", _report(step_time=1e308), "step_time"),
    ("POST", "/report", b'{"rank": 0, "round": 1, "steps": 1, "step_time": 1e400}', "step_time"),
    ("POST", "/report", b'{"rank": 0, "round": 1, "steps": 1, "step_time": Infinity}', "step_time"),
    ("POST", "/report", _report(step_time=0), "step_time"),
    ("POST", "/report", _report(step_time="0.1"), "step_time"),
    ("POST", "/report", _report(step_time=True), "step_time"),
    ("POST", "/report", b'{"rank": 0, "round": 1%s, "steps": 1, "step_time": 0.1}' % (b"0" * 400), "round"),
    ("POST", "/report", b'{"rank": 0, "round": 1, "steps": 1%s, "step_time": 0.1}' % (b"0" * 400), "steps"),
    ("POST", "/report", _report(rank=-1), "rank"),
    ("POST", "/report", _report(rank=10 ** 30), "rank"),
    ("POST", "/report", _report(steps=-1), "steps"),
    ("POST", "/report", _report(round=1.5), "round"),
    ("POST", "/report", _report(device=7), "device"),
    ("POST", "/report", b"", "JSON object"),
    ("POST", "/report", b"null", "JSON object"),
    ("POST", "/report", b'"text"', "JSON object"),
    ("POST", "/report", b"[" * 100000, "body"),  # over MAX_BODY
    ("POST", "/report", b"[" * 5000 + b"]" * 5000, "JSON object"),  # deep nesting
    ("POST", "/report", b"\xff\xfe garbage", "JSON object"),
    ("POST", "/init", json.dumps({"workers": 2_000_000}).encode(), "workers"),
    ("POST", "/init", json.dumps({"workers": 0}).encode(), "workers"),
    ("POST", "/init", json.dumps({"workers": "4"}).encode(), "workers"),
    ("POST", "/init", json.dumps({"workers": 2, "epsilon": 5}).encode(), "epsilon"),
    ("POST", "/init", json.dumps({"workers": 2, "epsilon": "auto"}).encode(), "epsilon"),
    ("POST", "/init", json.dumps({}).encode(), "workers"),
    ("POST", "/init", json.dumps({"workers": 2, "lost": [0, 1]}).encode(), "lost"),
    ("POST", "/init", json.dumps({"workers": 2, "lost": [2]}).encode(), "lost"),
    ("POST", "/init", json.dumps({"workers": 2, "lost": "1"}).encode(), "lost"),
    ("POST", "/init", json.dumps({"workers": 2, "lost": [True]}).encode(), "lost"),
    ("PUT", "/report", _report(), "PUT"),
    ("DELETE", "/init", b"", "DELETE"),
    ("POST", "/status", b"{}", "POST"),
    ("GET", "/../etc/passwd", None, "404"),
]


@pytest.mark.parametrize("method, path, body, needle", BAD_REQUESTS)
def test_malformed_requests_get_one_4xx_line_and_planning_goes_on(server, method, path, body, needle):
    headers = {"Content-Type": "application/json"}
    status, data = _raw(server, method, path, body, headers)
    assert 400 <= status < 500, (status, data)
    assert needle in json.loads(data)["error"]
    # the next well-formed round is planned as usual (a poisoned tracker would answer 500)
    c = StateClient(server.host, server.port, timeout=5)
    c.init(workers=2, epsilon=0.0)
    assert c.report(0, 1, 1, 0.01).ready and c.report(1, 1, 1, 0.05).ready
    assert not c.report(0, 2, 1, 0.01).ready
    c.close()


def test_a_huge_step_time_ratio_is_planned_at_once(server):
    c = StateClient(server.host, server.port, timeout=5)
    c.init(workers=2, epsilon=None)
    c.report(0, 1, 1, 1e-7)
    c.report(1, 1, 1, 3.0)  # 3·10^7 times slower: the round length weighs bounded candidates
    d = c.report(0, 2, 1, 1e-7)
    assert d.steps_left > 10 ** 6
    c.close()


def _raw_socket(server, payload: bytes, wait: float = 5.0) -> bytes:
    import socket

    with socket.create_connection((server.host, server.port), timeout=wait) as s:
        try:
            s.sendall(payload)
        except (BrokenPipeError, ConnectionResetError):  # refused before all was sent
            return b""
        out = b""
        while True:
            try:
                chunk = s.recv(65536)
            except TimeoutError:
                raise AssertionError(f"no answer and no close within {wait} s: {out!r}")
            except ConnectionResetError:  # closed with our bytes still unread: refused
                return out
            if not chunk:
                return out
            out += chunk


@pytest.mark.parametrize("payload", [
    b"GET /\r\n\r\n",  # HTTP/0.9
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(32),  # a TLS ClientHello
    b"POST /report HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
    b"POST /report HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
    b"BREW /pot HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET / HTTP/1.1\r\n" + b"X: " + b"a" * 200000 + b"\r\n\r\n",
])
def test_garbage_on_the_wire_is_answered_or_closed_not_held(server, payload):
    out = _raw_socket(server, payload)  # answered (never 5xx) and closed, or just closed
    assert out == b"" or (out.startswith(b"HTTP/1.1 ") and out[9:10] in b"24"), out[:200]
    status, _ = _raw(server, "GET", "/healthz")
    assert status == 200


@pytest.mark.parametrize("head, served", [
    (b"X: " + b"a" * 100_000 + b"\r\n", False),  # one 100 KB header line
    (b"".join(b"X%d: %s\r\n" % (i, b"b" * 50) for i in range(300)), False),  # 17.5 KB
    (b"".join(b"X%d: %s\r\n" % (i, b"b" * 10) for i in range(300)), True),  # 6.4 KB: fine
])
def test_request_heads_are_bounded_as_the_readme_says(server, head, served):
    out = _raw_socket(server, b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + head +
                      b"Connection: close\r\n\r\n")
    if served:
        assert out.startswith(b"HTTP/1.1 200 "), out[:200]
    else:
        assert out.startswith(b"HTTP/1.1 400 ") and out.endswith(b"request head over 16384 "
                                                                   b"bytes"), out[-200:]


def test_a_half_sent_request_is_closed_after_the_request_timeout(server, monkeypatch):
    import hetsync.serving as module

    monkeypatch.setattr(module, "REQUEST_TIMEOUT", 0.5)
    out = _raw_socket(server, b"POST /report HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{",
                      wait=10)
    assert out == b""  # closed by the server, long before the client's own 10 s


def test_binding_beyond_loopback_needs_a_token(monkeypatch):
    from hetsync.state.server import ServerConfigError

    monkeypatch.delenv("HETSYNC_TOKEN", raising=False)
    with pytest.raises(ServerConfigError, match="--token"):
        StateServer(workers=2, host="0.0.0.0", port=0)


def test_with_a_token_every_request_but_healthz_must_carry_it():
    s = StateServer(workers=2, host="0.0.0.0", port=0, token="s3cret").start()
    try:
        status, data = _raw(s, "GET", "/status")
        assert status == 401 and "token" in json.loads(data)["error"]
        status, _ = _raw(s, "GET", "/status", headers={"Authorization": "Bearer wrong"})
        assert status == 401
        assert _raw(s, "GET", "/healthz")[0] == 200
        assert _raw(s, "GET", "/?token=s3cret")[0] == 200
        with pytest.raises(StateServerError, match="token"):
            StateClient("127.0.0.1", s.port, timeout=5, token="nope").report(0, 1, 1, 0.1)
        c = StateClient("127.0.0.1", s.port, timeout=5, token="s3cret")
        assert c.report(0, 1, 1, 0.1).ready
        c.close()
    finally:
        s.stop()


def test_the_cli_refuses_an_exposed_server_without_a_token_in_one_line(capsys, monkeypatch):
    from hetsync.cli import main

    monkeypatch.delenv("HETSYNC_TOKEN", raising=False)
    assert main(["state-server", "--host", "0.0.0.0", "--port", "0"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--token" in err[0] and "0.0.0.0" in err[0]


@pytest.mark.slow
def test_load_from_16_keep_alive_clients_has_no_errors():
    """A bounded load (the figures are `hetsync bench state`'s to print, not this test's)."""
    import asyncio

    from hetsync.bench.state_load import drive, start_server

    proc, port = start_server(16)
    try:
        result = asyncio.run(drive("127.0.0.1", port, 4000, 16))
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert result.errors == 0 and result.requests == 4000


def test_the_client_waits_for_a_restarted_server():
    """Down for a moment (a restart): the client tries again with backoff, then goes on."""
    import threading

    first = StateServer(workers=2, epsilon=0.0, port=0).start()
    port = first.port
    c = StateClient("127.0.0.1", port, timeout=5, retry_s=10)
    assert c.report(0, 1, 1, 0.01).ready
    first.stop()
    restarted = []
    timer = threading.Timer(1.0, lambda: restarted.append(
        StateServer(workers=2, epsilon=0.0, port=port).start()))
    timer.start()
    try:
        assert c.report(1, 1, 1, 0.05).ready  # sent while nothing listened
        assert c.retries >= 1
    finally:
        timer.join()
        for s in restarted:
            s.stop()


@pytest.mark.slow
def test_an_esync_run_survives_a_killed_state_server_with_its_step_spread_restored(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "hetsync", "launch", "-m", "esync", "--workers", "3",
         "--slowdowns", "1,2,4", "--time-budget", "14", "-ld", str(tmp_path), "--run-name",
         "run", "--quiet", "--no-figures", "--timeout", "30"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def rows(rank):
        path = run / f"worker-{rank}.jsonl"
        return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []

    def state_server_pid():
        from processes import pid_of

        return pid_of(run, "state-server")

    deadline = time.monotonic() + 120
    while len(rows(0)) < 60 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    before = rows(0)
    os.kill(state_server_pid(), signal.SIGKILL)
    killed_at_round = before[-1]["round"]
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out
    assert "the state server exited with code -9; started it again" in out
    after = [r for r in rows(0) if r["round"] > killed_at_round + 10]
    fast = [r["local_steps"] for r in after]
    spread = [r["local_steps"] for r in before[-20:]]

    def step_time(records):  # the median step as the run measured it
        return statistics.median(r["compute_s"] / r["local_steps"] for r in records
                                 if r["local_steps"])

    # How many of the fastest worker's steps fit in the slowest's (4x nominal; less on a busy
    # machine), as the run itself measured them after the restart:
    slow = [r for r in rows(2) if r["round"] > killed_at_round + 10]
    fit = step_time(slow) / step_time(after)
    # the fastest worker fills the slowest's step again, as it did before the kill: with a
    # margin for rounds the planner cuts short, at least half of what fits, and more than one
    # step a round wherever two fit
    assert len(fast) >= 10, fast
    for steps in (fast, spread):
        mean = sum(steps) / len(steps)
        assert mean >= 0.5 * fit and (fit < 2 or mean > 1.0), (fit, steps)


def _figures(rank, rounds):
    return {"run": "exp", "rank": rank, "mode": "sync", "deferred": False,
            "worker": {"device": "cpu", "rounds": rounds, "samples": 64 * rounds,
                       "local_steps": 1, "compute_s": 0.2, "wait_s": 0.1, "eval_s": 0.0,
                       "t_end": 0.4, "step_ms": 3.0},
            "loss": [[0.4, 1.5]], "evaluated": [[0.4, 0.6]] if rank == 0 else []}


def test_the_live_page_shows_what_workers_post_and_refuses_the_malformed(server):
    client = StateClient(server.host, server.port)
    client.post("/progress", _figures(1, 7))
    client.post("/progress", _figures(0, 9))
    status, data = _raw(server, "GET", "/live/data")
    data = json.loads(data)
    assert status == 200 and data["run"] == "exp"
    assert [(w["rank"], w["rounds"]) for w in data["workers"]] == [(0, 9), (1, 7)]
    assert data["evaluated"] == [[0.4, 0.6]]
    status, page = _raw(server, "GET", "/live/")
    assert status == 200 and b'fetch("data"' in page
    status, _ = _raw(server, "GET", "/live")
    assert status == 307  # to /live/, where the page's relative "data" is /live/data
    for bad, needle in (({**_figures(0, 1), "rank": 5}, "rank"),
                        ({**_figures(0, 1), "loss": [[0, "x"]]}, "loss"),
                        ({**_figures(0, 1), "run": "other"}, "still posting")):
        with pytest.raises(StateServerError, match=needle):
            client.post("/progress", bad)
    status, data = _raw(server, "GET", "/live/data")
    assert [w["rounds"] for w in json.loads(data)["workers"]] == [9, 7]  # as it was
    client.close()


def test_the_live_page_needs_the_token_beyond_loopback():
    s = StateServer(workers=2, host="0.0.0.0", port=0, token="s3cret").start()
    try:
        assert _raw(s, "GET", "/live/data")[0] == 401
        with pytest.raises(StateServerError, match="token"):
            StateClient("127.0.0.1", s.port, timeout=5, token="nope").post(
                "/progress", _figures(0, 1))
        StateClient("127.0.0.1", s.port, timeout=5, token="s3cret").post(
            "/progress", _figures(0, 1))
        status, data = _raw(s, "GET", "/live/data?token=s3cret")
        assert status == 200 and json.loads(data)["workers"][0]["rounds"] == 1
    finally:
        s.stop()


def test_a_held_round_is_answered_once_every_worker_has_reported_whatever_their_order():
    """`/init`'s hold (a run on the virtual clock): the fast worker's report waits for the
    slow one's, and both plans are what the step times say, whichever came first."""
    import threading

    s = StateServer(workers=2, epsilon=None, port=0).start()
    try:
        plans = {}
        for first, second in ((0, 1), (1, 0)):
            clients = [StateClient(s.host, s.port) for _ in range(2)]
            clients[0].init(workers=2, run=f"run-{first}", hold=30.0)
            clients[1].run = clients[0].run
            times = {0: 0.01, 1: 0.04}
            answers = {}

            def report(rank, rnd):
                answers[rank, rnd] = clients[rank].report(rank, rnd, 0, times[rank])

            for rnd in (1, 2):  # round 1 warms up (the other's time unknown), round 2 plans
                early = threading.Thread(target=report, args=(first, rnd))
                early.start()
                time.sleep(0.3)
                assert early.is_alive()  # held: the other worker has not reported
                report(second, rnd)
                early.join(10)
                assert not early.is_alive()
            plans[first] = {k: (a.steps_left, a.time_left) for k, a in answers.items()}
            for c in clients:
                c.close()
        assert plans[0] == plans[1]  # the order the requests came in changed nothing
        assert plans[0][0, 2] == (4, pytest.approx(0.04))  # 4 of the fast one's steps fit
        assert plans[0][1, 2][0] == 1  # the slowest: one step a round
    finally:
        s.stop()
