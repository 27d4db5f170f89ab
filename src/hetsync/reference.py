"""The flag reference, generated from the parsers the commands use (`docs/reference.md`).

Every flag of every command with its help and default, as `--help` has them (each command's
own defaults: `launch`'s differ from `worker`'s), mode options marked with the modes that
take them. `tests/test_docs.py` fails when the page differs from what this writes:

    .venv/bin/python -m hetsync.reference > docs/reference.md
"""

import argparse

from hetsync.bench.modes import build_parser as bench_parser
from hetsync.cli import build_parser

#: the commands in the order a user meets them (`bench comm` and `bench state` have their own
#: `--help`)
COMMANDS = ("launch", "worker", "bench", "summarize", "plot", "gather", "evaluate",
            "state-server", "models")


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _rows(parser: argparse.ArgumentParser) -> list[str]:
    formatter = parser._get_formatter()
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
            continue
        names = (", ".join(f"`{n}`" for n in action.option_strings)
                 or f"`{action.metavar or action.dest}`")
        helped = formatter._expand_help(action) if action.help else ""
        rows.append(f"| {names} | {_cell(helped)} |")
    return rows


def reference() -> str:
    """The whole page."""
    parsers = _subparsers(build_parser())
    parsers["bench"] = bench_parser()
    out = ["# Flag reference", "",
           "Generated from the code by `python -m hetsync.reference` (do not edit by hand; "
           "`tests/test_docs.py` checks it). A flag in brackets `[mode, ...]` is that mode's "
           "own option. The guides say when to use which: [flags.md](flags.md).", ""]
    for name in COMMANDS:
        parser = parsers[name]
        out += [f"## `hetsync {name}`", ""]
        if parser.description:
            out += [_cell(parser.description), ""]
        out += ["| flag | meaning (and default) |", "|---|---|", *_rows(parser), ""]
    return "\n".join(out)


if __name__ == "__main__":
    print(reference(), end="")
