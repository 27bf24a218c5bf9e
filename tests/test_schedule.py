"""The scheduling pass: Loop IR -> Tile IR keeps every program's value (checked by running the Tile IR
interpreter against the Loop IR interpreter), on ragged and degenerate shapes, and makes dots of matmuls."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, note
from hypothesis import strategies as st
from helpers import ops_of

import redfuser as rf
from redfuser.ir import (
    Axis, Binary, BinaryOp, Buffer, BufferType, Compute, Const, FusedLoop, Load, OnlineState, Program, ReduceOp,
    Select, Unary, UnaryOp, run_program, verify_program,
)
from redfuser.ir.tile import nodes as t
from redfuser.ir import types as T
from redfuser.ir.tile.interpreter import run_tile_program
from redfuser.ir.tile.verifier import verify_tile_program
from redfuser.schedule import ScheduleOptions, options_for, schedule_program
from redfuser.schedule.options import VECTOR_K, WHOLE_MAX
from redfuser.testing import assert_close
from redfuser.testing.strategies import programs
from redfuser.workloads import attention, causal_attention, log_softmax, softmax

F32 = T.float32
blocks = st.builds(ScheduleOptions, block_m=st.sampled_from([1, 2, 3, 4, 16]), block_n=st.sampled_from([1, 3, 4, 8]),
                   block_k=st.sampled_from([1, 2, 5, 8]), pow2=st.booleans())


def lowered(fn, *args, fuse=True):
    return rf.kernel(fn, backend="interpret", fuse=fuse).lower(*args)


def check_schedule(program: Program, args, opts: ScheduleOptions, dtype=np.float32, n: int = 1, scale=None,
                   chunk: int = 64, any_nonfinite: bool = False):
    tiled = schedule_program(program, opts)
    verify_tile_program(tiled)
    expected = run_program(program, args, chunk=chunk)
    actual = run_tile_program(tiled, args)
    for a, e in zip(actual, expected):
        assert_close(a, e, dtype, n, str(tiled), scale=scale, any_nonfinite=any_nonfinite)
    return tiled


# ---------------------------------------------------------------------------------------------
# random programs, unfused and fused, any tile sizes
# ---------------------------------------------------------------------------------------------
@given(programs(max_steps=5, max_size=256), blocks, st.booleans())
def test_random_programs_keep_their_value(program, opts, fuse):
    note(repr(program))
    low = lowered(program.body, *program.inputs, fuse=fuse)
    check_schedule(low.program, program.inputs, opts, program.dtype, program.reduction_length, program.scale,
                   any_nonfinite=True)


def _inf_times_a_cancelling_sum(x0, x2, x3):
    v3 = rf.sum(x0, axis=2) + x2          # stored in bf16 by the schedule, the interpreter keeps f32
    return x3 @ v3


def test_an_infinity_times_a_sum_that_cancels_may_be_nan_or_inf():
    """Found by the random programs: the sum rounds to bf16 in its scratch buffer, cancels to exactly 0
    against x2, and -inf * 0 is NaN, where the reference's unrounded sum leaves 2^-11 and -inf * that is
    inf. Both are right under the tolerance rule; strict comparison says NaN positions differ."""
    x0 = np.zeros((1, 3, 5, 1), rf.bfloat16)
    x0[0, 0, :, 0] = [0.240234, -1, 0.10498, 0.134766, 0.152344]
    x2 = np.full((1, 1, 1), 0.367188, rf.bfloat16)
    x3 = np.array([-np.inf, 1.0, 16.0], np.float32)
    low = lowered(_inf_times_a_cancelling_sum, x0, x2, x3, fuse=False)
    opts = ScheduleOptions(block_m=1, block_n=1, block_k=1, pow2=False)
    with pytest.raises(AssertionError, match="NaN positions differ"):
        check_schedule(low.program, (x0, x2, x3), opts, rf.bfloat16, 15)
    check_schedule(low.program, (x0, x2, x3), opts, rf.bfloat16, 15, any_nonfinite=True)


@given(programs(max_steps=3, max_size=128, allow_zero=True), blocks)
def test_empty_dimensions(program, opts):
    note(repr(program))
    low = lowered(program.body, *program.inputs)
    check_schedule(low.program, program.inputs, opts, program.dtype, program.reduction_length, program.scale,
                   any_nonfinite=True)


@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (1, 2, 7, 3), (2, 1, 13, 5), (1, 3, 17, 16)])
@pytest.mark.parametrize("fn", [attention, causal_attention])
def test_attention_shapes(shape, fn):
    rng = np.random.default_rng(sum(shape))
    q, k, v = (rng.standard_normal(shape).astype(np.float32) for _ in range(3))
    low = lowered(fn, q, k, v)
    for opts in (ScheduleOptions(block_m=4, block_n=4), ScheduleOptions(block_m=3, block_n=5, pow2=True)):
        check_schedule(low.program, (q, k, v), opts, n=shape[-2])


# ---------------------------------------------------------------------------------------------
# what the schedule looks like
# ---------------------------------------------------------------------------------------------
def test_fused_attention_is_one_kernel_with_two_dots_and_loop_carried_state():
    q, k, v = (np.zeros((2, 4, 33, 16), np.float32) for _ in range(3))
    tiled = schedule_program(lowered(attention, q, k, v).program, ScheduleOptions(block_m=16, block_n=8))
    (kernel,) = tiled.kernels
    assert kernel.grid == (2, 4, 3)  # batch and heads folded into the grid, 33 rows in tiles of 16
    assert len(ops_of(kernel, t.Dot)) == 2  # s = q k^T and the p v update
    (loop,) = ops_of(kernel, t.For)
    assert (loop.start, loop.stop, loop.step) == (0, 33, 8)
    # m, l, the p v accumulator, and l's compensation (a per-row sum: `states.compensated_states`)
    assert [a.type for a in loop.body.args] == [t.TileType(F32, (16,)), t.TileType(F32, (16,)), t.TileType(F32, (16, 16)),
                                                t.TileType(F32, (16,))]
    assert not tiled.scratch  # m, l, acc never leave the kernel
    loads = ops_of(kernel, t.Load)
    q_load = next(op for op in loads if op.buffer.name == "q")
    assert q_load in kernel.body  # the q tile is loop-invariant: loaded once, before the loop
    text = str(tiled)
    assert "%m_acc: f32[16] = maximum %m_prev, %m" in text
    assert ("= select %eq, %sum0, %sum_scaled" in text) or "rescaled" in text
    stores = ops_of(kernel, t.Store)
    assert [s.buffer.name for s in stores] == ["out"]


def test_decoding_heads_go_to_the_grid_not_into_a_three_dimensional_tile():
    """With one query row per head, heads are the last axis every state shares; each head reads its own
    k[h, j, :] and v[h, j, :], so a tile of heads would only stack rows (a heads x keys x d product,
    255 registers and spills on sm_90) with nothing shared. One program per head, 2-d tiles."""
    q = np.zeros((2, 8, 1, 16), np.float32)
    k, v = (np.zeros((2, 8, 256, 16), np.float32) for _ in range(2))
    tiled = schedule_program(lowered(attention, q, k, v).program, ScheduleOptions(block_m=4, block_n=32, split=1))
    (kernel,) = tiled.kernels
    assert kernel.grid == (2, 8)
    ranks = {len(op.out.type.shape) for op in t.walk_ops(kernel.body) if hasattr(op, "out")
             and isinstance(op.out.type, t.TileType)}
    assert max(ranks) == 2
    rows = np.zeros((2, 8, 6, 16), np.float32)   # several query rows per head: those still share a tile
    (kernel,) = schedule_program(lowered(attention, rows, k, v).program,
                                 ScheduleOptions(block_m=4, block_n=32, split=1)).kernels
    assert kernel.grid == (2, 8, 2)


def test_matmuls_become_dots_and_batch_axes_fold_into_the_grid():
    a = np.ones((3, 5, 7, 9), np.float32)
    b = np.ones((3, 5, 9, 4), np.float32)
    tiled = schedule_program(lowered(lambda a, b: a @ b, a, b).program, ScheduleOptions(block_m=4, block_n=4, block_k=4))
    (kernel,) = tiled.kernels
    assert kernel.grid == (3, 5, 2, 1)
    assert len(ops_of(kernel, t.Dot)) == 1
    (loop,) = ops_of(kernel, t.For)
    assert (loop.stop, loop.step) == (9, 4)


def sum_and_max(x):
    return rf.sum(x, axis=-1), rf.max(x, axis=-1)


def sum_and_matmul(x, w):
    return rf.sum(x, axis=-1), x @ w


@pytest.mark.parametrize("fn,shapes,grid", [(sum_and_max, [(100, 100, 64)], (100, 2)),
                                            (sum_and_matmul, [(17, 3, 5), (17, 5, 5)], (17, 1))])
def test_sibling_reductions_of_one_input_share_the_grid(fn, shapes, grid):
    """Two reductions of the same tensor that read no result of each other run in one fused loop; their
    states share no computed buffer, so only the input they both load joins their row axes. Without that
    join the kernel had no grid (one program holding all 100 x 100 rows; on the GPU the f64 case of fuzz
    example 48483 needed 64 KiB of shared memory for a [8, 32, 4, 8] product tile)."""
    args = [np.random.default_rng(0).standard_normal(s).astype(np.float32) for s in shapes]
    program = lowered(fn, *args).program
    (kernel,) = check_schedule(program, args, options_for("gpu"), n=shapes[0][-1]).kernels
    assert kernel.grid == grid


@pytest.mark.parametrize("sa,sb", [((6,), (6,)), ((6,), (6, 3)), ((4, 6), (6,)), ((2, 1, 4, 6), (3, 6, 5))])
def test_one_dimensional_and_broadcast_matmuls(sa, sb):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(sa).astype(np.float32), rng.standard_normal(sb).astype(np.float32)
    low = lowered(lambda a, b: a @ b, a, b)
    check_schedule(low.program, (a, b), ScheduleOptions(block_m=3, block_n=2, block_k=4), n=6)


def test_unfused_programs_pass_temporaries_through_scratch():
    x = np.random.default_rng(0).standard_normal((5, 37)).astype(np.float32)
    tiled = check_schedule(lowered(softmax, x, fuse=False).program, (x,), ScheduleOptions(block_m=2, block_k=8), n=37)
    assert len(tiled.kernels) == 5 and {b.name for b in tiled.scratch} >= {"m", "e"}
    fused = check_schedule(lowered(log_softmax, x).program, (x,), ScheduleOptions(block_m=2, block_n=8), n=37)
    (kernel,) = fused.kernels   # the (m, l) loop, then the output swept in chunks by the same programs
    assert not fused.scratch and [op.stop for op in kernel.body if isinstance(op, t.For)] == [37, 37]
    split = check_schedule(lowered(log_softmax, x).program, (x,),
                           ScheduleOptions(block_m=2, block_n=8, split=3), n=37)
    assert len(split.kernels) == 3  # partial states, their merge, and the output over the whole grid


def test_huge_buffers_get_64_bit_offsets():
    big = Buffer("x", BufferType(F32, (70000, 40000)))
    out = Buffer("out", BufferType(F32, (70000, 40000)))
    i, j = Axis("i0", 70000), Axis("i1", 40000)
    p = verify_program(Program("big", (big,), (out,), (Compute(out, (i, j), Load(big, (i, j))),)))
    (kernel,) = schedule_program(p).kernels
    assert {op.offsets.dtype for op in ops_of(kernel, t.Load)} == {T.int64}
    small = schedule_program(lowered(softmax, np.zeros((4, 8), np.float32)).program).kernels[0]
    assert {op.offsets.dtype for op in ops_of(small, t.Load)} == {T.int32}


def test_offsets_are_32_bit_where_tiles_cannot_reach_2_to_the_31():
    """A tile never overhangs its axis by more than the axis (tiles are no longer than it), so a small tensor
    keeps i32 offsets however large the cpu's tiles are (group norm's [2, 64, 32, 32] took i64 when each axis
    was padded by a whole 256-row dot tile); a tensor whose padded extent crosses 2**31 takes i64."""
    from redfuser.schedule.program import _needs_i64
    cpu = options_for("cpu", {"num_threads": 1})
    assert max(cpu.dot_tile) == 256
    assert not _needs_i64([Buffer("x", BufferType(F32, (2, 64, 32, 32)))], cpu)
    assert not _needs_i64([Buffer("x", BufferType(F32, (2**16 - 600, 2**15 - 800)))], cpu)  # < 2**31 padded
    assert _needs_i64([Buffer("x", BufferType(F32, (2**16, 2**15 - 100)))], cpu)   # 2**31 - 2**22 + padding


def test_options_for_backends():
    # a tile the user chose is the tile: the GEMM core's dot_tile is off, the exact causal skip stays on
    assert options_for("cpu", {"block_m": 32, "fuse": True, "num_threads": 1}) == \
        ScheduleOptions(block_m=32, skip_exact=True, peel_ragged=True, whole_max=WHOLE_MAX["cpu"],
                        vector_k=VECTOR_K)
    assert options_for("cpu", {"num_threads": 1}).dot_tile == (256, 128)
    assert options_for("cpu", {"block_k": 32, "num_threads": 1}).vector_k == 0   # the chunk the user chose
    assert not options_for("cpu", {"skip_masked": False, "num_threads": 1}).skip_exact
    assert options_for("gpu").pow2
    with pytest.raises(rf.ArgumentError):
        ScheduleOptions(block_m=0)


@pytest.mark.parametrize("head", [128, 100])
def test_decoding_reads_each_key_row_whole(head):
    """One query against a chunk of keys (decoding): ``q . k`` takes the whole head dimension (up to `VECTOR_K`)
    in one chunk, so each key's row is read once, in memory order; in chunks of 64 it was two passes over
    the chunk's rows, and the loop was bound by those reads (decode [1,8,32768,128] 12.3 -> 9.6 ms). A tile of
    several query rows (a dot) and a user's ``block_k`` keep their chunks."""
    rng = np.random.default_rng(6)
    q = rng.standard_normal((1, 2, 1, head)).astype(np.float32)
    k, v = (rng.standard_normal((1, 2, 300, head)).astype(np.float32) for _ in range(2))
    text = str(rf.kernel(attention, backend="cpu").lower(q, k, v).stages["tile"])
    assert f"k: f32[128,{head}] = load" in text and "step 64 iter" not in text
    given = str(rf.kernel(attention, backend="cpu", block_k=64).lower(q, k, v).stages["tile"])
    assert "k: f32[128,64] = load" in given
    ref = attention(*(a.astype(np.float64) for a in (q, k, v))).astype(np.float32)
    assert_close(rf.kernel(attention, backend="cpu")(q, k, v), ref, np.float32, 300)


