"""The Tile IR -> SIMT IR lowering: layouts, conversions, dot operands, the structure of what it emits, and
that the simulator catches a barrier or a bound taken out of it."""
from __future__ import annotations

from collections import Counter
from dataclasses import replace

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from redfuser.ir.simt.fragments import fragment_a, fragment_b, fragment_c
from redfuser.codegen.simt import GpuOptions, lower_kernel, lower_to_simt, narrow_dot_operands
from redfuser.codegen.simt.affine import Affine, AffineInfo
from redfuser.codegen.simt.convert import ldmatrix_plan, register_map
from redfuser.codegen.simt.layouts import blocked, mma_a, mma_acc, mma_b, sliced
from redfuser.codegen.simt.run import simulate_program
from redfuser.codegen.simt.views import source_layout
from redfuser.codegen.simulator import SimOptions
from redfuser.ir import BinaryOp, SimulationError
from redfuser.ir.tile import nodes as t
from redfuser.ir.simt.nodes import (
    Barrier, For, LdMatrix, LoadGlobal, LoadShared, Mma, MmaShape, Shuffle, StoreShared, walk_stmts,
)
from redfuser.ir.tile.interpreter import run_tile_program
from redfuser.ir.types import bool_, float16, float32, int32, int64

import redfuser as rf
from redfuser.schedule import options_for, schedule_program
from redfuser.testing import assert_close
from redfuser.workloads import attention, causal_attention, fp8_quant_gemm, moe_routing, softmax

RNG = np.random.default_rng(5)


def tile_program(fn, *args, **options) -> t.TileProgram:
    lowered = rf.kernel(fn, backend="interpret").lower(*args)
    return schedule_program(lowered.program, options_for("gpu", options))


def normal(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def elements(layout) -> np.ndarray:
    """Each thread's elements, as a [threads, regs] table of flat indices."""
    return layout.table()


# --- layouts ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape,order,vec,warps", [((64, 64), (1, 0), 4, 4), ((8, 256), (1, 0), 4, 4),
                                                   ((32, 16), (0, 1), 2, 2), ((4, 2, 8), (2, 1, 0), 1, 1),
                                                   ((1024,), (0,), 8, 4)])
def test_blocked_layouts_give_every_element_to_exactly_one_owner(shape, order, vec, warps):
    layout = blocked(shape, warps, order, vec)
    owners = elements(layout)[[tid for tid in range(layout.threads) if not tid & layout.replica_mask()]]
    assert sorted(owners.ravel().tolist()) == list(range(int(np.prod(shape))))
    fast = order[0]
    assert all(b[fast] == 1 << i for i, b in enumerate(layout.regs[: (vec.bit_length() - 1)]))


def test_small_tiles_replicate_instead_of_dropping_elements():
    layout = blocked((8,), 4, None, 4)
    table = elements(layout)
    assert set(table.ravel().tolist()) == set(range(8))
    assert bin(layout.replica_mask()).count("1") >= 4    # 128 threads, 8 elements


@pytest.mark.parametrize("k,dtype", [(16, "f16"), (32, "f8")])
def test_mma_layouts_are_the_ptx_fragments(k, dtype):
    acc, a, b = mma_acc(16, 8, 1), mma_a(16, k, 8, 1, k), mma_b(k, 8, 16, 1, k)
    for lane in range(32):
        assert acc.table()[lane].tolist() == [r * 8 + c for r, c in fragment_c(lane)]
        assert a.table()[lane].tolist() == [r * k + c for reg in fragment_a(lane, k) for r, c in reg]
        assert b.table()[lane].tolist() == [r * 8 + c for reg in fragment_b(lane, k) for r, c in reg]


