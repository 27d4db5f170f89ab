"""A restricted unpickler for data files that hold only numpy arrays, dicts, lists and scalars.

``pickle.load`` on an untrusted file can call any importable function (``os.system`` ...).
:class:`RestrictedUnpickler` resolves only the globals that numpy's array pickling needs and
refuses everything else with :class:`~hetsync.data.errors.UnsafePickleError`. Dicts, lists,
tuples, str, bytes, int, float, bool and None are built by pickle opcodes, not globals, so
they need no allow-list entry.

A few bytes of pickle can also ask for any amount of memory: a BINBYTES8 or FRAME opcode
declaring 100 GB, an array of a huge shape. :func:`safe_load` unpickles from the file's bytes
in memory, so a declared length beyond them fails at once (pickle allocates it before
reading: a MemoryError, or a truncation); it then checks every length the opcodes declare
against the file's size to say which one lies (a scan of every opcode costs about as much as
the unpickling, so it is done only then). It refuses object dtypes and arrays larger than the
file outright. A corrupt file is thus a :class:`~hetsync.data.errors.DataFormatError` naming
it, never a MemoryError.
"""

from __future__ import annotations

import codecs
import functools
import importlib
import io
import math
import os
import pickle
import pickletools
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

    def __init__(self, file, *, source: str = "<pickle>", encoding: str = "bytes",
                 max_bytes: int | None = None) -> None:
        super().__init__(file, encoding=encoding)
        self.source = source
        self.max_bytes = max_bytes  # no array may be larger (the file's size)

    def find_class(self, module: str, name: str) -> Any:
        try:
            found = ALLOWED_GLOBALS[(module, name)]
            if found is np.dtype:
                return _plain_dtype
            if name == "_reconstruct":
                return functools.partial(_bounded_reconstruct, found, self.max_bytes)
            return found
        except KeyError:
            allowed = ", ".join(sorted(f"{m}.{n}" for m, n in ALLOWED_GLOBALS))
            raise UnsafePickleError(
                f"{self.source}: refusing to load global {module}.{name}; a data pickle may only "
                f"reference {allowed}"
            ) from None

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafePickleError(f"{self.source}: refusing persistent id {pid!r} in a data pickle")


class _Refused(ValueError):
    """What a data pickle may not build (named in safe_load's error)."""


def _plain_dtype(*args: Any) -> np.dtype:
    dtype = np.dtype(*args)
    if dtype.hasobject:
        raise _Refused(f"refusing dtype {dtype}: a data array holds numbers, not Python objects")
    return dtype


def _bounded_reconstruct(reconstruct: Callable[..., Any], max_bytes: int | None, subtype: Any,
                         shape: Any, dtype: Any) -> Any:
    # numpy pickles an array as an empty one (shape (0,)) filled by its state; a bigger shape
    # here only allocates memory, so it may not exceed the file.
    try:
        size = math.prod(shape) if isinstance(shape, tuple) else int(shape)
        itemsize = np.dtype(dtype).itemsize
    except (TypeError, ValueError):
        raise _Refused(f"bad array shape {shape!r} or dtype {dtype!r}") from None
    if max_bytes is not None and size * itemsize > max_bytes:
        raise _Refused(f"an array of shape {shape!r} ({size * itemsize} bytes) is larger than "
                       f"the file ({max_bytes} bytes)")
    return reconstruct(subtype, shape, dtype)


def _check_lengths(data: bytes) -> None:
    """ValueError when an opcode declares more bytes than the pickle has (pickle itself would
    allocate them first): pickletools reads each counted argument from the bytes at hand."""
    for op, arg, pos in pickletools.genops(io.BytesIO(data)):
        if op.name == "FRAME" and arg > len(data) - pos - 9:  # opcode and 8-byte length
            raise ValueError(f"a frame of {arg} bytes at byte {pos}, but only "
                             f"{len(data) - pos - 9} remain")


def safe_load(path: str | os.PathLike[str]) -> Any:
    """Unpickle ``path`` with :class:`RestrictedUnpickler` (``encoding='bytes'``, so Python 2
    pickles such as CIFAR-10's load with ``bytes`` keys). A refused global raises
    :class:`UnsafePickleError`; a truncated or malformed pickle, one that declares more data
    than the file holds, or an object array raises :class:`DataFormatError`; both name the
    file."""
    name = os.fspath(path)
    with open(name, "rb") as f:
        data = f.read()
    try:
        return RestrictedUnpickler(io.BytesIO(data), source=name, max_bytes=len(data)).load()
    except UnsafePickleError:
        raise
    except _Refused as e:
        raise DataFormatError(f"{name}: {e}") from None
    except (MemoryError, pickle.UnpicklingError, EOFError, ValueError, TypeError,
            AttributeError, IndexError, KeyError, OverflowError, RecursionError) as e:
        error = e
    try:  # which declared length lies, if one does
        _check_lengths(data)
    except ValueError as e:
        raise DataFormatError(f"{name}: not a valid pickle ({len(data)} bytes): {e}") from None
    if isinstance(error, MemoryError):
        raise DataFormatError(f"{name}: asks for more memory than this machine has "
                              f"({len(data)} bytes on disk): not a data pickle") from None
    raise DataFormatError(f"{name}: not a valid pickle: {type(error).__name__}: {error}"
                          ) from error
