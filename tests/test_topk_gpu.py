"""Top-k on the GPU path: the Tile IR `TopK` op lowered to SIMT (k-lists in registers, shuffles across lanes,
shared memory across warps) follows `redfuser.ir.topk` exactly in the simulator -- ties, NaN, -0.0, empty slots,
i32/i64 indices, f32/f64 values -- and MoE routing (E = 8..256, k = 1..8) gives the reference's indices on
``simulate`` with PTX that assembles for sm_80 and sm_90 without spills."""
from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest
from redfuser.codegen.ptx_check import check_ptx
from redfuser.codegen.simt import GpuOptions, lower_to_simt
from redfuser.codegen.simt.run import simulate_program
from redfuser.ir import Buffer, BufferType
from redfuser.ir.tile import nodes as t
from redfuser.ir import topk as topk_semantics
from redfuser.ir import types as T
from redfuser.ir.tile.interpreter import run_tile_program
from redfuser.ir.tile.verifier import verify_tile_program

from helpers import routing

import redfuser as rf
from redfuser.testing import assert_close

F32, F64, I32, I64 = T.float32, T.float64, T.int32, T.int64


def v(name, dtype, *shape):
    return t.Value(name, t.TileType(dtype, tuple(shape)))


def merge_program(rows: int, n: int, k: int, index=I64, dtype=F32, acc: bool = True) -> t.TileProgram:
    """One kernel: ``out = topk(x, xi) into (a, ai)`` over whole [rows, n] / [rows, k] buffers."""
    names = [("x", dtype, n), ("xi", index, n)] + ([("a", dtype, k), ("ai", index, k)] if acc else [])
    bufs = {name: Buffer(name, BufferType(d, (rows, w))) for name, d, w in
            names + [("ov", dtype, k), ("oi", index, k)]}
    ops = [t.Arange(v("rn", I32, rows))]
    for w in sorted({n, k}):
        ops += [t.Arange(v(f"c{w}", I32, w)), t.Constant(v(f"s{w}", I32, rows), w),
                t.Binary(v(f"r{w}", I32, rows), t.BinaryOp.MUL, v("rn", I32, rows), v(f"s{w}", I32, rows)),
                t.ExpandDims(v(f"re{w}", I32, rows, 1), v(f"r{w}", I32, rows), 1),
                t.Broadcast(v(f"rb{w}", I32, rows, w), v(f"re{w}", I32, rows, 1)),
                t.ExpandDims(v(f"ce{w}", I32, 1, w), v(f"c{w}", I32, w), 0),
                t.Broadcast(v(f"cb{w}", I32, rows, w), v(f"ce{w}", I32, 1, w)),
                t.Binary(v(f"off{w}", I32, rows, w), t.BinaryOp.ADD, v(f"rb{w}", I32, rows, w),
                         v(f"cb{w}", I32, rows, w))]
    on, ok = v(f"off{n}", I32, rows, n), v(f"off{k}", I32, rows, k)
    ops += [t.Load(v("xv", dtype, rows, n), bufs["x"], on, None, 0.0),
            t.Load(v("xiv", index, rows, n), bufs["xi"], on, None, 0)]
    lists = ()
    if acc:
        ops += [t.Load(v("av", dtype, rows, k), bufs["a"], ok, None, 0.0),
                t.Load(v("aiv", index, rows, k), bufs["ai"], ok, None, 0)]
        lists = (v("av", dtype, rows, k), v("aiv", index, rows, k))
    ops += [t.TopK(v("tv", dtype, rows, k), v("ti", index, rows, k), v("xv", dtype, rows, n),
                   v("xiv", index, rows, n), 1, *lists),
            t.Store(bufs["ov"], ok, v("tv", dtype, rows, k), None),
            t.Store(bufs["oi"], ok, v("ti", index, rows, k), None)]
    ins = tuple(bufs[name] for name, _, _ in names)
    kernel = t.TileKernel("merge", (1,), tuple(bufs.values()), tuple(ops))
    return verify_tile_program(t.TileProgram("merge", ins, (bufs["ov"], bufs["oi"]), (), (kernel,)))


