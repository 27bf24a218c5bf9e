"""Types of the IR: element dtypes and buffer types, as objects (never strings).

A `DType` names one element type and knows its numpy dtype; a `BufferType`
is a dtype plus a static shape and prints like ``f32[2,4,128,64]``.
"""
from __future__ import annotations

import struct

from dataclasses import dataclass

import ml_dtypes
import numpy as np


@dataclass(frozen=True, slots=True)
class DType:
    """An element type. `name` is the short printed form (``f32``, ``bf16``...)."""

    name: str
    numpy_name: str

    @property
    def numpy(self) -> np.dtype:
        """The numpy (or ml_dtypes) dtype with the same values."""
        return _NUMPY[self.name]

    @property
    def is_float(self) -> bool:
        return self.name.startswith(("f", "bf"))

    @property
    def is_int(self) -> bool:
        return self.name.startswith("i")

    @property
    def is_bool(self) -> bool:
        return self.name == "bool"

    @property
    def storage_only(self) -> bool:
        """Whether values of this type are kept in memory but computed in f32 (f16, bf16, float8 e4m3fn).

        Such a type has too few bits to carry a sum, a running max's rescale or an exp argument without
        losing the result, and on the GPU it has no (bf16, e4m3) or only paired (f16) arithmetic: so the
        schedule widens every operand to f32 and rounds once to the narrow type where the value is stored or
        numpy's result type says so, the verifiers refuse arithmetic in it, and the emitters need only its
        loads, stores and conversions."""
        return self.name in _STORAGE_ONLY

    @property
    def itemsize(self) -> int:
        return self.numpy.itemsize

    def __str__(self) -> str:
        return self.name


float32 = DType("f32", "float32")
float64 = DType("f64", "float64")
float16 = DType("f16", "float16")
bfloat16 = DType("bf16", "bfloat16")
float8_e4m3fn = DType("f8e4m3", "float8_e4m3fn")
int32 = DType("i32", "int32")
int64 = DType("i64", "int64")
bool_ = DType("bool", "bool")

_STORAGE_ONLY = frozenset({"f16", "bf16", "f8e4m3"})

ALL_DTYPES: tuple[DType, ...] = (float32, float64, float16, bfloat16, float8_e4m3fn, int32, int64, bool_)

_NUMPY: dict[str, np.dtype] = {
    "f32": np.dtype(np.float32),
    "f64": np.dtype(np.float64),
    "f16": np.dtype(np.float16),
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "f8e4m3": np.dtype(ml_dtypes.float8_e4m3fn),
    "i32": np.dtype(np.int32),
    "i64": np.dtype(np.int64),
    "bool": np.dtype(np.bool_),
}
_FROM_NUMPY: dict[np.dtype, DType] = {_NUMPY[d.name]: d for d in ALL_DTYPES}


def from_numpy(dtype: object) -> DType | None:
    """The IR dtype for a numpy dtype (or dtype-like), or None if the IR has none."""
    try:
        return _FROM_NUMPY.get(np.dtype(dtype))
    except TypeError:
        return None


def row_major_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Element strides of a dense row-major array of `shape` (the last dim has stride 1)."""
    out, n = [], 1
    for s in reversed(shape):
        out.append(n)
        n *= s
    return tuple(reversed(out))


@dataclass(frozen=True, slots=True)
class BufferType:
    """An array type with a static shape: dense row-major, or a strided view of memory.

    Below the Loop IR of a shape-polymorphic kernel a dense buffer's shape may hold run-time extents
    (`redfuser.ir.sizes.Size`); its size and strides are then expressions of them. A view's strides are
    static; its shape may hold run-time extents too (its `span` and `base_offset` are then expressions).

    `strides` are element strides, one per dim (any sign; 0 repeats one element along a dim, as
    ``numpy.broadcast_to`` does); None means dense row-major, the layout of every array the compiler
    allocates. Only kernel inputs are ever strided: a kernel is specialized on its arguments' strides,
    so it reads a view in place instead of copying it (a 4-byte ``broadcast_to`` view of a large shape
    stays 4 bytes). Memory is addressed from the view's lowest element: element ``i`` lives at
    ``base_offset + sum(i[d] * strides[d])`` elements past it, and the view covers `span` elements.
    """

    dtype: DType
    shape: tuple[int, ...]
    strides: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if any(type(n) is not int and isinstance(n, int) for n in self.shape):   # traced probe lengths
            object.__setattr__(self, "shape", tuple(int(n) if isinstance(n, int) else n for n in self.shape))
        if self.strides is not None and len(self.strides) != len(self.shape):
            raise ValueError(f"{len(self.strides)} strides for a {len(self.shape)}-d shape")

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        """Elements of the array (the product of its shape)."""
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def empty(self) -> bool:
        """Whether the array has no element (a run-time extent is never 0: a length of 0 stays static)."""
        return any(isinstance(n, int) and n == 0 for n in self.shape)

    @property
    def element_strides(self) -> tuple[int, ...]:
        """Element strides per dim (row-major ones for a dense buffer)."""
        return self.strides if self.strides is not None else row_major_strides(self.shape)

    @property
    def base_offset(self) -> int:
        """Elements from the lowest addressed element to element ``[0, ..., 0]`` (> 0 only with negative
        strides)."""
        if self.strides is None or self.empty:
            return 0
        return sum((1 - n) * s for n, s in zip(self.shape, self.element_strides) if s < 0)

    @property
    def span(self) -> int:
        """Elements of memory between the lowest and the highest addressed element, both included (the
        size for a dense buffer; 0 for an empty one)."""
        if self.strides is None:
            return self.size
        if self.empty:
            return 0
        return 1 + sum((n - 1) * abs(s) for n, s in zip(self.shape, self.element_strides))

    def __str__(self) -> str:
        text = f"{self.dtype}[{','.join(str(s) for s in self.shape)}]"
        if self.strides is not None:
            text += f"{{strides {','.join(str(s) for s in self.strides)}}}"
        return text


def scalar_key(value: object) -> tuple:
    """A scalar's type and exact value, as a key: Python's ``==`` says ``2 == 2.0 == True`` and ``0.0 == -0.0``
    and NaN is not itself, but each of those computes differently. Floats go by their bits, numpy scalars by
    their dtype and bytes; anything else by its type name and value."""
    if isinstance(value, np.generic):
        return ("numpy", value.dtype.str, value.tobytes())
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int):
        return ("int", int(value))
    if isinstance(value, float):
        return ("float", struct.pack("<d", value))
    return (type(value).__name__, value)
