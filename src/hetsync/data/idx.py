"""Reader (and writer, for tests and tools) of the IDX format used by MNIST and Fashion-MNIST.

Format (big-endian throughout)::

    byte 0, 1   0x00 0x00
    byte 2      dtype code: 0x08 uint8, 0x09 int8, 0x0B int16, 0x0C int32,
                0x0D float32, 0x0E float64
    byte 3      number of dimensions d (1..4 accepted here)
    d × uint32  the size of each dimension
    body        prod(dims) items, C order

Files may be gzip-compressed: a name ending in ``.gz`` or a stream that starts with the gzip
magic bytes is decompressed first (a raw IDX file always starts with two zero bytes, so the
two cases cannot be confused).

Decompressing Fashion-MNIST costs about half a second of CPU, which every process of a run
would pay (a launch of four workers: six times, on the same cores at once). So the array a
compressed file holds, once read and checked, is kept in a cache (``$HETSYNC_CACHE``, else
``$XDG_CACHE_HOME/hetsync``, else ``~/.cache/hetsync``; ``HETSYNC_CACHE=none``: no cache)
under a name made of the file's real path, size and modification time, so a changed file is
read afresh; the cache is written atomically, and one that cannot be read or written is
passed over.
"""

from __future__ import annotations

import gzip
import hashlib
import math
import os
import struct
import tempfile
import zlib
from pathlib import Path
from typing import Union

import numpy as np

from .errors import IdxFormatError

__all__ = ["IDX_DTYPES", "read_idx", "write_idx"]

PathLike = Union[str, "os.PathLike[str]"]

#: IDX dtype code -> numpy dtype (big-endian as stored in the file).
IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype("u1"),
    0x09: np.dtype("i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_CODES = {dt.newbyteorder("=").str: code for code, dt in IDX_DTYPES.items()}
_GZIP_MAGIC = b"\x1f\x8b"
_MAX_DIMS = 4


def _dtype_list() -> str:
    return ", ".join(f"0x{c:02X} {IDX_DTYPES[c].name}" for c in IDX_DTYPES)


def _read_bytes(path: PathLike) -> bytes:
    name = os.fspath(path)
    with open(name, "rb") as f:
        raw = f.read()
    if name.endswith(".gz") or raw[:2] == _GZIP_MAGIC:
        if raw[:2] != _GZIP_MAGIC:
            raise IdxFormatError(
                f"{name}: not a gzip stream: expected magic bytes 1f 8b, found {raw[:2].hex(' ') or 'an empty file'}"
            )
        try:
            return gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as e:
            raise IdxFormatError(f"{name}: corrupt gzip stream ({len(raw)} compressed bytes): {e}") from e
    return raw


def _cache_file(path: PathLike) -> Path | None:
    """Where the array of compressed file `path` is kept (None: no cache, or no such file)."""
    root = os.environ.get("HETSYNC_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "hetsync")
    if root == "none":
        return None
    try:
        real = os.path.realpath(path)
        stat = os.stat(real)
    except OSError:
        return None
    key = hashlib.sha1(f"{real}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    return Path(root) / "idx" / f"{Path(real).name}-{key}.npy"


def read_idx(path: PathLike) -> np.ndarray:
    """Read one IDX file (raw or gzip; a gzip file's array from the cache where it is there,
    see the module docstring) into a native-endian, writable numpy array.

    Guarantees: the returned array has the dtype and shape declared in the header, in native
    byte order. Raises :class:`IdxFormatError` (naming the file, and what was expected vs
    found) for: a corrupt or truncated gzip stream, a header shorter than declared, a magic
    whose first two bytes are not zero, an unknown dtype code, a number of dimensions outside
    1..4, or a body whose length is not exactly prod(dims) × item size (truncated files and
    trailing bytes are both errors). A missing file raises the usual ``FileNotFoundError``.
    """
    cache = _cache_file(path) if _compressed(path) else None
    if cache is not None and cache.is_file():
        try:
            return np.load(cache, allow_pickle=False)
        except (OSError, ValueError):
            pass  # (cut short or foreign: read the file, and write it again)
    arr = _parse(path)
    if cache is not None:
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=cache.parent, suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                np.save(f, arr, allow_pickle=False)
            os.replace(tmp, cache)
        except OSError:
            pass  # (an unwritable cache only costs the next process the same read)
    return arr


def _compressed(path: PathLike) -> bool:
    name = os.fspath(path)
    if name.endswith(".gz"):
        return True
    try:
        with open(name, "rb") as f:
            return f.read(2) == _GZIP_MAGIC
    except OSError:
        return False


def _parse(path: PathLike) -> np.ndarray:
    """The array of IDX file `path`, read and checked (`read_idx`'s guarantees)."""
    name = os.fspath(path)
    data = _read_bytes(path)
    if len(data) < 4:
        raise IdxFormatError(f"{name}: file has {len(data)} bytes, expected at least a 4-byte IDX magic")
    zero0, zero1, code, ndim = data[0], data[1], data[2], data[3]
    if zero0 != 0 or zero1 != 0:
        raise IdxFormatError(
            f"{name}: bad IDX magic {data[:4].hex(' ')}: expected the first two bytes to be 00 00, "
            f"found {data[:2].hex(' ')}"
        )
    if code not in IDX_DTYPES:
        raise IdxFormatError(f"{name}: unknown IDX dtype code 0x{code:02X}, expected one of {_dtype_list()}")
    if not 1 <= ndim <= _MAX_DIMS:
        raise IdxFormatError(f"{name}: IDX header declares {ndim} dimensions, expected 1 to {_MAX_DIMS}")
    header = 4 + 4 * ndim
    if len(data) < header:
        raise IdxFormatError(
            f"{name}: header has {len(data)} bytes, expected {header} for {ndim} dimension sizes"
        )
    shape = struct.unpack(f">{ndim}I", data[4:header])
    dtype = IDX_DTYPES[code]
    expected = math.prod(shape) * dtype.itemsize
    body = len(data) - header
    if body != expected:
        what = "truncated" if body < expected else "trailing bytes"
        raise IdxFormatError(
            f"{name}: body has {body} bytes, expected {expected} for shape {tuple(shape)} "
            f"{dtype.name} ({what})"
        )
    arr = np.frombuffer(data, dtype=dtype, count=math.prod(shape), offset=header).reshape(shape)
    return arr.astype(dtype.newbyteorder("="), copy=True)


def write_idx(path: PathLike, array: np.ndarray) -> None:
    """Write ``array`` as an IDX file (gzip-compressed when ``path`` ends in ``.gz``).

    The inverse of :func:`read_idx`, for tests and tools. ``array`` must have 1..4 dimensions
    and one of the IDX dtypes (uint8, int8, int16, int32, float32, float64).
    """
    array = np.asarray(array)
    key = array.dtype.newbyteorder("=").str
    if key not in _CODES:
        raise ValueError(f"write_idx: dtype {array.dtype} has no IDX code; expected one of {_dtype_list()}")
    if not 1 <= array.ndim <= _MAX_DIMS:
        raise ValueError(f"write_idx: array has {array.ndim} dimensions, expected 1 to {_MAX_DIMS}")
    code = _CODES[key]
    header = bytes([0, 0, code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    body = np.ascontiguousarray(array, dtype=IDX_DTYPES[code]).tobytes()
    name = os.fspath(path)
    opener = gzip.open if name.endswith(".gz") else open
    with opener(name, "wb") as f:
        f.write(header + body)