def random_lists(rng, rows, n, k, dtype=np.float32, index=np.int64):
    """Candidates with ties, NaN, -inf, -0.0, empty (index -1) lanes; an acc list made by the reference with
    empty slots, permuted in places (a rescaled list need not be sorted any more)."""
    x = rng.integers(-3, 4, (rows, n)).astype(dtype)
    x[rng.random((rows, n)) < 0.15] = np.nan
    x[rng.random((rows, n)) < 0.1] = -np.inf
    x[rng.random((rows, n)) < 0.1] = -0.0
    xi = np.broadcast_to(np.arange(100, 100 + n), (rows, n)).copy()
    xi[rng.random((rows, n)) < 0.2] = -1
    pool = rng.integers(-3, 4, (rows, k)).astype(dtype)
    pool[rng.random(pool.shape) < 0.15] = np.nan
    a, ai = topk_semantics.topk(pool, k, axis=-1)
    ai[rng.random((rows, k)) < 0.25] = -1                      # empty slots
    a[ai < 0] = np.nan
    swap = rng.random(rows) < 0.3
    a[swap], ai[swap] = a[swap][:, ::-1], ai[swap][:, ::-1]    # unsorted lists merge by the definition too
    return x, xi.astype(index), a.astype(dtype), ai.astype(index)


def reference_merge(x, xi, a, ai):
    vals, idx = topk_semantics.merge(a, ai.astype(np.int64), x, xi.astype(np.int64))
    return np.where(idx < 0, np.nan, vals), np.where(idx < 0, -1, idx)


def simulated(p: t.TileProgram, args, sm="sm_90", warps=4):
    return simulate_program(lower_to_simt(p, GpuOptions(sm=sm, num_warps=warps)), args)


# rows x n spread over the thread bits differently: rows on every thread (registers along the axis), the axis on
# lanes (shuffles), the axis on lanes and warps (shared memory), many rows per thread (vectors of 16 rows)
@pytest.mark.parametrize("rows,n,k,warps", [(64, 16, 4, 2), (4, 64, 8, 4), (1, 256, 8, 4), (256, 4, 2, 1),
                                            (8, 8, 1, 1), (2, 32, 16, 2)])
@pytest.mark.parametrize("dtype,index", [(np.float32, np.int64), (np.float32, np.int32), (np.float64, np.int64)])
def test_topk_op_follows_the_definition_in_the_simulator(rows, n, k, warps, dtype, index):
    rng = np.random.default_rng(rows * 1000 + n * 10 + k)
    args = random_lists(rng, rows, n, k, dtype, index)
    p = merge_program(rows, n, k, I32 if index is np.int32 else I64, F64 if dtype is np.float64 else F32)
    ev, ei = reference_merge(*args)
    got_v, got_i = simulated(p, args, warps=warps)
    assert got_i.dtype == index and np.array_equal(got_i, ei)
    assert np.array_equal(got_v, ev, equal_nan=True)
    assert np.array_equal(np.signbit(got_v), np.signbit(ev.astype(dtype)))   # -0.0 kept where it ranks
    tile_v, tile_i = run_tile_program(p, list(args))
    assert np.array_equal(tile_i, got_i) and np.array_equal(tile_v, got_v, equal_nan=True)


def test_topk_without_acc_and_the_structure_of_its_lowering():
    p = merge_program(1, 256, 8, acc=False)
    kernel = lower_to_simt(p, GpuOptions(num_warps=4)).kernels[0]
    text = str(kernel)
    assert text.count("shfl.bfly") and "barrier" in text and "shared smem_i64" in text   # lanes, then warps
    rng = np.random.default_rng(5)
    x, xi, _, _ = random_lists(rng, 1, 256, 8)
    got_v, got_i = simulated(p, [x, xi])
    ev, ei = reference_merge(x, xi, *topk_semantics.empty((1,), 8, np.float32))   # no acc: k empty slots
    assert np.array_equal(got_i, ei) and np.array_equal(got_v, ev, equal_nan=True)


def positions_program(rows: int, n: int, k: int, indices: str, index=I64) -> t.TileProgram:
    """``topk(x, xi) into (a, ai)`` where the candidates' indices are computed, not loaded: ``up`` (100 + j, the
    positions a scheduler builds), ``down`` (100 + n - 1 - j) or ``shifted`` (j - 1: candidate 0 is empty)."""
    p = merge_program(rows, n, k, index)
    kernel = p.kernels[0]
    start, step = {"up": (100, 1), "down": (100 + n - 1, -1), "shifted": (-1, 1)}[indices]
    j, first = v("j", I32, n), v("first", I32, n)
    ops = [t.Arange(j), t.Constant(first, start)]
    if step == 1:
        ops.append(t.Binary(v("pos", I32, n), t.BinaryOp.ADD, first, j))
    else:
        ops.append(t.Binary(v("pos", I32, n), t.BinaryOp.SUB, first, j))
    ops += [t.ExpandDims(v("pos_e", I32, 1, n), v("pos", I32, n), 0),
            t.Broadcast(v("pos_b", I32, rows, n), v("pos_e", I32, 1, n))]
    if index is I64:
        ops.append(t.Cast(v("xiv", I64, rows, n), v("pos_b", I32, rows, n)))
    else:
        ops[-1] = t.Broadcast(v("xiv", I32, rows, n), v("pos_e", I32, 1, n))
    body = [op for op in kernel.body if not (isinstance(op, t.Load) and op.out.name == "xiv")]
    at = next(i for i, op in enumerate(body) if isinstance(op, t.TopK))
    kernel = replace(kernel, params=tuple(b for b in kernel.params if b.name != "xi"),
                     body=tuple(body[:at] + ops + body[at:]))
    return verify_tile_program(replace(p, inputs=tuple(b for b in p.inputs if b.name != "xi"), kernels=(kernel,)))