@pytest.mark.parametrize("n", [1000, 1024, 40])
def test_a_ragged_fused_loop_on_the_cpu_peels_its_last_chunk(n):
    """A fused loop over 1000 elements in chunks of 64 walks 15 whole chunks unmasked, then the last 40 on
    their own (`chunks.chunk_loop`, `peel_ragged`): a masked chunk costs its selects on every chunk
    (softmax 1000x1000 6.6 -> 1.6 ms). A whole number of chunks, or one short chunk, is one loop as before;
    the GPU keeps one masked loop (its masked loads are predicated)."""
    x = np.random.default_rng(5).standard_normal((8, n)).astype(np.float32)
    kernel = rf.kernel(softmax, backend="cpu", split=1, block_n=64)   # (the default takes rows of 1000 whole)
    lowered = kernel.lower(x)
    text = str(lowered.stages["tile"])
    assert ("_tail" in text) == (n == 1000)          # the last chunk's own loop (one trip: inlined)
    assert ("to 960 step 64" in text) == (n == 1000)  # the whole chunks' loop, unmasked
    assert_close(kernel(x), softmax(x.astype(np.float64)).astype(np.float32), np.float32, n)
    gpu = schedule_program(lowered.program, options_for("gpu"))
    assert not options_for("gpu").peel_ragged and gpu is not None


