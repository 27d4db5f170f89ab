"""Exceptions raised by :mod:`hetsync.data`.

Every message names the file or directory concerned and, for format errors, what was
expected and what was found, so that a user can fix the data without reading the code.
"""

from __future__ import annotations

import pickle

__all__ = ["DataFormatError", "IdxFormatError", "UnsafePickleError", "DataNotFoundError"]


class DataFormatError(ValueError):
    """A data file exists but its content is not what the format requires."""


class IdxFormatError(DataFormatError):
    """An IDX file (the MNIST / Fashion-MNIST format) is malformed or inconsistent."""


class UnsafePickleError(DataFormatError, pickle.UnpicklingError):
    """A pickle referenced a global that the restricted unpickler does not allow."""


class DataNotFoundError(FileNotFoundError):
    """A data set could not be found in any of the places searched."""
