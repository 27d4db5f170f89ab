"""The all-reduce benchmark harness: bus-bandwidth arithmetic, argument checks, one tiny run."""

from __future__ import annotations

import json
import time

import pytest

from hetsync.bench import comm as bench


def test_bus_bandwidth_is_the_nccl_tests_convention():
    # 4 ranks, 40 MB in 0.1 s: algbw 0.4 GB/s, busbw = algbw * 2 * 3 / 4
    assert bench.bus_bandwidth(40_000_000, 0.1, 4) == pytest.approx(0.6e9)
    assert bench.bus_bandwidth(8, 1.0, 2) == pytest.approx(8.0)
    with pytest.raises(ValueError, match="seconds"):
        bench.bus_bandwidth(8, 0.0, 2)


@pytest.mark.parametrize("kwargs,needle", [
    ({"world_sizes": (1,)}, "world sizes"),
    ({"sizes": (0,)}, "sizes"),
    ({"algorithms": ("ps",)}, "'ps'"),
    ({"algorithms": ("nope",)}, "'nope'"),
    ({"repeats": 0}, "repeats"),
    ({"step": -0.001}, r"step must be in \[0, 1\] seconds"),
    ({"work": (0.001,)}, "work needs a step > 0"),
    ({"step": 0.002, "work": (0.003,)}, r"work must be in \[0, step = 0.002\] seconds"),
    ({"world_sizes": (2,), "step": 0.01, "work": (0.001, 0.002, 0.003)}, "one per rank, got 3"),
    ({"world_sizes": (2, 4), "step": 0.01, "work": (0.001, 0.002)}, "the world sizes differ"),
    ({"step": 0.5, "timeout": 10.0}, "past the bench's 10 s"),
])
def test_bad_arguments_are_named(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        bench.run_comm_bench(**kwargs)


def test_main_runs_prints_a_table_and_writes_json(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert bench.main(["--world-sizes", "2", "--sizes", "1e2,3000", "--algorithms",
                       "ring,butterfly", "--repeats", "2", "--warmup", "1",
                       "--json", str(out)]) == 0
    table = capsys.readouterr().out
    assert "| P | floats |" in table and "busbw / native" in table
    rows = json.loads(out.read_text())
    assert [(r["numel"], r["algorithm"]) for r in rows] == [
        (100, "ring"), (100, "butterfly"), (3000, "ring"), (3000, "butterfly")]
    for r in rows:
        assert r["world_size"] == 2 and r["bytes"] == 4 * r["numel"] and r["verified"]
        assert r["repeats"] == 2 and r["min_s"] <= r["latency_s"] <= r["max_s"]
        assert r["busbw_GBps"] == pytest.approx(
            bench.bus_bandwidth(r["bytes"], r["latency_s"], 2) / 1e9)
        assert r["busbw_ratio"] == pytest.approx(r["busbw_GBps"] / r["native_busbw_GBps"])


def test_sums_after_emulated_steps_are_timed_and_checked():
    """`--step-ms`: each sum after every rank's step (its CPU work, then a sleep to the step's
    end) instead of a barrier; the result is still checked against gloo's all-reduce."""
    rows = bench.run_comm_bench(world_sizes=(2,), sizes=(1000,), algorithms=("star",),
                                repeats=3, warmup=1, step=0.004, work=(0.002, 0.0005))
    assert [(r["algorithm"], r["step_s"], r["work_s"]) for r in rows] == [
        ("star", 0.004, [0.002, 0.0005])]
    assert rows[0]["verified"] and 0 < rows[0]["min_s"] <= rows[0]["latency_s"]
    assert rows[0]["late_s"] >= 0  # every rank slept to its step's end before the sum


def test_a_steps_work_is_that_much_cpu_time():
    start = time.thread_time()
    bench._compute(0.02)
    assert time.thread_time() - start >= 0.02
