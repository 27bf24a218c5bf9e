"""Types of the SIMT IR: per-thread registers, shared allocations and the op enums.

A `RegType` is a scalar or a short fixed-length vector of one dtype (one value
per thread, printed ``f32`` or ``<4 x f32>``); a `Reg` is an SSA register of
that type. `MmaShape` names a tensor-core instruction and knows the fragment
types it reads and writes (see `fragments.fragment_a/b/c`).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Union

from ..types import BufferType, DType, bfloat16, float8_e4m3fn, float16, float32

WARP_SIZE = 32
MAX_VECTOR = 16
MAX_STATIC_SHARED_BYTES = 48 * 1024
"""Shared memory a kernel may declare statically (``.shared``): past it, the launch's dynamic shared memory."""
MAX_DYNAMIC_SHARED_BYTES = 227 * 1024
"""Shared memory of one block on Hopper (sm_90a) with the per-kernel opt-in raised: the launch's dynamic
shared memory (`SimtKernel.dynamic_shared`). Ampere and Ada allow less (163 and 99 KiB), so the kernels
for sm_80 and sm_90 stay within `MAX_STATIC_SHARED_BYTES`."""
SHARED_BYTES_PER_SM = 228 * 1024
"""An H100/H200 SM's shared memory, of which each resident block takes its own and `BLOCK_RESERVED_SHARED_BYTES`."""
BLOCK_RESERVED_SHARED_BYTES = 1024
REGISTERS_PER_SM = 65536
"""32-bit registers of one SM (every target RedFuser emits for)."""

Scalar = Union[float, int, bool]


@dataclass(frozen=True, slots=True)
class RegType:
    """A per-thread register type: `dtype` and `length` (1: a scalar); prints ``f32`` or ``<4 x f32>``."""

    dtype: DType
    length: int = 1

    @property
    def is_vector(self) -> bool:
        return self.length > 1

    @property
    def nbytes(self) -> int:
        return self.dtype.itemsize * self.length

    def scalar(self) -> "RegType":
        return RegType(self.dtype)

    def with_dtype(self, dtype: DType) -> "RegType":
        return RegType(dtype, self.length)

    def __str__(self) -> str:
        return str(self.dtype) if self.length == 1 else f"<{self.length} x {self.dtype}>"


@dataclass(frozen=True, slots=True)
class Reg:
    """An SSA register (one value per thread); `name` is unique in its kernel, printed ``%name``."""

    name: str
    type: RegType

    @property
    def dtype(self) -> DType:
        return self.type.dtype

    @property
    def length(self) -> int:
        return self.type.length

    def __str__(self) -> str:
        return f"%{self.name}"


@dataclass(frozen=True, slots=True)
class SharedAlloc:
    """A static shared-memory array of the block (row-major `type`, indexed by flat element offset), placed at
    a multiple of `align` bytes (1024 for a tile a ``wgmma`` descriptor reads with a 128-byte swizzle)."""

    name: str
    type: BufferType
    align: int = 16

    @property
    def dtype(self) -> DType:
        return self.type.dtype

    @property
    def size(self) -> int:
        return self.type.size

    @property
    def nbytes(self) -> int:
        return self.type.size * self.type.dtype.itemsize


class IntOp(enum.Enum):
    """Integer-only binary ops (index arithmetic); `Binary` has the Loop IR's ops."""

    DIV = "div"   # truncates toward zero
    REM = "rem"   # sign of the dividend
    SHL = "shl"
    SHR = "shr"   # arithmetic
    AND = "and"
    OR = "or"
    XOR = "xor"


class ShuffleKind(enum.Enum):
    BFLY = "bfly"
    IDX = "idx"
    DOWN = "down"


class MmaShape(enum.Enum):
    """A warp-wide ``mma.sync.aligned`` shape with f32 accumulate (row-major A, "col" B)."""

    M16N8K16_F16 = "m16n8k16.f16"
    M16N8K16_BF16 = "m16n8k16.bf16"
    M16N8K32_E4M3 = "m16n8k32.e4m3"

    @property
    def k(self) -> int:
        return 32 if self is MmaShape.M16N8K32_E4M3 else 16

    @property
    def operand_dtype(self) -> DType:
        return {MmaShape.M16N8K16_F16: float16, MmaShape.M16N8K16_BF16: bfloat16,
                MmaShape.M16N8K32_E4M3: float8_e4m3fn}[self]

    @property
    def a_type(self) -> RegType:
        """Per-lane A fragment: 16 x k elements over 32 lanes."""
        return RegType(self.operand_dtype, 16 * self.k // WARP_SIZE)

    @property
    def b_type(self) -> RegType:
        """Per-lane B fragment: k x 8 elements over 32 lanes."""
        return RegType(self.operand_dtype, 8 * self.k // WARP_SIZE)

    @property
    def c_type(self) -> RegType:
        """Per-lane C/D fragment: 16 x 8 f32 over 32 lanes."""
        return RegType(float32, 4)


@dataclass(frozen=True, slots=True)
class WgmmaShape:
    """A warpgroup ``wgmma.mma_async.sync.aligned.m64nNkK`` with f32 accumulate: `n` a multiple of 8 up to
    256, K = 16 for f16/bf16 operands (`dtype`), 32 for e4m3 (``ir/simt/wgmma_fragments.py``)."""

    n: int
    dtype: DType

    @property
    def k(self) -> int:
        return 32 if self.dtype == float8_e4m3fn else 16

    @property
    def value(self) -> str:
        return f"m64n{self.n}k{self.k}.{self.dtype}"

    @property
    def a_type(self) -> RegType:
        """A from registers: 64 x K elements over the warpgroup's 128 threads."""
        return RegType(self.dtype, 64 * self.k // 128)

    @property
    def c_type(self) -> RegType:
        """The f32 accumulator: 64 x N over 128 threads."""
        return RegType(float32, self.n // 2)
