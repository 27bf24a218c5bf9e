"""The SIMT simulator's model of Hopper's ``wgmma`` (codegen/simulator/wgmma.py): a warpgroup GEMM through
128-byte swizzled shared tiles equals numpy's, and each ordering rule of the PTX ISA that a kernel can break
without the arithmetic noticing is reported: a missing ``wgmma.fence``, ``fence.proxy.async``, commit/wait
or barrier, a read of C after the issue, a divergent warpgroup, a descriptor that differs between threads.
Each planted bug below is the one-line change of the correct kernel that the check must catch."""
from __future__ import annotations

import numpy as np
import pytest

from redfuser.codegen.simulator import simulate
from redfuser.ir.errors import SimulationError
from redfuser.ir.simt.builder import SimtBuilder
from redfuser.ir.simt.nodes import WgmmaShape
from redfuser.ir.simt.wgmma_fragments import Swizzle, accumulator, swizzle
from redfuser.ir.types import float16, float32, int32

N, K = 64, 64          # D (64 x N) = A (64 x K) · B (N x K)ᵀ, four k16 steps (the default kernel)
ROW_BYTES = 128        # a K-major row of 64 f16 (128 e4m3) values: one 128-byte swizzle row


def swizzled_image(tile: np.ndarray) -> np.ndarray:
    """The shared-memory image of a K-major tile of 128-byte rows under the 128-byte swizzle."""
    out = np.empty(tile.size, tile.dtype)
    item = tile.dtype.itemsize
    for r in range(tile.shape[0]):
        for k in range(tile.shape[1]):
            out[swizzle(r * ROW_BYTES + item * k, Swizzle.B128) // item] = tile[r, k]
    return out


def gemm_kernel(bug: str = "", n: int = N, dtype=float16):
    """One warpgroup: copy the swizzled A and B images to shared memory, then four chained wgmmas, commit,
    wait, and store the accumulator fragment (thread-major, n/2 values each). `bug` plants one mistake."""
    shape = WgmmaShape(n, dtype)
    k = ROW_BYTES // dtype.itemsize             # 64 f16/bf16 or 128 e4m3: four k-steps either way
    b = SimtBuilder("wgmma_gemm", warps=4, grid=(1,))
    a_img, b_img = b.buffer("a", dtype, (64 * k,)), b.buffer("b", dtype, (n * k,))
    out = b.buffer("out", float32, (128 * n // 2,))
    a_s = b.shared("a_s", dtype, (64 * k,), align=1024)
    b_s = b.shared("b_s", dtype, (n * k,), align=1024)
    tid = b.thread_idx()

    def copy(src, dst, iv):
        i = b.add(b.mul(iv, b.const(128, int32)), tid)
        b.store_shared(dst, i, b.load_global(src, i))

    b.for_(0, 64 * k // 128, 1, [], lambda iv: copy(a_img, a_s, iv))
    b.for_(0, n * k // 128, 1, [], lambda iv: copy(b_img, b_s, iv))
    if bug != "no barrier":
        b.barrier()
    if bug != "no proxy fence":
        b.fence_proxy_async()
    if bug != "no wgmma fence":
        b.wgmma_fence()
    a_addr, b_addr = b.shared_address(a_s), b.shared_address(b_s)
    if bug == "descriptor per thread":   # thread 5 reads its B tile 16 bytes further on
        b_addr = b.add(b_addr, b.select(b.eq(tid, b.const(5, int32)), b.const(16, int32), b.const(0, int32)))
    acc = None
    for step in range(4):
        offset = b.const(32 * step, int32)   # the k-step's 32 bytes within each swizzled row
        da = b.wgmma_descriptor(b.add(a_addr, offset), leading=16, stride=8 * ROW_BYTES, swizzle=1)
        db = b.wgmma_descriptor(b.add(b_addr, offset), leading=16, stride=8 * ROW_BYTES, swizzle=1)
        if bug == "divergent" and step == 0:   # half the warpgroup issues a wgmma
            b.if_(b.lt(tid, b.const(64, int32)), lambda: b.wgmma(shape, a_desc=da, b_desc=db) and None,
                  lambda: None)
        previous = acc
        acc = b.wgmma(shape, a_desc=da, b_desc=db, c=acc)
        if bug == "read C after issue" and previous is not None:
            b.store_global(out, b.mul(tid, b.const(n // 2, int32)), b.extract(previous, 0, 4))
    if bug != "no commit":
        b.wgmma_commit()
    if bug not in ("no wait", "no commit"):
        b.wgmma_wait(0)
    for part in range(max(n // 2 // 4, 1)):   # (16-byte stores)
        index = b.add(b.mul(tid, b.const(n // 2, int32)), b.const(4 * part, int32))
        b.store_global(out, index, b.extract(acc, 4 * part, 4))
    return b.build()


def tiles(seed: int = 0, n: int = N, dtype=np.float16) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    k = ROW_BYTES // np.dtype(dtype).itemsize
    return (rng.standard_normal((64, k)).astype(dtype), rng.standard_normal((n, k)).astype(dtype))


def unfragment(flat: np.ndarray, n: int = N) -> np.ndarray:
    d = np.empty((64, n), np.float32)
    values = flat.reshape(128, n // 2)
    for t in range(128):
        for i in range(n // 2):
            d[accumulator(t, i, n)] = values[t, i]
    return d


def test_a_warpgroup_gemm_through_swizzled_shared_tiles_equals_numpy():
    a, bt = tiles()
    result = simulate(gemm_kernel(), {"a": swizzled_image(a), "b": swizzled_image(bt), "out": np.zeros(128 * N // 2)})
    want = a.astype(np.float64) @ bt.astype(np.float64).T
    np.testing.assert_allclose(unfragment(result["out"]), want, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("n", [8, 128, 256])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float8_e4m3fn"])
def test_wgmma_shapes_and_types_equal_numpy_and_assemble(n, dtype):
    """m64nNk16 for f16/bf16 and m64nNk32 for e4m3 at the smallest, a middle and the largest N: numpy's
    product in the simulator (exact products, one f32 rounding per k-step's sum), and the same kernel
    assembled for sm_90a without spills."""
    import ml_dtypes

    from redfuser.codegen import ptx_check
    from redfuser.codegen.simt_to_llvm.kernel import compile_simt
    from redfuser.ir import types

    np_dtype = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float8_e4m3fn": ml_dtypes.float8_e4m3fn}[dtype]
    kernel = gemm_kernel(n=n, dtype=getattr(types, dtype))
    a, bt = tiles(1, n, np_dtype)
    result = simulate(kernel, {"a": swizzled_image(a), "b": swizzled_image(bt), "out": np.zeros(128 * n // 2)})
    want = a.astype(np.float64) @ bt.astype(np.float64).T
    np.testing.assert_allclose(unfragment(result["out"], n), want, rtol=1e-5, atol=1e-4)
    (assembled,) = ptx_check.check_ptx(compile_simt(kernel, "sm_90a").ptx).values()
    assert assembled.usage[0].spill_store_bytes == 0


def test_a_tile_read_unswizzled_is_wrong():
    """The check behind the test above can fail: images stored without the swizzle give another product."""
    a, bt = tiles()
    result = simulate(gemm_kernel(), {"a": a.ravel(), "b": bt.ravel(), "out": np.zeros(128 * N // 2)})
    assert not np.allclose(unfragment(result["out"]), a.astype(np.float64) @ bt.astype(np.float64).T, atol=1e-3)


@pytest.mark.parametrize("bug,kind", [
    ("no proxy fence", "fence_proxy_async"),
    ("no wgmma fence", "wgmma_fence"),
    ("no wait", "wgmma_in_flight"),
    ("no commit", "wgmma_in_flight"),
    ("read C after issue", "wgmma_in_flight"),
    ("divergent", "divergent_warpgroup_op"),
    ("descriptor per thread", "nonuniform_descriptor"),
    ("no barrier", "race"),
])
def test_each_planted_ordering_bug_is_reported(bug, kind):
    a, bt = tiles()
    with pytest.raises(SimulationError) as err:
        simulate(gemm_kernel(bug), {"a": swizzled_image(a), "b": swizzled_image(bt), "out": np.zeros(128 * N // 2)})
    assert err.value.kind == kind, str(err.value)


def register_a_kernel(fenced: bool):
    """An m64n8k16 wgmma whose A is an f16 fragment made by ordinary code (all ones), B a tile of ones."""
    b = SimtBuilder("wgmma_reg_a", warps=4, grid=(1,))
    out = b.buffer("out", float32, (128 * 8 // 2,))
    b_s = b.shared("b_s", float16, (8 * 64,), align=1024)
    tid = b.thread_idx()
    b.for_(0, 4, 1, [], lambda iv: b.store_shared(b_s, b.add(b.mul(iv, b.const(128, int32)), tid),
                                                   b.const(1.0, float16)) and None)
    b.barrier()
    b.fence_proxy_async()
    a = b.const(1.0, float16, 8)
    if fenced:
        b.wgmma_fence()
    desc = b.wgmma_descriptor(b.shared_address(b_s), leading=16, stride=1024, swizzle=1)
    acc = b.wgmma(WgmmaShape(8, float16), a=a, b_desc=desc)
    b.wgmma_commit()
    b.wgmma_wait(0)
    b.store_global(out, b.mul(tid, b.const(4, int32)), acc)
    return b.build()


def test_a_register_written_since_the_last_fence_is_reported():
    """A from registers needs a wgmma.fence after ordinary code wrote them."""
    result = simulate(register_a_kernel(True), {"out": np.zeros(512)})
    assert np.all(result["out"] == 16.0)   # a row of 16 ones times a column of 16 ones
    with pytest.raises(SimulationError, match="wgmma.fence"):
        simulate(register_a_kernel(False), {"out": np.zeros(512)})


def test_a_register_fragment_is_passed_as_four_32_bit_registers():
    from redfuser.codegen import ptx_check
    from redfuser.codegen.simt_to_llvm.kernel import compile_simt

    ptx = compile_simt(register_a_kernel(True), "sm_90a").ptx
    line = next(l for l in ptx.splitlines() if "wgmma.mma_async" in l)
    assert "m64n8k16.f32.f16.f16" in line and line.count("{") == 3   # the asm block, D, and A's 4 registers
    assert ptx_check.check_ptx(ptx)


def test_wgmma_kernels_assemble_for_sm_90a_without_spills_or_serialization():
    """The simulated kernels are also compiled: inline ``wgmma.mma_async`` with C tied to D, the fence,
    commit and wait intrinsics, ``.target sm_90a``, assembled by ptxas with 0 spills and without its
    warning that the wgmmas were serialized (which would mean the asynchrony is lost)."""
    from redfuser.codegen import ptx_check
    from redfuser.codegen.simt_to_llvm.kernel import compile_simt

    artifact = compile_simt(gemm_kernel(), "sm_90a")
    ptx = artifact.ptx
    assert ".target sm_90a" in ptx
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16") == K // 16
    for op in ("wgmma.fence.sync.aligned", "wgmma.commit_group.sync.aligned", "wgmma.wait_group.sync.aligned",
               "fence.proxy.async.shared::cta"):
        assert op in ptx
    (result,) = ptx_check.check_ptx(ptx).values()
    (usage,) = result.usage
    assert usage.spill_store_bytes == 0 and usage.spill_load_bytes == 0 and usage.stack_bytes == 0
    assert "serializ" not in result.info_log.lower()


def test_a_wgmma_kernel_for_another_target_is_refused():
    from redfuser.codegen.simt_to_llvm.kernel import compile_simt
    from redfuser.ir.errors import BackendError

    with pytest.raises(BackendError, match="only sm_90a"):
        compile_simt(gemm_kernel(), "sm_90")


def specialized_kernel(split: int = 128):
    """Two warpgroups: the first (the producer of a warp-specialized kernel) gives registers back, the
    second takes them; `split` is the thread where the branch divides (128: at the warpgroup boundary)."""
    b = SimtBuilder("specialized", warps=8, grid=(1,))
    out = b.buffer("out", int32, (256,))
    tid = b.thread_idx()
    b.if_(b.lt(tid, b.const(split, int32)), lambda: b.set_max_nreg(40, increase=False),
          lambda: b.set_max_nreg(232, increase=True))
    b.store_global(out, tid, tid)
    return b.build()


def test_setmaxnreg_per_warpgroup_runs_and_assembles_and_a_split_warpgroup_is_reported():
    from redfuser.codegen import ptx_check
    from redfuser.codegen.simt_to_llvm.kernel import compile_simt

    assert np.array_equal(simulate(specialized_kernel(), {"out": np.zeros(256)})["out"], np.arange(256))
    ptx = compile_simt(specialized_kernel(), "sm_90a").ptx
    import re

    assert re.search(r"setmaxnreg\.dec\.sync\.aligned\.u32\s+40;", ptx)
    assert re.search(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+232;", ptx)
    assert ptx_check.check_ptx(ptx)
    with pytest.raises(SimulationError) as err:
        simulate(specialized_kernel(split=64), {"out": np.zeros(256)})
    assert err.value.kind == "divergent_warpgroup_op"
