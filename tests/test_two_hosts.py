"""torchrun across two machines, made on this one (root only; skipped with the reason
elsewhere): two network namespaces joined by veth pairs to a bridge
(`runtime.network.LimitedNetwork`), the state server on the bridge's own address (a third
machine: ESync's planner, and the live page every worker posts to), the README's `torchrun
--nnodes 2` command on each host, each host's records in its own directory, gathered into one
(`hetsync gather`) — and its summary beside a one-host `hetsync launch` of the same size, both
on the virtual clock."""

import json
import os
import secrets
import subprocess
import sys
import time
import urllib.request

import pytest

from hetsync.runtime.network import LimitedNetwork, NetworkUnavailable, check_available
from hetsync.telemetry.summarize import summarize
from distributed import free_port


def _unavailable() -> str | None:
    try:
        check_available()
    except NetworkUnavailable as err:
        return str(err)
    return None


pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(_unavailable() is not None,
                                 reason=f"cannot make network namespaces here: {_unavailable()}")]

# on the virtual clock with one given step time, so that both runs model the same devices
# and links whatever else this machine is doing: their throughputs can be compared
BUDGET = "5"
COMMON = ["-n", "lenet", "--time-budget", BUDGET, "--eval-interval", "2.5", "--timeout", "60",
          "--batch-size", "64", "--clock", "virtual", "--step-work", "0.01"]


def _hetsync(*args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hetsync", *args], capture_output=True,
                          text=True, timeout=300, **kw)


