"""The documentation as a user finds it: the generated flag reference is current, and every
relative link of the README and the guides leads to a file."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_flag_reference_is_what_the_code_generates():
    # A fresh process, as the page is written: modes other tests register (plugins) are in
    # this process's registry, not in the page.
    generated = subprocess.run([sys.executable, "-m", "hetsync.reference"], check=True,
                               capture_output=True, text=True).stdout
    page = (ROOT / "docs" / "reference.md").read_text()
    assert page == generated, ("docs/reference.md is stale: run "
                                 ".venv/bin/python -m hetsync.reference > docs/reference.md")
    assert "`--clock`" in page and "`--lr-sweep`" in page
    assert "[lookahead, sync-lookahead]" in page


def test_every_relative_link_of_the_readme_and_guides_leads_to_a_file():
    pages = [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]+)", page.read_text()):
            if "://" not in target and not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, broken


def test_the_results_index_lists_every_result_kept():
    import importlib.util

    spec = importlib.util.spec_from_file_location("results_index",
                                                  ROOT / "benchmarks" / "results_index.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    page = (ROOT / "results" / "README.md").read_text()
    assert page == module.index(), ("results/README.md is stale: run "
                                    ".venv/bin/python benchmarks/results_index.py")
    for path in (ROOT / "results").iterdir():  # (a folder: a link into it, or its name)
        if path.name != "README.md":
            assert (f"]({path.name})" in page or f"]({path.name}/" in page
                    or f"| {path.name}/" in page or f", {path.name}/" in page), path.name


def test_the_documentation_site_builds_with_every_link_checked(tmp_path):
    """`scripts/docs_site.py build`: MkDocs, strict (a warning is an error), over the README,
    the guides and the results, every internal link and anchor checked."""
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "docs_site.py"), "build",
                           "-d", str(tmp_path / "site")], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "docs" / "worth-it" / "index.html").is_file()
