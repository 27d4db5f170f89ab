#!/usr/bin/env python3
"""The documentation site: the README as its front page, the guides under docs/ and the results
archive under results/, built by MkDocs (`mkdocs.yml`) as they are laid out in the repository.

    .venv/bin/python scripts/docs_site.py serve     # http://127.0.0.1:8000/, rebuilt on save
    .venv/bin/python scripts/docs_site.py build     # site/ (strict: a warning is an error)

MkDocs reads one folder; the pages link each other by their paths in the repository
(`docs/faults.md`, `../results/chaos.md`), so the folder is staged from the repository as it is
(`build/docs-src/`: the README as `index.md`, docs/ and results/ copied whole), and every
internal link and anchor is checked where it points on GitHub too. Why MkDocs: the pages are
Markdown already, rendered as GitHub renders them; Sphinx would need MyST and a conf.py to read
them, for an API reference hetsync generates itself (`docs/reference.md`).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAGE = ROOT / "build" / "docs-src"


def stage() -> Path:
    shutil.rmtree(STAGE, ignore_errors=True)
    STAGE.mkdir(parents=True)
    shutil.copy(ROOT / "README.md", STAGE / "index.md")
    for part in ("docs", "results"):
        shutil.copytree(ROOT / part, STAGE / part)
    return STAGE


def main(argv: list[str]) -> int:
    what = argv[0] if argv else "build"
    if what not in ("build", "serve"):
        print(f"docs_site.py: invalid command {what!r}; expected build or serve",
              file=sys.stderr)
        return 2
    stage()
    mkdocs = [sys.executable, "-m", "mkdocs", what, "-f", str(ROOT / "mkdocs.yml")]
    return subprocess.run(mkdocs + (["--strict"] if what == "build" else []) + argv[1:]).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
