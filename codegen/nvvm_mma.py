"""Tensor cores and the data movement around them, emitted with `llvmlite.ir`.

Warp-wide ``mma.sync.aligned`` through LLVM 22's NVVM intrinsics (no inline PTX needed):

    f16  m16n8k16, f32 accumulate  llvm.nvvm.mma.m16n8k16.row.col.f32.f32          A 4 x <2 x half>, B 2 x <2 x half>
    bf16 m16n8k16, f32 accumulate  llvm.nvvm.mma.m16n8k16.row.col.bf16             A 4 x i32,        B 2 x i32
    e4m3 m16n8k32, f32 accumulate  llvm.nvvm.mma.m16n8k32.row.col.f32.e4m3.e4m3.f32 A 4 x i32,       B 2 x i32

C and D are 4 x f32 per lane. f16/bf16 need sm_80 (PTX 7.0); e4m3 needs sm_89 and PTX 8.4.
Which lane holds which matrix element is `redfuser.ir.simt.fragments` (`fragment_a/b/c`, PTX ISA
"Matrix Fragments for mma.m16n8k16 / m16n8k32"), shared with the lowering and the SIMT simulator.
"""
from __future__ import annotations

from llvmlite import ir

from ..ir.errors import InternalError
from .nvvm import BF16, F16, F32, HALF2, I16, I32, PTR_GLOBAL, PTR_SHARED, call_intrinsic, like, splat

_RESULT4 = ir.LiteralStructType([F32, F32, F32, F32])


# --- mma.sync ---------------------------------------------------------------------------------

def _mma(builder: ir.IRBuilder, name: str, a_regs: list[ir.Value], b_regs: list[ir.Value], c_regs: list[ir.Value],
         operand_type: ir.Type) -> list[ir.Value]:
    if len(a_regs) != 4 or len(b_regs) != 2 or len(c_regs) != 4:
        raise InternalError(f"{name}: wants 4 A, 2 B and 4 C registers, got {len(a_regs)}, {len(b_regs)}, "
                            f"{len(c_regs)}", pass_name="nvvm")
    for reg in (*a_regs, *b_regs):
        if reg.type != operand_type:
            raise InternalError(f"{name}: operand of type {reg.type}, wants {operand_type}", pass_name="nvvm")
    for reg in c_regs:
        if reg.type != F32:
            raise InternalError(f"{name}: accumulator of type {reg.type}, wants float", pass_name="nvvm")
    result = call_intrinsic(builder, name, _RESULT4, [*a_regs, *b_regs, *c_regs])
    return [builder.extract_value(result, i) for i in range(4)]


def mma_m16n8k16_f16_f32(builder: ir.IRBuilder, a_regs: list[ir.Value], b_regs: list[ir.Value],
                         c_regs: list[ir.Value]) -> list[ir.Value]:
    """D = A·B + C on a warp: A 16x16 f16 (4 x <2 x half>), B 16x8 f16 (2 x <2 x half>), C/D 4 x f32."""
    return _mma(builder, "llvm.nvvm.mma.m16n8k16.row.col.f32.f32", a_regs, b_regs, c_regs, HALF2)


def mma_m16n8k16_bf16_f32(builder: ir.IRBuilder, a_regs: list[ir.Value], b_regs: list[ir.Value],
                          c_regs: list[ir.Value]) -> list[ir.Value]:
    """D = A·B + C on a warp with bf16 A/B, each register an i32 of two bf16 (low half first)."""
    return _mma(builder, "llvm.nvvm.mma.m16n8k16.row.col.bf16", a_regs, b_regs, c_regs, I32)


def mma_m16n8k32_e4m3_f32(builder: ir.IRBuilder, a_regs: list[ir.Value], b_regs: list[ir.Value],
                          c_regs: list[ir.Value]) -> list[ir.Value]:
    """D = A·B + C on a warp with FP8 e4m3 A (16x32) and B (32x8), each register an i32 of four bytes."""
    return _mma(builder, "llvm.nvvm.mma.m16n8k32.row.col.f32.e4m3.e4m3.f32", a_regs, b_regs, c_regs, I32)


# --- packing and conversions --------------------------------------------------------------------

def pack_half2(builder: ir.IRBuilder, lo: ir.Value, hi: ir.Value) -> ir.Value:
    """``<2 x half>`` from two halves (`lo` is element 0, the low 16 bits)."""
    vec = builder.insert_element(ir.Constant(HALF2, None), lo, ir.Constant(I32, 0))
    return builder.insert_element(vec, hi, ir.Constant(I32, 1))


