"""What the host passes for each TMA source of a kernel: the arguments of ``cuTensorMapEncodeTiled``.

A SIMT kernel's `TmaLoad`s read a global buffer through a *tensor map* that the host encodes before the
launch (``cuda.bindings.driver.cuTensorMapEncodeTiled``) and passes as the kernel's extra parameter
``<buffer>_tmap`` (`codegen.simt_to_llvm.kernel.tensor_map_sources`). `tensor_map_specs` derives those
arguments from the kernel, in the driver's conventions, and refuses with the reason what TMA cannot do:

- dimensions innermost first; ``globalStrides`` are the byte strides of the outer dimensions (rank - 1 of
  them), each a multiple of 16 (a row of 13 f32 values cannot be a TMA source);
- ``boxDim`` innermost first, each 1 to 256, the inner extent in bytes a multiple of 16 and, under a swizzle,
  at most the swizzle's span (64 f16 values for 128 bytes);
- out-of-bounds elements are filled with zeros (``OOB_FILL_NONE``), as the simulator does;
- e4m3 and bool travel as bytes (``UINT8``): TMA moves bits.

Every copy from one buffer must use the same box and swizzle (one map per buffer). `encode` asks the driver
for the 128-byte map of a spec at a buffer's device address; the cuda backend passes one per source at every
launch (`runtime/cuda_backend.py`).
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

from ..ir.errors import BackendError
from ..ir.simt.nodes import SimtKernel, TmaLoad, walk_stmts
from ..ir.simt.wgmma_fragments import Swizzle

_DATA_TYPES = {"f16": "FLOAT16", "bf16": "BFLOAT16", "f32": "FLOAT32", "i32": "INT32", "i64": "INT64",
               "f8e4m3": "UINT8", "bool": "UINT8"}
_SWIZZLES = {Swizzle.NONE: "NONE", Swizzle.B128: "128B", Swizzle.B64: "64B", Swizzle.B32: "32B"}


@dataclass(frozen=True)
class TensorMapSpec:
    """The arguments of ``cuTensorMapEncodeTiled`` for one buffer (enum names without their
    ``CU_TENSOR_MAP_...`` prefixes; the address is the buffer's at launch)."""

    buffer: str
    data_type: str                     # CU_TENSOR_MAP_DATA_TYPE_<data_type>
    global_dims: tuple[int, ...]       # innermost first
    global_strides: tuple[int, ...]    # bytes, the outer rank - 1 dimensions, innermost first
    box: tuple[int, ...]               # innermost first
    element_strides: tuple[int, ...]
    swizzle: str                       # CU_TENSOR_MAP_SWIZZLE_<swizzle>
    oob_fill: str = "NONE"             # zeros
    interleave: str = "NONE"
    l2_promotion: str = "L2_128B"


def tensor_map_specs(kernel: SimtKernel) -> list[TensorMapSpec]:
    """One spec per TMA source buffer of `kernel`, in the order of its ``_tmap`` parameters."""
    uses: dict[str, TmaLoad] = {}
    for s in walk_stmts(kernel.body):
        if isinstance(s, TmaLoad):
            first = uses.setdefault(s.src.name, s)
            if (first.box, first.swizzle) != (s.box, s.swizzle):
                raise BackendError(f"kernel {kernel.name}: TMA copies of {s.src.name} use boxes {first.box} and "
                                   f"{s.box} (or two swizzles); one tensor map per buffer takes one of each")
    return [_spec(kernel.name, kernel.buffer(s.src.name), s) for s in uses.values()]


def _spec(kernel: str, buf, s: TmaLoad) -> TensorMapSpec:
    """The spec of the copies `s` of `buf` (the kernel's parameter: a shape-polymorphic kernel's at the launch's
    lengths, `codegen.simt.run.at_lengths`)."""
    item = buf.dtype.itemsize
    where = f"kernel {kernel}: the TMA source {buf.name} ({buf.type})"
    dims = tuple(reversed(buf.shape))
    strides = []
    step = item
    for extent in dims[:-1]:
        step *= extent
        strides.append(step)
    if any(st % 16 for st in strides):
        raise BackendError(f"{where} has rows of {strides[0]} bytes; TMA needs byte strides that are multiples of 16")
    box = tuple(reversed(s.box))
    mode = Swizzle(s.swizzle)
    inner = box[0] * item
    if inner % 16 or (mode is not Swizzle.NONE and inner > mode.row_bytes):
        raise BackendError(f"{where}: a box row of {inner} bytes under swizzle {_SWIZZLES[mode]} (a multiple of 16"
                           + (f", at most {mode.row_bytes})" if mode is not Swizzle.NONE else ")"))
    if buf.dtype.name not in _DATA_TYPES:
        raise BackendError(f"{where}: TMA does not copy {buf.dtype}")
    return TensorMapSpec(buf.name, _DATA_TYPES[buf.dtype.name], dims, tuple(strides), box, (1,) * len(box),
                         _SWIZZLES[mode])


TENSOR_MAP_BYTES = 128


def encode(spec: TensorMapSpec, address: int) -> ctypes.Array:
    """The ``CUtensorMap`` of `spec` for the buffer at device `address` (16-byte aligned: the cuda backend copies
    an input that is not), as the bytes a kernel parameter takes (`cuda_driver.pack_params`)."""
    from .cuda_driver import call, driver

    def enum(kind: str, prefix: str, name: str):
        return getattr(getattr(driver, kind), f"CU_TENSOR_MAP_{prefix}_{name}")

    tensor_map = call("cuTensorMapEncodeTiled", enum("CUtensorMapDataType", "DATA_TYPE", spec.data_type),
                      len(spec.global_dims), address,
                      [driver.cuuint64_t(n) for n in spec.global_dims],
                      [driver.cuuint64_t(n) for n in spec.global_strides],
                      [driver.cuuint32_t(n) for n in spec.box],
                      [driver.cuuint32_t(n) for n in spec.element_strides],
                      enum("CUtensorMapInterleave", "INTERLEAVE", spec.interleave),
                      enum("CUtensorMapSwizzle", "SWIZZLE", spec.swizzle),
                      enum("CUtensorMapL2promotion", "L2_PROMOTION", spec.l2_promotion),
                      enum("CUtensorMapFloatOOBfill", "FLOAT_OOB_FILL", spec.oob_fill))
    return (ctypes.c_uint8 * TENSOR_MAP_BYTES).from_buffer_copy(ctypes.string_at(tensor_map.getPtr(), TENSOR_MAP_BYTES))


__all__ = ["TENSOR_MAP_BYTES", "TensorMapSpec", "encode", "tensor_map_specs"]
