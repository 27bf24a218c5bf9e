"""wgmma operand tiles loaded by the tensor memory accelerator (codegen/simt/tma.py, the ``tma`` option).

Each kernel is compared with the same kernel whose threads stage the tiles, in the simulator, bit for bit:
the copies land where the threads' swizzled stores did, and the simulator checks the mbarrier protocol on
the way (expected bytes, one issuing thread, phases, reads before the wait, copies into tiles in flight).
TMA is the default on sm_90a (``tma=False`` keeps the threads' staging). The mbarrier's phase parity is
derived from the enclosing loops' counters: a parity fixed at 0 deadlocks on the second key block (the
planted bug). Where a tile cannot be copied (a masked load, an 8-bit MN-major operand, a load another op
reads) the threads stage it as before. In a loop the copies go through a ring of ``tma_stages`` tiles (the
next iteration's copies issued before this one's wait) where the extra tiles cost no blocks an SM; planted
bugs in the ring (its next stage the current one, a wrong step to the next tile, parities of one stage)
are each caught.
"""
from __future__ import annotations

from dataclasses import replace

import ml_dtypes
import numpy as np
import pytest
from helpers import assemble_without_spills

import redfuser as rf
from redfuser.codegen.simt import tma
from redfuser.ir.errors import SimulationError
from redfuser.codegen.simt.kernel import ring_budget, rings_cost_blocks
from redfuser.ir.simt.nodes import (Barrier, For, If, MbarrierInit, MbarrierWait, Reg, StoreGlobal, StoreShared,
                                    TmaLoad, walk_stmts)
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


def test_grouped_query_attention_copies_each_key_head_for_its_query_heads():
    """GQA (`workloads.gqa_attention_f16`: 8 query heads on 2 key/value heads, the query heads seen as
    [B, 2, 4, N, D] against k and v broadcast over the group): one kernel whose Q, K and V tiles the copy
    engine loads, K's and V's at the group's key head; equal bit for bit to the threads-staged kernel and to
    mma.sync, within the tolerance rule of numpy's body (a batch of one: its epilogue in the same kernel)."""
    from redfuser.workloads import gqa_attention_f16

    q = RNG.standard_normal((1, 8, 128, 128)).astype(np.float16)
    k, v = (RNG.standard_normal((1, 2, 192, 128)).astype(np.float16) for _ in range(2))
    lowered, got, want = on_both(gqa_attention_f16, q, k, v)
    assert len(lowered.stages["tile"].kernels) == 1
    assert {c.src.name for c in copies(lowered)} == {"q", "k", "v"}
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, rf.kernel(gqa_attention_f16, backend="simulate", sm="sm_90")(q, k, v))
    assert_close(got.astype(np.float32), gqa_attention_f16(q, k, v).astype(np.float32), np.float16, 192)


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
    kernel = rf.kernel(flash_attention_f16, backend="simulate", sm="sm_90a", tma=True, tma_stages=1)
    with pytest.raises(SimulationError) as err:
        kernel(q, k, k)
    assert err.value.kind == "mbarrier_deadlock"


@pytest.mark.parametrize("nq,nk,options", [(64, 200, {}), (100, 200, {}), (192, 77, {}), (100, 200, {"tma_stages": 1})])
def test_ragged_tiles_are_copied_with_the_copy_engine_filling_the_rows_past_the_end(nq, nk, options):
    """A ragged last key block (or query tile) is a load masked by ``row < N``: the copy of its box reads the
    same, the copy engine filling the rows past the buffer's end with zeros, as the load's ``other`` 0. The
    tile's first row is below N wherever it is copied (a loop counter below the loop's stop, a program id
    whose grid ends there), so its coordinates are the row's own."""
    q = RNG.standard_normal((1, 2, nq, 64)).astype(np.float16)
    k, v = (RNG.standard_normal((1, 2, nk, 64)).astype(np.float16) for _ in range(2))
    lowered, got, want = on_both(flash_attention_f16, q, k, v, **options)
    assert {c.src.name for c in copies(lowered)} == {"q", "k", "v"}
    np.testing.assert_array_equal(got, want)
    assert_close(got.astype(np.float32), flash_attention_f16(q, k, v).astype(np.float32), np.float16, nk)


