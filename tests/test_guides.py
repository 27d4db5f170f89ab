"""Every `hetsync` command the README and the guides show in a shell block is one hetsync
takes: its flags parse, and a run's configuration validates (as `launch` and `worker` check
it before starting anything) — so a renamed flag or a changed range fails here, not in a
reader's terminal. What a command would read or write (run directories, data elsewhere) is
not needed: nothing is run."""

import re
import shlex
from pathlib import Path

import pytest

from hetsync.cli import build_parser, launch_config, worker_config
from hetsync.command_line import chosen_mode

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: what a placeholder in a guide stands for (the user's data directory: any that exists)
PLACEHOLDERS = {"$NODE": "0", "$HETSYNC_TOKEN": "token", "~/data": str(ROOT)}


def _commands() -> list[tuple[str, list[str]]]:
    """(where, argv after `hetsync`) of every hetsync command in a ```sh block, its lines
    joined where they continue, its comment cut; `torchrun ... -m hetsync` too."""
    found = []
    for page in PAGES:
        for block in re.findall(r"^```sh\n(.*?)^```", page.read_text(), flags=re.M | re.S):
            for line in block.replace("\\\n", " ").splitlines():
                for key, value in PLACEHOLDERS.items():
                    line = line.replace(key, value)
                for words in _shell_commands(line):
                    if ".venv/bin/hetsync" in words:  # (the README's own venv)
                        words[words.index(".venv/bin/hetsync")] = "hetsync"
                    if "hetsync" in words and words[0] != "pip":
                        at = words.index("hetsync")
                        if at == 0 or words[at - 1] == "-m":
                            found.append((f"{page.name}: {' '.join(words)[:70]}",
                                          words[at + 1:]))
    return found


def _shell_commands(line: str) -> list[list[str]]:
    """The words of each command of a shell line (split at `&&`, `||`, `;` and `|` outside
    quotes), its comment cut."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split, lexer.commenters = True, "#"
    commands: list[list[str]] = [[]]
    for token in lexer:
        if token in ("&&", "||", ";", "|"):
            commands.append([])
        else:
            commands[-1].append(token)
    return [words for words in commands if words]


COMMANDS = _commands()


def test_the_guides_show_the_commands_a_user_runs():
    subcommands = {argv[0] for _, argv in COMMANDS if argv}
    assert {"launch", "worker", "bench", "summarize", "plot", "probe", "advise",
            "state-server", "gather"} <= subcommands, subcommands


@pytest.mark.parametrize("where,argv", COMMANDS, ids=[w for w, _ in COMMANDS])
def test_every_command_in_a_guide_parses_and_its_run_validates(where, argv):
    if argv[:1] == ["bench"] and argv[1:2] not in (["modes"], ["comm"], ["state"]):
        argv = ["bench", "modes", *argv[1:]]  # (as `hetsync`'s main reads it)
    if "--plugin" in argv:  # a user's own module, which this checkout does not have
        pytest.skip("names a plugin of the user's")
    try:
        args = build_parser(chosen_mode(argv)).parse_args(argv)
    except SystemExit as exit:
        pytest.fail(f"{where}: `hetsync {' '.join(argv)}` does not parse (exit {exit.code})")
    if args.command == "launch" and not args.resume:
        launch_config(args)[0].validate()
    elif args.command == "worker" and not (args.resume or args.config):
        worker_config(args)
