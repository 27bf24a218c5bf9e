"""TMA copies and mbarriers in the SIMT simulator (codegen/simulator/tma.py): a wgmma GEMM fed by TMA
(boxes written with the 128-byte swizzle, 0 past the tensor's end) equals numpy's, and each protocol bug
is reported: a missing ``expect_tx``, a copy issued by every thread, a wait for the wrong parity, a read
before the wait, an uninitialized barrier, and a stage overwritten while a wgmma still reads it."""
from __future__ import annotations

import numpy as np
import pytest

from redfuser.codegen.simulator import simulate
from redfuser.ir.errors import SimulationError
from redfuser.ir.simt.builder import SimtBuilder
from redfuser.ir.simt.nodes import WgmmaShape
from redfuser.ir.simt.wgmma_fragments import accumulator
from redfuser.ir.types import float8_e4m3fn, float16, float32, int32, int64

N, ROWS_B, K = 64, 60, 64     # B has 60 rows: the 64-row box reads 4 rows past its end, which TMA fills with 0


def tma_gemm(bug: str = ""):
    b = SimtBuilder("tma_gemm", warps=4, grid=(1,))
    a_g, b_g = b.buffer("a", float16, (64, K)), b.buffer("b", float16, (ROWS_B, K))
    out = b.buffer("out", float32, (128 * N // 2,))
    a_s = b.shared("a_s", float16, (64 * K,), align=1024)
    b_s = b.shared("b_s", float16, (N * K,), align=1024)
    bars = b.shared("bars", int64, (1,), align=8)
    tid = b.thread_idx()
    zero = b.const(0, int32)
    one_thread = b.eq(tid, zero)
    tx = 2 * (64 * K + N * K) if bug != "no expect_tx" else 0

    def produce():
        if bug != "no init":
            b.mbarrier_init(bars, 0, 1)
        b.mbarrier_arrive(bars, 0, tx_bytes=tx)
        if bug != "copy by every thread":
            b.tma_load(a_s, 0, a_g, [zero, zero], (64, K), swizzle=1, barrier=bars, barrier_index=0)
            b.tma_load(b_s, 0, b_g, [zero, zero], (N, K), swizzle=1, barrier=bars, barrier_index=0)

    b.if_(one_thread, produce, lambda: None)
    if bug == "copy by every thread":
        b.tma_load(a_s, 0, a_g, [zero, zero], (64, K), swizzle=1, barrier=bars, barrier_index=0)
    b.barrier()
    if bug != "read before wait":
        b.mbarrier_wait(bars, 0, 1 if bug == "wrong parity" else 0)
    b.wgmma_fence()
    a_addr, b_addr = b.shared_address(a_s), b.shared_address(b_s)
    shape, acc = WgmmaShape(N, float16), None
    for step in range(K // 16):
        offset = b.const(32 * step, int32)
        da = b.wgmma_descriptor(b.add(a_addr, offset), leading=16, stride=1024, swizzle=1)
        db = b.wgmma_descriptor(b.add(b_addr, offset), leading=16, stride=1024, swizzle=1)
        acc = b.wgmma(shape, a_desc=da, b_desc=db, c=acc)
    b.wgmma_commit()
    if bug == "reuse in flight":   # the next stage's copy into a_s before the wgmmas reading it are done
        b.if_(one_thread, lambda: (b.mbarrier_arrive(bars, 0, tx_bytes=2 * 64 * K),
                                   b.tma_load(a_s, 0, a_g, [zero, zero], (64, K), swizzle=1, barrier=bars,
                                              barrier_index=0)) and None, lambda: None)
    b.wgmma_wait(0)
    for part in range(N // 2 // 4):
        index = b.add(b.mul(tid, b.const(N // 2, int32)), b.const(4 * part, int32))
        b.store_global(out, index, b.extract(acc, 4 * part, 4))
    return b.build()


def _inputs(seed: int = 0):
    rng = np.random.default_rng(seed)
    return {"a": rng.standard_normal((64, K)).astype(np.float16),
            "b": rng.standard_normal((ROWS_B, K)).astype(np.float16), "out": np.zeros(128 * N // 2)}


def test_a_tma_fed_wgmma_gemm_equals_numpy_with_zero_fill_past_the_end():
    args = _inputs()
    result = simulate(tma_gemm(), args)
    d = np.empty((64, N))
    values = result["out"].reshape(128, N // 2)
    for t in range(128):
        for i in range(N // 2):
            d[accumulator(t, i, N)] = values[t, i]
    b_padded = np.zeros((N, K))
    b_padded[:ROWS_B] = args["b"]
    want = args["a"].astype(np.float64) @ b_padded.T
    np.testing.assert_allclose(d, want, rtol=1e-6, atol=1e-5)
    assert np.all(d[:, ROWS_B:] == 0)


@pytest.mark.parametrize("bug,kind", [
    ("no expect_tx", "mbarrier_expect_tx"),
    ("copy by every thread", "mbarrier_expect_tx"),
    ("wrong parity", "mbarrier_deadlock"),
    ("read before wait", "tma_not_landed"),
    ("no init", "mbarrier_uninitialized"),
    ("reuse in flight", "buffer_reuse"),
])
def test_each_planted_protocol_bug_is_reported(bug, kind):
    with pytest.raises(SimulationError) as err:
        simulate(tma_gemm(bug), _inputs())
    assert err.value.kind == kind, str(err.value)


def test_the_tma_fed_gemm_assembles_for_sm_90a_with_tensor_maps_read_in_place():
    """Each TMA source buffer gets a 128-byte CUtensorMap parameter (64-byte aligned, grid-constant: used in
    place through ``cvta.param``, never copied to local memory); the copies, the expect_tx arrive and the
    parity wait are what the PTX holds, and ptxas assembles it without spills or local memory."""
    from redfuser.codegen import ptx_check
    from redfuser.codegen.simt_to_llvm.kernel import compile_simt, tensor_map_sources

    kernel = tma_gemm()
    assert tensor_map_sources(kernel) == ["a", "b"]
    ptx = compile_simt(kernel, "sm_90a").ptx
    assert ptx.count(".param .align 64 .b8 tma_gemm_param_") == 2 and ptx.count("cvta.param.u64") == 2
    assert ptx.count("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes") == 2
    for op in ("mbarrier.init.shared::cta.b64", "mbarrier.arrive.expect_tx.shared::cta.b64",
               "mbarrier.try_wait.parity.shared::cta.b64"):
        assert op in ptx
    (result,) = ptx_check.check_ptx(ptx).values()
    assert result.usage[0].spill_store_bytes == 0 and "0 bytes lmem" in result.info_log


def tma_copy(swizzle: int = 0):
    """TMA alone: a 4 x 64 f16 box at row 2 of a 5-row tensor (rows past the end read 0), then each thread
    reads two elements of the landed (and possibly swizzled) box back out to global memory."""
    b = SimtBuilder("tma_copy", warps=1, grid=(1,))
    src, out = b.buffer("src", float16, (5, 64)), b.buffer("out", float16, (256,))
    box = b.shared("box", float16, (256,), align=1024)
    bars = b.shared("bars", int64, (1,), align=8)
    tid = b.thread_idx()
    zero, two = b.const(0, int32), b.const(2, int32)

    def produce():
        b.mbarrier_init(bars, 0, 1)
        b.mbarrier_arrive(bars, 0, tx_bytes=256 * 2)
        b.tma_load(box, 0, src, [two, zero], (4, 64), swizzle=swizzle, barrier=bars, barrier_index=0)

    b.if_(b.eq(tid, zero), produce, lambda: None)
    b.barrier()
    b.mbarrier_wait(bars, 0, 0)
    for half in range(8):
        i = b.add(b.mul(tid, b.const(8, int32)), b.const(half, int32))
        b.store_global(out, i, b.load_shared(box, i))
    return b.build()


@pytest.mark.parametrize("swizzle", [0, 1])
def test_a_tma_box_lands_row_by_row_swizzled_and_zero_past_the_end(swizzle):
    from redfuser.ir.simt.wgmma_fragments import Swizzle, swizzle as swizzled

    src = np.arange(5 * 64, dtype=np.float16).reshape(5, 64)
    out = simulate(tma_copy(swizzle), {"src": src, "out": np.zeros(256)})["out"]
    want = np.zeros((4, 64), np.float16)
    want[:3] = src[2:]
    flat = want.ravel()
    if swizzle:
        placed = np.empty_like(flat)
        for e in range(flat.size):
            placed[swizzled(2 * e, Swizzle.B128) // 2] = flat[e]
        flat = placed
    np.testing.assert_array_equal(out, flat)


def test_tma_kernels_are_refused_before_sm_90():
    from redfuser.codegen import ptx_check
    from redfuser.codegen.simt_to_llvm.kernel import compile_simt
    from redfuser.ir.errors import BackendError

    with pytest.raises(BackendError, match="TMA and mbarriers, which need sm_90"):
        compile_simt(tma_copy(), "sm_80")
    assert ptx_check.check_ptx(compile_simt(tma_copy(), "sm_90").ptx)


def test_tensor_map_arguments_follow_the_drivers_conventions_and_refuse_what_tma_cannot_do():
    from redfuser.ir.errors import BackendError
    from redfuser.runtime.tensor_maps import tensor_map_specs

    a, b = tensor_map_specs(tma_gemm())
    assert (a.buffer, a.data_type, a.global_dims, a.global_strides, a.box, a.swizzle) == \
        ("a", "FLOAT16", (K, 64), (2 * K,), (K, 64), "128B")
    assert (b.global_dims, b.box, b.oob_fill) == ((K, ROWS_B), (K, N), "NONE")   # rows past 60 read 0

    def copy_kernel(shape, box, swizzle, dtype=float16):
        kb = SimtBuilder("k", warps=1, grid=(1,))
        src = kb.buffer("src", dtype, shape)
        dst = kb.shared("dst", dtype, (box[0] * box[1],), align=1024)
        bars = kb.shared("bars", int64, (1,), align=8)
        zero = kb.const(0, int32)
        kb.mbarrier_init(bars, 0, 1)
        kb.tma_load(dst, 0, src, [zero, zero], box, swizzle=swizzle, barrier=bars, barrier_index=0)
        return kb.build()

    with pytest.raises(BackendError, match="rows of 26 bytes"):
        tensor_map_specs(copy_kernel((4, 13), (4, 8), 0))
    with pytest.raises(BackendError, match="box row of 256 bytes under swizzle 128B"):
        tensor_map_specs(copy_kernel((4, 128), (4, 128), 1))
    (e4m3,) = tensor_map_specs(copy_kernel((4, 128), (4, 128), 1, dtype=float8_e4m3fn))
    assert e4m3.data_type == "UINT8" and e4m3.box == (128, 4)
