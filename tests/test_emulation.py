"""Fitting emulated devices into the cores: the demand rule, the scale, the placement, and
what `hetsync launch` says about them (pure rules; no timings)."""

import json
import subprocess
import sys

import pytest

from hetsync.cli import build_parser, launch_config
from hetsync.config import Config
from hetsync.options import ConfigError
from hetsync.runtime import emulation as em
from hetsync.telemetry.summarize import emulation_warnings


def test_demand_is_the_cores_the_devices_compute_on():
    assert em.demand((1, 2, 4, 8)) == pytest.approx(1.875)
    assert em.demand((1, 2, 4, 8), threads=2) == pytest.approx(3.75)
    assert em.demand(()) == 0


def test_budget_leaves_a_core_and_headroom():
    assert em.budget(2) == pytest.approx(0.75)     # 0.75 x (2 - 1)
    assert em.budget(1) == pytest.approx(0.375)    # half of one core alone
    assert em.budget(16) == pytest.approx(11.25)


def test_a_cluster_that_does_not_fit_is_slowed_by_one_factor():
    fitted = em.fit((1, 2, 4, 8), cores=2)
    assert fitted.scale == pytest.approx(1.875 / 0.75)
    assert fitted.scaled == pytest.approx((2.5, 5, 10, 20))  # relative speeds kept
    assert em.demand(fitted.scaled) == pytest.approx(fitted.budget)
    assert "2.5x slower" in fitted.describe() and "1.88 core(s)" in fitted.describe()
    fits = em.fit((4, 8), cores=2)  # 0.375 cores of 0.75
    assert fits.scale == 1 and "they fit" in fits.describe()
    assert em.fit((1, 2, 4, 8), cores=8).scale == 1  # 1.875 of 5.25


def test_oversubscribing_keeps_the_slowdowns_and_says_so():
    kept = em.fit((1, 2, 4, 8), cores=2, oversubscribe=True)
    assert kept.scale == 1 and kept.oversubscribed
    assert "--oversubscribe 1" in kept.describe() and "will not hold" in kept.describe()


def test_a_fit_beyond_the_slowest_allowed_device_is_refused_naming_the_flags():
    with pytest.raises(ConfigError, match="--slowdowns/--cores") as err:
        em.fit((1.0,) * 4 + (500.0,), cores=2)  # scale 5.3: the slowest 2667x slower
    assert "--oversubscribe 1" in str(err.value)


def test_the_fastest_devices_get_cores_of_their_own():
    # 1,2,4,8 scaled to 2.5: the fastest alone on core 0, the rest share core 1
    devices, shared = em.placement((2.5, 5, 10, 20), 1, [0, 1])
    assert devices == [[0], [1], [1], [1]] and shared == [1]
    # equal fast devices: each its own core while one is left for the rest
    devices, shared = em.placement((1, 1, 1, 1), 1, [0, 1, 2, 3])
    assert devices[:3] == [[0], [1], [2]] and devices[3] == [3] and shared == [3]
    # devices slow enough to wait twice their work share
    devices, shared = em.placement((3, 4), 1, [0, 1])
    assert devices == [[0, 1], [0, 1]] and shared == [0, 1]
    # ranks in any order: the fastest first; two threads take two cores
    devices, shared = em.placement((8, 1), 2, [0, 1, 2, 3])
    assert devices == [[2, 3], [0, 1]] and shared == [2, 3]
    assert em.placement((1, 2), 1, [5]) == ([[5], [5]], [5])  # one core: nothing to place


def test_launch_names_each_process_its_cores():
    cfg = Config(workers=4, slowdowns=(1, 2, 4, 8), speed_scale=2.5, cores=2)
    cores = em.affinities(cfg)
    if len(em.usable_cores(2)) < 2:
        assert cores == {}
        return
    first, second = em.usable_cores(2)
    assert cores["rank-0"] == [first]
    assert cores["rank-3"] == cores["evaluator"] == cores["state-server"] == [second]
    assert em.affinities(Config(workers=2, slowdowns=())) == {}  # no emulated devices


def test_nominal_speed_is_samples_per_emulated_step():
    assert em.nominal_speed(64, 2.5, 0.005) == pytest.approx(5120)
    assert em.nominal_speed(64, 2.5, None) is None


