"""The state server over real HTTP on loopback: good requests, malformed ones, the status page."""

import http.client
import json

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


def test_client_reports_a_refusal_with_the_servers_reason(server):
    c = StateClient(server.host, server.port)
    with pytest.raises(StateServerError, match="rank 9"):
        c.report(9, 1, 1, 0.1)
