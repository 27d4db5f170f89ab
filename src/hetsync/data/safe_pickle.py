"""A restricted unpickler for data files that hold only numpy arrays, dicts, lists and scalars.

``pickle.load`` on an untrusted file can call any importable function (``os.system`` ...).
:class:`RestrictedUnpickler` resolves only the globals that numpy's array pickling needs and
refuses everything else with :class:`~hetsync.data.errors.UnsafePickleError`. Dicts, lists,
tuples, str, bytes, int, float, bool and None are built by pickle opcodes, not globals, so
they need no allow-list entry.
"""

from __future__ import annotations

import codecs
import importlib
import os
import pickle
from typing import Any, Callable

import numpy as np

from .errors import DataFormatError, UnsafePickleError

__all__ = ["RestrictedUnpickler", "ALLOWED_GLOBALS", "safe_load"]


def _numpy_core(submodule: str):
    # numpy 2 renamed numpy.core to numpy._core; old pickles (CIFAR-10's, from Python 2 and
    # numpy 1) still name numpy.core.*. Resolve both to whichever module this numpy has.
    try:
        return importlib.import_module(f"numpy._core.{submodule}")
    except ImportError:  # numpy < 2
        return importlib.import_module(f"numpy.core.{submodule}")


def _allowed() -> dict[tuple[str, str], Callable[..., Any]]:
    multiarray = _numpy_core("multiarray")
    numeric = _numpy_core("numeric")
    table: dict[tuple[str, str], Callable[..., Any]] = {
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        # Python 3 pickles of bytes at protocol < 3 go through _codecs.encode(str, "latin1").
        ("_codecs", "encode"): codecs.encode,
    }
    for pkg in ("numpy.core", "numpy._core"):
        table[(f"{pkg}.multiarray", "_reconstruct")] = multiarray._reconstruct  # protocols 0-4
        table[(f"{pkg}.multiarray", "scalar")] = multiarray.scalar  # numpy scalars
        table[(f"{pkg}.numeric", "_frombuffer")] = numeric._frombuffer  # protocol 5
    return table


#: (module, name) -> object: the only globals a pickle may reference.
ALLOWED_GLOBALS: dict[tuple[str, str], Callable[..., Any]] = _allowed()


class RestrictedUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` whose ``find_class`` allows only :data:`ALLOWED_GLOBALS`.

    ``source`` names the file in error messages.
    """

    def __init__(self, file, *, source: str = "<pickle>", encoding: str = "bytes") -> None:
        super().__init__(file, encoding=encoding)
        self.source = source

    def find_class(self, module: str, name: str) -> Any:
        try:
            return ALLOWED_GLOBALS[(module, name)]
        except KeyError:
            allowed = ", ".join(sorted(f"{m}.{n}" for m, n in ALLOWED_GLOBALS))
            raise UnsafePickleError(
                f"{self.source}: refusing to load global {module}.{name}; a data pickle may only "
                f"reference {allowed}"
            ) from None

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafePickleError(f"{self.source}: refusing persistent id {pid!r} in a data pickle")


def safe_load(path: str | os.PathLike[str]) -> Any:
    """Unpickle ``path`` with :class:`RestrictedUnpickler` (``encoding='bytes'``, so Python 2
    pickles such as CIFAR-10's load with ``bytes`` keys). A refused global raises
    :class:`UnsafePickleError`; a truncated or malformed pickle raises
    :class:`DataFormatError`; both name the file."""
    name = os.fspath(path)
    with open(name, "rb") as f:
        try:
            return RestrictedUnpickler(f, source=name).load()
        except UnsafePickleError:
            raise
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError) as e:
            raise DataFormatError(f"{name}: not a valid pickle: {type(e).__name__}: {e}") from e
