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
COMMANDS = ("launch", "worker", "bench", "probe", "advise", "summarize", "plot", "gather", "evaluate",
            "state-server", "models")


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _table(parser: argparse.ArgumentParser, actions) -> list[str]:
    formatter = parser._get_formatter()
    rows = ["| flag | meaning (and default) |", "|---|---|"]
    for action in actions:
        if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
            continue
        names = (", ".join(f"`{n}`" for n in action.option_strings)
                 or f"`{action.metavar or action.dest}`")
        helped = formatter._expand_help(action) if action.help else ""
        rows.append(f"| {names} | {_cell(helped)} |")
    return rows if len(rows) > 2 else []


def _sections(parser: argparse.ArgumentParser) -> list[str]:
    """A table per section of `--help` (argparse's groups), in its order."""
    own = ("positional arguments", "options")  # argparse's own two groups: one table
    groups = [("the command's own", [a for g in parser._action_groups if g.title in own
                                     for a in g._group_actions])]
    groups += [(g.title, g._group_actions) for g in parser._action_groups if g.title not in own]
    out = []
    for title, actions in groups:
        rows = _table(parser, actions)
        if rows:
            out += [f"### {title}", "", *rows, ""]
    return out


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
        out += _sections(parser)
    return "\n".join(out)


if __name__ == "__main__":
    print(reference(), end="")