# ---------------------------------------------------------------------------------------------
# a hand-built fused loop: online softmax with masked rows, chunk by chunk like the interpreter
# ---------------------------------------------------------------------------------------------
def online_softmax_sum(rows: int, keys: int) -> Program:
    """``m = max_k x``, ``l = sum_k exp(x - m)`` (rescaled by exp(m_prev - m)), then ``out = log(l) + m``."""
    def buf(name, *shape):
        return Buffer(name, BufferType(F32, shape))

    x = buf("x", rows, keys)
    i, k = Axis("i0", rows), Axis("k", keys)
    m, m_prev, l, l_prev, out = buf("m", rows), buf("m_prev", rows), buf("l", rows), buf("l_prev", rows), buf("out", rows)

    def exp_minus(a, b):
        return Unary(UnaryOp.EXP, Binary(BinaryOp.SUB, a, b, F32), F32)

    states = (
        OnlineState(m, m_prev, (i,), ReduceOp.MAX, Load(x, (i, k))),
        OnlineState(l, l_prev, (i,), ReduceOp.SUM, exp_minus(Load(x, (i, k)), Load(m, (i,))),
                    exp_minus(Load(m_prev, (i,)), Load(m, (i,)))),
    )
    lse = Binary(BinaryOp.ADD, Unary(UnaryOp.LOG, Load(l, (i,)), F32), Load(m, (i,)), F32)
    clean = Select(Binary(BinaryOp.EQ, Load(m, (i,)), Const(float("-inf"), F32), T.bool_), Const(0.0, F32), lse, F32)
    return verify_program(Program("lse", (x,), (out, m), (FusedLoop(k, (), states), Compute(out, (i,), clean))))