def test_a_given_reference_step_is_per_batch_and_says_the_speeds_it_gives():
    # --step-work is the time of one step on -b samples: the same 6 ms at -b 96 is a device
    # 1.5x faster than at -b 64, and the line says so rather than leaving it to the reader
    speeds = {}
    for batch in (64, 96):
        cfg = Config(workers=2, slowdowns=(1.0, 2.0), batch_size=batch, step_work=0.006)
        same, line = em.with_reference_step(cfg, split=None)  # given: nothing is measured
        assert same.step_work == 0.006
        assert line.startswith(f"reference step: 6.00 ms of lenet at batch {batch}, given")
        speeds[batch] = line.split("nominal speeds ")[1]
    assert speeds == {64: "10,667 / 5,333 samples per second of computing",
                      96: "16,000 / 8,000 samples per second of computing"}
    # balanced batches: the slower device's batch of 32 takes half the reference's work
    balanced = Config(workers=2, slowdowns=(1.0, 2.0), batch_size=64, step_work=0.006,
                      balanced_batches=True)
    _, line = em.with_reference_step(balanced, split=None)
    assert line.endswith("nominal speeds 10,667 / 5,333 samples per second of computing")
    assert em.with_reference_step(Config(), split=None) == (Config(), None)  # no emulation
    assert same.resolved == {}  # (given, not resolved)


def test_a_measured_reference_step_is_recorded_as_resolved_not_asked():
    cfg = Config(dataset="synthetic", network="mlp", workers=2, slowdowns=(1.0, 2.0))
    measured, line = em.with_reference_step(cfg, cfg.load_data())
    assert measured.step_work > 0 and "measured here" in line
    assert measured.resolved["step_work"]["asked"] is None
    assert "median step of mlp at batch 64" in measured.resolved["step_work"]["how"]


def _launch(*argv):
    return launch_config(build_parser().parse_args(["launch", *argv]))


def test_launch_fits_its_cluster_into_the_cores_it_is_given():
    cfg, fitted = _launch("--slowdowns", "1,2,4,8", "--cores", "2")
    assert cfg.speed_scale == pytest.approx(2.5) and fitted.scale == pytest.approx(2.5)
    assert cfg.slowdown_of(0) == pytest.approx(2.5) and cfg.slowdowns == (1, 2, 4, 8)
    # what launch chose is recorded beside what was asked (the default), and why
    assert cfg.resolved["speed_scale"] == {"asked": 1.0, "how": fitted.describe()}
    assert Config.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    cfg, fitted = _launch("--slowdowns", "1,2,4,8", "--cores", "2", "--oversubscribe", "1")
    assert cfg.speed_scale == 1 and fitted.oversubscribed
    # -m local: the whole cluster is fitted, then its fastest device runs alone
    cfg, _ = _launch("-m", "local", "--cores", "2")
    assert cfg.workers == 1 and cfg.slowdown_of(0) == pytest.approx(2.5)
    # a scale the user gave is kept, and refused where the devices would not fit
    cfg, fitted = _launch("--slowdowns", "1,2,4,8", "--cores", "2", "--speed-scale", "3")
    assert cfg.speed_scale == 3 and fitted is None and cfg.resolved == {}
    with pytest.raises(ConfigError, match="--speed-scale: invalid value 2; .* at least 2.5"):
        _launch("--slowdowns", "1,2,4,8", "--cores", "2", "--speed-scale", "2")


def test_launch_prints_the_scaling_or_the_refusal_in_one_line(tmp_path):
    cmd = [sys.executable, "-m", "hetsync", "launch", "--slowdowns", "1,2,4,8", "--cores", "2",
           "--speed-scale", "1.5", "-ld", str(tmp_path)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert "--speed-scale: invalid value 1.5" in line and "--oversubscribe 1" in line
    assert not list(tmp_path.iterdir())  # nothing started


def test_summarize_warns_of_a_device_below_its_nominal_speed():
    workers = [{"rank": 0, "slowdown": 2.5, "isolated_throughput": 4800.0,
                "nominal_speed": 5000.0, "speed_of_nominal": 0.96},
               {"rank": 1, "slowdown": 5.0, "isolated_throughput": 2000.0,
                "nominal_speed": 2500.0, "speed_of_nominal": 0.8},
               {"rank": 2, "slowdown": 1.0, "isolated_throughput": 9000.0,
                "nominal_speed": None, "speed_of_nominal": None}]
    (line,) = emulation_warnings(workers)
    assert line.startswith("rank 1 (slowdown 5) ran at 80% of its nominal speed")