def test_a_shape_polymorphic_kernel_copies_its_whole_key_blocks():
    """``dynamic=True``: one kernel for every length, whose loop over the whole key blocks (to ``(N // 64) *
    64``) copies K and V by TMA (the coordinates divide by the run-time extents; K in a ring of two stages), the
    ragged rest in a masked loop of its own staged by the threads; Q, read by both loops' dots, too. Equal to
    the threads-staged kernel bit for bit at every length, from one compile."""
    kernel = rf.kernel(flash_attention_f16, backend="simulate", sm="sm_90a", dynamic=True)
    staged = rf.kernel(flash_attention_f16, backend="simulate", sm="sm_90a", dynamic=True, tma=False)
    for n in (256, 200, 130, 64):
        q, k, v = (RNG.standard_normal((1, 2, n, 64)).astype(np.float16) for _ in range(3))
        np.testing.assert_array_equal(kernel(q, k, v), staged(q, k, v))
    (lowered, _), = kernel._cache.values()
    assert lowered.shapes is not None
    assert {c.src.name for c in copies(lowered)} == {"k", "v"}
    assert stages_of(lowered)[K] == 2
    assert kernel.cache_info().misses == 1


def test_an_n_major_fp8_weight_is_copied_k_major_once_then_by_tma():
    """e4m3 wgmma reads B K-major; ``w[k, n]`` is N-major in memory. With at least 256 rows (4 tiles, each of
    which read and transposed all of ``w`` in its threads), the program copies ``w`` once into ``w_k_major[n,
    k]`` (a kernel of its own: the ``k_major`` stage) and the GEMM's tiles of it come by TMA: the same bytes, so
    the same result bit for bit; with 64 rows, and where there is no TMA (sm_90), ``w`` is read as it is."""
    from redfuser.testing.quantization import assert_quantized_gemm

    w = (RNG.standard_normal((256, 128)) * 0.1).astype(ml_dtypes.float8_e4m3fn)
    ws = RNG.uniform(0.5, 2.0, 128).astype(np.float32)
    x = RNG.standard_normal((512, 256)).astype(np.float16)
    lowered, got, want = on_both(fp8_quant_gemm, x, w, ws)
    assert "k_major" in lowered.stages and {c.src.name for c in copies(lowered)} >= {"w_k_major"}
    assert "w_k_major" in str(lowered.stages["k_major"])
    # the copy reads rows of w and writes rows of w_k_major 16 bytes an access (its bytes cross over in shared
    # memory: `memory._store` converts a 1-byte value stored one byte at a time)
    writes = [s for k in lowered.stages["simt"].kernels for s in walk_stmts(k.body)
              if isinstance(s, StoreGlobal) and s.buffer.name == "w_k_major"]
    assert writes and all(s.value.type.length == 16 for s in writes)
    np.testing.assert_array_equal(got, want)
    assert_quantized_gemm(got, x, w, ws)
    few = rf.kernel(fp8_quant_gemm, backend="simulate", sm="sm_90a").lower(x[:64], w, ws)
    assert "w_k_major" not in str(few.stages["k_major"])
    hopper_without_tma = rf.kernel(fp8_quant_gemm, backend="simulate", sm="sm_90").lower(x, w, ws)
    assert "k_major" not in hopper_without_tma.stages


@pytest.mark.parametrize("case", ["masked rows", "fp8 w", "read twice", "option off", "sm_90"])
def test_tiles_the_copy_engine_cannot_take_are_staged_by_the_threads(case):
    if case == "fp8 w":          # e4m3 B must be K-major: w [k, n] runs along N, so its tile is transposed
        x = RNG.standard_normal((64, 256)).astype(np.float16)
        w = RNG.standard_normal((256, 128)).astype(ml_dtypes.float8_e4m3fn)
        args, body = (x, w, np.ones(128, np.float32)), fp8_quant_gemm
    elif case == "read twice":
        args, body = (RNG.standard_normal((128, 128)).astype(np.float16),) * 2, gemm_twice
    else:                        # 1000 keys split across programs: a slice's first row is not provably below N
        q = RNG.standard_normal((1, 1, 64, 64)).astype(np.float16)
        args, body = (q, *(RNG.standard_normal((1, 1, 1000 if case == "masked rows" else 128, 64))
                           .astype(np.float16) for _ in range(2))), flash_attention_f16
    options = {"tma": case != "option off", "sm": "sm_90" if case == "sm_90" else "sm_90a"}
    lowered = rf.kernel(body, backend="simulate", **options).lower(*args)
    names = {c.src.name for c in copies(lowered)}
    if case == "masked rows":
        assert names == {"q"}                       # Q's rows are whole; K's and V's rows run to a split's stop
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


