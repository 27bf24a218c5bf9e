"""wgmma operand tiles loaded by the tensor memory accelerator (codegen/simt/tma.py, the ``tma`` option).

Each kernel is compared with the same kernel whose threads stage the tiles, in the simulator, bit for bit:
the copies land where the threads' swizzled stores did, and the simulator checks the mbarrier protocol on
the way (expected bytes, one issuing thread, phases, reads before the wait, copies into tiles in flight).
TMA is the default on sm_90a (``tma=False`` keeps the threads' staging). The mbarrier's phase parity is derived from the enclosing loops' counters: a parity fixed at 0 deadlocks
on the second key block (the planted bug). Where a tile cannot be copied (a masked load, an 8-bit MN-major
operand, a load another op reads) the threads stage it as before.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from helpers import assemble_without_spills

import redfuser as rf
from redfuser.codegen.simt import tma
from redfuser.ir.errors import SimulationError
from redfuser.ir.simt.nodes import Barrier, For, If, MbarrierWait, StoreShared, TmaLoad, walk_stmts
from redfuser.testing import assert_close
from redfuser.workloads import causal_attention, flash_attention_bf16, flash_attention_f16, fp8_quant_gemm

RNG = np.random.default_rng(21)
BF16 = ml_dtypes.bfloat16


def gemm_f32(x, w):
    return x.astype(rf.float32) @ w.astype(rf.float32)


def gemm_twice(x, w):
    """``x`` read by the product and by a sum: its tile must stay in registers, so the threads stage it."""
    return x.astype(rf.float32) @ w.astype(rf.float32) + (x.astype(rf.float32)).sum(axis=1, keepdims=True)


def copies(lowered) -> list[TmaLoad]:
    return [s for k in lowered.stages["simt"].kernels for s in walk_stmts(k.body) if isinstance(s, TmaLoad)]


def shared_stores(lowered) -> int:
    return sum(isinstance(s, StoreShared) for k in lowered.stages["simt"].kernels for s in walk_stmts(k.body))


def on_both(body, *args, **options):
    """(the TMA kernel's lowering and result, the threads-staged kernel's result), both simulated on sm_90a."""
    with_tma = rf.kernel(body, backend="simulate", sm="sm_90a", **options)         # the default on sm_90a
    staged = rf.kernel(body, backend="simulate", sm="sm_90a", tma=False, **options)
    return with_tma.lower(*args), with_tma(*args), staged(*args)


@pytest.mark.parametrize("body,dtype,head,keys,options", [
    (flash_attention_f16, np.float16, 64, 256, {}),                  # two warpgroups, Q staged once
    (flash_attention_bf16, BF16, 128, 192, {}),                      # 3 key blocks: odd trips
    (causal_attention, np.float16, 128, 256, {"skip_masked": True}),  # a run-time trip count (outermost)
    (flash_attention_bf16, BF16, 256, 128, {}),                      # head chunks of 128: an inner loop of 2
    (flash_attention_f16, np.float16, 384, 128, {"whole_max": 512}),  # an inner loop of 3: odd inner trips
])
def test_attention_with_tma_equals_the_threads_staged_kernel(body, dtype, head, keys, options):
    q = RNG.standard_normal((1, 2, 128, head)).astype(dtype)
    k, v = (RNG.standard_normal((1, 2, keys, head)).astype(dtype) for _ in range(2))
    lowered, got, want = on_both(body, q, k, v, **options)
    sources = {c.src.name for c in copies(lowered)}
    # P·V with N = 384 is not a whole number of wgmma N chunks (256): it runs on mma.sync, V in registers
    assert sources == ({"q", "k"} if head == 384 else {"q", "k", "v"})
    np.testing.assert_array_equal(got, want)
    assert_close(got.astype(np.float32), body(q, k, v).astype(np.float32), dtype, keys)


@pytest.mark.parametrize("m,k,n", [(128, 512, 128), (256, 192, 64)])
def test_a_gemm_with_tma_copies_both_operands_and_stores_nothing_to_shared_memory(m, k, n):
    x, w = RNG.standard_normal((m, k)).astype(np.float16), RNG.standard_normal((k, n)).astype(np.float16)
    lowered, got, want = on_both(gemm_f32, x, w)
    assert {c.src.name for c in copies(lowered)} == {"x", "w"}
    assert shared_stores(lowered) == 0
    np.testing.assert_array_equal(got, want)
    assert_close(got, gemm_f32(x, w), np.float32, k)


def test_the_tma_kernels_assemble_for_sm_90a_without_spills():
    q = RNG.standard_normal((1, 2, 256, 128)).astype(BF16)
    assemble_without_spills(rf.kernel(flash_attention_bf16, backend="simulate", sm="sm_90a", tma=True).lower(q, q, q))
    x = RNG.standard_normal((256, 256)).astype(np.float16)
    assemble_without_spills(rf.kernel(gemm_f32, backend="simulate", sm="sm_90a", tma=True).lower(x, x))


def test_each_copy_waits_behind_a_barrier_that_frees_its_tile():
    """Thread 0 issues a loop's copies only after a block barrier since the loop's wgmmas: every warpgroup has
    waited for the wgmmas that read the tile's previous contents (the barrier pass keeps it: a copy writes
    the tile). Every thread then waits on the mbarrier before the next wgmma reads it."""
    q = RNG.standard_normal((1, 1, 128, 64)).astype(np.float16)
    lowered = rf.kernel(flash_attention_f16, backend="simulate", sm="sm_90a", tma=True).lower(q, q, q)
    (loop,) = [s for s in walk_stmts(lowered.stages["simt"].kernels[0].body) if isinstance(s, For)]
    body = loop.body.stmts
    issuing = [i for i, s in enumerate(body) if isinstance(s, If) and any(isinstance(x, TmaLoad)
                                                                          for x in walk_stmts(s.then.stmts))]
    assert len(issuing) == 2                                      # K for Q·Kᵀ, V for P·V
    previous = 0
    for i in issuing:
        assert any(isinstance(s, Barrier) for s in body[previous:i])
        assert any(isinstance(s, MbarrierWait) for s in body[i + 1:])
        previous = i + 1


def test_a_phase_parity_that_ignores_the_loop_deadlocks_the_second_key_block(monkeypatch):
    """The planted bug: with the parity fixed at 0, the second key block waits for a phase that completed
    already, which the simulator reports (on the GPU the wait would return at once, before the copy lands)."""
    q = RNG.standard_normal((1, 1, 64, 64)).astype(np.float16)
    k = RNG.standard_normal((1, 1, 256, 64)).astype(np.float16)
    monkeypatch.setattr(tma, "phase_parity", lambda lw, depth: 0)
    kernel = rf.kernel(flash_attention_f16, backend="simulate", sm="sm_90a", tma=True)
    with pytest.raises(SimulationError) as err:
        kernel(q, k, k)
    assert err.value.kind == "mbarrier_deadlock"


@pytest.mark.parametrize("case", ["masked rows", "fp8 w", "read twice", "option off", "sm_90"])
def test_tiles_the_copy_engine_cannot_take_are_staged_by_the_threads(case):
    if case == "fp8 w":          # e4m3 B must be K-major: w [k, n] runs along N, so its tile is transposed
        x = RNG.standard_normal((64, 256)).astype(np.float16)
        w = RNG.standard_normal((256, 128)).astype(ml_dtypes.float8_e4m3fn)
        args, body = (x, w, np.ones(128, np.float32)), fp8_quant_gemm
    elif case == "read twice":
        args, body = (RNG.standard_normal((128, 128)).astype(np.float16),) * 2, gemm_twice
    else:                        # 200 keys: the last key block's loads are masked
        q = RNG.standard_normal((1, 1, 64, 64)).astype(np.float16)
        args, body = (q, *(RNG.standard_normal((1, 1, 200 if case == "masked rows" else 128, 64))
                           .astype(np.float16) for _ in range(2))), flash_attention_f16
    options = {"tma": case != "option off", "sm": "sm_90" if case == "sm_90" else "sm_90a"}
    lowered = rf.kernel(body, backend="simulate", **options).lower(*args)
    names = {c.src.name for c in copies(lowered)}
    if case == "masked rows":
        assert names == {"q"}                       # Q's rows are whole; K's and V's last block is masked
    elif case == "fp8 w":
        assert "w" not in names
    elif case == "read twice":
        assert "x" not in names and "w" in names
    else:
        assert names == set()
    assert shared_stores(lowered) > 0 or case in ("sm_90",)


def merged_rows_gemm(x, w):
    return x.reshape(-1, 64).astype(rf.float32) @ w.astype(rf.float32)


@pytest.mark.parametrize("n,copied", [(96, False), (128, True)])
def test_a_tile_whose_rows_run_into_the_next_block_is_not_copied(n, copied):
    """A copy's box is bounded per dim: a tile of rows of ``x.reshape(-1, 64)`` that runs from one block of
    x's second-to-last dim into the next (96 rows a block, tiles of 64) would read zeros where the load reads
    the next block. Such a tile is staged by the threads (it took the copy, and was wrong, before the check);
    with 128 rows a block every tile lies in one and is copied."""
    x = RNG.standard_normal((2, n, 64)).astype(np.float16)
    w = RNG.standard_normal((64, 64)).astype(np.float16)
    lowered, got, want = on_both(merged_rows_gemm, x, w)
    assert ("x" in {c.src.name for c in copies(lowered)}) == copied
    np.testing.assert_array_equal(got, want)
    assert_close(got, merged_rows_gemm(x, w), np.float32, 64)
