"""Types of the IR: element dtypes and buffer types, as objects (never strings).

A `DType` names one element type and knows its numpy dtype; a `BufferType`
is a dtype plus a static shape and prints like ``f32[2,4,128,64]``.
"""
from __future__ import annotations

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
    """A dense, row-major array type with a static shape."""

    dtype: DType
    shape: tuple[int, ...]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(str(s) for s in self.shape)}]"
