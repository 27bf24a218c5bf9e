"""Loop-carried tiles updated in place by the host code (`codegen/host/stmts.py`, `plan.py`): a dot whose
accumulator is computed elementwise from the carried value writes it over that value and accumulates there, a
yield computed elementwise from the value it replaces is written straight into its slot, and a dot without an
accumulator starts its register blocks at zero. Each is checked for what it removes from the code and, on
hand-written tile programs, for what it must refuse: a read of the carried value at other indices (a view),
a read of another carried value, a reader outside the accumulator's computation. Results are compared with
the Tile IR interpreter exactly (the arithmetic is the same operations in the same order)."""
from __future__ import annotations

import re

import numpy as np
import pytest

import redfuser as rf
from redfuser.codegen.host import build_host_module
from redfuser.codegen.host.plan import plan_kernel
from redfuser.ir import BinaryOp, Buffer, BufferType, ReduceOp
from redfuser.ir import types as T
from redfuser.ir.tile import nodes as t
from redfuser.ir.tile.interpreter import run_tile_program
from redfuser.ir.tile.verifier import verify_tile_program
from redfuser.runtime.cpu_jit import CpuProgram, compile_cached
from redfuser.testing import assert_close
from redfuser.workloads import attention, layer_norm_gemm

F32, I32 = T.float32, T.int32
R, C, TRIPS = 16, 16, 3


def v(name, dtype, *shape):
    return t.Value(name, t.TileType(dtype, tuple(shape)))


def _offsets(prefix: str, rows: int, cols: int) -> tuple[list, t.Value]:
    """Ops computing the row-major offsets of a whole ``[rows, cols]`` buffer."""
    off = v(f"{prefix}off", I32, rows, cols)
    ops = [t.Arange(v(f"{prefix}r", I32, rows)), t.Arange(v(f"{prefix}c", I32, cols)),
           t.Constant(v(f"{prefix}w", I32, rows), cols),
           t.Binary(v(f"{prefix}ro", I32, rows), BinaryOp.MUL, v(f"{prefix}r", I32, rows), v(f"{prefix}w", I32, rows)),
           t.ExpandDims(v(f"{prefix}re", I32, rows, 1), v(f"{prefix}ro", I32, rows), 1),
           t.Broadcast(v(f"{prefix}rb", I32, rows, cols), v(f"{prefix}re", I32, rows, 1)),
           t.ExpandDims(v(f"{prefix}ce", I32, 1, cols), v(f"{prefix}c", I32, cols), 0),
           t.Broadcast(v(f"{prefix}cb", I32, rows, cols), v(f"{prefix}ce", I32, 1, cols)),
           t.Binary(off, BinaryOp.ADD, v(f"{prefix}rb", I32, rows, cols), v(f"{prefix}cb", I32, rows, cols))]
    return ops, off


def _loop_program(body_ops, yields, args, extra_outs=()) -> t.TileProgram:
    """One kernel: ``acc = x``, ``b = y`` (both ``[R, C]``, square), a loop of `TRIPS` trips over
    `body_ops` carrying `args` (``acc`` and ``b``, initially ``x`` and ``y``), then ``out = acc`` and ``out2 = b``.
    The body may read ``w`` (``[C, C]``) as ``wv``."""
    x, y = Buffer("x", BufferType(F32, (R, C))), Buffer("y", BufferType(F32, (R, C)))
    w = Buffer("w", BufferType(F32, (C, C)))
    out, out2 = Buffer("out", BufferType(F32, (R, C))), Buffer("out2", BufferType(F32, (R, C)))
    ops, off = _offsets("a", R, C)
    wops, woff = _offsets("w", C, C)
    ops += wops
    ops += [t.Load(v("x0", F32, R, C), x, off, None, 0.0), t.Load(v("y0", F32, R, C), y, off, None, 0.0),
            t.Load(v("wv", F32, C, C), w, woff, None, 0.0)]
    results = (v("acc_out", F32, R, C), v("b_out", F32, R, C))
    ops.append(t.For(results, 0, TRIPS, 1, (v("x0", F32, R, C), v("y0", F32, R, C)),
                     t.Region(v("i", I32), args, tuple(body_ops), yields)))
    ops += [t.Store(out, off, results[0], None), t.Store(out2, off, results[1], None)]
    kernel = t.TileKernel("loop", (1,), (x, y, w, out, out2), tuple(ops))
    return verify_tile_program(t.TileProgram("loop", (x, y, w), (out, out2), (), (kernel,)))


ACC, B = v("acc", F32, R, C), v("b", F32, R, C)


def _check(p: t.TileProgram) -> tuple[frozenset[str], str]:
    """Runs `p` on the host and in the interpreter (equal exactly); returns the plan's in-place yields and the
    kernel's LLVM IR."""
    module, abis = build_host_module(p)
    library, _ = compile_cached(str(module), {"test": "in_place"})
    rng = np.random.default_rng(3)
    ins = [rng.integers(-4, 5, (R, C)).astype(np.float32), rng.integers(-4, 5, (R, C)).astype(np.float32),
           rng.integers(-2, 3, (C, C)).astype(np.float32)]
    got = CpuProgram(p, abis, library, threads=1)(ins)
    want = run_tile_program(p, ins)
    for g, e in zip(got, want):
        np.testing.assert_array_equal(g, e)
    return plan_kernel(p.kernels[0]).in_place_yields, str(module)


