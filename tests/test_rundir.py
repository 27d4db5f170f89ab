"""The run directory's one room (`telemetry/rundir.py`): its file names are written nowhere
else, and its events are appended by many processes at once without a line lost or mixed."""

import ast
import json
import multiprocessing
from pathlib import Path

import pytest

import hetsync
from hetsync.telemetry import rundir
from hetsync.telemetry.gather import gather
from hetsync.telemetry.rundir import EVENTS, RunDir

SRC = Path(hetsync.__file__).parent
NAMES = (rundir.CONFIG, rundir.RUN, rundir.EVAL, rundir.PS, rundir.SERVICE, rundir.EVENTS,
         rundir.SUMMARY, rundir.ESYNC_SUMMARY, rundir.PIDS, rundir.OLD_SERVICE)


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes (they may name the files: they explain them)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def _names_written_outside(names: tuple[str, ...]) -> list[str]:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if path == SRC / "telemetry" / "rundir.py":
            continue
        tree = ast.parse(path.read_text())
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                    id(node) not in docs:
                text = node.value
                if any(name in text for name in names) or \
                        ("worker-" in text and ".jsonl" in text) or text == "worker-":
                    found.append(f"{path.relative_to(SRC)}:{node.lineno}: {text[:60]!r}")
    return found


def test_the_run_directorys_file_names_are_written_only_in_its_module():
    # (messages may name a file in passing; paths are made by RunDir alone)
    paths = [f for f in _names_written_outside(NAMES) if " " not in f.split(": ", 1)[1]]
    assert paths == [], "\n".join(paths)


def test_the_check_finds_a_file_name_written_elsewhere(tmp_path, monkeypatch):
    stray = SRC / "telemetry" / "_stray_for_test.py"
    stray.write_text('PATH = "eval.jsonl"\n')
    try:
        assert any("_stray_for_test.py:1" in f for f in _names_written_outside(NAMES))
    finally:
        stray.unlink()


def _append(args):
    path, rank = args
    events = RunDir(path)
    for k in range(200):
        events.event("lost", rank=rank, k=k, pad="x" * 200)


def test_events_from_many_processes_at_once_are_each_one_whole_line(tmp_path):
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        pool.map(_append, [(str(tmp_path), r) for r in range(4)])
    lines = (tmp_path / EVENTS).read_text().splitlines()
    assert len(lines) == 800
    events = [json.loads(line) for line in lines]  # (a mixed line would not parse)
    for r in range(4):
        assert [e["k"] for e in events if e["rank"] == r] == list(range(200))


def test_an_unknown_event_is_refused_and_a_cut_last_line_is_skipped(tmp_path):
    events = RunDir(tmp_path)
    with pytest.raises(ValueError, match="unknown event 'regrouped'; valid: resumed, lost"):
        events.event("regrouped")
    events.event("joined", rank=2, round=7, waited_s=0.5)
    with open(tmp_path / EVENTS, "a") as f:
        f.write('{"t": 1.0, "event": "lo')  # a process died mid-line
    assert [(e["event"], e["rank"]) for e in events.read_events()] == [("joined", 2)]
    assert events.read_events("lost") == []


def test_gather_merges_every_machines_events_in_time_order(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for path, ranks in ((a, [0, 1]), (b, [2, 3])):
        path.mkdir()
        for r in ranks:
            RunDir(path).worker(r).write_text(json.dumps({"rank": r}) + "\n")
    RunDir(a).run.write_text(json.dumps({"run_name": "x", "start_time": 1.0}))
    with open(a / EVENTS, "w") as f:
        f.write(json.dumps({"t": 3.0, "event": "lead", "rank": 0}) + "\n")
    with open(b / EVENTS, "w") as f:
        f.write(json.dumps({"t": 2.0, "event": "joined", "rank": 2}) + "\n")
    copied = gather(a, [a, b])
    assert EVENTS in copied
    assert [e["event"] for e in RunDir(a).read_events()] == ["joined", "lead"]


def test_an_events_fields_may_be_named_as_its_arguments(tmp_path):
    """(A fault's own `kind` is one of its fields.)"""
    rundir.tell(tmp_path, "fault", "rank 1: injected fault", rank=1, kind="hang", round=5)
    fault, = RunDir(tmp_path).read_events("fault")
    assert (fault["rank"], fault["kind"], fault["round"]) == (1, "hang", 5)