@pytest.mark.parametrize("rows,keys,chunk", [(7, 19, 4), (7, 8, 8), (7, 1, 3), (7, 40, 64)])
def test_hand_built_fused_loop_matches_the_interpreter_chunk_for_chunk(rows, keys, chunk):
    x = (np.random.default_rng(rows * keys).standard_normal((rows, keys)) * 4).astype(np.float32)
    x[1] = -np.inf                      # a fully masked row
    x[2, : keys // 2 + 1] = -np.inf     # the first chunks masked
    x[3, -1] = 90.0                     # a large score in the last chunk rescales everything
    x[4, 0] = np.nan                    # NaN propagates through max like numpy
    program = online_softmax_sum(rows, keys)
    tiled = check_schedule(program, (x,), ScheduleOptions(block_m=3, block_n=chunk), n=keys, chunk=chunk)
    assert len(tiled.kernels) == 1  # the epilogue joined the fused loop


# ---------------------------------------------------------------------------------------------
# loops of one iteration are inlined (cleanup.peel_single_trips)
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fn", [softmax, log_softmax])
def test_a_row_in_one_chunk_is_loaded_once(fn):
    """With the chunk the whole row, the fused loop and the second pass run once each: inlined, their two
    loads of the same tile merge, and the row goes to memory once instead of twice."""
    x = (np.random.default_rng(3).standard_normal((6, 512)) * 3).astype(np.float16)
    low = lowered(fn, x)
    one = check_schedule(low.program, [x], ScheduleOptions(block_m=1, block_n=512), np.float16, 512)
    (kernel,) = one.kernels
    assert not ops_of(kernel, t.For) and len(ops_of(kernel, t.Load)) == 1
    two = check_schedule(low.program, [x], ScheduleOptions(block_m=1, block_n=256), np.float16, 512)
    assert len(ops_of(two.kernels[0], t.For)) == 2 and len(ops_of(two.kernels[0], t.Load)) == 2
    for backend in ("cpu", "simulate"):
        out = rf.kernel(fn, backend=backend, block_m=1, block_n=512, num_warps=2)(x)
        assert_close(out, fn(x), np.float16, 512)


def test_an_inlined_loop_inside_a_loop_and_around_one_keeps_the_values():
    """Attention with one key block (its loop inlined) whose head dimension is chunked (inner loops kept),
    and with two key blocks (kept) whose chunks are one each (inlined): both equal the reference."""
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((1, 2, 40, 64)).astype(np.float32) for _ in range(3))
    low = lowered(attention, q, k, v)
    one_block = check_schedule(low.program, [q, k, v], ScheduleOptions(block_m=16, block_n=64, block_k=16),
                               n=40)
    loops = [(op.body.iv.name, op.stop, op.step) for op in ops_of(one_block.kernels[0], t.For)]
    assert loops == [("r0", 64, 16)]                        # the key loop inlined, q @ k^T's chunks kept
    two_blocks = check_schedule(low.program, [q, k, v], ScheduleOptions(block_m=16, block_n=32, block_k=64), n=40)
    loops = [(op.body.iv.name, op.stop, op.step) for op in ops_of(two_blocks.kernels[0], t.For)]
    assert loops == [("j", 40, 32)]                          # the key loop kept, the head in one chunk


