"""Cluster profiles (`hetsync.clock.profile`): what a device and a link cost, read from a file
that `hetsync probe` writes or a user writes by hand, and a virtual run timed by one."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from hetsync.clock import Link, VirtualClock
from hetsync.clock.profile import ClusterProfile, Device, ProfileError, load, parse
from hetsync.config import Config
from hetsync.options import ConfigError
from hetsync.runtime.heterogeneity import StepTimer
from hetsync.runtime.launcher import launch

#: a fast device (6 ms for 64 samples, a third of it fixed) and two of a slow one
TWO_KINDS = {"format": "hetsync-profile", "version": 1, "source": "a test",
             "devices": [{"name": "fast", "step_s": 0.002, "sample_s": 6.25e-5,
                          "alone": {"step_s": 0.001, "sample_s": 5e-5}},
                         {"name": "slow", "count": 2, "step_s": 0.004, "sample_s": 2.5e-4,
                          "link": {"latency_s": 1e-4, "bandwidth_bps": 1e9}}],
             "link": {"latency_s": 2e-5, "bandwidth_bps": 1e10}}


def _file(tmp_path: Path, data) -> str:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_a_profile_gives_each_device_its_time_and_prices_messages_on_the_slowest_link(tmp_path):
    profile = load(_file(tmp_path, TWO_KINDS))
    assert [d.name for d in profile.devices] == ["fast", "slow", "slow"]
    assert profile.devices[0].seconds(64) == pytest.approx(0.006)
    assert profile.devices[0].by_itself().seconds(64) == pytest.approx(0.0042)  # alone
    assert profile.devices[1].seconds(16) == pytest.approx(0.008)
    assert profile.devices[1].by_itself() == profile.devices[1]  # (the same alone)
    assert profile.slowdowns(64) == pytest.approx((1.0, 0.02 / 0.006, 0.02 / 0.006))
    assert profile.slowest_link == Link(1e-4, 1e9)
    again = tmp_path / "again.json"
    profile.save(again)  # what is saved reads back the same
    assert load(again) == profile


@pytest.mark.parametrize("change,needle", [
    ({"devices": []}, "devices: expected a non-empty list"),
    ({"devices": [{"step_s": 0.1}]}, "devices[0]: missing ['sample_s']"),
    ({"devices": [{"step_s": -1, "sample_s": 0}]}, "devices[0].step_s: invalid value -1"),
    ({"devices": [{"step_s": 0, "sample_s": 0}]}, "both 0"),
    ({"devices": [{"step_s": 0.1, "sample_s": 0, "count": 0}]}, "devices[0].count"),
    ({"devices": [{"step_s": 0.1, "sample_s": 0, "speed": 3}]}, "unknown key(s) ['speed']"),
    ({"devices": [{"step_s": 0.1, "sample_s": 0, "alone": {"step_s": 0.1}}]},
     "devices[0].alone: missing ['sample_s']"),
    ({"devices": [{"step_s": 0.1, "sample_s": 0, "alone": {"step_s": 0, "sample_s": 0}}]},
     "devices[0].alone: step_s and sample_s are both 0"),
    ({"link": {"bandwidth_bps": 0}}, "link.bandwidth_bps: invalid value 0; expected a number > 0"),
    ({"jitter": {"distribution": "uniform"}}, "expected one of lognormal, half-normal"),
    ({"version": 2}, "this hetsync reads version 1"),
    ({"gpus": 4}, "unknown key(s) ['gpus']"),
])
def test_a_bad_profile_is_one_line_naming_the_key(change, needle):
    with pytest.raises(ProfileError) as err:
        parse({**TWO_KINDS, **change})
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_a_profiles_config_has_its_devices_and_a_steps_fixed_part_does_not_scale(tmp_path):
    cfg = Config(profile=_file(tmp_path, TWO_KINDS), balanced_batches=True,
                 mode="sync").with_profile(given={"profile"})
    assert (cfg.clock, cfg.workers, cfg.step_work) == ("virtual", 3, pytest.approx(0.006))
    assert cfg.link_latency == 1e-4 and cfg.link_bandwidth == "1gbit"
    # balanced with the fixed parts: the slow device's 8 samples take the fast one's 6 ms
    # for 64 (4 ms + 8 x 0.25 ms; in proportion to the times of 64, 19: 8.75 ms)
    assert [cfg.batch_of(r) for r in range(3)] == [64, 8, 8]
    # each device's step of its own batch costs what the profile says, whatever the batch
    for rank, device in enumerate(load(cfg.profile).devices):
        timer = StepTimer(cfg.slowdown_of(rank), work=cfg.step_work_of(rank),
                          clock=VirtualClock(), fixed=cfg.step_overhead_of(rank))
        assert timer.virtual_seconds() == pytest.approx(device.seconds(cfg.batch_of(rank)))
        assert timer.virtual_seconds(0.5) == pytest.approx(
            device.step_s + device.sample_s * cfg.batch_of(rank) / 2)
    alone = cfg.fastest_devices(1)  # the bench's reference: the fast device as it was
    assert (alone.workers, alone.slowdowns, alone.step_overheads) == (1, (1.0,), (0.002,))
    given = Config(profile=cfg.profile, link_bandwidth="100mbit").with_profile(
        given={"profile", "link_bandwidth"})
    assert given.link_bandwidth == "100mbit"  # a link flag given outweighs the profile's


@pytest.mark.parametrize("given,needle", [
    ({"workers": 4}, "--workers: invalid value 4; expected 3 (the devices of --profile"),
    ({"slowdowns": (1.0, 2.0, 2.0)}, "--slowdowns: invalid value"),
    ({"clock": "wall"}, "--clock: invalid value 'wall'; expected virtual with --profile"),
    ({"network": "resnet18", "dataset": "cifar10"},
     "its devices were timed on lenet, and this run trains -n resnet18"),
])
def test_flags_a_profile_decides_are_refused_beside_it(tmp_path, given, needle):
    with pytest.raises(ConfigError) as err:
        Config(profile=_file(tmp_path, {**TWO_KINDS, "model": "lenet"}), **given).with_profile(
            given={"profile", *given})
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_a_missing_profile_is_one_line_from_the_command_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "hetsync", "launch", "--profile",
                           str(tmp_path / "nowhere.json")], capture_output=True, text=True)
    assert done.returncode != 0
    lines = (done.stderr or done.stdout).strip().splitlines()
    assert len(lines) == 1 and "--profile:" in lines[0] and "nowhere.json" in lines[0], lines


def test_a_virtual_run_on_a_profile_spends_each_devices_time_on_each_step(tmp_path):
    profile = _file(tmp_path, {**TWO_KINDS, "jitter": {"distribution": "half-normal",
                                                       "sigma": 0.2}})
    cfg = Config(mode="sync", profile=profile, time_budget=0.6, epochs=None, eval_interval=0.3,
                 log_dir=str(tmp_path), run_name="profiled", seed=1).with_profile({"profile"})
    run_dir = launch(cfg, show_progress=False, figures=False, stream=open(os.devnull, "w"))
    run = json.loads((run_dir / "run.json").read_text())
    assert run["clock"]["profile"] == profile
    for rank, device in enumerate(load(profile).devices):
        records = [json.loads(line) for line in
                   (run_dir / f"worker-{rank}.jsonl").read_text().splitlines()]
        assert len(records) >= 10
        steps = [r["compute_s"] for r in records]
        # half-normal jitter: never faster than the device, slower on average by σ√(2/π)
        assert min(steps) >= device.seconds(64) - 1e-12
        mean = sum(steps) / len(steps)
        assert device.seconds(64) * 1.05 < mean < device.seconds(64) * 1.35


# ----------------------------------------------------------------------------- hetsync probe
def test_the_probes_fits_recover_a_known_device_and_link():
    from hetsync.bench.probe import fit_device, fit_pair, fit_ring

    device = Device("d", 0.002, 5e-5)
    assert fit_device([16, 32, 64], [device.seconds(b) for b in (16, 32, 64)]) == \
        pytest.approx((0.002, 5e-5))
    assert fit_device([16, 64], [0.01, 0.009]) == pytest.approx((0.0095, 0.0))  # no slope
    # a line that would cross 0 goes through it: least squares through the origin
    assert fit_device([16, 64], [0.001, 0.008]) == pytest.approx(
        (0.0, (16 * 0.001 + 64 * 0.008) / (16 ** 2 + 64 ** 2)))
    link, sizes = Link(3e-5, 4e9), (64, 4 << 20)
    from hetsync.clock import all_reduce_seconds

    ring = fit_ring(sizes, [all_reduce_seconds("ring", 4, s, link) for s in sizes], 4)
    assert ring.latency_s == pytest.approx(3e-5) and ring.bandwidth_bps == pytest.approx(4e9)
    pair = fit_pair(sizes, [link.message_seconds(s) for s in sizes])
    assert pair.latency_s == pytest.approx(3e-5) and pair.bandwidth_bps == pytest.approx(4e9)


def test_probe_measures_emulated_devices_into_a_profile_a_virtual_run_takes(tmp_path):
    out = tmp_path / "probed.json"
    done = subprocess.run([sys.executable, "-m", "hetsync", "probe", "--workers", "2",
                           "--slowdowns", "1,10", "--batch-sizes", "8,32", "--seconds", "0.5",
                           "-o", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "rank 1:" in done.stdout and f"wrote {out}" in done.stdout
    profile = load(out)
    fast, slow = profile.devices
    # the slow device sleeps its steps up to 10x the reference step; a busy machine stretches
    # the fast one's real steps (2-3x beside a CPU-heavy neighbour here; 9x beside the suite
    # and two virtual runs, where the ratio measured 1.65)
    assert slow.seconds(32) / fast.seconds(32) > 1.5
    assert profile.link.bandwidth_bps > 0 and "measured by hetsync probe" in profile.source
    assert profile.model == "lenet"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["probed.json"]  # nothing else left
    cfg = Config(mode="sync", profile=str(out), time_budget=0.3, epochs=None,
                 eval_interval=0.3, log_dir=str(tmp_path / "runs"),
                 run_name="on-probed").with_profile({"profile"})
    run_dir = launch(cfg, show_progress=False, figures=False, stream=open(os.devnull, "w"))
    assert json.loads((run_dir / "run.json").read_text())["train_time"] >= 0.3


USER_MODEL = """
import torch.nn as nn