# What the lowering knows of computed indices (`topk._candidate_facts`) changes the code it emits; these check that
# every way it can know something gives the definition's answer, ties, NaN, -0.0 and empty candidates included.
@pytest.mark.parametrize("indices", ["up", "down", "shifted"])
@pytest.mark.parametrize("rows,n,k,warps", [(64, 16, 4, 2), (4, 64, 8, 4), (1, 256, 2, 4), (256, 4, 2, 1),
                                            (8, 8, 1, 1), (32, 64, 2, 4)])
@pytest.mark.parametrize("index", [I64, I32])
def test_topk_of_computed_positions_follows_the_definition(indices, rows, n, k, warps, index):
    rng = np.random.default_rng(rows * 1000 + n * 10 + k)
    x, _, a, ai = random_lists(rng, rows, n, k, index=np.int64 if index is I64 else np.int32)
    ai = np.where(ai >= 0, ai + 1000, ai)          # the acc list's positions are not the candidates' (as in a loop)
    start, step = {"up": (100, 1), "down": (100 + n - 1, -1), "shifted": (-1, 1)}[indices]
    xi = np.broadcast_to(start + step * np.arange(n), (rows, n)).astype(ai.dtype)
    got_v, got_i = simulated(positions_program(rows, n, k, indices, index), [x, a, ai], warps=warps)
    ev, ei = reference_merge(x, xi, a, ai)
    assert np.array_equal(got_i, ei)
    assert np.array_equal(got_v, ev, equal_nan=True)
    assert np.array_equal(np.signbit(got_v), np.signbit(ev))


def test_what_the_lowering_knows_of_computed_positions():
    from redfuser.codegen.simt.plan import plan_kernel
    from redfuser.codegen.simt.topk import _candidate_facts, _Rows
    from redfuser.codegen.simt.context import Lowering
    from redfuser.codegen.simt.values import LoweringBuilder

    def facts(p):
        kernel, opts = p.kernels[0], GpuOptions(num_warps=2)
        plan = plan_kernel(kernel, opts)
        op = next(op for op in kernel.body if isinstance(op, t.TopK))
        layout = plan.reduce_in[op.out.name]
        lw = Lowering(kernel, plan, opts, LoweringBuilder("k", warps=plan.warps, grid=(1,)))
        return _candidate_facts(lw, op, layout, _Rows(layout, op.axis))

    assert facts(positions_program(64, 16, 4, "up")) == (True, True)          # real positions, in order
    assert facts(positions_program(64, 16, 4, "down")) == (False, False)      # descending; sign unknown
    assert facts(positions_program(64, 16, 4, "shifted")) == (False, True)    # in order; one is -1
    assert facts(merge_program(64, 16, 4)) == (False, False)                  # loaded: nothing known
    ranked = lower_to_simt(positions_program(64, 16, 4, "up"), GpuOptions(num_warps=2)).kernels[0]
    loaded = lower_to_simt(merge_program(64, 16, 4), GpuOptions(num_warps=2)).kernels[0]
    assert len(str(ranked).splitlines()) < 0.75 * len(str(loaded).splitlines())


def test_moe_routing_ranks_its_i64_positions_as_i32():
    # the expert indices are i64 positions cast from i32: lanes exchange them as one 32-bit word, not two
    x = moe_logits(64, 128, 2, 3)
    kernel = lower_to_simt(rf.kernel(routing(2), backend="simulate").lower(x).stages["tile"], GpuOptions()).kernels[0]
    text = str(kernel)
    assert "shfl.bfly" in text and not re.search(r"i64>? = shr", text)



