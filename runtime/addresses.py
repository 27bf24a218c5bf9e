"""The address of a numpy array's first element, cheaply: the call path's most frequent question.

``a.__array_interface__["data"][0]`` and ``a.ctypes.data`` build a dict or a ctypes
object per call (2-3 µs each, measured on the 2-core Xeon of docs/cpu-backend.md);
a cached kernel call asks it once per buffer. numpy's C API reads the same value
as a field of the array object (``PyArray_DATA``: the ``data`` pointer right after
the object header), so on CPython, where ``id(a)`` is the object's address, that
field is read directly with one ctypes load (0.24 µs).

Where that field is is found, not assumed: at import the offsets after the object
header are searched for one that holds the data address of several probe arrays
(sizes, dtypes, a view with an offset into its base). Where none is found (another
Python, another object layout) `data_address` is the ``__array_interface__`` read.
"""
from __future__ import annotations

import ctypes
import platform
from collections.abc import Callable

import numpy as np

_POINTER = ctypes.sizeof(ctypes.c_void_p)
_load = ctypes.c_void_p.from_address


def _interface_address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def _probes() -> list[np.ndarray]:
    base = np.arange(64, dtype=np.float64)
    return [np.zeros((4, 16), np.float32), np.ones(3, np.int8), base, base[5:], base.reshape(8, 8)[2:, 1:],
            np.empty(0, np.int32), np.full((2, 3, 5), 7, np.int64)]


def _data_field_offset() -> int | None:
    """The byte offset of the data pointer in an ndarray object, verified on every probe; None if none fits."""
    if platform.python_implementation() != "CPython":
        return None
    probes = _probes()
    want = [_interface_address(p) for p in probes]
    for offset in range(_POINTER, 8 * _POINTER, _POINTER):   # after the header's reference count, at least
        if all((_load(id(p) + offset).value or 0) == w for p, w in zip(probes, want)):
            return offset
    return None


def _field_reader(offset: int) -> Callable[[np.ndarray], int]:
    def data_address(a: np.ndarray) -> int:
        """The address of `a`'s first element (module docstring)."""
        return _load(id(a) + offset).value or 0
    return data_address


_OFFSET = _data_field_offset()
data_address: Callable[[np.ndarray], int] = _field_reader(_OFFSET) if _OFFSET is not None else _interface_address
"""The address of a numpy array's first element (module docstring); for `np.ndarray` and its subclasses only."""
