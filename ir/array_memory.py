"""The memory a kernel input occupies, as a flat array the compiled code addresses.

Compiled kernels (cpu, simulate, cuda) address an input of `BufferType` ``type`` as a flat array of
``type.span`` elements starting at its lowest addressed element; element ``i`` of the view is at
``type.base_offset + sum(i[d] * type.element_strides[d])`` (`redfuser.schedule.space.offsets`). For a
dense input that is the array itself; for a strided view (a transpose, a slice, a ``broadcast_to``)
it is a view of the memory the caller's array already uses: nothing is copied, a zero-stride view of
one element stays one element.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from .errors import InternalError
from .sizes import concrete
from .types import BufferType


def memory_of(array: np.ndarray, type_: BufferType, sizes: Mapping[str, int] | None = None) -> np.ndarray:
    """The flat, read-only view of `array`'s memory that code compiled for `type_` addresses (a view of a
    shape-polymorphic kernel: its run-time extents' values in `sizes`)."""
    if sizes and type_.strides is not None:
        type_ = BufferType(type_.dtype, concrete(type_.shape, sizes), type_.strides)
    if type_.strides is None:
        return np.ascontiguousarray(array, dtype=type_.dtype.numpy).reshape(-1)
    item = array.itemsize
    got = tuple(s // item for s in array.strides)
    if array.dtype != type_.dtype.numpy or array.shape != type_.shape or any(
            n > 1 and g != s for n, g, s in zip(array.shape, got, type_.strides)):
        raise InternalError(f"an argument of {array.dtype}{list(array.shape)} with element strides {got} was passed "
                            f"to code compiled for {type_}", pass_name="array_memory")
    if type_.span == 0:
        return np.empty(0, array.dtype)
    # Reversing the dims that step backwards puts the lowest addressed element first.
    lowest = array[tuple(slice(None, None, -1) if s < 0 and n > 1 else slice(None)
                         for n, s in zip(array.shape, array.strides))]
    return np.lib.stride_tricks.as_strided(lowest, shape=(type_.span,), strides=(item,), writeable=False)