def stages_of(lowered) -> dict[str, int]:
    """The mbarriers each staging point set up, by allocation: its ring's stages."""
    counts: dict[str, int] = {}
    for k in lowered.stages["simt"].kernels:
        for s in walk_stmts(k.body):
            if isinstance(s, MbarrierInit):
                counts[s.alloc.name] = counts.get(s.alloc.name, 0) + 1
    return counts


K, V = "s_matmul_dot_landed", "matmul_acc_dot_landed"     # the staging points of Q·Kᵀ and of P·V


@pytest.mark.parametrize("body,dtype,head,keys,options,stages,expected", [
    (flash_attention_f16, np.float16, 64, 320, {}, 1, {K: 1, V: 1}),        # 5 key blocks: odd trips
    (flash_attention_f16, np.float16, 64, 320, {}, 2, {K: 2, V: 2}),
    (flash_attention_f16, np.float16, 64, 320, {}, 4, {K: 4, V: 4}),
    (causal_attention, np.float16, 64, 256, {"skip_masked": True}, 2,       # a run-time trip count
     {K: 2, "out_acc_dot_landed": 2}),
    # 3 blocks an SM (the register bound) leave 27 KiB for extra stages: K's (16 KiB), not V's too
    (flash_attention_bf16, BF16, 128, 256, {}, 2, {K: 2, V: 1}),
    # 2 blocks leave 65 KiB: K's three extra stages (48 KiB), then V's ring halved to 2 stages
    (flash_attention_bf16, BF16, 128, 256, {"min_blocks_per_sm": 2}, 4, {K: 4, V: 2}),
    # rings in an inner loop (head chunks of 128: 2 trips; of 3 key blocks), the run count through both loops
    (flash_attention_bf16, BF16, 256, 192, {"min_blocks_per_sm": 1}, 2, {K: 2, V: 2}),
    (flash_attention_f16, np.float16, 384, 192, {"whole_max": 512, "min_blocks_per_sm": 1}, 2, {K: 2}),
])
def test_a_ring_of_stages_equals_the_threads_staged_kernel(body, dtype, head, keys, options, stages, expected):
    """The ring's copies issued an iteration ahead land in the stage the next iteration reads: the same bits as
    the threads' staging, and the simulator sees every wait find its phase (a wrong stage or parity deadlocks
    or reads a copy not landed). Rings take the shared memory the kernel's blocks an SM leave."""
    q = RNG.standard_normal((1, 2, 128, head)).astype(dtype)
    k, v = (RNG.standard_normal((1, 2, keys, head)).astype(dtype) for _ in range(2))
    lowered, got, want = on_both(body, q, k, v, tma_stages=stages, **options)
    assert {name: n for name, n in stages_of(lowered).items() if not name.startswith("q_")} == expected
    np.testing.assert_array_equal(got, want)
    assert_close(got.astype(np.float32), body(q, k, v).astype(np.float32), dtype, keys)


