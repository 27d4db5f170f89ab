"""Where data sets are looked for, and the error that lists every place tried.

Search order for a data set whose conventional sub-folder is ``SUB`` (``fashion-mnist``,
``cifar-10-batches-py``):

1. ``data_dir/SUB/``   (ESync's ``-dd DIR`` layout)
2. ``data_dir/``       (the files directly in the given folder)
3. ``$HETSYNC_DATA/SUB/`` and ``$HETSYNC_DATA/``
4. the system folders for that data set (e.g. Debian's ``/usr/share/datasets/fashion-mnist``),
   taken from :data:`SYSTEM_DIRS`, a module-level mapping tests may monkeypatch.

A ``data_dir`` that is given but does not exist is an error by itself (a typo should not
silently fall through to another copy of the data).
"""

from __future__ import annotations

import os
from typing import Callable, Optional, Sequence

from .errors import DataNotFoundError

__all__ = ["ENV_VAR", "SYSTEM_DIRS", "candidate_dirs", "find_data_dir", "first_existing"]

#: Environment variable naming a folder that holds data sets.
ENV_VAR = "HETSYNC_DATA"

#: data set name -> system-wide folders searched last (in this order).
SYSTEM_DIRS: dict[str, tuple[str, ...]] = {
    "fashion-mnist": ("/usr/share/datasets/fashion-mnist",),
    "cifar10": (),
}


def candidate_dirs(name: str, subdir: str, data_dir: Optional[str]) -> list[str]:
    """The folders searched for data set ``name``, in order, without duplicates."""
    out: list[str] = []
    if data_dir is not None:
        data_dir = os.fspath(data_dir)
        if not os.path.isdir(data_dir):
            raise DataNotFoundError(f"data directory {data_dir!r} (given for {name}) does not exist or is not a directory")
        out += [os.path.join(data_dir, subdir), data_dir]
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
    :class:`DataNotFoundError` listing every folder tried with its reason, plus ``how_to_get``.
    """
    tried: list[str] = []
    for d in candidate_dirs(name, subdir, data_dir):
        reason = "does not exist" if not os.path.isdir(d) else probe(d)
        if reason is None:
            return d
        tried.append(f"  {d}: {reason}")
    if not tried:
        tried.append("  (no folder to search)")
    env_note = "" if os.environ.get(ENV_VAR) else f" ({ENV_VAR} is not set)"
    raise DataNotFoundError(
        f"{name} data not found. Places tried, in order{env_note}:\n" + "\n".join(tried) + "\n" + how_to_get
    )


def first_existing(folder: str, names: Sequence[str]) -> Optional[str]:
    """The path of the first of ``names`` that exists as a file in ``folder``, or None."""
    for n in names:
        p = os.path.join(folder, n)
        if os.path.isfile(p):
            return p
    return None
