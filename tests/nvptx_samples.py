"""Small hand-built NVPTX kernels that prove the plumbing under the SIMT lowering.

Each builder returns an `llvmlite.ir.Module` with one kernel. The tests compile
them to PTX for sm_80 and sm_90 and assemble the result; on a GPU the runtime
tests launch them and compare with numpy. The host-side
`pack_mma_operands`/`unpack_mma_result` turn matrices into the per-lane
registers of `redfuser.ir.simt.fragments`, so an mma kernel's output checks the
fragment layouts against the hardware.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
from llvmlite import ir

from redfuser.codegen import nvvm
from redfuser.codegen.nvptx import new_module
from redfuser.codegen.nvvm import F32, HALF2, I32, I64, PTR
from redfuser.codegen.nvvm_mma import mma_m16n8k16_bf16_f32, mma_m16n8k16_f16_f32, mma_m16n8k32_e4m3_f32
from redfuser.ir.simt.fragments import fragment_a, fragment_b, fragment_c

BLOCK_SUM_THREADS = 256


def vector_add() -> ir.Module:
    """``c[i] = a[i] + b[i]`` for ``i < n``: f32, one element per thread, 64-bit index, masked."""
    module = new_module("vector_add")
    fn = nvvm.define_kernel(module, "vector_add", [PTR, PTR, PTR, I64])
    a, b, c, n = fn.args
    builder = ir.IRBuilder(fn.append_basic_block("entry"))
    i = nvvm.global_index_i64(builder)
    inside = builder.icmp_signed("<", i, n, name="inside")
    zero = ir.Constant(F32, 0.0)
    x = nvvm.load_masked(builder, nvvm.element_ptr(builder, a, F32, i), F32, inside, zero)
    y = nvvm.load_masked(builder, nvvm.element_ptr(builder, b, F32, i), F32, inside, zero)
    nvvm.store_masked(builder, builder.fadd(x, y), nvvm.element_ptr(builder, c, F32, i), inside)
    builder.ret_void()
    return module


def vector_add_v4() -> ir.Module:
    """``c = a + b`` with 16-byte vector loads/stores: thread t owns elements 4t..4t+3, scalar masked tail."""
    module = new_module("vector_add_v4")
    fn = nvvm.define_kernel(module, "vector_add_v4", [PTR, PTR, PTR, I64])
    a, b, c, n = fn.args
    builder = ir.IRBuilder(fn.append_basic_block("entry"))
    first = builder.mul(nvvm.global_index_i64(builder), ir.Constant(I64, 4), name="first")
    whole = builder.icmp_signed("<=", builder.add(first, ir.Constant(I64, 4)), n, name="whole")
    vec = nvvm.vector_type(F32)
    with builder.if_else(whole) as (then, otherwise):
        with then:
            x = nvvm.load_vector(builder, nvvm.element_ptr(builder, a, F32, first), vec)
            y = nvvm.load_vector(builder, nvvm.element_ptr(builder, b, F32, first), vec)
            nvvm.store_vector(builder, builder.fadd(x, y), nvvm.element_ptr(builder, c, F32, first))
        with otherwise:
            for j in range(4):
                i = builder.add(first, ir.Constant(I64, j))
                inside = builder.icmp_signed("<", i, n)
                x = nvvm.load_masked(builder, nvvm.element_ptr(builder, a, F32, i), F32, inside, ir.Constant(F32, 0))
                y = nvvm.load_masked(builder, nvvm.element_ptr(builder, b, F32, i), F32, inside, ir.Constant(F32, 0))
                nvvm.store_masked(builder, builder.fadd(x, y), nvvm.element_ptr(builder, c, F32, i), inside)
    builder.ret_void()
    return module


def block_sum(threads: int = BLOCK_SUM_THREADS) -> ir.Module:
    """``out[block] = sum(x[block*threads : (block+1)*threads])`` (masked by `n`): warp butterflies,
    one partial per warp in shared memory, a barrier, then warp 0 reduces the partials."""
    warps = threads // 32
    module = new_module("block_sum")
    fn = nvvm.define_kernel(module, "block_sum", [PTR, PTR, I64])
    nvvm.set_launch_bounds(fn, threads)
    x, out, n = fn.args
    partials = nvvm.declare_shared(module, "warp_partials", F32, warps)
    builder = ir.IRBuilder(fn.append_basic_block("entry"))
    i = nvvm.global_index_i64(builder)
    value = nvvm.load_masked(builder, nvvm.element_ptr(builder, x, F32, i), F32,
                             builder.icmp_signed("<", i, n), ir.Constant(F32, 0.0))
    fadd = lambda b, p, q: b.fadd(p, q)  # noqa: E731 - the monoid of this reduction
    warp_total = nvvm.warp_allreduce(builder, value, fadd)
    tid = nvvm.thread_idx(builder)
    lane = builder.and_(tid, ir.Constant(I32, 31), name="lane")
    warp = builder.lshr(tid, ir.Constant(I32, 5), name="warp")
    lane0 = builder.icmp_unsigned("==", lane, ir.Constant(I32, 0))
    nvvm.store_masked(builder, warp_total, nvvm.shared_gep(builder, partials, F32, warp), lane0)
    nvvm.barrier(builder)
    with builder.if_then(builder.icmp_unsigned("==", warp, ir.Constant(I32, 0))):
        has = builder.icmp_unsigned("<", lane, ir.Constant(I32, warps))
        mine = nvvm.load_masked(builder, nvvm.shared_gep(builder, partials, F32, lane), F32, has, ir.Constant(F32, 0))
        total = nvvm.warp_allreduce(builder, mine, fadd)
        out_ptr = nvvm.element_ptr(builder, out, F32, nvvm.block_idx(builder))
        nvvm.store_masked(builder, total, out_ptr, lane0)
    builder.ret_void()
    return module


def reverse_in_block() -> ir.Module:
    """``out[i] = x[block_start + ntid - 1 - tid]`` through *dynamic* shared memory (launch with
    ``shared_bytes >= 4 * ntid``; more than 48 KiB exercises the runtime's opt-in). Needs full blocks."""
    module = new_module("reverse_in_block")
    fn = nvvm.define_kernel(module, "reverse_in_block", [PTR, PTR])
    x, out = fn.args
    smem = nvvm.declare_dynamic_shared(module)
    builder = ir.IRBuilder(fn.append_basic_block("entry"))
    i = nvvm.global_index_i64(builder)
    tid = nvvm.thread_idx(builder)
    value = builder.load(nvvm.element_ptr(builder, x, F32, i), typ=F32)
    builder.store(value, nvvm.shared_gep(builder, smem, F32, tid))
    nvvm.barrier(builder)
    mirror = builder.sub(builder.sub(nvvm.block_dim(builder), ir.Constant(I32, 1)), tid)
    builder.store(builder.load(nvvm.shared_gep(builder, smem, F32, mirror), typ=F32),
                  nvvm.element_ptr(builder, out, F32, i))
    builder.ret_void()
    return module


_MMA = {
    "f16": (16, HALF2, mma_m16n8k16_f16_f32),
    "bf16": (16, I32, mma_m16n8k16_bf16_f32),
    "e4m3": (32, I32, mma_m16n8k32_e4m3_f32),
}


def mma_tile(kind: str) -> ir.Module:
    """One warp computes ``D = A·B`` (16x8, f32) from pre-packed per-lane registers:
    ``a_regs[32][4]``, ``b_regs[32][2]`` (i32 each) in, ``d_regs[32][4]`` (f32) out."""
    _, operand, mma = _MMA[kind]
    module = new_module(f"mma_{kind}")
    fn = nvvm.define_kernel(module, f"mma_{kind}", [PTR, PTR, PTR])
    nvvm.set_launch_bounds(fn, 32)
    a_regs, b_regs, d_regs = fn.args
    builder = ir.IRBuilder(fn.append_basic_block("entry"))
    lane = builder.zext(nvvm.thread_idx(builder), I64)

    def regs(base: ir.Value, count: int) -> list[ir.Value]:
        first = builder.mul(lane, ir.Constant(I64, count))
        loaded = [builder.load(nvvm.element_ptr(builder, base, I32, builder.add(first, ir.Constant(I64, r))), typ=I32)
                  for r in range(count)]
        return [builder.bitcast(v, operand) for v in loaded] if operand != I32 else loaded

    zero = [ir.Constant(F32, 0.0)] * 4
    d = mma(builder, regs(a_regs, 4), regs(b_regs, 2), zero)
    first = builder.mul(lane, ir.Constant(I64, 4))
    for r in range(4):
        builder.store(d[r], nvvm.element_ptr(builder, d_regs, F32, builder.add(first, ir.Constant(I64, r))))
    builder.ret_void()
    return module


_NUMPY = {"f16": (np.float16, np.uint16), "bf16": (ml_dtypes.bfloat16, np.uint16),
          "e4m3": (ml_dtypes.float8_e4m3fn, np.uint8)}


def pack_mma_operands(kind: str, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-lane registers (uint32 ``[32,4]`` and ``[32,2]``) of A (16 x k) and B (k x 8) for `mma_tile`."""
    k = _MMA[kind][0]
    dtype, bits_type = _NUMPY[kind]
    a_bits = np.asarray(a, dtype=dtype).view(bits_type).astype(np.uint32)
    b_bits = np.asarray(b, dtype=dtype).view(bits_type).astype(np.uint32)
    width = 8 * np.dtype(bits_type).itemsize
    a_regs = np.zeros((32, 4), np.uint32)
    b_regs = np.zeros((32, 2), np.uint32)
    for lane in range(32):
        for r, coords in enumerate(fragment_a(lane, k)):
            a_regs[lane, r] = sum(int(a_bits[row, col]) << (j * width) for j, (row, col) in enumerate(coords))
        for r, coords in enumerate(fragment_b(lane, k)):
            b_regs[lane, r] = sum(int(b_bits[row, col]) << (j * width) for j, (row, col) in enumerate(coords))
    return a_regs, b_regs


def unpack_mma_result(d_regs: np.ndarray) -> np.ndarray:
    """The 16 x 8 f32 matrix from `mma_tile`'s per-lane output registers ``[32,4]``."""
    d = np.zeros((16, 8), np.float32)
    for lane in range(32):
        for r, (row, col) in enumerate(fragment_c(lane)):
            d[row, col] = d_regs[lane, r]
    return d


__all__ = ["vector_add", "vector_add_v4", "block_sum", "reverse_in_block", "mma_tile", "pack_mma_operands",
           "unpack_mma_result",
           "BLOCK_SUM_THREADS"]
