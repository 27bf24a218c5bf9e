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
from redfuser.ir.types import float16, float32, int32, int64

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