def moe_logits(tokens: int, experts: int, k: int, seed: int) -> np.ndarray:
    """Random logits without ties, plus rows tested on purpose: masked chunks, all tied, ties at the maximum,
    a fully masked row (NaN weights, indices 0..k-1) and a NaN (spreading to its row like the reference)."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((tokens, experts)) * 3).astype(np.float32)
    x[1, : experts // 2] = -np.inf
    x[2] = -np.inf
    x[3] = 0.5
    x[4, :k + 1] = 9.0
    x[5, experts - 1] = np.nan
    return x


@pytest.mark.parametrize("experts,k", [(8, 1), (8, 2), (16, 3), (32, 5), (64, 8), (128, 4), (256, 6), (256, 8)])
def test_moe_routing_on_simulate_gives_the_reference_indices(experts, k):
    x = moe_logits(21, experts, k, experts * 10 + k)
    route = routing(k)
    (w, idx), (w_ref, idx_ref) = rf.kernel(route, backend="simulate")(x), route(x)
    assert np.array_equal(idx, idx_ref)
    assert_close(w, w_ref, np.float32, experts)


def test_moe_routing_workload_split_and_small_tiles():
    from redfuser.workloads import moe_routing

    x = moe_logits(19, 40, 3, 7)
    route = routing(3)
    for body, opts in ((moe_routing, {}), (route, {"split": 3, "block_n": 8}), (route, {"block_m": 4, "block_n": 16})):
        (w, idx), (w_ref, idx_ref) = rf.kernel(body, backend="simulate", **opts)(x), body(x)
        assert np.array_equal(idx, idx_ref), opts
        assert_close(w, w_ref, np.float32, 40)


@pytest.mark.parametrize("k,axis,dtype", [(3, -1, np.float32), (5, 0, np.int32), (8, -1, np.float16)])
def test_topk_nests_on_simulate_equal_the_definition(k, axis, dtype):
    rng = np.random.default_rng(k)
    x = rng.integers(-4, 5, size=(6, 40)).astype(np.float32)   # many ties on purpose
    if dtype is not np.int32:
        x[rng.random(x.shape) < 0.1] = np.nan
        x[rng.random(x.shape) < 0.05] = -np.inf
    x = x.astype(dtype)

    def f(x):
        return rf.topk(x, k, axis=axis)

    got, ref = rf.kernel(f, backend="simulate", block_k=16)(x), f(x)
    assert got[0].dtype == ref[0].dtype and np.array_equal(got[1], ref[1])
    assert np.array_equal(got[0], ref[0], equal_nan=True)


@pytest.mark.parametrize("experts,k", [(8, 2), (16, 3), (256, 8)])
def test_moe_routing_ptx_assembles_for_sm80_and_sm90_without_spills(experts, k):
    x = moe_logits(16, experts, k, 1)
    for sm in ("sm_80", "sm_90"):
        ptx = rf.kernel(routing(k), backend="cuda", sm=sm).lower(x).stages["ptx"]
        for kernel in ptx.kernels:
            for arch, result in check_ptx(kernel.ptx).items():   # raises with the assembler's log on bad PTX
                assert all(u.spill_store_bytes == 0 and u.registers <= 255 for u in result.usage), (kernel.name, arch)
        assert "shfl.sync.bfly.b32" in str(ptx)


def top_k_of_probabilities(x, k):
    p = rf.exp(x - rf.max(x, axis=-1, keepdims=True))
    return rf.topk(p, k)


def test_a_k_beyond_the_gpu_limit_is_refused_with_the_users_line_and_the_limit_itself_compiles():
    """Long campaign (seed 1), example 5850: a top-1000 routing ran past 30 minutes on `simulate` (the GPU's
    k-lists are unrolled registers; lowering took 45 s at k = 64, 200 s at k = 128). k above 32 is now a
    clear refusal on the GPU backends naming the user's line; cpu still compiles it; k = 32 runs."""
    from redfuser.codegen.simt.topk import MAX_GPU_TOPK

    x = np.random.default_rng(3).standard_normal((2, 40)).astype(np.float32)
    with pytest.raises(rf.BackendError, match="top-k of more than 32 values per row is not compiled for the GPU") \
            as err:
        rf.kernel(lambda x: top_k_of_probabilities(x, MAX_GPU_TOPK + 1), backend="simulate")(x)
    assert "rf.topk(p, k)" in str(err.value) and "test_topk_gpu.py" in str(err.value)
    for backend, k in (("cpu", 33), ("simulate", 32)):
        values, indices = rf.kernel(lambda x: top_k_of_probabilities(x, k), backend=backend)(x)
        want_v, want_i = top_k_of_probabilities(x, k)
        assert np.array_equal(indices, want_i)
        assert_close(values, want_v, np.float32, 40)