def pack_i16x2(builder: ir.IRBuilder, lo: ir.Value, hi: ir.Value) -> ir.Value:
    """An i32 of two 16-bit patterns (bf16 pairs for the bf16 mma); `lo` in the low bits."""
    return builder.or_(builder.zext(lo, I32), builder.shl(builder.zext(hi, I32), ir.Constant(I32, 16)))


def f32_to_bf16_bits(builder: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """Round-to-nearest-even bf16 of `x` (a scalar or vector), as i16 bit patterns (``cvt.rn.bf16.f32`` on sm_80+)."""
    return builder.bitcast(builder.fptrunc(x, like(x.type, BF16)), like(x.type, I16))


def bf16_bits_to_f32(builder: ir.IRBuilder, bits: ir.Value) -> ir.Value:
    """The f32 value of bf16 bit patterns (scalar or vector; exact: shifted into the high half)."""
    wide = builder.zext(bits, like(bits.type, I32))
    return builder.bitcast(builder.shl(wide, splat(wide.type, 16)), like(bits.type, F32))


def f32x2_to_e4m3x2(builder: ir.IRBuilder, lo: ir.Value, hi: ir.Value) -> ir.Value:
    """Two f32 to two saturated FP8 e4m3 bytes in an i16 (`lo` in the low byte); sm_89+.

    ``cvt.rn.satfinite.e4m3x2.f32 d, a, b`` puts `a` in the *upper* byte, hence the swap.
    """
    return call_intrinsic(builder, "llvm.nvvm.ff.to.e4m3x2.rn", I16, [hi, lo])


def f16_to_f32(builder: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """Exact widening of a half (``cvt.f32.f16``)."""
    if x.type != F16:
        raise InternalError(f"f16_to_f32 of {x.type}", pass_name="nvvm")
    return builder.fpext(x, F32)


# --- shared-memory staging (sm_80 pipelines) ------------------------------------------------------

def ldmatrix(builder: ir.IRBuilder, smem_ptr: ir.Value, count: int = 4, *, trans: bool = False) -> list[ir.Value]:
    """``ldmatrix.sync.aligned.m8n8.x<count>[.trans].shared.b16``: `count` 8x8 b16 tiles, one i32 each per lane
    (the two elements a lane receives, the first in the low half).

    Lane `i` gives the shared address of row ``i % 8`` of tile ``i // 8`` (`smem_ptr`, addrspace 3).
    """
    if count not in (1, 2, 4):
        raise InternalError(f"ldmatrix of {count} tiles: 1, 2 or 4", pass_name="nvvm")
    name = f"llvm.nvvm.ldmatrix.sync.aligned.m8n8.x{count}" + (".trans" if trans else "") + ".b16"
    if count == 1:
        return [call_intrinsic(builder, name, I32, [_shared(smem_ptr, name)])]
    result = call_intrinsic(builder, name, ir.LiteralStructType([I32] * count), [_shared(smem_ptr, name)])
    return [builder.extract_value(result, i) for i in range(count)]


def cp_async_16(builder: ir.IRBuilder, smem_ptr: ir.Value, gmem_ptr: ir.Value) -> None:
    """``cp.async.cg.shared.global`` of 16 bytes (bypasses L1 and registers); both pointers 16-byte aligned."""
    if gmem_ptr.type != PTR_GLOBAL:
        gmem_ptr = builder.addrspacecast(gmem_ptr, PTR_GLOBAL)
    call_intrinsic(builder, "llvm.nvvm.cp.async.cg.shared.global.16", ir.VoidType(),
                   [_shared(smem_ptr, "cp.async"), gmem_ptr])


def cp_async_commit(builder: ir.IRBuilder) -> None:
    """``cp.async.commit_group``: close the group of copies issued so far."""
    call_intrinsic(builder, "llvm.nvvm.cp.async.commit.group", ir.VoidType(), [])


def cp_async_wait(builder: ir.IRBuilder, pending: int = 0) -> None:
    """``cp.async.wait_group n``: wait until at most `pending` groups are in flight (then barrier to share)."""
    call_intrinsic(builder, "llvm.nvvm.cp.async.wait.group", ir.VoidType(), [ir.Constant(I32, pending)])


def _shared(ptr: ir.Value, what: str) -> ir.Value:
    if ptr.type != PTR_SHARED:
        raise InternalError(f"{what} wants a shared-space pointer (ptr addrspace(3)), got {ptr.type}", pass_name="nvvm")
    return ptr


__all__ = [
    "mma_m16n8k16_f16_f32", "mma_m16n8k16_bf16_f32", "mma_m16n8k32_e4m3_f32",
    "pack_half2", "pack_i16x2", "f32_to_bf16_bits", "bf16_bits_to_f32", "f32x2_to_e4m3x2", "f16_to_f32",
    "ldmatrix", "cp_async_16", "cp_async_commit", "cp_async_wait",
]
