"""Thread coordinates, constants, elementwise arithmetic, casts and vector packing.

Computed for every thread of the block at once (inactive threads compute
garbage nobody observes). Conversions follow the hardware, not numpy, where
the two differ: float to f8 e4m3 saturates to +-448 (``cvt.rn.satfinite``),
float to int truncates with NaN -> 0 and saturates (``cvt.rzi``), and
conversions to bf16/e4m3 from anything but f32 go through f32, as the emitted
LLVM IR does.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ...ir.semantics import BINARY_FUNCS, UNARY_FUNCS
from ...ir.simt.nodes import (
    Binary, Bitcast, BlockIdx, Cast, Const, Extract, IntBinary, IntOp, LaneId, Pack, Select, ThreadIdx, Unary, WarpId,
)
from ...ir.types import DType, bfloat16, float8_e4m3fn, float32
from .state import Block

E4M3_MAX = 448.0


def _trunc_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    q = a // b
    return np.where((a % b != 0) & ((a < 0) != (b < 0)), q + 1, q).astype(a.dtype)


INT_FUNCS: dict[IntOp, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    IntOp.DIV: _trunc_div,
    IntOp.REM: lambda a, b: (a - _trunc_div(a, b) * b).astype(a.dtype),
    IntOp.SHL: np.left_shift,
    IntOp.SHR: np.right_shift,
    IntOp.AND: np.bitwise_and,
    IntOp.OR: np.bitwise_or,
    IntOp.XOR: np.bitwise_xor,
}


def convert(x: np.ndarray, src: DType, dst: DType) -> np.ndarray:
    """`x` (of dtype `src`) converted to `dst` as the GPU does it (see the module docstring)."""
    if src == dst:
        return x
    if src == float8_e4m3fn or (dst in (bfloat16, float8_e4m3fn) and src != float32 and not src.is_bool):
        return convert(x.astype(np.float32), float32, dst)   # through f32, like the emitted code
    if dst == float8_e4m3fn:
        x = x.astype(np.float32)
        return np.where(np.isnan(x), x, np.clip(x, -E4M3_MAX, E4M3_MAX)).astype(dst.numpy)
    if dst.is_bool:
        return x != 0
    if dst.is_int and src.is_float:
        info = np.iinfo(dst.numpy)
        wide = np.nan_to_num(np.trunc(x.astype(np.float64)), nan=0.0)
        limit = float(info.max) + 1.0       # 2**(bits-1), exact in f64 (info.max itself may not be)
        inside = np.where((wide < limit) & (wide >= -limit), wide, 0.0).astype(dst.numpy)
        return np.where(wide >= limit, info.max, np.where(wide < -limit, info.min, inside)).astype(dst.numpy)
    return x.astype(dst.numpy)


_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def bitcast(x: np.ndarray, src: DType, dst: DType) -> np.ndarray:
    """`x`'s bits as `dst` (`Bitcast`: float bits zero-extended to an integer, an integer's low bits as a float)."""
    x = np.ascontiguousarray(x, dtype=src.numpy)
    if src.is_float:
        return x.view(_UINT[src.itemsize]).astype(dst.numpy)
    return x.astype(_UINT[dst.itemsize]).view(dst.numpy)


def _const(s: Const, block: Block) -> None:
    block.set(s.out, np.asarray(s.value).astype(s.out.dtype.numpy))


def _select(s: Select, block: Block) -> None:
    cond = block[s.cond]
    if s.cond.length == 1 and s.a.length > 1:
        cond = cond[:, None]
    block.set(s.out, np.where(cond, block[s.a], block[s.b]))


def _pack(s: Pack, block: Block) -> None:
    block.set(s.out, np.concatenate([block[p].reshape(block.threads, -1) for p in s.parts], axis=1))


def _extract(s: Extract, block: Block) -> None:
    vec = block[s.vec]
    block.set(s.out, vec[:, s.index] if s.out.length == 1 else vec[:, s.index:s.index + s.out.length])


RULES: dict[type, Callable[..., None]] = {
    ThreadIdx: lambda s, b: b.set(s.out, b.tid),
    LaneId: lambda s, b: b.set(s.out, b.tid & 31),
    WarpId: lambda s, b: b.set(s.out, b.tid >> 5),
    BlockIdx: lambda s, b: b.set(s.out, np.int32(b.coords[s.axis])),
    Const: _const,
    Unary: lambda s, b: b.set(s.out, UNARY_FUNCS[s.op](b[s.x])),
    Binary: lambda s, b: b.set(s.out, BINARY_FUNCS[s.op](b[s.a], b[s.b])),
    IntBinary: lambda s, b: b.set(s.out, INT_FUNCS[s.op](b[s.a], b[s.b])),
    Select: _select,
    Cast: lambda s, b: b.set(s.out, convert(b[s.x], s.x.dtype, s.out.dtype)),
    Bitcast: lambda s, b: b.set(s.out, bitcast(b[s.x], s.x.dtype, s.out.dtype)),
    Pack: _pack,
    Extract: _extract,
}