def test_loops_past_2_31_index_in_64_bits_though_their_buffers_are_small():
    """Offsets were chosen i32 or i64 from the buffers' spans alone; a zero-stride broadcast view of 2^31 + 7
    elements spans 4 bytes, so its loop index wrapped: a sum of it gave 7, an argmax -1, positions from
    `arange` past 2^31 were never reached. A loop's own extent (and a reduction's whole run) now counts too.
    Found by a helper."""
    n = 2**31 + 7
    ones = np.broadcast_to(np.ones(1, np.int32), (n,))
    count = rf.kernel(lambda a: rf.sum(rf.where(rf.arange(a.shape[0]) >= 2**31, a, 0)), backend="cpu")
    assert int(count(ones)) == 7
    assert int(rf.kernel(lambda a: rf.sum(a), backend="cpu")(ones)) == n
    marked = rf.kernel(lambda a: rf.argmax(rf.where(rf.arange(a.shape[0]) == 2**31 + 3, 2, a)), backend="cpu")
    assert int(marked(ones)) == 2**31 + 3


def _gemv_of_a_broadcast_vector(x0, x1):
    return x1.sum(axis=-1, keepdims=True), x1 @ x0


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_gpu_chunk_materialized_whole_stays_within_its_element_budget(dynamic):
    """An int32 ``x1 @ x0`` (no `dot`: integers) fused with a sum of ``x1`` over symbolic lengths took a 64 x 64 x
    64 tile per chunk, 2048 lanes a thread; the SIMT lowering ran for more than 800 s (fuzz seed 101, example
    1216). A chunk the GPU schedule materializes whole holds at most `CHUNK_TILE` elements."""
    import math

    from redfuser.schedule.options import CHUNK_TILE

    x0 = np.ones((15, 5, 10), np.int32)
    x1 = np.broadcast_to(np.int32(3), (5,))
    lowered = rf.kernel(_gemv_of_a_broadcast_vector, backend="interpret", dynamic=dynamic).lower(x0, x1)
    tiled = schedule_program(lowered.program, options_for("gpu"))
    verify_tile_program(tiled)
    largest = max(math.prod(op.out.shape) for k in tiled.kernels for op in t.walk_ops(k.body)
                  if isinstance(getattr(op, "out", None), t.Value))
    assert largest <= CHUNK_TILE, largest