def test_an_elementwise_update_of_a_carried_tile_is_computed_into_its_slot():
    """``acc <- acc * 2 + b`` (``b`` carried unchanged) reads ``acc`` only at the element it writes: no tile
    of its own, no copy."""
    body = [t.Constant(v("two", F32, R, C), 2.0), t.Binary(v("d", F32, R, C), BinaryOp.MUL, ACC, v("two", F32, R, C)),
            t.Binary(v("acc1", F32, R, C), BinaryOp.ADD, v("d", F32, R, C), B)]
    lazy, text = _check(_loop_program(body, (v("acc1", F32, R, C), B), (ACC, B)))
    assert lazy == {"acc1"}
    assert '"acc1.tile"' not in text


def test_an_update_reading_its_carried_tile_through_a_view_keeps_its_own_tile():
    """``acc <- acc + transpose(acc) + rowsum(acc)`` reads elements of ``acc`` the update overwrites first:
    not in place (computed into ``acc``'s slot, the result differs from the interpreter's)."""
    body = [t.Reduce(v("rs", F32, R), ACC, 1, ReduceOp.SUM),   # materialized: a reader outside the tree is fine
            t.ExpandDims(v("rse", F32, R, 1), v("rs", F32, R), 1),
            t.Broadcast(v("rsb", F32, R, C), v("rse", F32, R, 1)),
            t.Permute(v("tr", F32, C, R), ACC, (1, 0)),
            t.Binary(v("d", F32, R, C), BinaryOp.ADD, ACC, v("tr", F32, C, R)),
            t.Binary(v("acc1", F32, R, C), BinaryOp.ADD, v("d", F32, R, C), v("rsb", F32, R, C))]
    lazy, _ = _check(_loop_program(body, (v("acc1", F32, R, C), B), (ACC, B)))
    assert lazy == set()


def test_an_update_reading_another_carried_tile_keeps_its_own_tile():
    """``acc <- acc + b`` and ``b <- b + acc``: each reads the other's old value, which the other's yield
    overwrites: neither in place."""
    body = [t.Binary(v("acc1", F32, R, C), BinaryOp.ADD, ACC, B), t.Binary(v("b1", F32, R, C), BinaryOp.ADD, B, ACC)]
    lazy, _ = _check(_loop_program(body, (v("acc1", F32, R, C), v("b1", F32, R, C)), (ACC, B)))
    assert lazy == set()


def _dot_body(extra_reader: bool):
    """``acc <- b @ w + acc * 0.5`` (a rescaled accumulator, `b` unchanged) or, with `extra_reader`, also
    ``b <- b + acc`` (``acc`` read outside the accumulator's computation)."""
    half = v("half", F32, R, C)
    ops = [t.Constant(half, 0.5), t.Binary(v("scaled", F32, R, C), BinaryOp.MUL, ACC, half),
           t.Dot(v("acc1", F32, R, C), B, v("wv", F32, C, C), v("scaled", F32, R, C))]
    if extra_reader:
        ops.append(t.Binary(v("b1", F32, R, C), BinaryOp.ADD, B, ACC))
        return ops, (v("acc1", F32, R, C), v("b1", F32, R, C))
    return ops, (v("acc1", F32, R, C), B)


@pytest.mark.parametrize("extra_reader", [False, True])
def test_a_dot_accumulates_into_its_carried_tile_unless_something_else_reads_it(extra_reader):
    ops, yields = _dot_body(extra_reader)
    _, text = _check(_loop_program(ops, yields, (ACC, B)))
    assert ('"acc1.tile"' in text) == extra_reader
    assert ("acc1.cp" in text) == extra_reader


def _llvm(kernel, *args) -> str:
    return str(kernel.lower(*args).stages["llvm"])


def test_fused_attention_and_layer_norm_gemm_update_their_states_in_place():
    """Attention's ``P @ V`` accumulates into the carried output tile (its rescale written over it), ``S``'s
    dot starts from zero registers; layer norm + GEMM's dot does the same and its running column sum of ``w``
    is computed into its slot. Results within the tolerance rule of the numpy bodies."""
    rng = np.random.default_rng(5)
    q, k, vv = (rng.standard_normal((1, 2, 256, 64)).astype(np.float32) for _ in range(3))
    kern = rf.kernel(attention, backend="cpu")
    text = _llvm(kern, q, k, vv)
    assert not re.search(r'"out_acc_dot\.(cp|tile)', text) and "s_matmul_dot.init" not in text
    want = attention(*(a.astype(np.float64) for a in (q, k, vv))).astype(np.float32)
    assert_close(kern(q, k, vv), want, np.float32, 256)
    x = (rng.standard_normal((256, 1536)) * 2 + 3).astype(np.float32)    # three chunks of 512 (`GEMM_TILE`)
    w = rng.standard_normal((1536, 256)).astype(np.float32)
    kern = rf.kernel(layer_norm_gemm, backend="cpu")
    text = _llvm(kern, x, w)
    assert not re.search(r'"out_acc1_dot\.(cp|tile)', text)
    assert '"out_acc_acc.tile"' not in text
    want = layer_norm_gemm(x.astype(np.float64), w.astype(np.float64)).astype(np.float32)
    assert_close(kern(x, w), want, np.float32, 1536)
