"""Top-k compiled: the Tile IR `TopK` op (verifier, printer, interpreter, host code) follows `redfuser.ir.topk`
exactly (ties, NaN, empty slots); `rf.topk` nests and MoE routing (its top-k after the softmax's pass) run on the
cpu backend with the reference's indices exactly and its values within the tolerance rule."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers import routing

import redfuser as rf
from redfuser.codegen.host import build_host_module
from redfuser.ir import Buffer, BufferType, VerifyError
from redfuser.ir.tile import nodes as t
from redfuser.ir import topk as topk_semantics
from redfuser.ir import types as T
from redfuser.ir.tile.interpreter import run_tile_program
from redfuser.ir.tile.verifier import verify_tile_program
from redfuser.runtime.cpu_jit import CpuProgram, compile_cached
from redfuser.testing import assert_close

F32, I32, I64, BOOL = T.float32, T.int32, T.int64, T.bool_


def v(name, dtype, *shape):
    return t.Value(name, t.TileType(dtype, tuple(shape)))


def merge_program(rows: int, n: int, k: int, index=I64) -> t.TileProgram:
    """One kernel: ``out = topk(x, xi) into (a, ai)`` over whole [rows, n] / [rows, k] buffers."""
    bufs = {name: Buffer(name, BufferType(d, (rows, w))) for name, d, w in
            (("x", F32, n), ("xi", index, n), ("a", F32, k), ("ai", index, k), ("ov", F32, k), ("oi", index, k))}
    ops = [t.Arange(v("rn", I32, rows)), t.Arange(v("cn", I32, n)), t.Arange(v("ck", I32, k))]
    for w, c in ((n, "cn"), (k, "ck")):
        ops += [t.Constant(v(f"s{w}{c}", I32, rows), w),
                t.Binary(v(f"r{c}", I32, rows), t.BinaryOp.MUL, v("rn", I32, rows), v(f"s{w}{c}", I32, rows)),
                t.ExpandDims(v(f"re{c}", I32, rows, 1), v(f"r{c}", I32, rows), 1),
                t.Broadcast(v(f"rb{c}", I32, rows, w), v(f"re{c}", I32, rows, 1)),
                t.ExpandDims(v(f"ce{c}", I32, 1, w), v(c, I32, w), 0),
                t.Broadcast(v(f"cb{c}", I32, rows, w), v(f"ce{c}", I32, 1, w)),
                t.Binary(v(f"off{c}", I32, rows, w), t.BinaryOp.ADD, v(f"rb{c}", I32, rows, w), v(f"cb{c}", I32, rows, w))]
    on, ok = v("offcn", I32, rows, n), v("offck", I32, rows, k)
    ops += [t.Load(v("xv", F32, rows, n), bufs["x"], on, None, 0.0), t.Load(v("xiv", index, rows, n), bufs["xi"], on, None, 0),
            t.Load(v("av", F32, rows, k), bufs["a"], ok, None, 0.0), t.Load(v("aiv", index, rows, k), bufs["ai"], ok, None, 0),
            t.TopK(v("tv", F32, rows, k), v("ti", index, rows, k), v("xv", F32, rows, n), v("xiv", index, rows, n), 1,
                   v("av", F32, rows, k), v("aiv", index, rows, k)),
            t.Store(bufs["ov"], ok, v("tv", F32, rows, k), None), t.Store(bufs["oi"], ok, v("ti", index, rows, k), None)]
    kernel = t.TileKernel("merge", (1,), tuple(bufs.values()), tuple(ops))
    ins = tuple(bufs[n_] for n_ in ("x", "xi", "a", "ai"))
    return verify_tile_program(t.TileProgram("merge", ins, (bufs["ov"], bufs["oi"]), (), (kernel,)))


def compiled(p: t.TileProgram) -> CpuProgram:
    module, abis = build_host_module(p)
    library, _ = compile_cached(str(module), {"test": "topk"})
    return CpuProgram(p, abis, library, threads=1)


def random_lists(rng, rows, n, k):
    """Candidates with ties, NaN, empty (index -1) lanes, and a sorted k-list made by the reference."""
    x = rng.integers(-3, 4, (rows, n)).astype(np.float32)
    x[rng.random((rows, n)) < 0.15] = np.nan
    x[rng.random((rows, n)) < 0.1] = -np.inf
    xi = np.broadcast_to(np.arange(100, 100 + n), (rows, n)).copy()
    xi[rng.random((rows, n)) < 0.2] = -1
    pool = rng.integers(-3, 4, (rows, n + 3)).astype(np.float32)
    pool[rng.random(pool.shape) < 0.15] = np.nan
    a, ai = topk_semantics.topk(pool, min(k, n + 3), axis=-1)
    if a.shape[-1] < k:  # pad with empty slots
        ea, eai = topk_semantics.empty((rows,), k - a.shape[-1], np.float32)
        a, ai = np.concatenate([a, ea], -1), np.concatenate([ai, eai], -1)
    ai[:, -1:][rng.random((rows, 1)) < 0.5] = -1  # some lists end in an empty slot
    a[ai < 0] = np.nan
    return x, xi, a.astype(np.float32), ai


def reference_merge(x, xi, a, ai):
    vals, idx = topk_semantics.merge(a, ai, x, xi)
    return np.where(idx < 0, np.nan, vals), np.where(idx < 0, -1, idx)


# rows of 32 candidates and more are screened in blocks first (codegen/host/topk.SCREEN); 8 rows and more (16
# with AVX-512) go in groups as the lanes of vectors (topk.row_lanes), the rows left over one at a time
@pytest.mark.parametrize("rows,n,k", [(5, 9, 3), (4, 1, 1), (3, 20, 8), (2, 3, 8), (6, 37, 3), (5, 64, 1), (4, 100, 8),
                                      (19, 37, 3), (16, 64, 2), (35, 100, 8), (40, 5, 1), (33, 1, 1)])
def test_topk_op_follows_the_definition_in_the_interpreter_and_on_the_cpu(rows, n, k):
    rng = np.random.default_rng(rows * 100 + n * 10 + k)
    x, xi, a, ai = random_lists(rng, rows, n, k)
    ev, ei = reference_merge(x, xi, a, ai)
    p = merge_program(rows, n, k)
    cpu = compiled(p)
    for run in (lambda args: run_tile_program(p, args), cpu):
        got_v, got_i = run([x, xi, a, ai])
        assert np.array_equal(got_i, ei)
        assert np.array_equal(got_v, ev, equal_nan=True)


def test_rows_of_a_topk_go_as_vector_lanes_where_there_are_enough():
    """The lanes path is taken (vector lists in the LLVM IR) for 19 rows, not for 5."""
    from redfuser.codegen.host.topk import row_lanes

    def lists_in_lanes(rows):
        p = merge_program(rows, 37, 3)
        (op,) = [op for op in p.kernels[0].body if isinstance(op, t.TopK)]
        module, _ = build_host_module(p)
        return row_lanes(op) > 0, ".lv0" in str(module)
    assert lists_in_lanes(19) == (True, True)
    assert lists_in_lanes(5) == (False, False)


def test_topk_op_with_i32_indices_and_no_acc_prints_and_verifies():
    p = merge_program(2, 4, 2, index=I32)
    text = str(p)
    assert "%tv: f32[2,2], %ti: i32[2,2] = topk %xv, %xiv axis 1 into (%av, %aiv)" in text
    x = np.array([[1, np.nan, 1, 5], [0, 0, 0, 0]], np.float32)
    xi = np.array([[3, 2, 1, 0], [-1, 7, -1, 6]], np.int32)
    a = np.full((2, 2), np.nan, np.float32)
    ai = np.full((2, 2), -1, np.int32)
    got_v, got_i = compiled(p)([x, xi, a, ai])
    assert got_i.tolist() == [[0, 1], [6, 7]] and got_v.tolist() == [[5, 1], [0, 0]]


@pytest.mark.parametrize("bad", ["k0", "dtype", "acc", "index"])
def test_verifier_rejects_broken_topk(bad):
    x, xi = v("x", F32, 4, 8), v("xi", I64, 4, 8)
    out, oi = v("o", F32, 4, 2), v("oi", I64, 4, 2)
    acc = None
    if bad == "k0":
        out, oi = v("o", F32, 4, 0), v("oi", I64, 4, 0)
    elif bad == "dtype":
        x, out = v("x", T.float16, 4, 8), v("o", T.float16, 4, 2)
    elif bad == "acc":
        acc = (v("x", F32, 4, 3), v("xi", I64, 4, 3))
    else:
        xi = v("xi", BOOL, 4, 8)
    ops = (t.Constant(x, 0.0), t.Constant(xi, 0))  # a wrongly typed acc reuses these names
    op = t.TopK(out, oi, x, xi, 1, *(acc or (None, None)))
    kernel = t.TileKernel("k", (1,), (), ops + (op,))
    with pytest.raises(VerifyError, match="topk"):
        verify_tile_program(t.TileProgram("p", (), (), (), (kernel,)))


# ---------------------------------------------------------------------------------------------
# rf.topk nests and MoE routing on the cpu backend
# ---------------------------------------------------------------------------------------------
@given(st.sampled_from([1, 2, 5, 8]), st.sampled_from([8, 13, 64, 256]), st.integers(0, 2**16),
       st.sampled_from([-1, 0]), st.sampled_from([np.float32, np.float16, np.int32, np.bool_]))
def test_topk_nests_equal_the_definition_exactly(k, n, seed, axis, dtype):
    rng = np.random.default_rng(seed)
    x = rng.integers(-4, 5, size=(6, n)).astype(np.float32)   # many ties on purpose
    if dtype in (np.float32, np.float16):
        x[rng.random(x.shape) < 0.1] = np.nan
        x[rng.random(x.shape) < 0.05] = -np.inf
    x = x.astype(dtype)
    if axis == 0:
        x = x.T.copy()

    def f(x):
        return rf.topk(x, k, axis=axis)

    for opts in ({}, {"block_m": 3, "block_k": 5}):
        got, ref = rf.kernel(f, backend="cpu", **opts)(x), f(x)
        assert got[0].dtype == ref[0].dtype and np.array_equal(got[1], ref[1])
        assert np.array_equal(got[0], ref[0], equal_nan=True)



@pytest.mark.parametrize("experts,k", [(8, 1), (8, 8), (64, 2), (100, 5), (256, 8)])
@pytest.mark.parametrize("block_n", [16, 64])
def test_moe_routing_on_the_cpu(experts, k, block_n):
    rng = np.random.default_rng(experts * k)
    x = (rng.standard_normal((37, experts)) * 3).astype(np.float32)
    x[1, : experts // 2] = -np.inf        # the first chunks masked
    x[2] = -np.inf                        # a fully masked row: NaN weights, indices 0..k-1
    x[3] = 0.5                            # all tied: the lowest indices win
    x[4, :k + 1] = 7.0                    # ties at the row's maximum, in the first chunk
    x[5, 0] = np.nan                      # NaN (in the first chunk) spreads to the row, like the reference
    route = routing(k)
    kern = rf.kernel(route, backend="cpu", block_n=block_n, block_m=8)
    (w, idx), (w_ref, idx_ref) = kern(x), route(x)
    assert np.array_equal(idx, idx_ref)
    assert_close(w, w_ref, np.float32, experts)
    tiled = kern.lower(x).stages["tile"]
    assert sum(isinstance(op, t.TopK) for kk in tiled.kernels for op in t.walk_ops(kk.body)) == 1
    # the softmax's m and l in one pass; the top-k; the renormalization's sum and divide in one kernel (a loop of
    # one reduction and its sweep: `fusion.cascade.swept_later`)
    assert len(tiled.kernels) == 3


def test_moe_routing_workload_matches_the_interpreter_tile_for_tile():
    x = (np.random.default_rng(9).standard_normal((11, 40)) * 3).astype(np.float32)
    kern = rf.kernel(routing(3), backend="cpu", block_m=4, block_n=16)
    tiled = kern.lower(x).stages["tile"]
    (w, idx), (w_tile, idx_tile) = kern(x), run_tile_program(tiled, [x])
    assert np.array_equal(idx, idx_tile)
    assert_close(w, w_tile, np.float32, 40)


def test_computed_candidates_are_computed_once():
    """A top-k compares a candidate and then keeps it: a candidate computed inline (routing's
    ``exp(x - m) / sum``) would be recomputed at each read, so the host plan keeps it in memory."""
    from redfuser.codegen.host.plan import plan_kernel
    from redfuser.ir.tile import nodes as t
    from redfuser.workloads import moe_routing

    x = np.random.default_rng(3).standard_normal((64, 64)).astype(np.float32)
    tile = rf.kernel(moe_routing, backend="cpu").lower(x).stages["tile"]
    checked = 0
    for k in tile.kernels:
        plan = plan_kernel(k)
        for op in t.walk_ops(k.body):
            if isinstance(op, t.TopK):
                assert op.x.name in plan.materialized
                checked += isinstance(plan.defs[op.x.name], t.Binary)   # the division, not a load
    assert checked
