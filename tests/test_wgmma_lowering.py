"""Tile IR dots lowered to Hopper's ``wgmma`` (codegen/simt/wgmma.py) for ``sm="sm_90a"``: the SIMT simulator
runs the lowered kernels with its wgmma ordering checks on (fences, commit/wait, barriers, C registers in
flight, the async proxy) and they equal numpy within the tolerance rule; their PTX assembles for sm_90a
without spills; where a dot cannot take wgmma (shape, warps, shared memory) the kernel keeps ``mma.sync``."""
from __future__ import annotations

import re
from dataclasses import replace

import ml_dtypes
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from helpers import assemble_without_spills

import redfuser as rf
from redfuser.codegen.simt.wgmma import TileGeometry
from redfuser.ir.errors import VerifyError
from redfuser.ir.simt.nodes import SharedAlloc
from redfuser.ir.simt.verifier import verify_simt_kernel
from redfuser.ir.simt.wgmma_fragments import Swizzle, k_major_offset
from redfuser.ir.types import BufferType, float32
from redfuser.testing import assert_close
from redfuser.testing.quantization import assert_quantized_gemm, spike_rows
from redfuser.workloads import causal_attention, flash_attention_bf16, flash_attention_f16, fp8_quant_gemm

BF16, F8 = ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn
RNG = np.random.default_rng(90)


def matmul_f32(x, w):
    return x.astype(rf.float32) @ w.astype(rf.float32)


def instructions(lowered) -> tuple[int, int]:
    """(wgmma, mma.sync) instructions in the lowered SIMT program."""
    text = str(lowered.stages["simt"])
    return text.count("wgmma.m64"), text.count("mma.m16")


