"""One LLVM type layer for both emitters: IR dtypes as LLVM types and constants, and numpy's ``astype``.

- `types`: register and memory types of each dtype, constants, the bool byte of memory;
- `bits`: bf16 / float8 e4m3fn / f64 -> f32-to-odd conversions as integer code;
- `casts`: `cast`, the one conversion ladder, choosing per step by the target's `TargetCaps`;
- `target`: `TargetCaps` and the two targets, `HOST` and `NVPTX`.

The host emitter (`codegen.host`) and the GPU emitter (`codegen.simt_to_llvm`) use only this for dtypes;
what differs between them is data on their `TargetCaps`.
"""
from .casts import cast
from .target import HOST, NVPTX, TargetCaps
from .types import constant, from_memory, holds_bits, intrinsic_suffix, memory_type, register_type, to_memory

__all__ = ["cast", "HOST", "NVPTX", "TargetCaps", "constant", "from_memory", "holds_bits", "intrinsic_suffix",
           "memory_type", "register_type", "to_memory"]
