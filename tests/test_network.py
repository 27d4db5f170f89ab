"""Real bandwidth limits: emulated hosts in network namespaces behind tc tbf links (root only;
skipped with the reason elsewhere), and the rate parser."""

import os
import signal
import subprocess
import sys
import time

import pytest

from hetsync.runtime.network import (LimitedNetwork, NetworkUnavailable, check_available,
                                     parse_rate, remove_stale)


def test_rates_are_read_as_tc_writes_them():
    assert parse_rate("100mbit") == 100e6
    assert parse_rate("1.5gbit") == 1.5e9
    assert parse_rate("500kbit") == 500e3
    for bad in ("100", "100mb", "fast", "0mbit", "-1mbit"):
        with pytest.raises(ValueError, match="expected a number > 0 followed by kbit"):
            parse_rate(bad)


def _namespaces_available() -> str | None:
    try:
        check_available()
    except NetworkUnavailable as err:
        return str(err)
    return None


needs_namespaces = pytest.mark.skipif(_namespaces_available() is not None,
                                      reason=f"cannot make network namespaces here: "
                                             f"{_namespaces_available()}")


def _leftovers(owner: int) -> list[str]:
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    return [line for line in (names + links).splitlines() if f"hs{owner}-" in line]


TRANSFER = """
import os, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
x = torch.ones(10_000_000)
start = time.perf_counter()
if dist.get_rank() == 0:
    dist.send(x, 1)
else:
    dist.recv(x, 0)
    print(f"seconds {time.perf_counter() - start:.3f} sum {float(x.sum()):.0f}")
dist.barrier()
dist.destroy_process_group()
"""


@needs_namespaces
@pytest.mark.slow
def test_ten_million_floats_behind_100mbit_take_at_least_3_seconds():
    with LimitedNetwork(2, "100mbit") as net:
        env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": net.address(0),
               "MASTER_PORT": "29533", "GLOO_SOCKET_IFNAME": net.interface}
        procs = [subprocess.Popen(net.command(k, [sys.executable, "-c", TRANSFER]),
                                  env={**env, "RANK": str(k)}, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True) for k in (0, 1)]
        outputs = [p.communicate(timeout=120)[0] for p in procs]
        owner = net.owner
    assert [p.returncode for p in procs] == [0, 0], outputs
    line = next(line for line in outputs[1].splitlines() if line.startswith("seconds"))
    seconds, total = float(line.split()[1]), float(line.split()[3])
    assert total == 10_000_000  # it all arrived
    # 4e7 bytes = 3.2e8 bits: at most 100 Mbit/s allows 3.2 s
    assert seconds >= 3.0, f"10^7 floats took {seconds} s behind 100mbit"
    assert _leftovers(owner) == []


@needs_namespaces
def test_a_dead_launchers_namespaces_are_removed_by_the_next():
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    net = LimitedNetwork(1, "1gbit", owner=dead.pid)
    net._make()  # made, then left behind as by a killed launcher
    assert _leftovers(dead.pid)
    removed = remove_stale()
    assert f"hs{dead.pid}-0" in removed and _leftovers(dead.pid) == []


@needs_namespaces
@pytest.mark.slow
def test_ctrl_c_during_a_limited_launch_leaves_no_namespace_behind(tmp_path):
    launcher = subprocess.Popen(
        [sys.executable, "-m", "hetsync", "launch", "-m", "async", "--workers", "2", "--slowdowns", "1,1",
         "--bandwidth", "100mbit", "--time-budget", "60", "--log-dir", str(tmp_path),
         "--run-name", "limited", "--quiet", "--no-figures"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 90
    while not (tmp_path / "limited" / "worker-0.jsonl").exists():  # training has begun
        assert launcher.poll() is None, launcher.communicate()[0]
        assert time.monotonic() < deadline, "the limited run did not start training"
        time.sleep(0.5)
    assert _leftovers(launcher.pid)  # the hosts exist while it runs
    launcher.send_signal(signal.SIGINT)
    out = launcher.communicate(timeout=60)[0]
    assert "interrupted" in out
    assert _leftovers(launcher.pid) == []


def test_launch_says_clearly_when_it_cannot_limit(tmp_path, monkeypatch):
    from hetsync.config import Config
    from hetsync.runtime import launcher, network

    monkeypatch.setattr(network.os, "geteuid", lambda: 1000)
    cfg = Config(mode="sync", workers=2, bandwidth="100mbit", epochs=0.01, log_dir=str(tmp_path))
    with pytest.raises(launcher.LaunchError, match="--bandwidth 100mbit: emulated hosts need root"):
        launcher.launch(cfg, show_progress=False, figures=False)
