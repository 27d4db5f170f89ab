"""`hetsync gather`: one run's records from several machines' directories into one."""

import json

import pytest

from hetsync.telemetry.gather import GatherError, gather


def _part(path, ranks, run_json=None, name="exp", start=1.0):
    path.mkdir(parents=True)
    for r in ranks:
        (path / f"worker-{r}.jsonl").write_text(json.dumps({"rank": r}) + "\n")
    if run_json is not None:
        (path / "run.json").write_text(json.dumps({"run_name": name, "start_time": start,
                                                   **run_json}))
    (path / "checkpoints").mkdir()
    return path


def test_gather_copies_every_machines_records_and_the_final_run_json(tmp_path):
    a = _part(tmp_path / "a", [0, 1], {"ranks": [0, 1, 2, 3], "end_time": 9.0})
    b = _part(tmp_path / "b", [2, 3], {})   # a copy of run.json from before the end
    copied = gather(a, [a, b])
    assert copied == ["worker-2.jsonl", "worker-3.jsonl"]
    assert json.loads((a / "run.json").read_text())["end_time"] == 9.0
    assert sorted(p.name for p in a.glob("worker-*")) == [f"worker-{r}.jsonl" for r in range(4)]
    assert not list(a.glob(".*tmp"))


def test_gather_refuses_two_runs_a_differing_file_and_no_run_json(tmp_path):
    a = _part(tmp_path / "a", [0], {})
    other = _part(tmp_path / "other", [1], {}, name="exp2")
    with pytest.raises(GatherError, match="more than one run"):
        gather(tmp_path / "out", [a, other])
    clash = _part(tmp_path / "clash", [], None)
    (clash / "worker-0.jsonl").write_text('{"rank": 0, "round": 7}\n')
    with pytest.raises(GatherError, match="worker-0.jsonl differs between"):
        gather(tmp_path / "out", [a, clash])
    with pytest.raises(GatherError, match="no run.json"):
        gather(tmp_path / "out", [_part(tmp_path / "c", [3])])
    with pytest.raises(GatherError, match="not a directory"):
        gather(tmp_path / "out", [tmp_path / "missing"])