def _two_hosts(tmp_path, mode: str, workers: int, *flags: str, spare: bool = False):
    """The run on two emulated hosts of 2 processes each; each host's run directory.
    `spare`: the last of `workers` is a spare (`--spare-workers 1`), started on host 1 with
    `hetsync worker --join` against torchrun's store once the run has begun."""
    env = {**os.environ, "HETSYNC_TOKEN": secrets.token_hex(8)}
    args = ["-m", mode, "--workers", str(workers), "--run-name", "exp", *COMMON, *flags]
    if spare:
        args += ["--spare-workers", "1"]
    server = joiner = None
    with LimitedNetwork(2, "10gbit") as net:
        env["GLOO_SOCKET_IFNAME"] = net.interface
        try:
            # on a third machine (the bridge's address): ESync's planner, and every mode's
            # live page, which the workers post to (--live-report)
            port = free_port()
            server = subprocess.Popen(
                [sys.executable, "-m", "hetsync", "state-server", "--host",
                 net.bridge_address, "--port", str(port), "--workers", str(workers)],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            args += ["-ip", net.bridge_address, "-port", str(port), "--live-report", "1"]
            master_port = str(free_port())
            hosts = [subprocess.Popen(net.command(k, [
                sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
                "--nproc-per-node", "2", "--node-rank", str(k), "--master-addr",
                net.address(0), "--master-port", master_port,
                "-m", "hetsync", "worker", *args, "-ld", str(tmp_path / f"host{k}")]),
                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                for k in (0, 1)]
            if spare:  # a machine that becomes free mid-run: rank `workers - 1`, on host 1
                records = tmp_path / "host0" / "exp" / "worker-0.jsonl"
                deadline = time.monotonic() + 120
                while not (records.exists() and records.read_text().count("\n") >= 5):
                    ended = [h.communicate()[0][:3000] for h in hosts if h.poll() is not None]
                    assert not ended and time.monotonic() < deadline, ended
                    time.sleep(0.2)
                joiner = subprocess.Popen(net.command(1, [
                    sys.executable, "-m", "hetsync", "worker", *args, "--join", "--run-dir",
                    str(tmp_path / "host1" / "exp")]), stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT, text=True,
                    env={**env, "RANK": str(workers - 1), "WORLD_SIZE": str(workers),
                         "LOCAL_RANK": "0", "MASTER_ADDR": net.address(0),
                         "MASTER_PORT": master_port, "TORCHELASTIC_USE_AGENT_STORE": "True",
                         "TORCHELASTIC_RESTART_COUNT": "0"})
            outputs = [host.communicate(timeout=300)[0] for host in hosts]
            if joiner is not None:
                outputs.append(joiner.communicate(timeout=120)[0])
                hosts.append(joiner)
            request = urllib.request.Request(
                f"http://{net.bridge_address}:{port}/live/data",
                headers={"Authorization": f"Bearer {env['HETSYNC_TOKEN']}"})
            live = json.loads(urllib.request.urlopen(request, timeout=10).read())
        finally:
            if server is not None:
                server.terminate()
                server.wait(timeout=10)
    for host, out in zip(hosts, outputs):
        assert host.returncode == 0, out[-3000:]
    return [tmp_path / f"host{k}" / "exp" for k in (0, 1)], live


# ESync: collectives across the hosts and the planner on a third; async: a parameter server
# on host 1 (sync's collectives are ESync's)
@pytest.mark.parametrize("mode,workers", [("esync", 4), ("async", 3)])
def test_two_hosts_gathered_summarise_as_one_host_of_the_same_size(tmp_path, mode, workers):
    (host0, host1), live = _two_hosts(tmp_path, mode, workers)
    # rank 0's machine's records alone: a warning naming the ranks whose records are on host 1
    alone = _hetsync("summarize", str(host0))
    assert alone.returncode == 0, alone.stderr
    elsewhere = "[2, 3]" if workers == 4 else "[2]"
    assert "with no records here" in alone.stderr and elsewhere in alone.stderr
    gathered = tmp_path / "gathered"
    out = _hetsync("gather", str(gathered), str(host0), str(host1))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "with no records here" not in out.stderr
    two = summarize(gathered)
    assert two["complete"] and two["missing_workers"] == []
    assert [w["rank"] for w in two["per_worker"]] == list(range(workers))
    assert {w["host"] for w in two["per_worker"]} == {
        json.loads((host0 / "run.json").read_text())["ranks"][0]["host"]}  # one machine
    # the state server's live page: every worker of both hosts, all their rounds
    assert (live["run"], live["mode"]) == ("exp", mode)
    assert [(w["rank"], w["rounds"]) for w in live["workers"]] == [
        (w["rank"], w["rounds"]) for w in two["per_worker"]]
    assert live["evaluated"]  # rank 0's deferred evaluations, posted at the end
    if mode == "esync":  # the state server's records, from rank 0 (no launcher here)
        assert json.loads((gathered / "service.json").read_text())["requests"] > 0
    if mode == "async":  # the parameter server's, from its own rank on host 1
        assert (gathered / "ps.jsonl").is_file()

    one = _hetsync("launch", "-m", mode, "--workers", str(workers), "--slowdowns",
                   ",".join(["1"] * workers), "--run-name", "one", "-ld", str(tmp_path),
                   "--no-figures", "--quiet", "--no-live", *COMMON)
    assert one.returncode == 0, one.stdout[-2000:] + one.stderr[-2000:]
    single = summarize(tmp_path / "one")
    ratio = two["throughput"] / single["throughput"]
    print(f"{mode}: two hosts {two['throughput']:.0f} samples/s, one host "
          f"{single['throughput']:.0f} samples/s, ratio {ratio:.2f}")
    # the same devices and links modelled: the same speed within the asynchronous modes' noise
    assert ratio == pytest.approx(1.0, rel=0.05), (two["throughput"], single["throughput"])


def test_a_worker_that_was_never_part_of_the_run_joins_a_running_two_host_torchrun_job(
        tmp_path):
    """esync-outer, 5 workers, the last a spare: torchrun starts the first four on two hosts;
    once they train, `hetsync worker --join` starts the fifth on host 1 against torchrun's
    store. It is admitted at a round's end, trains to the end, draws its shard from where the
    member that held it meanwhile got to (no batch twice or skipped), and is in the records
    and on the live page."""
    # (spares start by the wall clock: each step topped up to the given step work; 30 s: the
    # joiner imports torch beside four busy workers on two cores, and CI saw it admitted with
    # one round left of 20 s)
    (host0, host1), live = _two_hosts(tmp_path, "esync-outer", 5, "--clock", "wall",
                                      "--time-budget", "30", spare=True)
    gathered = tmp_path / "gathered"
    out = _hetsync("gather", str(gathered), str(host0), str(host1))
    assert out.returncode == 0, out.stdout + out.stderr
    joined = [json.loads(line) for line in (host1 / "events.jsonl").read_text().splitlines()
              if json.loads(line)["event"] == "joined"]
    assert [e["rank"] for e in joined] == [4], joined
    summary = summarize(gathered)
    assert summary["complete"] and [w["rank"] for w in summary["per_worker"]] == [0, 1, 2, 3, 4]
    spare = next(w for w in summary["per_worker"] if w["rank"] == 4)
    assert spare["rounds"] > 5, spare
    ledger = summary["ledger"]
    assert ledger["batches_twice"] == ledger["batches_skipped"] == 0, ledger
    assert ledger["per_worker"]["4"]["drawn_by"] == [0, 4], ledger  # (holder(4, [0..3]))
    assert [w["rank"] for w in live["workers"]] == [0, 1, 2, 3, 4]