def make(input_shape, num_classes):
    c, h, w = input_shape
    return nn.Sequential(nn.Flatten(), nn.Linear(c * h * w, 32), nn.ReLU(),
                         nn.Linear(32, num_classes))
"""


def test_probe_measures_the_users_own_model_and_a_virtual_run_trains_it(tmp_path, monkeypatch):
    """`-n MODULE:FACTORY`: the user's own nn.Module factory, imported by every process."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "usernet.py").write_text(USER_MODEL)
    out = tmp_path / "probed.json"
    done = subprocess.run([sys.executable, "-m", "hetsync", "probe", "--workers", "2",
                           "-n", "usernet:make", "--batch-sizes", "8,32", "--seconds", "0.3",
                           "-o", str(out)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(code)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usernet:make on fashion-mnist" in done.stdout
    profile = load(out)
    assert profile.model == "usernet:make" and len(profile.devices) == 2
    # the two ranks share this host: each was timed alone too, in turn
    assert "share a host: each timed again alone" in done.stdout
    assert all(d.alone is not None and d.by_itself().seconds(32) > 0 for d in profile.devices)
    monkeypatch.syspath_prepend(str(code))  # (launch's processes take this sys.path)
    cfg = Config(mode="sync", network="usernet:make", profile=str(out), time_budget=0.5,
                 epochs=None, eval_interval=0.5, log_dir=str(tmp_path / "runs"),
                 run_name="mine").with_profile({"profile"})
    run_dir = launch(cfg, show_progress=False, figures=False, stream=open(os.devnull, "w"))
    evals = [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines()]
    assert evals[-1]["test_acc"] > 0.5  # (10 classes: it learnt)


@pytest.mark.parametrize("argv,needle", [
    (["--slowdowns", "1,2"], "--slowdowns: invalid value 1.0,2.0; expected 1 factors"),
    (["--batch-sizes", "0,8"], "--batch-sizes: invalid value '0,8'"),
    (["-n", "nonet"], "-n/--network: invalid value 'nonet'"),
    (["-n", "nosuchmodule:make"], "-n/--network: model 'nosuchmodule:make': cannot import "
                                  "module 'nosuchmodule'"),
    (["-n", "json:no_such_factory"], "module 'json' has no function 'no_such_factory'"),
    (["-o", "/no/such/folder/p.json"], "-o/--out: invalid value"),
])
def test_probes_bad_flags_are_one_line(argv, needle):
    done = subprocess.run([sys.executable, "-m", "hetsync", "probe", *argv],
                          capture_output=True, text=True, timeout=120)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and needle in lines[0], done.stderr


# ----------------------------------------------------------------------------- hetsync advise
def test_advise_tries_all_devices_then_cuts_where_speeds_differ():
    from hetsync.bench.advise import Candidate, capacity, fastest_of, rank, subsets

    profile = parse({"devices": [{"step_s": 0, "sample_s": s, "count": c} for s, c in
                                 ((1e-4, 2), (1.02e-4, 1), (4e-4, 3), (8e-4, 1))]})
    # 7 devices: cuts after the 3 near-equal fast ones and after the 3 of speed 1/4
    assert subsets(profile, 64, most=3) == [7, 6, 3]
    assert subsets(profile, 64, most=1) == [7]
    three = fastest_of(profile, 3, 64)
    assert [d.sample_s for d in three.devices] == [1e-4, 1e-4, 1.02e-4]
    assert capacity(three, 64) == pytest.approx(2 + 1 / 1.02)
    c = lambda name, tta, final: Candidate(name, 2, 0.1, None, tta, final, 2.0)  # noqa: E731
    ranked = rank([c("late", 9.0, 0.9), c("missed", None, 0.89), c("soon", 3.0, 0.86),
                   c("missed-worse", None, 0.8)], higher_is_better=True)
    assert [x.scheme for x in ranked] == ["soon", "late", "missed", "missed-worse"]


@pytest.mark.slow
def test_advise_ranks_schemes_and_the_fastest_device_and_writes_the_winners_settings(tmp_path):
    profile = _file(tmp_path, {"devices": [{"name": "fast", "step_s": 0, "sample_s": 1e-4,
                                            "alone": {"step_s": 0, "sample_s": 0.8e-4}},
                                           {"name": "slow", "step_s": 0, "sample_s": 3e-4}]})
    out = tmp_path / "advice"
    done = subprocess.run([sys.executable, "-m", "hetsync", "advise", profile, "--budget", "1",
                           "--modes", "sync", "--reference", "sgd", "--subsets", "1",
                           "--target", "0.6", "-o", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    advice = json.loads((out / "advice.json").read_text())
    schemes = {(c["scheme"], c["devices"]) for c in advice["ranked"]}
    assert schemes == {("sync", 2), ("fastest device alone, sgd", 1)}
    alone = next(c for c in advice["ranked"] if c["devices"] == 1)
    assert alone["tta"] is not None and alone["vs_fastest"] == pytest.approx(1.0)
    # the device alone trains at its speed alone on its host, the pair at theirs together
    assert [d.sample_s for d in load(out / "profiles" / "fastest-alone.json").devices] == \
        [0.8e-4]
    assert [d.sample_s for d in load(out / "profiles" / "fastest-2.json").devices] == \
        [1e-4, 3e-4]
    winner = advice["ranked"][0]
    assert winner["tta"] == min(c["tta"] for c in advice["ranked"] if c["tta"] is not None)
    from hetsync.cli import build_parser

    commands = [line.split(" -m hetsync ", 1)[-1].removeprefix("hetsync ")
                for line in advice["settings"] if "hetsync " in line and "wrap(" not in line]
    assert commands
    for command in commands:  # the winner's settings run as written: every flag is valid
        build_parser().parse_args(shlex.split(command))
    assert (out / "figures" / "accuracy.png").is_file() and "advice:" in done.stdout


def test_advise_refuses_a_bad_profile_in_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "hetsync", "advise",
                           _file(tmp_path, {"devices": []}), "-o", str(tmp_path / "a")],
                          capture_output=True, text=True, timeout=120)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "devices: expected a non-empty" in \
        lines[0], done.stderr


# ------------------------------------------------------- balanced batches from measured speeds
def test_balanced_batches_follow_measured_speeds_and_the_sums_count_samples():
    cfg = Config(workers=3, balanced_batches=True, mode="sync", batch_size=64,
                 device_speeds=(1.0, 0.5, 0.26))
    assert [cfg.batch_of(r) for r in range(3)] == [64, 32, 16]
    weights = [cfg.sample_weight_of(r) for r in range(3)]
    assert weights == pytest.approx([3 * 64 / 112, 3 * 32 / 112, 3 * 16 / 112])
    assert Config.from_dict(cfg.to_dict()).device_speeds == cfg.device_speeds


def test_a_run_on_real_devices_measures_their_speeds_for_its_balanced_batches(tmp_path):
    """Two workers on this machine's CPU (no --slowdowns): each times its own steps, the
    speeds are shared, the batches follow them, and run.json records them."""
    # (not re-planned as the speeds drift: every step draws the batch measured at the start)
    cfg = Config(mode="sync", workers=2, balanced_batches=True, time_budget=2.0, epochs=None,
                 eval_interval=2.0, log_dir=str(tmp_path), run_name="measured", timeout=120,
                 replan_drift=0)
    run_dir = launch(cfg, show_progress=False, figures=False, stream=open(os.devnull, "w"))
    saved = json.loads((run_dir / "run.json").read_text())["config"]
    speeds = saved["device_speeds"]
    assert len(speeds) == 2 and max(speeds) == 1.0 and all(0 < s <= 1 for s in speeds)
    measured = Config.from_dict(saved)
    for rank in range(2):
        records = [json.loads(line) for line in
                   (run_dir / f"worker-{rank}.jsonl").read_text().splitlines()]
        # every step of a worker drew its measured batch
        assert {r["samples"] // r["local_steps"] for r in records[1:]} == {
            measured.batch_of(rank)}


def test_advise_says_so_when_no_candidate_completed(tmp_path):
    import argparse
    import io

    from hetsync.bench.advise import report
    from hetsync.telemetry.metric import metric_of

    profile = parse({"devices": [{"step_s": 0, "sample_s": 1e-4, "count": 2}]})
    failed = {"label": "sync", "kind": "mode", "lr": 0.1, "run_dir": None, "summary": None,
              "error": "rank-1 exited with code 1\nits log ends with: boom"}
    args = argparse.Namespace(target=0.85, batch_size=64, out=str(tmp_path))
    out = io.StringIO()
    assert report(args, profile, {2: {"runs": [failed]}}, metric_of("fashion-mnist"), out) == 1
    assert "no candidate completed a run" in out.getvalue()
    assert "rank-1 exited with code 1" in out.getvalue()
    assert not (tmp_path / "advice.md").exists()  # no advice written from nothing
