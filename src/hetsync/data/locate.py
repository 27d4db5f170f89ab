"""Where data sets are looked for, and the error that lists every place tried.

Search order for a data set whose conventional sub-folder is ``SUB`` (``fashion-mnist``,
``cifar-10-batches-py``):

1. ``data_dir/SUB/``   (ESync's ``-dd DIR`` layout)
2. ``data_dir/``       (the files directly in the given folder)

and, only when no ``data_dir`` is given:

3. ``$HETSYNC_DATA/SUB/`` and ``$HETSYNC_DATA/``
4. the system folders for that data set (e.g. Debian's ``/usr/share/datasets/fashion-mnist``),
   taken from :data:`SYSTEM_DIRS`, a module-level mapping tests may monkeypatch.

A ``data_dir`` that is given is the only place searched: one that does not exist, or lacks a
file, is an error naming it and what is missing (a typo or an incomplete copy must not
silently fall through to another copy of the data). The error is one line.
"""

from __future__ import annotations

import os
from typing import Callable, Optional, Sequence

from .errors import DataNotFoundError

__all__ = ["ENV_VAR", "SYSTEM_DIRS", "candidate_dirs", "find_data_dir", "first_existing",
           "missing_reason"]

#: Environment variable naming a folder that holds data sets.
ENV_VAR = "HETSYNC_DATA"

#: data set name -> system-wide folders searched last (in this order).
SYSTEM_DIRS: dict[str, tuple[str, ...]] = {
    "fashion-mnist": ("/usr/share/datasets/fashion-mnist",),
    "cifar10": (),
    "shakespeare": (os.path.expanduser("~/.local/share/hetsync/shakespeare"),),
}


def candidate_dirs(name: str, subdir: str, data_dir: Optional[str]) -> list[str]:
    """The folders searched for data set ``name``, in order, without duplicates: only
    ``data_dir``'s two when it is given."""
    out: list[str] = []
    if data_dir is not None:
        data_dir = os.fspath(data_dir)
        if not os.path.isdir(data_dir):
            raise DataNotFoundError(f"data directory {data_dir!r} (given for {name}) does not exist or is not a directory")
        out += [os.path.join(data_dir, subdir), data_dir]
    else:
        env = os.environ.get(ENV_VAR, "")
        if env:
            out += [os.path.join(env, subdir), env]
        out += list(SYSTEM_DIRS.get(name, ()))
    seen: set[str] = set()
    unique = []
    for d in out:
        key = os.path.normpath(os.path.abspath(d))
        if key not in seen:
            seen.add(key)
            unique.append(d)
    return unique


def find_data_dir(
    name: str,
    subdir: str,
    data_dir: Optional[str],
    probe: Callable[[str], Optional[str]],
    how_to_get: str,
) -> str:
    """Return the first candidate folder for which ``probe(folder)`` returns None.

    ``probe`` returns None when the folder holds the data set, else a short reason
    ("does not exist", "missing X"). When no folder qualifies, raises
    :class:`DataNotFoundError`, one line listing every folder tried with its reason, plus
    ``how_to_get``.
    """
    tried: list[str] = []
    for d in candidate_dirs(name, subdir, data_dir):
        reason = "does not exist" if not os.path.isdir(d) else probe(d)
        if reason is None:
            return d
        tried.append(f"{d} ({reason})")
    if not tried:
        tried.append("(no folder to search)")
    if data_dir is not None:
        where = (f"in the given data directory {os.fspath(data_dir)!r} (when one is given, "
                 f"nothing else is searched)")
    else:
        where = "; places tried, in order" + ("" if os.environ.get(ENV_VAR)
                                              else f" ({ENV_VAR} is not set)")
    raise DataNotFoundError(f"{name} data not found {where}: {', '.join(tried)}. {how_to_get}")


def first_existing(folder: str, names: Sequence[str]) -> Optional[str]:
    """The path of the first of ``names`` that exists as a file in ``folder``, or None."""
    for n in names:
        p = os.path.join(folder, n)
        if os.path.isfile(p):
            return p
    return None


def missing_reason(folder: str, wanted: dict[str, Sequence[str]]) -> Optional[str]:
    """A probe's reason for ``folder``: ``wanted`` maps each file the data set needs, as
    shown in the reason, to the names it may have (``{"x(.gz)": ("x.gz", "x")}``). None when
    every one exists as a file; else which are missing, and which are something other than a
    file (a directory where the file should be)."""
    missing, odd = [], []
    for shown, names in wanted.items():
        if first_existing(folder, names) is None:
            other = [n for n in names if os.path.lexists(os.path.join(folder, n))]
            (odd if other else missing).append(other[0] if other else shown)
    parts = []
    if missing:
        parts.append("missing " + ", ".join(missing))
    if odd:
        parts.append(", ".join(odd) + (" is not a file" if len(odd) == 1 else " are not files"))
    return "; ".join(parts) or None