def test_warps_tile_the_mma_output_and_operands_follow():
    acc, a, b = mma_acc(64, 32, 4), mma_a(64, 32, 32, 4, 16), mma_b(32, 32, 64, 4, 16)
    assert sorted(acc.table().ravel().tolist()) == list(range(64 * 32))
    for warp in range(4):    # a warp holds the A rows and B columns of the outputs it computes
        lanes = slice(32 * warp, 32 * warp + 32)
        rows = {i // 32 for i in acc.table()[lanes].ravel()}
        cols = {i % 32 for i in acc.table()[lanes].ravel()}
        assert {i // 32 for i in a.table()[lanes].ravel()} == rows
        assert {i % 32 for i in b.table()[lanes].ravel()} == cols


def test_an_accumulator_is_reread_as_an_a_operand_without_moving_data():
    # P = softmax(Q K^T) in accumulator fragments feeds P @ V's A operand by renaming registers (FlashAttention-2).
    assert register_map(mma_acc(64, 32, 4), mma_a(64, 32, 64, 4, 16)) is not None
    assert register_map(blocked((64, 32), 4, (1, 0), 4), mma_a(64, 32, 64, 4, 16)) is None


def test_a_reduction_slices_the_reduced_dim_away():
    layout = blocked((16, 64), 4, (1, 0), 4)
    out = sliced(layout, 1)
    table, src = out.table(), layout.table()
    for tid in range(128):
        assert set(table[tid].tolist()) == {i // 64 for i in src[tid]}


@pytest.mark.parametrize("view", [t.Permute(t.Value("o", t.TileType(float16, (8, 16))),
                                            t.Value("x", t.TileType(float16, (16, 8))), (1, 0)),
                                  t.ExpandDims(t.Value("o", t.TileType(float16, (16, 1))),
                                               t.Value("x", t.TileType(float16, (16,))), 1),
                                  t.Broadcast(t.Value("o", t.TileType(float16, (16, 8))),
                                              t.Value("x", t.TileType(float16, (16, 1))))])
def test_a_views_source_layout_holds_the_elements_the_view_reads(view):
    out = blocked(view.out.shape, 2, None, 2)
    src = source_layout(view, out)
    out_shape, x_shape = view.out.shape, view.x.shape
    for tid in range(64):
        for r in range(out.num_regs):
            coord = np.unravel_index(out.table()[tid, r], out_shape)
            if isinstance(view, t.Permute):
                want = tuple(coord[view.perm.index(d)] for d in range(len(x_shape)))
            else:
                want = tuple(c if s != 1 else 0 for c, s in zip(coord, x_shape))
            assert src.table()[tid, r] == np.ravel_multi_index(want, x_shape)


def test_gpu_tile_rows_follow_what_the_fused_states_hold():
    """GPU default (``block_m=None``): a fused loop of per-row values (softmax's m and l) over a row that
    fits `ONE_PASS_MAX` takes whole rows, `ONE_PASS_TILE` elements a tile (routing's softmax too: its top-k
    is a nest of its own after the pass, 64 rows); 32 rows for per-row running top-k lists (no tensor cores
    to feed, half the code per thread); 64 for attention's query rows,
    128 where its contraction runs on tensor cores and the accumulator fits `ACC_TILE`. A block_m or
    block_n the user gives is kept either way."""
    x, q = normal(256, 1024), normal(1, 2, 256, 64)

    def grids(fn, *args, **options):
        return [k.grid for k in tile_program(fn, *args, workers=1, **options).kernels]

    assert grids(softmax, x) == [(256 // 16,)]
    assert grids(softmax, x, block_m=64) == [(256 // 64,)]
    assert grids(softmax, x, block_n=64) == [(256 // 32,)]
    assert grids(attention, q, q, q) == [(2, 256 // 64)]
    assert grids(attention, q, q, q, block_m=32) == [(2, 256 // 32)]
    # f16 attention feeds tensor cores: 128 rows (`WIDE_ROWS`) while rows x head dim stays within `ACC_TILE`
    h64, h128 = normal(1, 2, 256, 64, dtype=np.float16), normal(1, 2, 256, 128, dtype=np.float16)
    assert grids(attention, h64, h64, h64) == [(2, 256 // 128)]
    assert grids(attention, h128, h128, h128) == [(2, 256 // 64)]
    assert grids(attention, h64, h64, h64, block_m=64) == [(2, 256 // 64)]
    assert grids(moe_routing, x[:, :64])[:2] == [(1,), (256 // 64,)]   # whole rows; the top-k nest keeps 64


@pytest.mark.parametrize("head", [64, 128])
def test_attention_reads_q_once_and_contractions_divide_into_chunks(head):
    """GPU ``block_k=None``: a 16-bit contraction up to 128 long is one chunk (`options.K_BLOCK`), so the q
    tile is loop-invariant, loaded and made into mma fragments before the key loop, and the key loop has
    no inner loop (4 barriers a key block, not 2 + 4 per head-dim chunk); f32 contractions are cut at
    64; 96 divides into chunks of 32 (`ScheduleOptions.chunk`) and stays on tensor cores."""
    h = normal(1, 2, 128, head, dtype=np.float16)
    simt = lower_to_simt(tile_program(attention, h, h, h), GpuOptions()).kernels[0]
    loop = next(s for s in simt.body if isinstance(s, For))
    assert "q" in {s.buffer.name for s in simt.body if isinstance(s, LoadGlobal)}
    assert "q" not in {s.buffer.name for s in walk_stmts(loop.body.stmts) if isinstance(s, LoadGlobal)}
    assert not [s for s in walk_stmts(loop.body.stmts) if isinstance(s, For)]
    f32 = lower_to_simt(tile_program(attention, *(h.astype(np.float32),) * 3), GpuOptions()).kernels[0]
    f32_loop = next(s for s in f32.body if isinstance(s, For))
    in_loop = {s.buffer.name for s in walk_stmts(f32_loop.body.stmts) if isinstance(s, LoadGlobal)}
    assert ("q" in in_loop) == (head > 64)      # f32 (FMA): q re-read per 64-wide chunk of a longer head dim
    opts = options_for("gpu")
    assert [opts.chunk(n) for n in (64, 96, 128, 48, 4096, 100)] == [64, 32, 64, 16, 64, 64]
    assert [opts.chunk(n, narrow_product=True) for n in (64, 96, 128, 256)] == [64, 32, 128, 128]
    wide = normal(1, 1, 32, 96, dtype=np.float16)
    simt = lower_to_simt(tile_program(attention, wide, wide, wide), GpuOptions()).kernels[0]
    assert {s.shape for s in stmts(simt, Mma)} == {MmaShape.M16N8K16_F16}


# --- analyses and the dot pre-pass ----------------------------------------------------------------

def test_offsets_are_affine_and_ragged_masks_constant_over_vectors():
    # split: the output pass is a loop-free kernel of its own (a sweep inside the fused kernel indexes by a
    # loop's induction variable, which the bare definition table built here knows nothing about)
    k = tile_program(softmax, normal(8, 100), block_m=8, block_n=64, split=2).kernels[-1]
    defs = {r.name: op for op in t.walk_ops(k.body) for r in t.results(op)}
    info = AffineInfo(defs)
    load = next(op for op in t.walk_ops(k.body) if isinstance(op, t.Load) and op.out.shape == (8, 64))
    form = info.of(load.offsets)
    assert form is not None and form.strides == (100, 1) and form.div % 4 == 0
    assert info.constancy(load.mask, 1) == 4      # 100 = 4 * 25: 16-byte vectors stay inside the row


def test_which_affine_offsets_are_known_non_negative():
    def val(name, dtype=int32, shape=(8,)):
        return t.Value(name, t.TileType(dtype, shape))

    ops = [t.Arange(val("j")), t.Constant(val("two"), 2), t.Constant(val("neg"), -3),
           t.ProgramId(val("pid", shape=()), 0),
           t.Binary(val("up"), BinaryOp.ADD, val("j"), val("two")),              # j + 2
           t.Binary(val("scaled"), BinaryOp.MUL, val("j"), val("two")),          # 2 j
           t.Binary(val("down"), BinaryOp.SUB, val("two"), val("j")),            # 2 - j: negative past j = 2
           t.Binary(val("shifted"), BinaryOp.ADD, val("j"), val("neg")),         # j - 3
           t.Binary(val("flipped"), BinaryOp.MUL, val("j"), val("neg")),         # -3 j
           t.Binary(val("zero"), BinaryOp.SUB, val("two"), val("two")),          # 0
           t.Cast(val("wide", int64), val("up")),                                # i32 -> i64 keeps the sign
           t.Cast(val("narrow"), val("wide", int64))]                            # i64 -> i32 could wrap
    info = AffineInfo({r.name: op for op in ops for r in t.results(op)})
    known = {op.out.name: info.of(op.out).nonneg for op in ops}
    assert known == {"j": True, "two": True, "neg": False, "pid": True, "up": True, "scaled": True, "down": False,
                     "shifted": False, "flipped": False, "zero": True, "wide": True, "narrow": False}


def test_a_select_under_one_scalar_condition_between_equal_strides_is_affine():
    """The prefetched loop's next counter, ``j + 64 < stop ? j + 64 : j``, keeps its offsets affine: the next
    tile is loaded in 16-byte vectors from a base, not element by element (schedule/prefetch.py)."""
    def val(name, shape=(8,), dtype=int32):
        return t.Value(name, t.TileType(dtype, shape))

    ops = [t.Arange(val("j")), t.Constant(val("c4"), 4), t.Constant(val("c64", ()), 64),
           t.ProgramId(val("pid", ()), 0), t.Binary(val("later", ()), BinaryOp.ADD, val("pid", ()), val("c64", ())),
           t.Binary(val("more", (), bool_), BinaryOp.LT, val("later", ()), val("c64", ())),
           t.Select(val("next", ()), val("more", (), bool_), val("later", ()), val("pid", ())),
           t.Broadcast(val("row"), val("next", ())), t.Binary(val("four_j"), BinaryOp.MUL, val("j"), val("c4")),
           t.Binary(val("off"), BinaryOp.ADD, val("row"), val("j")),
           t.Select(val("mixed"), val("more", (), bool_), val("off"), val("four_j")),         # strides 1 and 4
           t.Binary(val("lane_cond"), BinaryOp.LT, val("j"), val("c4")),
           t.Select(val("per_lane"), val("lane_cond", dtype=bool_), val("off"), val("j"))]   # a tile condition
    info = AffineInfo({r.name: op for op in ops for r in t.results(op)})
    assert info.of(val("next", ())) == Affine((), 1, None, True)
    assert info.of(val("off")).strides == (1,)
    assert info.of(val("mixed")) is None and info.of(val("per_lane")) is None


def test_dots_get_half_precision_operands_only_when_exact_or_rounded_away():
    q = normal(1, 1, 32, 16, dtype=ml_dtypes.bfloat16)
    prog = tile_program(attention, q, q, q, block_m=16, block_n=16)   # bf16 in, f32 out
    kernel = narrow_dot_operands(prog.kernels[0], GpuOptions())
    dots = [op for op in t.walk_ops(kernel.body) if isinstance(op, t.Dot)]
    # Q @ K^T: both exact; P @ V: the f32 P split into three bf16 parts, chained through the accumulator,
    # the two smaller parts against V with its infinities 0, the largest against V itself
    assert [(d.a.dtype.name, d.b.dtype.name) for d in dots] == [("bf16", "bf16")] * 4
    assert dots[2].acc == dots[1].out and dots[3].acc == dots[2].out
    assert dots[1].b == dots[2].b != dots[3].b and "finite" in dots[1].b.name and "finite" not in dots[3].b.name
    same = replace(prog, kernels=(kernel,))
    assert_close(run_tile_program(same, [q, q, q])[0], run_tile_program(prog, [q, q, q])[0], np.float32, 32)
    h = normal(1, 1, 32, 16, dtype=np.float16)                        # f16 out: P is rounded for P @ V
    kernel = narrow_dot_operands(tile_program(attention, h, h, h, block_m=16, block_n=16).kernels[0], GpuOptions())
    assert all(op.a.dtype == float16 for op in t.walk_ops(kernel.body) if isinstance(op, t.Dot))


def widened_matmul(x, w):
    return x.astype(rf.float32) @ w.astype(rf.float32)


def test_a_ragged_k_contraction_of_f16_data_stays_on_tensor_cores():
    """K = 40 in chunks of 16: the scheduler zeroes the padded lanes of K with a select over each operand,
    which a load masked the same way (other 0) already gives; the narrowing sees through it, so the dot
    reads the f16 loads (it was an f32 FMA dot). A select that does change the padding keeps the f32 dot."""
    rng = np.random.default_rng(31)
    x, w = rng.standard_normal((32, 40)).astype(np.float16), rng.standard_normal((40, 24)).astype(np.float16)
    prog = tile_program(widened_matmul, x, w, block_m=16, block_n=8, block_k=16)
    kernel = narrow_dot_operands(prog.kernels[0], GpuOptions())
    (dot,) = [op for op in t.walk_ops(kernel.body) if isinstance(op, t.Dot)]
    assert (dot.a.dtype, dot.b.dtype) == (float16, float16)
    narrowed = run_tile_program(replace(prog, kernels=(kernel,)), [x, w])[0]
    np.testing.assert_array_equal(narrowed, run_tile_program(prog, [x, w])[0])
    simulated = rf.kernel(widened_matmul, backend="simulate", block_m=16, block_n=8, block_k=16)(x, w)
    assert_close(simulated, widened_matmul(x, w), np.float32, 40)

    zeros = {op.b.name for op in t.walk_ops(prog.kernels[0].body) if isinstance(op, t.Select)}
    ones = [op for op in t.walk_ops(prog.kernels[0].body) if isinstance(op, t.Constant) and op.out.name in zeros]
    assert ones, "the padding selects are gone: this test no longer checks the see-through"
    def pad_with_one(ops):
        return tuple(replace(op, value=1.0) if op in ones else
                     replace(op, body=replace(op.body, ops=pad_with_one(op.body.ops))) if isinstance(op, t.For) else op
                     for op in ops)

    padded_with_one = replace(prog.kernels[0], body=pad_with_one(prog.kernels[0].body))
    (dot,) = [op for op in t.walk_ops(narrow_dot_operands(padded_with_one, GpuOptions()).body) if isinstance(op, t.Dot)]
    assert (dot.a.dtype, dot.b.dtype) == (float32, float32)


def adversarial_f32(rows: int, cols: int) -> np.ndarray:
    """f32 values with full 24-bit significands over the whole exponent range a bf16 split keeps exactly
    (|x| >= 2**-110), f32's largest, and values between bf16's largest finite and f32's largest."""
    rng = np.random.default_rng(23)
    significand = 1 + rng.integers(0, 1 << 23, (rows, cols)) / float(1 << 23)
    x = (rng.choice([-1.0, 1.0], (rows, cols)) * significand * 2.0 ** rng.integers(-110, 127, (rows, cols)))
    x = x.astype(np.float32)
    beyond = np.float32(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
    x[0, :4] = [np.finfo(np.float32).max, -np.finfo(np.float32).max, np.nextafter(beyond, np.float32(np.inf)),
                -np.nextafter(beyond, np.float32(np.inf))]
    return x


def matmul(p, v):
    return p @ v


@pytest.mark.parametrize("backend", ["tile", "simulate"])
def test_an_f32_operand_split_into_bf16_parts_is_exact(backend):
    """f32 @ bf16 with f32 out: the f32 operand is split into bf16 parts that sum to it exactly, so with a
    one-hot V each output is one of P's values, bit for bit, on the Tile interpreter and the mma simulator."""
    p = adversarial_f32(32, 32)
    perm = np.random.default_rng(24).permutation(32)
    v = np.eye(32, dtype=np.float32)[:, perm].astype(ml_dtypes.bfloat16)   # out[:, j] = p[:, perm[j]]
    prog = tile_program(matmul, p, v, block_m=16, block_n=16)
    kernel = narrow_dot_operands(prog.kernels[0], GpuOptions())
    assert sum(isinstance(op, t.Dot) and op.a.dtype.name == "bf16" for op in t.walk_ops(kernel.body)) == 3
    if backend == "tile":
        out = run_tile_program(replace(prog, kernels=(kernel,)), [p, v])[0]
    else:
        out = rf.kernel(matmul, backend="simulate", block_m=16, block_n=16)(p, v)
    np.testing.assert_array_equal(out, p[:, perm])


@pytest.mark.parametrize("backend", ["tile", "simulate"])
def test_a_split_operand_keeps_infinities_and_nan(backend):
    p = normal(16, 16)
    p[1, 3], p[2, 5], p[3, 7] = np.inf, -np.inf, np.nan
    v = normal(16, 16, dtype=ml_dtypes.bfloat16)
    v[3, 0] = 0.0                                        # inf * 0: NaN, as in the reference
    with np.errstate(all="ignore"):
        expected = (p.astype(np.float64)[:, :, None] * v.astype(np.float64)[None]).sum(1)
    if backend == "tile":
        prog = tile_program(matmul, p, v, block_m=16, block_n=16)
        out = run_tile_program(replace(prog, kernels=(narrow_dot_operands(prog.kernels[0], GpuOptions()),)), [p, v])[0]
    else:
        out = rf.kernel(matmul, backend="simulate", block_m=16, block_n=16)(p, v)
    assert_close(out, expected.astype(np.float32), np.float32, 16)


@given(m=st.sampled_from([16, 32, 48]), k=st.sampled_from([16, 32, 64, 96]), n=st.sampled_from([8, 16, 40]),
       tiles=st.sampled_from([(16, 16), (32, 16), (16, 32)]), seed=st.integers(0, 2**32 - 1),
       specials=st.lists(st.sampled_from([np.inf, -np.inf, np.nan, 0.0, -0.0]), max_size=3),
       v_specials=st.lists(st.sampled_from([np.inf, -np.inf, np.nan]), max_size=2),
       short=st.booleans())
def test_split_operand_dots_match_the_reference_on_the_simulator(m, k, n, tiles, seed, specials, v_specials, short):
    """Random shapes, tiles and magnitudes (2**-100 to 2**100) for ``f32 @ bf16``: the simulated split mmas
    agree with numpy's f32 product under the one tolerance rule, non-finite positions exactly. Infinities
    go in either operand, and `short` makes P's values bf16-exact or nearly (parts of 0 and of either sign)."""
    rng = np.random.default_rng(seed)
    p = (rng.standard_normal((m, k)) * 2.0 ** rng.integers(-100, 100, (m, k))).astype(np.float32)
    if short:   # 8 to 10 significant bits: the second and third parts 0, or the second of the other sign
        p = (p.view(np.uint32) & np.uint32(0xFFFF0000 if seed % 2 else 0xFFFFC000)).view(np.float32)
    for value in specials:
        p[rng.integers(m), rng.integers(k)] = value
    v = rng.standard_normal((k, n)).astype(ml_dtypes.bfloat16)
    for value in v_specials:
        v[rng.integers(k), rng.integers(n)] = value
    with np.errstate(all="ignore"):
        expected = matmul(p, v)
    kernel = rf.kernel(matmul, backend="simulate", block_m=tiles[0], block_n=tiles[1])
    simt = kernel.lower(p, v).stages["simt"].kernels[0]
    assert stmts(simt, Mma), "the split runs on (simulated) tensor cores"
    assert_close(kernel(p, v), expected, np.float32, k)


# --- what the lowering emits ----------------------------------------------------------------------

def stmts(kernel, kind):
    return [s for s in walk_stmts(kernel.body) if isinstance(s, kind)]


def test_attention_runs_on_tensor_cores_with_its_online_state_in_registers():
    h = normal(1, 2, 64, 32, dtype=np.float16)
    kv = normal(1, 2, 128, 32, dtype=np.float16)           # two key blocks: a loop (one would be inlined)
    simt = lower_to_simt(tile_program(attention, h, kv, kv), GpuOptions()).kernels[0]
    assert {s.shape for s in stmts(simt, Mma)} == {MmaShape.M16N8K16_F16}
    loop = next(s for s in simt.body if isinstance(s, For))
    assert [r.dtype.name for r in loop.results] == ["f32"] * len(loop.results) and len(loop.results) >= 3
    assert stmts(simt, Shuffle), "row reductions go through warp shuffles"
    assert any(s.out.length > 1 for s in stmts(simt, LoadGlobal)), "global loads are vectors"
    f32 = lower_to_simt(tile_program(attention, *(x.astype(np.float32) for x in (h, h, h))), GpuOptions())
    assert not stmts(f32.kernels[0], Mma), "f32 dots run as FMA"


def test_mma_operands_come_out_of_shared_memory_through_ldmatrix():
    """Q and K^T fragments are ``ldmatrix``'s own layout, V's (pairs down the columns of a row-major tile)
    its transpose; a blocked layout or an 8-bit tile is neither."""
    assert ldmatrix_plan(mma_a(64, 64, 64, 4, 16), 2) == ldmatrix_plan(mma_a(64, 64, 64, 4, 16), 2)
    assert not ldmatrix_plan(mma_a(64, 64, 64, 4, 16), 2).trans
    assert ldmatrix_plan(mma_b(64, 64, 64, 4, 16), 2).trans
    assert ldmatrix_plan(blocked((64, 64), 4, vec=8), 2) is None
    assert ldmatrix_plan(mma_b(64, 64, 64, 4, 32), 1) is None
    h = normal(1, 2, 64, 64, dtype=np.float16)
    simt = lower_to_simt(tile_program(attention, h, h, h), GpuOptions()).kernels[0]
    assert {(s.count, s.trans) for s in stmts(simt, LdMatrix)} == {(4, False), (4, True)}
    assert not stmts(simt, LoadShared), "every shared read of attention is an ldmatrix"


@pytest.mark.parametrize("head", [32, 64, 128])
def test_ldmatrix_reads_of_a_padded_scratch_are_one_wavefront_a_matrix(head):
    """An 8x8 matrix of ``ldmatrix`` is 8 rows of 16 bytes; the 32 banks span 128 bytes, so the read is one
    wavefront when the rows fall in distinct 16-byte quarters, else one per row sharing a quarter. Row-major
    attention tiles ``head`` halves wide put the rows 4 (head 32) or 8 to a quarter; `ldmatrix_pitch` pads
    them to one."""
    from redfuser.codegen.simt.convert import ldmatrix_pitch, transposed

    def wavefronts(layout, pitch):
        plan = ldmatrix_plan(layout, 2, pitch)
        rows = [sum(r for bit, r in enumerate(plan.rows) if i >> bit & 1) for i in range(8)]
        return plan.trans, max(Counter(2 * r // 16 % 8 for r in rows).values())

    operands = {"Q (A)": mma_a(64, head, 64, 4, 16), "K (B of K^T)": transposed(mma_b(head, 64, 64, 4, 16)),
                "V (B, transposed read)": mma_b(64, head, 64, 4, 16)}
    for name, layout in operands.items():
        pitch = ldmatrix_pitch(layout, 2)
        assert layout.shape[1] == head and pitch == head + 8, name
        trans, unpadded = wavefronts(layout, None)
        assert wavefronts(layout, pitch) == (trans, 1), name
        assert unpadded == {32: 4, 64: 8, 128: 8}[head], name
    assert ldmatrix_pitch(blocked((64, 64), 4, vec=8), 2) is None        # not an ldmatrix read: row-major


@pytest.mark.parametrize("sm,shape", [("sm_90", MmaShape.M16N8K32_E4M3), ("sm_80", None)])
def test_fp8_gemm_uses_e4m3_tensor_cores_only_where_they_exist(sm, shape):
    x, w = normal(32, 64, dtype=np.float16), normal(64, 32, dtype=ml_dtypes.float8_e4m3fn)
    prog = tile_program(fp8_quant_gemm, x, w, normal(32))
    simt = lower_to_simt(prog, GpuOptions(sm=sm)).kernels[0]
    assert {s.shape for s in stmts(simt, Mma)} == ({shape} if shape else set())


def test_fp8_b_fragments_are_read_as_words_from_a_column_major_scratch():
    """An e4m3 mma's B fragment holds four consecutive k of one column: a row-major ``[k, n]`` scratch would
    give them as four byte loads, so the conversion keeps that tile column-major and reads 32-bit words."""
    from redfuser.codegen.simt.convert import _reads_wider_transposed, transposed

    b_frag, a_frag = mma_b(64, 64, 64, 4, 32), mma_a(64, 64, 64, 4, 32)
    assert _reads_wider_transposed(b_frag, 1) and not _reads_wider_transposed(a_frag, 1)
    assert not _reads_wider_transposed(b_frag, 2)                  # 16-bit: ldmatrix.trans reads it
    assert transposed(transposed(b_frag)) == b_frag
    x, w, ws = normal(64, 128, dtype=np.float16), normal(128, 64, dtype=ml_dtypes.float8_e4m3fn), normal(64)
    prog = tile_program(fp8_quant_gemm, x, w, ws)
    simt = lower_to_simt(prog, GpuOptions(sm="sm_90"))
    f8_reads = [s for s in stmts(simt.kernels[0], LoadShared) if s.out.dtype.name == "f8e4m3"]
    assert f8_reads and all(s.out.length == 4 for s in f8_reads)
    assert_close(simulate_program(simt, [x, w, ws])[0], run_tile_program(prog, [x, w, ws])[0], np.float32, 128)


def test_a_transposed_byte_scratch_is_padded_so_b_fragment_reads_collide_less():
    """Shared memory has 32 banks of 4 bytes; lanes reading distinct words of one bank take turns. Rows of
    a 64-byte scratch put the 8 fragment rows a warp reads 4 to a bank; 4 bytes of padding halve that."""
    from redfuser.codegen.simt.convert import BYTE_ROW_PAD, transposed

    scratch = transposed(mma_b(64, 64, 64, 4, 32))        # B fragments as a layout of the [n, k] scratch
    rows, width = scratch.shape
    table = scratch.table()                               # [threads, registers] row-major flat indices

    def turns(pitch: int) -> int:                         # the worst word read (4 registers) of any warp
        worst = 0
        for warp in range(scratch.threads // 32):
            for r in range(0, scratch.num_regs, 4):
                flat_index = table[32 * warp: 32 * warp + 32, r]
                words = {(i // width * pitch + i % width) // 4 for i in flat_index.tolist()}
                worst = max(worst, max(Counter(w % 32 for w in words).values()))
        return worst

    assert (rows, width) == (64, 64) and turns(width) == 4 and turns(width + BYTE_ROW_PAD) == 2


def test_64_bit_offsets_where_the_tile_ir_says_i64():
    from redfuser.schedule.nests import compute_kernel

    x = normal(5, 37)
    lowered = rf.kernel(lambda a: a * 2.0 + 1.0, backend="interpret").lower(x)
    stmt = lowered.program.body[-1]
    kernel = compute_kernel(stmt, "scale64", options_for("gpu", dict(block_m=4, block_n=16)), int64)
    prog = t.TileProgram("scale64", lowered.program.inputs, lowered.program.outputs, (), (kernel,))
    simt = lower_to_simt(prog, GpuOptions())
    assert {s.index.dtype for s in stmts(simt.kernels[0], LoadGlobal)} == {int64}
    np.testing.assert_array_equal(simulate_program(simt, [x])[0], x * 2.0 + 1.0)


def test_kernel_names_become_ptx_identifiers():
    prog = tile_program(lambda a: a + 1.0, normal(4))
    assert lower_to_simt(prog, GpuOptions()).kernels[0].name == "_lambda__0"


def test_fma_dots_stage_the_contraction_in_chunks_that_fit_shared_memory():
    q = normal(1, 1, 64, 128)    # P @ V: a 64 x 64 and b 64 x 128 in f32 would be 48 KiB at once
    simt = lower_to_simt(tile_program(attention, q, q, q), GpuOptions()).kernels[0]
    chunks = [s for s in stmts(simt, For) if s.body.iv.name.startswith("kk")]
    assert len(chunks) >= 4 and simt.shared_bytes <= 32 * 1024


def test_too_much_shared_memory_is_a_clear_error():
    q = normal(1, 1, 128, 256, dtype=np.float16)   # q: 128 x 256 f16 through shared memory is 64 KiB
    # block_n=256 keeps the 256-long head dim whole (a longer one would be tiled across the grid)
    with pytest.raises(rf.BackendError, match="shared memory"):
        lower_to_simt(tile_program(attention, q, q, q, block_m=128, block_n=256), GpuOptions())


# --- planted bugs the simulator must catch ----------------------------------------------------------

def _drop_barrier_after_first_shared_store(stmts_):
    out, dropped = [], False
    for i, s in enumerate(stmts_):
        if not dropped and isinstance(s, Barrier) and i and isinstance(stmts_[i - 1], StoreShared):
            dropped = True
            continue
        out.append(s)
    return tuple(out), dropped


def test_a_missing_barrier_in_a_layout_conversion_is_a_race():
    x = normal(4, 16)
    prog = tile_program(lambda a: rf.swapaxes(a, 0, 1) @ a, x, block_m=16, block_n=16, block_k=16)
    simt = lower_to_simt(prog, GpuOptions())
    assert simulate_program(simt, [x])[0].shape == (16, 16)
    body, dropped = _drop_barrier_after_first_shared_store(simt.kernels[0].body)
    assert dropped
    broken = replace(simt, kernels=(replace(simt.kernels[0], body=body),))
    with pytest.raises(SimulationError) as info:
        simulate_program(broken, [x], SimOptions(check_uninitialized=False))
    assert info.value.kind == "race"


def test_an_off_by_one_mask_reads_out_of_bounds():
    x = normal(5, 37)
    prog = tile_program(lambda a: a * 2.0, x, block_m=4, block_n=16)
    kernel = prog.kernels[0]

    def loosen(ops):
        return tuple(replace(op, op=BinaryOp.LE) if isinstance(op, t.Binary) and op.op is BinaryOp.LT
                     and op.b.shape and op.a.dtype.is_int else op for op in ops)

    broken = lower_kernel(replace(kernel, body=loosen(kernel.body)), GpuOptions())
    with pytest.raises(SimulationError) as info:
        simulate_program(replace(lower_to_simt(prog, GpuOptions()), kernels=(broken,)), [x])
    assert info.value.kind == "out_of_bounds"


def test_min_blocks_per_sm_reaches_ptxas_and_caps_registers():
    """``min_blocks_per_sm=4`` on 128-thread attention blocks: the SIMT header says so, the PTX carries
    ``.minnctapersm 4``, and ptxas keeps a thread within 65536 / (4 * 128) = 128 registers, where by
    default it takes more; bad values are refused by name."""
    from redfuser.codegen.ptx_check import assemble

    h = normal(1, 2, 256, 64, dtype=np.float16)
    usage = {}
    for blocks in (None, 4):
        low = rf.kernel(attention, backend="cuda", sm="sm_90", min_blocks_per_sm=blocks).lower(h, h, h)
        (k,) = low.stages["ptx"].kernels
        assert (".minnctapersm 4" in k.ptx) == (blocks == 4)
        assert ("at least 4 blocks an SM" in str(low.stages["simt"])) == (blocks == 4)
        usage[blocks] = assemble(k.ptx, "sm_90").usage[0].registers
    assert usage[4] <= 128 < usage[None]
    for bad in (0, True, 2.0, 33):
        with pytest.raises(rf.ArgumentError, match="min_blocks_per_sm"):
            rf.kernel(attention, backend="cuda", sm="sm_90", min_blocks_per_sm=bad).lower(h, h, h)
    # more blocks than an SM's 2048 threads hold: ptxas ignored the bound with a warning nobody saw
    x = np.ones((8, 100), np.float32)
    with pytest.raises(rf.BackendError, match=r"min_blocks_per_sm=32 .* at most 16 blocks of this kernel"):
        rf.kernel(softmax, backend="cuda", sm="sm_90", min_blocks_per_sm=32, num_warps=4).lower(x)


@pytest.mark.parametrize("fn,n,m,options", [(attention, 200, 200, {}), (attention, 77, 150, {}),
                                            (causal_attention, 200, 200, {"skip_masked": True})])
def test_wide_attention_rows_on_ragged_shapes_equal_numpy(fn, n, m, options):
    """f16 attention at head 64 takes 128-row tiles (`WIDE_ROWS`); ragged query and key counts (masked
    rows and keys, a causal diagonal cutting a tile) give numpy's values on the simulator."""
    rng = np.random.default_rng(n + m)
    q = rng.standard_normal((1, 2, n, 64)).astype(np.float16)
    k, v = (rng.standard_normal((1, 2, m, 64)).astype(np.float16) for _ in range(2))
    kernel = rf.kernel(fn, backend="simulate", **options)
    (tiled,) = kernel.lower(q, k, v).stages["tile"].kernels
    assert tiled.grid[-1] == -(-n // 128)
    with np.errstate(all="ignore"):
        expected = fn(q, k, v)
    assert_close(kernel(q, k, v), expected, np.float16, m)


def _rms_norm_beside_a_gemm(x, w, a, b):
    from redfuser.workloads import rms_norm

    return rms_norm(x, w), a @ b


def test_smaller_tiles_for_one_kernel_do_not_widen_the_others():
    """The retry with smaller tiles applies to the whole program: its ``block_n`` of 4096, meant to chunk a
    long fused row, made an f32 GEMM beside it a 64 x 4096 tile, 2048 accumulators a thread (a 47 s
    compile). A GPU tile's columns across the grid are at most `GPU_COLUMNS_MAX` (`ScheduleOptions.columns`);
    and a whole-rows tile of very short rows at most `ONE_PASS_ROWS` rows (16384 rows of one element needed
    the retry in the first place: fuzz seed 108, example 341)."""
    from redfuser.schedule.options import GPU_COLUMNS_MAX, ONE_PASS_ROWS

    args = (rf.ShapeDtype((256, 16384), np.float16), rf.ShapeDtype((16384,), np.float32),
            rf.ShapeDtype((64, 256), np.float32), rf.ShapeDtype((256, 8192), np.float32))
    lowered = rf.kernel(_rms_norm_beside_a_gemm, backend="simulate", sm="sm_90").lower(*args)
    assert lowered.options.block_n == 4096
    gemm = lowered.stages["tile"].kernels[-1]
    assert gemm.grid == (1, 8192 // GPU_COLUMNS_MAX)
    rng = np.random.default_rng(0)
    short = rf.kernel(_mean_of_one_element_rows_beside_a_matmul, backend="simulate", dynamic=True).lower(
        rng.standard_normal((9, 5, 3)).astype(np.float16), rng.standard_normal((9, 5, 1)).astype(np.float16),
        rng.standard_normal((2, 5)).astype(np.float32))
    assert short.options.block_n is None     # (no retry)
    assert f"cdiv(x0.1, {ONE_PASS_ROWS})" in [str(k.grid[-1]) for k in short.stages["tile"].kernels]


def _mean_of_one_element_rows_beside_a_matmul(x0, x1, x2):
    v3 = rf.sqrt(rf.abs(x1) + 1.0)
    return rf.mean(v3, axis=2, keepdims=True), x2 @ (np.float32(0.5) * x0), v3


def test_default_tiles_that_need_more_shared_memory_than_the_target_are_made_smaller():
    """f16 RMSNorm of 16384-element rows took whole rows, and converting its f32 weight row took 64 KiB of
    shared memory (48 KiB on sm_90): the defaults then try smaller tiles (`compiler.SMALLER_TILES`) and the
    compile says which it took; a tile the user gave is kept, with the error."""
    from redfuser.workloads import rms_norm

    x, w = rf.ShapeDtype((256, 16384), np.float16), rf.ShapeDtype((16384,), np.float32)
    lowered = rf.kernel(rms_norm, backend="simulate", sm="sm_90").lower(x, w)
    assert lowered.options.block_n == 4096
    int64 = rf.ShapeDtype((64, 64), np.int64)        # (64 x 64 x 64 operand tiles of 8 bytes: 512 KiB)
    with pytest.raises(rf.BackendError, match="shared memory"):
        rf.kernel(lambda a, b: a @ b, backend="simulate", sm="sm_90", block_k=64).lower(int64, int64)
    small = np.random.default_rng(3).standard_normal((2, 16384)).astype(np.float16)
    weight = np.random.default_rng(4).standard_normal(16384).astype(np.float32)
    got = rf.kernel(rms_norm, backend="simulate", sm="sm_90")(small, weight)
    assert_close(got, rms_norm(small.astype(np.float64), weight.astype(np.float64)).astype(np.float16),
                 np.float16, 16384)


def _attention_of_f32_probabilities(q, k, v):
    s = q.astype(rf.float32) @ k.astype(rf.float32).T
    p = rf.exp(s - rf.max(s, axis=-1, keepdims=True))
    return ((p @ v) / rf.sum(p, axis=-1, keepdims=True)).astype(rf.float16)


@pytest.mark.parametrize("case", ["small p", "cancelling"])
def test_an_operand_numpy_holds_in_f32_is_not_rounded_for_tensor_cores(case):
    """(Found by a helper.) ``p @ v`` with an f32 ``p`` (the user's own f32 scores) and f16 ``v``, stored as f16:
    the GPU rounded ``p`` to f16 for ``mma``, which numpy never does. ``exp(-17)`` became 5.96e-8 for 4.1e-8
    (the result +44%), and cancelling terms gave 0 for numpy's 5e-5. An operand is rounded where numpy holds
    it in that type (`t.Dot.held`: a softmax of f16 scores), as f16 attention by numpy's rules still is."""
    q = np.zeros((16, 16), np.float16)
    q[:, 0] = 1
    k, v = np.zeros((16, 16), np.float16), np.zeros((16, 16), np.float16)
    if case == "small p":
        k[1:, 0], v[1:] = -17, 1000
    else:
        k[1::2, 0], v[0::2], v[1::2] = np.float16(-0.0001), 1, -1
    want = _attention_of_f32_probabilities(q, k, v)
    got = rf.kernel(_attention_of_f32_probabilities, backend="simulate")(q, k, v)
    assert_close(got, want, np.float16, 16)
    held = [op.held for op in t.walk_ops(tile_program(attention, *(normal(1, 2, 64, 32, dtype=np.float16),) * 3)
                                          .kernels[0].body) if isinstance(op, t.Dot)]
    assert (float16, None) in held           # f16 attention by numpy's rules: P is numpy's f16
