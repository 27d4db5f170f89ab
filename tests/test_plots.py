"""plots: the figures are written as real PNGs; the timeline's window and segments are exact."""

from __future__ import annotations

import struct
import warnings
from pathlib import Path

import pytest

from hetsync.telemetry.plots import PlotWarning, plot_run, plot_runs, timeline_segments, timeline_window
from test_summarize import EVALS, worker_records, write_run

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) of a PNG, after checking its signature and IHDR chunk."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def assert_sensible_png(path: Path) -> None:
    assert path.is_file() and path.stat().st_size > 5000, f"{path} missing or nearly empty"
    width, height = png_size(path)
    assert 400 <= width <= 3000 and 250 <= height <= 3000, (path, width, height)


def scaled_evals(factor: float) -> list[dict]:
    return [dict(e, train_time=e["train_time"] * factor, t=e["t"] * factor) for e in EVALS]


@pytest.fixture
def runs(tmp_path: Path) -> dict[str, Path]:
    return {
        "sync": write_run(tmp_path / "sync", mode="sync", evals=scaled_evals(3.0)),
        "esync": write_run(tmp_path / "esync", mode="esync", service=dict(bytes_sent=400)),
        "async": write_run(tmp_path / "async", mode="async", evals=scaled_evals(2.0),
                           ps=[dict(t=8.0, bytes_sent=4000, bytes_recv=4000)]),
        "local": write_run(tmp_path / "local", mode="local", workers={0: worker_records(0)},
                           slowdowns=[1.0], evals=scaled_evals(1.5)),
    }


def test_plot_runs_writes_every_figure(runs, tmp_path):
    out = tmp_path / "figures"
    with warnings.catch_warnings():
        warnings.simplefilter("error", PlotWarning)  # a sync run that reached 0.8: nothing skipped
        paths = plot_runs([runs["sync"], runs["esync"], runs["async"]], out, sequential=runs["local"])
    assert [p.name for p in paths] == [
        "accuracy.png", "throughput.png", "traffic.png", "computing_time_ratio.png", "speedup.png",
        "timeline-sync.png", "timeline-esync.png", "timeline-async.png",
    ]
    assert all(p.parent == out for p in paths)
    for p in paths:
        assert_sensible_png(p)


def test_speedup_skipped_without_sync_run(runs, tmp_path):
    with pytest.warns(PlotWarning, match="no run with mode 'sync'"):
        paths = plot_runs([runs["esync"], runs["async"]], tmp_path / "f")
    names = [p.name for p in paths]
    assert "speedup.png" not in names and "accuracy.png" in names
    assert not (tmp_path / "f" / "speedup.png").exists()


def test_speedup_skipped_when_sync_never_reached_target(runs, tmp_path):
    with pytest.warns(PlotWarning, match="never reached test accuracy 0.9"):
        paths = plot_runs([runs["sync"], runs["esync"]], tmp_path / "f", target=0.9)
    assert "speedup.png" not in [p.name for p in paths]


def test_labels_name_the_timelines(runs, tmp_path):
    paths = plot_runs([runs["sync"], runs["esync"]], tmp_path / "f", labels=["SSGD", "ESync ε=0.5 s"])
    assert {p.name for p in paths if p.name.startswith("timeline")} == {
        "timeline-SSGD.png", "timeline-ESync_0.5_s.png"}
    with pytest.raises(ValueError, match="labels has 1 entries for 2 run directories"):
        plot_runs([runs["sync"], runs["esync"]], tmp_path / "g", labels=["one"])


def test_runs_sharing_a_mode_get_distinct_labels(runs, tmp_path):
    other = write_run(tmp_path / "esync-b", mode="esync")
    with pytest.warns(PlotWarning):
        paths = plot_runs([runs["esync"], other], tmp_path / "f")
    assert {p.name for p in paths if p.name.startswith("timeline")} == {
        "timeline-esync_esync.png", "timeline-esync_esync-b.png"}


def test_plot_run_for_one_run(runs, tmp_path):
    paths = plot_run(runs["esync"], tmp_path / "one")
    assert [p.name for p in paths] == ["accuracy.png", "computing_time_ratio.png", "timeline-esync.png"]
    for p in paths:
        assert_sensible_png(p)
    assert plot_run(runs["sync"])[0].parent == runs["sync"]  # default: into the run directory


def test_run_without_evaluations_still_plots(tmp_path):
    run_dir = write_run(tmp_path / "r", mode="sync", evals=[])
    for p in plot_run(run_dir, tmp_path / "f"):
        assert_sensible_png(p)


# --- the timeline's pure helpers -------------------------------------------------------------

def rounds(n: int, span: float, start: float = 1.0) -> list[dict]:
    return [dict(t_start=start + i * span, t_end=start + (i + 1) * span) for i in range(n)]


def test_timeline_window_whole_short_run():
    assert timeline_window({0: rounds(10, 2.0), 1: rounds(5, 4.0)}) == (1.0, 21.0)


def test_timeline_window_caps_seconds():
    assert timeline_window({0: rounds(100, 1.0), 1: rounds(50, 2.0)}) == (1.0, 61.0)


def test_timeline_window_caps_rounds_of_the_fastest_worker():
    # rank 0's 200th round ends at 1 + 200 × 0.1 = 21 s; rank 1 is cut there too
    t0, t1 = timeline_window({0: rounds(1000, 0.1), 1: rounds(30, 2.0)})
    assert t0 == 1.0 and t1 == pytest.approx(21.0)
    assert timeline_window({}) == (0.0, 0.0)


def test_timeline_segments_in_order_and_clipped():
    records = [
        dict(t_start=0.0, t_end=2.0, compute_s=1.0, wait_s=0.5, comm_s=0.25, eval_s=0.0),
        dict(t_start=2.0, t_end=3.0, compute_s=0.5, wait_s=0.0, comm_s=0.25, eval_s=0.5),  # overruns
        dict(t_start=3.0, t_end=5.0, compute_s=1.5, wait_s=0.5, comm_s=0.0),  # cut by t1
    ]
    seg = timeline_segments(records, t1=4.0)
    assert seg["compute_s"] == [(0.0, 1.0), (2.0, 0.5), (3.0, 1.0)]
    assert seg["wait_s"] == [(1.0, 0.5)]
    assert seg["comm_s"] == [(1.5, 0.25), (2.5, 0.25)]
    assert seg["eval_s"] == [(2.75, 0.25)]
