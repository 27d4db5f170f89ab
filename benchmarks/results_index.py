"""Write `results/README.md`: every result kept under `results/`, newest first, with its date,
commit, question (its title or bench name), command and headline, and whether it is current
(read by the README or a guide), a record (read by a write-up that is itself kept), or
neither (kept only as history; git keeps what is removed).

    .venv/bin/python benchmarks/results_index.py     # tests/test_docs.py checks it is current

A result is a bench (`NAME.md`, `NAME.json` and its figures in `NAME/`, as `hetsync bench`
writes them), a write-up (`NAME.md` alone), or raw figures (`NAME.json` alone).
"""

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
#: pages whose links make a result current
CURRENT_READERS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _results() -> dict[str, list[Path]]:
    """Each result's name and its files and folders under results/."""
    out: dict[str, list[Path]] = {}
    for path in sorted(RESULTS.iterdir()):
        if path.name == "README.md":
            continue
        name = re.sub(r"\.(md|json|patch)$", "", path.name)
        out.setdefault(name, []).append(path)
    return out


def _cited(name: str, pages: list[Path]) -> bool:
    # (a link, a path, or a name in backticks: `NAME.md`, `NAME{,-60s}.md`)
    pattern = re.compile(rf"results/{re.escape(name)}(\.|/|\b)|\]\({re.escape(name)}(\.|/)"
                         rf"|`{re.escape(name)}[.{{/]")
    return any(pattern.search(p.read_text()) for p in pages if p.exists())


def _about(name: str, paths: list[Path]) -> dict:
    """Date, commit, question, command and headline of one result, from its files."""
    info = {"date": "", "commit": "", "question": name, "command": "", "headline": ""}
    js = RESULTS / f"{name}.json"
    if js.is_file():
        data = json.loads(js.read_text())
        if isinstance(data, dict):
            machine = data.get("machine", {})
            info["date"] = str(machine.get("date") or "")[:10]
            info["commit"] = str(machine.get("git_commit") or "")[:7]
            info["command"] = data.get("command", "")
            info["headline"] = _headline(data)
        else:  # a list of measurements (`hetsync bench comm --json`)
            info["headline"] = f"{len(data)} measurements"
    md = RESULTS / f"{name}.md"
    if md.is_file():
        text = md.read_text()
        title = re.search(r"^#+ (.+)$", text, flags=re.M)
        if title and not js.is_file():
            info["question"] = title.group(1).strip()
        if not info["date"]:
            dated = re.search(r"\b(20\d\d-\d\d-\d\d)\b", text)
            info["date"] = dated.group(1) if dated else ""
        if not info["commit"]:
            commit = re.search(r"[Cc]ommit `?([0-9a-f]{7})", text)
            info["commit"] = commit.group(1) if commit else ""
        if not info["command"]:
            command = re.search(r"^(?:Command: `)?((?:\.venv/bin/)?(?:hetsync|python|"
                                r"\.venv/bin/python|bash) [^\n`]+)", text, flags=re.M)
            info["command"] = command.group(1) if command else ""
    return info


def _headline(bench: dict) -> str:
    """A bench's best cluster run against its fastest device at the bench's speed-up target,
    else its best cluster run's final accuracy."""
    at = str(bench.get("speedup_at", ""))
    runs = [r for r in bench.get("runs", []) if r.get("summary")]
    ahead = [(r["vs_fastest"][at], r["label"]) for r in runs if r.get("kind") != "reference"
             and (r.get("vs_fastest") or {}).get(at) is not None]
    if ahead:
        ratio, label = max(ahead)
        return f"{label}: {ratio:.2f}x its fastest device's time to {at}"
    finals = [(r["summary"].get("final_accuracy"), r["label"]) for r in runs
              if r.get("kind") != "reference" and r["summary"].get("final_accuracy") is not None]
    if finals:
        value, label = max(finals)
        return f"best final accuracy {value:.4f} ({label})"
    return ""


def _link(path: Path) -> str:
    """A link to one of a result's files; a folder of figures links its first figure (a
    link to a folder works on GitHub, not on the documentation site)."""
    if not path.is_dir():
        return f"[{path.name}]({path.name})"
    figures = sorted(path.glob("*.png"), key=lambda f: (f.name != "accuracy.png",
                                                        f.name != "loss.png", f.name))
    if not figures:
        return f"{path.name}/"
    return f"[{path.name}/]({path.name}/{figures[0].name})"


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def index() -> str:
    results = _results()
    writeups = [RESULTS / f"{n}.md" for n in results if (RESULTS / f"{n}.md").is_file()]
    rows = []
    for name, paths in results.items():
        info = _about(name, paths)
        readers = [p for p in writeups if p.stem != name]
        status = ("current" if _cited(name, CURRENT_READERS) else
                  "record" if _cited(name, readers) else "history")
        files = ", ".join(_link(p) for p in paths)
        rows.append((info["date"], name, f"| {info['date'] or '—'} | {info['commit'] or '—'} | "
                     f"{status} | {_cell(info['question'])} | {_cell(info['headline'])} | "
                     f"{'`' + _cell(info['command']) + '`' if info['command'] else '—'} | "
                     f"{files} |"))
    rows.sort(key=lambda r: (r[0], r[1]), reverse=True)
    return "\n".join([
        "# Results", "",
        "Every result kept here, newest first (generated by `benchmarks/results_index.py`; "
        "`tests/test_docs.py` fails when a result lacks its entry). **current**: the README "
        "or a guide reads it; **record**: a kept write-up reads it (the wall-clock benches: "
        "[wall-clock-benches.md](wall-clock-benches.md)); **history**: nothing reads it any "
        "more, kept as it was measured. Each bench's figures are drawn again from its JSON "
        "and run directories by `hetsync bench --report NAME`.", "",
        "| date | commit | status | question | headline | command | files |",
        "|---|---|---|---|---|---|---|",
        *[r[2] for r in rows], ""])


if __name__ == "__main__":
    (RESULTS / "README.md").write_text(index())
    print(f"{RESULTS / 'README.md'}: {len(_results())} results", file=sys.stderr)