def test_a_ring_issues_the_next_iteration_before_waiting_for_this_one():
    """In the loop: a barrier, then thread 0 copies the first iteration's tiles where it is the first and the
    next iteration's where there is one, into the stages a register names, then every thread waits on this
    iteration's stage. ``Q``, staged once in front of the loop, has one stage."""
    q = RNG.standard_normal((1, 1, 128, 64)).astype(np.float16)
    lowered = rf.kernel(flash_attention_f16, backend="simulate", sm="sm_90a").lower(q, q, q)
    assert stages_of(lowered) == {"q_landed": 1, "s_matmul_dot_landed": 2, "matmul_acc_dot_landed": 2}
    (loop,) = [s for s in walk_stmts(lowered.stages["simt"].kernels[0].body) if isinstance(s, For)]
    issuing = [s for s in loop.body.stmts if isinstance(s, If) and any(isinstance(x, TmaLoad)
                                                                       for x in walk_stmts(s.then.stmts))]
    assert len(issuing) == 2
    for branch in issuing:
        inner = [s for s in branch.then.stmts if isinstance(s, If)]
        assert len(inner) == 2                       # this iteration's copies (the first), the next one's
        for side in inner:
            (copy,) = [s for s in side.then.stmts if isinstance(s, TmaLoad)]
            assert isinstance(copy.dst_index, Reg) and isinstance(copy.barrier_index, Reg)
    assert rf.kernel(flash_attention_f16, backend="simulate", sm="sm_90a").lower(q, q, q).stages["ptx"] is not None


def test_rings_keep_the_blocks_an_sm_holds():
    """A ring's extra tiles are taken only where the SM still holds as many blocks as with one stage (at most
    the register bound asks): the budget left is what the rings may take."""
    assert not rings_cost_blocks(65 * 1024, 16 * 1024, 3)          # 3 blocks of 49 and of 65 KiB fit 228 KiB
    assert rings_cost_blocks(81 * 1024, 32 * 1024, 3)              # 81 KiB: 2 blocks
    assert not rings_cost_blocks(81 * 1024, 32 * 1024, 2)
    assert rings_cost_blocks(128 * 1024, 64 * 1024, None)          # unbounded: 3 blocks of 64 KiB fit, 1 of 128
    assert ring_budget(48 * 1024, 3) == 76 * 1024 - 1024 - 48 * 1024
    assert ring_budget(48 * 1024, None) == 228 * 1024 // 4 - 1024 - 48 * 1024     # 4 blocks of 48 KiB fit


@pytest.mark.parametrize("bug,kind", [
    # the next iteration's copy lands in the tile being read, completing a second phase before the wait
    ("next stage is this one", "mbarrier_deadlock"),
    ("step 0", None),                           # the next iteration's copy reads this iteration's tile
    ("one stage's parity", "mbarrier_deadlock"),
])
def test_planted_bugs_in_a_ring_are_caught(monkeypatch, bug, kind):
    q = RNG.standard_normal((1, 1, 64, 64)).astype(np.float16)
    k, v = (RNG.standard_normal((1, 1, 320, 64)).astype(np.float16) for _ in range(2))
    plan_ring = tma.plan_ring

    def planted(lw, operands, depth, stages):
        ring = plan_ring(lw, operands, depth, stages)
        if ring.prefetch is None:
            return ring
        if bug == "next stage is this one":
            return tma.Ring(ring.stages, ring.stage, ring.parity, replace(ring.prefetch, next_stage=ring.stage))
        if bug == "step 0":
            return tma.Ring(ring.stages, ring.stage, ring.parity,
                            replace(ring.prefetch, steps=(0,) * len(ring.prefetch.steps)))
        return tma.Ring(ring.stages, ring.stage, tma.phase_parity(lw, depth), ring.prefetch)

    monkeypatch.setattr(tma, "plan_ring", planted)
    kernel = rf.kernel(flash_attention_f16, backend="simulate", sm="sm_90a")
    if kind is None:
        got = kernel(q, k, v)
        want = rf.kernel(flash_attention_f16, backend="simulate", sm="sm_90a", tma=False)(q, k, v)
        assert np.abs(got.astype(np.float32) - want.astype(np.float32)).max() > 1e-2
    else:
        with pytest.raises(SimulationError) as err:
            kernel(q, k, v)
        assert err.value.kind == kind, err.value


def test_the_ring_kernels_assemble_for_sm_90a_without_spills():
    q = RNG.standard_normal((1, 2, 256, 64)).astype(np.float16)
    lowered = rf.kernel(flash_attention_f16, backend="simulate", sm="sm_90a").lower(q, q, q)
    assert stages_of(lowered)["s_matmul_dot_landed"] == 2
    assemble_without_spills(lowered)
    c = RNG.standard_normal((1, 2, 512, 128)).astype(np.float16)
    assemble_without_spills(rf.kernel(causal_attention, backend="simulate", sm="sm_90a").lower(c, c, c))
