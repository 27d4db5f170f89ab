"""The README's own loop, run as a newcomer runs it: its Python block saved as `train.py`
and its shell lines after it run as written, in a fresh directory (`.venv` there is this
interpreter's environment)."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def _blocks(kind: str) -> list[str]:
    return re.findall(rf"^```{kind}\n(.*?)^```", README.read_text(), flags=re.M | re.S)


def test_the_readme_loop_trains_under_torchrun_and_summarises(tmp_path):
    train = _blocks("python")[0]
    assert "hetsync.wrap(" in train
    (tmp_path / "train.py").write_text(train)
    (tmp_path / ".venv").symlink_to(Path(sys.executable).parent.parent)
    text = README.read_text()
    after = text[text.index(train) + len(train):]
    block = re.search(r"^```sh\n(.*?)^```", after, flags=re.M | re.S).group(1)
    commands = [line for line in block.splitlines() if line.strip()]
    assert commands[0].startswith(".venv/bin/torchrun") and "train.py" in commands[0]
    for command in commands:
        out = subprocess.run(command, shell=True, cwd=tmp_path, capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0, (command, out.stdout[-2000:], out.stderr[-2000:])
    runs = list((tmp_path / "runs").glob("esync-*"))
    assert len(runs) == 1 and (runs[0] / "summary.json").is_file()
    assert "final accuracy" in out.stdout  # the summary, as the user reads it
    summary = json.loads((runs[0] / "summary.json").read_text())
    assert summary["final_accuracy"] > 0.8  # it learned the data's rule (chance: 0.25)


@pytest.mark.slow
def test_the_readme_cluster_commands_run_as_written_with_short_budgets(tmp_path):
    """The block under "A cluster on one machine", each line as written (its comment cut),
    with a budget of a second or less and the runs written under tmp_path."""
    text = README.read_text()
    block = re.search(r"^## A cluster on one machine\n.*?^```sh\n(.*?)^```", text,
                      flags=re.M | re.S).group(1)
    lines = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    assert [line.split()[1] for line in lines] == ["launch", "launch", "bench"]
    short = {"launch": ["--time-budget", "1", "--eval-interval", "0.5", "--no-live",
                        "--no-figures", "--quiet"],
             "bench": ["--time-budget", "0.3", "--eval-interval", "0.3", "--quiet"]}
    root = README.parent
    for k, line in enumerate(lines):
        argv = line.split()
        argv += short[argv[1]] + ["-ld", str(tmp_path / str(k))]
        out = subprocess.run(argv, cwd=root, capture_output=True, text=True, timeout=400)
        assert out.returncode == 0, (line, out.stdout[-2000:], out.stderr[-2000:])
        summaries = list((tmp_path / str(k)).rglob("summary.json"))
        # launch: its run; bench: the cluster's modes, PyTorch's baselines and the fastest
        # device's recipes
        assert len(summaries) == (1 if argv[1] == "launch" else 11), (line, summaries)