def test_the_operand_tiles_are_swizzled_k_major_panels():
    """A tile's byte offsets are `k_major_offset`'s within each 128-byte panel, panels one after another;
    narrower K takes the 64- or 32-byte swizzle; every element has its own byte range."""
    g = TileGeometry(rows=64, k=256, itemsize=2)
    assert (g.mode, g.panel_elements) == (Swizzle.B128, 64)
    for row, k in [(0, 0), (1, 0), (7, 9), (63, 63), (5, 64), (63, 255)]:
        assert g.offset(row, k) == (k // 64) * 64 * 128 + k_major_offset(row, k % 64, 2)
    assert TileGeometry(64, 32, 2).mode is Swizzle.B64 and TileGeometry(64, 16, 2).mode is Swizzle.B32
    assert TileGeometry(64, 128, 1).mode is Swizzle.B128
    for geometry in (g, TileGeometry(16, 32, 2), TileGeometry(8, 256, 1)):
        offsets = {geometry.offset(r, k) for r in range(geometry.rows) for k in range(geometry.k)}
        assert len(offsets) == geometry.rows * geometry.k and max(offsets) < geometry.nbytes


@pytest.mark.parametrize("dtype", [np.float16, BF16])
@pytest.mark.parametrize("m,k,n", [(64, 64, 64), (64, 16, 8), (64, 32, 32), (128, 64, 128), (256, 512, 256)])
def test_a_matmul_on_wgmma_equals_numpy(dtype, m, k, n):
    """One wgmma chain (K = 16 to 64 in one tile), several m64 slices a warpgroup, and a loop over K whose
    accumulator goes from one iteration's wgmmas to the next's."""
    x, w = RNG.standard_normal((m, k)).astype(dtype), RNG.standard_normal((k, n)).astype(dtype)
    kernel = rf.kernel(matmul_f32, backend="simulate", sm="sm_90a")
    got = kernel(x, w)
    lowered = kernel.lower(x, w)
    wgmma, mma = instructions(lowered)
    assert wgmma > 0 and mma == 0
    assert_close(got, matmul_f32(x, w), np.float32, k)
    assemble_without_spills(lowered)


@pytest.mark.parametrize("body,dtype,head", [(flash_attention_f16, np.float16, 64), (flash_attention_bf16, BF16, 64),
                                             (causal_attention, np.float16, 64), (flash_attention_f16, np.float16, 128),
                                             (flash_attention_bf16, BF16, 256)])
def test_attention_on_wgmma_equals_its_mma_sync_kernel(body, dtype, head):
    """Both GEMMs of a fused attention on wgmma (S = Q·Kᵀ from the K tile's registers seen transposed, P·V
    with P rounded in registers and staged): the same values as the ``mma.sync`` kernel (both sum each
    16-wide k-step exactly and round once to f32), and within numpy's tolerance."""
    q, k, v = (RNG.standard_normal((1, 2, 128, head)).astype(dtype) for _ in range(3))
    on_wgmma = rf.kernel(body, backend="simulate", sm="sm_90a")
    on_mma = rf.kernel(body, backend="simulate", sm="sm_90")
    got = on_wgmma(q, k, v)
    wgmma, mma = instructions(on_wgmma.lower(q, k, v))
    assert wgmma > 0 and mma == 0
    simt = str(on_wgmma.lower(q, k, v).stages["simt"])
    # Q·Kᵀ reads both operands through descriptors, P·V its A (P) from registers: one staged A tile
    a_operands = [line.split("= wgmma.")[1].split(" ", 1)[1].split(",")[0] for line in simt.splitlines()
                  if "= wgmma." in line]
    assert {a.startswith("desc") for a in a_operands} == {True, False}
    assert simt.count("_a_tile:") == 1
    np.testing.assert_array_equal(got, on_mma(q, k, v))
    # bf16 and causal attention divide by l in this kernel: without a subroutine call (ptxas would serialize
    # the wgmmas for one), codegen/correctly_rounded.py
    assemble_without_spills(on_wgmma.lower(q, k, v))


@pytest.mark.parametrize("head", [64, 128])
def test_attention_stages_q_once_and_v_n_major_in_16_byte_vectors(head):
    """What the staging costs a key block: Q (defined before the key loop) is stored to its tile once, in front
    of the loop; V, whose registers run along the head dimension (N of P·V), goes to an N-major tile
    (imm-trans-b) in 16-byte vectors, where a K-major tile took one 2-byte store an element. (The threads'
    staging, ``tma=False``: the copy engine's is tests/test_tma_lowering.py's.)"""
    q = RNG.standard_normal((1, 2, 128, head)).astype(np.float16)
    program = rf.kernel(flash_attention_f16, backend="simulate", sm="sm_90a", tma=False).lower(q, q, q).stages["simt"]
    simt, threads = str(program), program.kernels[0].threads
    lines = simt.splitlines()
    loop = next(i for i, line in enumerate(lines) if " = for " in line)
    q_stores = [i for i, line in enumerate(lines) if "store.shared" in line and "_a_tile[" in line]
    assert q_stores and max(q_stores) < loop
    pv = [line for line in lines if "= wgmma." in line and "desc" not in line.split("=", 1)[1].split(",")[0]]
    assert pv and all(" n-major" in line for line in pv)
    v_stores = [line for line in lines if "store.shared matmul_acc_dot_b_tile[" in line]
    assert len(v_stores) == 64 * head // threads // 8     # a key block of 64 x head, 8 elements a store


def e4m3_chains(simt: str) -> list[int]:
    """The lengths of the e4m3 wgmma chains in a printed SIMT kernel: a wgmma whose C is ``zero`` starts one,
    a wgmma whose C is the previous one's D continues it."""
    lengths: dict[str, int] = {}
    chains: list[int] = []
    for line in simt.splitlines():
        if "= wgmma." not in line or "e4m3" not in line:
            continue
        d, c = line.split("=")[0].split(":")[0].strip(), line.rsplit(",", 1)[1].strip()
        lengths[d] = 1 if c == "zero" else lengths[c] + 1
        if c != "zero":
            chains.remove(lengths[c])
        chains.append(lengths[d])
    return chains


def test_an_fp8_gemm_takes_the_e4m3_wgmma_and_promotes_every_128_products():
    """The e4m3 wgmma in chains that start from zero and hold at most 4 k-steps of 32 (Hopper's FP8 tensor
    cores keep about 14 bits of what they accumulate: each chain's sum is added to the accumulator in f32,
    `codegen/simt/wgmma.py`), so the carried accumulator never enters a wgmma. The fused FP8 GEMM (chunks of
    64: one chain of 2 a chunk) is within both bounds of the FP8 check; a plain e4m3 matmul in chunks of 256
    runs two chains of 4 a chunk and stays within numpy's tolerance."""
    x = spike_rows(RNG.standard_normal((128, 512)).astype(np.float32))
    w, ws = (RNG.standard_normal((512, 64)) * 0.1).astype(F8), RNG.uniform(0.5, 2.0, 64).astype(np.float32)
    on_wgmma = rf.kernel(fp8_quant_gemm, backend="simulate", sm="sm_90a")
    lowered = on_wgmma.lower(x, w, ws)
    simt = str(lowered.stages["simt"])
    assert "wgmma.m64n64k32.f8e4m3" in simt and e4m3_chains(simt) == [2]
    assert_quantized_gemm(on_wgmma(x, w, ws), x, w, ws)
    assemble_without_spills(lowered)     # 448 / absmax in the loop, without a subroutine call

    def widened(a, b):
        return a.astype(rf.float32) @ b.astype(rf.float32)

    a8 = (RNG.standard_normal((64, 512)) * 4).astype(F8)
    plain = rf.kernel(widened, backend="simulate", sm="sm_90a", block_k=256)
    lowered = plain.lower(a8, w)
    assert e4m3_chains(str(lowered.stages["simt"])) == [4, 4]
    assert_close(plain(a8, w), widened(a8, w), np.float32, 512)
    assemble_without_spills(lowered)


def test_a_wider_fp8_tile_is_not_bounded_into_spills():
    """The default register bound (`kernel.blocks_per_sm`) counts an e4m3 dot's accumulator twice: its promoted
    chains sum into registers of their own. A 64 x 128 FP8 GEMM tile takes about 210 registers; counted once,
    its 64 accumulator registers passed the 3-block bound's test and the bound (168) made it spill."""
    x = RNG.standard_normal((128, 512)).astype(np.float16)
    w, ws = (RNG.standard_normal((512, 256)) * 0.1).astype(F8), RNG.uniform(0.5, 2.0, 256).astype(np.float32)
    lowered = rf.kernel(fp8_quant_gemm, backend="simulate", sm="sm_90a", block_n=128).lower(x, w, ws)
    (kernel,) = lowered.stages["simt"].kernels
    assert kernel.min_blocks_per_sm is None
    assemble_without_spills(lowered)


def test_tiles_past_48_kib_take_dynamic_shared_memory_and_past_227_kib_keep_mma_sync():
    """128 x 128 x 128 tiles: the two wgmma operand tiles take 64 KiB, more than a kernel declares statically,
    so on sm_90a they live in the launch's dynamic shared memory (the same values as the mma.sync kernel of
    sm_90, which needs 34 KiB). 256 x 256 x 256 tiles would take 256 KiB of operand tiles, past Hopper's 227:
    the kernel is planned again with its dot on mma.sync."""
    x, w = RNG.standard_normal((256, 512)).astype(np.float16), RNG.standard_normal((512, 256)).astype(np.float16)
    tiles = dict(block_m=128, block_n=128, block_k=128)
    kernel = rf.kernel(matmul_f32, backend="simulate", sm="sm_90a", **tiles)
    lowered = kernel.lower(x, w)
    wgmma, mma = instructions(lowered)
    assert wgmma > 0 and mma == 0
    assert lowered.stages["simt"].kernels[0].dynamic_shared
    np.testing.assert_array_equal(kernel(x, w), rf.kernel(matmul_f32, backend="simulate", sm="sm_90", **tiles)(x, w))
    assemble_without_spills(lowered)
    larger = rf.kernel(matmul_f32, backend="simulate", sm="sm_90a", block_m=256, block_n=256, block_k=256)
    wgmma, mma = instructions(larger.lower(x, w))
    assert wgmma == 0 and mma > 0
    assert_close(larger(x, w), matmul_f32(x, w), np.float16, 512)


@pytest.mark.parametrize("sm", ["sm_90", "sm_89"])
def test_only_sm_90a_lowers_to_wgmma(sm):
    x, w = RNG.standard_normal((64, 64)).astype(np.float16), RNG.standard_normal((64, 64)).astype(np.float16)
    assert instructions(rf.kernel(matmul_f32, backend="simulate", sm=sm).lower(x, w))[0] == 0


@pytest.mark.parametrize("sm,head,threads,blocks", [("sm_90a", 64, 256, 2), ("sm_90a", 128, 128, 3),
                                                    ("sm_90", 64, 128, None), ("sm_90", 128, 128, None)])
def test_the_wgmma_plan_has_its_own_warps_and_blocks_an_sm(sm, head, threads, blocks):
    """Measured on an H200 (benchmarks/device_notes.md, run 10): on wgmma a 128-row tile takes two warpgroups
    (`plan.WGMMA_TILE_ROWS`) and a one-warpgroup kernel is built for 3 blocks an SM
    (`kernel.WGMMA_BLOCKS_PER_SM`); a two-warpgroup one for 2 (the occupancy run 11 measured, which the
    call-free division would lose to 6 more registers: `kernel.WGMMA_TWO_GROUP_BLOCKS_PER_SM`); mma.sync keeps
    4 warps and ptxas's register choice. A user's ``num_warps`` and ``min_blocks_per_sm`` still decide."""
    q = RNG.standard_normal((1, 2, 256, head)).astype(np.float16)
    kernel = rf.kernel(flash_attention_f16, backend="simulate", sm=sm).lower(q, q, q).stages["simt"].kernels[0]
    assert (kernel.threads, kernel.min_blocks_per_sm) == (threads, blocks)
    kernel = rf.kernel(flash_attention_f16, backend="simulate", sm=sm, num_warps=4,
                       min_blocks_per_sm=2).lower(q, q, q).stages["simt"].kernels[0]
    assert (kernel.threads, kernel.min_blocks_per_sm) == (128, 2)


@pytest.mark.parametrize("block_n,blocks", [(128, 2), (256, None)])
def test_two_warpgroups_are_bounded_for_two_blocks_only_where_their_accumulators_leave_room(block_n, blocks):
    """A 128 x 128 GEMM tile (64 accumulator registers a thread) is built for 2 blocks an SM like f16 attention;
    a 128 x 256 one (128 of them) keeps ptxas's choice, which a bound of 128 registers would make spill."""
    x = RNG.standard_normal((256, 256)).astype(np.float16)
    lowered = rf.kernel(_widened, backend="simulate", sm="sm_90a", block_m=128, block_n=block_n,
                        block_k=64).lower(x, x)
    kernel = lowered.stages["simt"].kernels[0]
    assert (kernel.warps, kernel.min_blocks_per_sm) == (8, blocks)
    assemble_without_spills(lowered)


def _widened(x, w):
    return x.astype(rf.float32) @ w.astype(rf.float32)


def _widened_transposed(x, w):
    return x.astype(rf.float32) @ rf.swapaxes(w, -1, -2).astype(rf.float32)


def _scaled_plus_row_sum(x, w):
    y = _widened(x, w) * 0.5
    return y + rf.sum(x.astype(rf.float32), axis=-1, keepdims=True)


@settings(deadline=None)
@given(m=st.sampled_from([1, 16, 64, 100, 128, 192, 257]), k=st.sampled_from([8, 16, 40, 64, 96, 128, 200]),
       n=st.sampled_from([8, 24, 64, 72, 128, 136]), dtype=st.sampled_from([np.float16, BF16]),
       body=st.sampled_from([_widened, _widened_transposed, _scaled_plus_row_sum]),
       tiles=st.sampled_from([{}, {"block_m": 64, "block_n": 64}, {"block_m": 128, "block_n": 64},
                              {"block_m": 64, "block_n": 128, "block_k": 32}, {"num_warps": 8},
                              {"block_m": 128, "num_warps": 8, "block_k": 128}]),
       seed=st.integers(0, 2**31 - 1))
@example(m=64, k=40, n=8, dtype=np.float16, body=_scaled_plus_row_sum, tiles={}, seed=0)
def test_random_matmuls_on_the_hopper_path_equal_numpy(m, k, n, dtype, body, tiles, seed):
    """Matmuls of random shapes (ragged ones included), 16-bit types, B K-major (``w.T``) or N-major (``w``),
    one or two warpgroups, with an epilogue that reads the result: the simulated ``sm_90a`` kernel (wgmma
    where the plan allows it, mma.sync or FMA elsewhere) within numpy's tolerance. The explicit example was
    its first finding: a constant zero accumulator (one register for the whole kernel) handed to a wgmma as
    its C, which the wgmma's D then owns, while the row sum still read it (`wgmma._accumulator_part`)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k)).astype(dtype)
    w = rng.standard_normal((n, k) if body is _widened_transposed else (k, n)).astype(dtype)
    got = rf.kernel(body, backend="simulate", sm="sm_90a", **tiles)(x, w)
    assert_close(got, body(x, w), np.float32, k, f"{body.__name__} {m}x{k}x{n} {tiles}")


def test_head_256_attention_takes_its_tiles_from_dynamic_shared_memory():
    """At head dimension 256 the wgmma operand tiles of a 128-row block (56 KiB) pass the 48 KiB a kernel may
    declare statically: the kernel is marked `dynamic_shared` (its header says how many bytes), its PTX
    declares no static ``.shared`` array but one ``.extern .shared`` array aligned for the 128-byte swizzle,
    and it keeps ptxas's register choice (bounded for 2 blocks an SM, its 164 registers would spill). The
    mma.sync kernel of the same body stays static."""
    q = RNG.standard_normal((1, 2, 128, 256)).astype(np.float16)
    lowered = rf.kernel(flash_attention_f16, backend="simulate", sm="sm_90a").lower(q, q, q)
    kernel = lowered.stages["simt"].kernels[0]
    assert kernel.dynamic_shared and 48 * 1024 < kernel.shared_bytes <= 227 * 1024
    assert f"{kernel.shared_bytes} bytes of dynamic shared memory" in str(kernel).splitlines()[0]
    assert kernel.min_blocks_per_sm is None
    ptx = lowered.stages["ptx"].kernels[0].ptx
    assert ".extern .shared .align 1024 .b8 redfuser_dynamic_smem[]" in ptx
    assert not re.search(r"^\s*\.shared\b", ptx, flags=re.M)          # a static array: `.shared .align 1024 .b8 ...`
    assemble_without_spills(lowered)
    on_mma = rf.kernel(flash_attention_f16, backend="simulate", sm="sm_90").lower(q, q, q)
    assert not any(k.dynamic_shared for k in on_mma.stages["simt"].kernels)


def test_the_verifier_bounds_static_and_dynamic_shared_memory():
    """A kernel may declare 48 KiB statically and take up to 227 KiB (Hopper's opt-in) from the launch."""
    q = RNG.standard_normal((1, 2, 128, 256)).astype(np.float16)
    kernel = rf.kernel(flash_attention_f16, backend="simulate", sm="sm_90a").lower(q, q, q).stages["simt"].kernels[0]
    verify_simt_kernel(kernel, "test")
    with pytest.raises(VerifyError, match="bytes of static shared memory"):
        verify_simt_kernel(replace(kernel, dynamic_shared=False), "test")
    huge = SharedAlloc("huge", BufferType(float32, (60 * 1024,)))
    with pytest.raises(VerifyError, match="bytes of dynamic shared memory"):
        verify_simt_kernel(replace(kernel, shared=kernel.shared + (huge,)), "test")
