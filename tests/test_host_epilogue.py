"""A dot's elementwise epilogue computed on the micro-kernel's registers (`codegen/host/epilogue.py`): where
the dot's tile is read by one elementwise value kept in memory (attention's ``(q @ k^T) * scale``), the
micro-kernel stores that value's vectors and the dot's tile is never stored. Hand-written tile programs, run
on the host and in the Tile IR interpreter (equal exactly: the same operations on the same operands), check
what it takes (constants, per-row values computed before the dot, the vector-safe float ops) and what it must
refuse (a per-row value computed after the dot, another reader of the dot's tile, an op without a vector
form). Whether it applied shows in the module: the value then has no loop nest of its own."""
from __future__ import annotations

import re

import numpy as np
import pytest

import redfuser as rf
from redfuser.codegen.host import build_host_module, stmts
from redfuser.ir import BinaryOp, Buffer, BufferType, ReduceOp, UnaryOp
from redfuser.ir import types as T
from redfuser.ir.tile import nodes as t
from redfuser.ir.tile.interpreter import run_tile_program
from redfuser.ir.tile.verifier import verify_tile_program
from redfuser.runtime.cpu_jit import CpuProgram, compile_cached
from redfuser.testing import assert_close
from redfuser.workloads import attention, softcap_attention

F32, I32 = T.float32, T.int32
R, K, C = 16, 8, 32     # C: whole vectors of 16, 8 or 4 lanes, so the micro-kernel takes the dot


def v(name, *shape, dtype=F32):
    return t.Value(name, t.TileType(dtype, tuple(shape)))


def _offsets(prefix: str, rows: int, cols: int) -> tuple[list, t.Value]:
    off = v(f"{prefix}off", rows, cols, dtype=I32)
    ops = [t.Arange(v(f"{prefix}r", rows, dtype=I32)), t.Arange(v(f"{prefix}c", cols, dtype=I32)),
           t.Constant(v(f"{prefix}w", rows, dtype=I32), cols),
           t.Binary(v(f"{prefix}ro", rows, dtype=I32), BinaryOp.MUL, v(f"{prefix}r", rows, dtype=I32),
                    v(f"{prefix}w", rows, dtype=I32)),
           t.ExpandDims(v(f"{prefix}re", rows, 1, dtype=I32), v(f"{prefix}ro", rows, dtype=I32), 1),
           t.Broadcast(v(f"{prefix}rb", rows, cols, dtype=I32), v(f"{prefix}re", rows, 1, dtype=I32)),
           t.ExpandDims(v(f"{prefix}ce", 1, cols, dtype=I32), v(f"{prefix}c", cols, dtype=I32), 0),
           t.Broadcast(v(f"{prefix}cb", rows, cols, dtype=I32), v(f"{prefix}ce", 1, cols, dtype=I32)),
           t.Binary(off, BinaryOp.ADD, v(f"{prefix}rb", rows, cols, dtype=I32), v(f"{prefix}cb", rows, cols, dtype=I32))]
    return ops, off


D, E = v("d", R, C), v("e", R, C)


def _row_sum() -> list:
    """``rs``: the row sums of ``a`` broadcast to ``[R, C]`` (``rsb``)."""
    return [t.Reduce(v("rs", R), v("av", R, K), 1, ReduceOp.SUM), t.ExpandDims(v("rse", R, 1), v("rs", R), 1),
            t.Broadcast(v("rsb", R, C), v("rse", R, 1))]


def _program(before: list, epilogue: list, store_d: bool = False) -> t.TileProgram:
    """``d = a @ b`` after `before`, then `epilogue` computing ``e`` (``[R, C]``), stored with its row maxima
    (two readers: ``e`` is kept in memory); with `store_d` the dot's tile is stored too."""
    a, b = Buffer("a", BufferType(F32, (R, K))), Buffer("b", BufferType(F32, (K, C)))
    out, out2 = Buffer("out", BufferType(F32, (R, C))), Buffer("out2", BufferType(F32, (R,)))
    outs = (out, out2) + ((Buffer("out3", BufferType(F32, (R, C))),) if store_d else ())
    ops, off = _offsets("o", R, C)
    aops, aoff = _offsets("a", R, K)
    bops, boff = _offsets("b", K, C)
    ops += aops + bops      # (``or``, the rows' arange, offsets ``out2``)
    ops += [t.Load(v("av", R, K), a, aoff, None, 0.0), t.Load(v("bv", K, C), b, boff, None, 0.0)]
    ops += before
    ops += [t.Dot(D, v("av", R, K), v("bv", K, C), None)]
    ops += epilogue
    ops += [t.Store(out, off, E, None), t.Reduce(v("mx", R), E, 1, ReduceOp.MAX),
            t.Store(out2, v("or", R, dtype=I32), v("mx", R), None)]
    if store_d:
        ops.append(t.Store(outs[2], off, D, None))
    kernel = t.TileKernel("epi", (1,), (a, b) + outs, tuple(ops))
    return verify_tile_program(t.TileProgram("epi", (a, b), outs, (), (kernel,)))


def _run(p: t.TileProgram) -> str:
    """Runs `p` on the host and in the interpreter (equal exactly); returns its LLVM IR."""
    module, abis = build_host_module(p)
    library, _ = compile_cached(str(module), {"test": "epilogue"})
    rng = np.random.default_rng(4)
    # small integers: every product and sum exact, so fused and separate multiply-adds agree
    ins = [rng.integers(-4, 5, (R, K)).astype(np.float32), rng.integers(-4, 5, (K, C)).astype(np.float32)]
    got = CpuProgram(p, abis, library, threads=1)(ins)
    want = run_tile_program(p, ins)
    for g, e in zip(got, want):
        np.testing.assert_array_equal(g, e)
    return str(module)


def _own_pass(text: str, name: str = "e") -> bool:
    """Whether the module computes `name` in a loop nest of its own (its materialization: ``e.0``, ``e.1``)."""
    return re.search(rf'^"?{re.escape(name)}\.0\.header"?:', text, re.M) is not None


def _constant(name: str, value: float) -> t.Op:
    return t.Constant(v(name, R, C), value)


def test_a_scale_by_a_constant_is_computed_in_the_micro_kernel():
    epilogue = [_constant("c", 0.125), t.Binary(E, BinaryOp.MUL, D, v("c", R, C))]
    assert not _own_pass(_run(_program([], epilogue)))


def test_a_chain_of_vector_ops_with_a_per_row_value_computed_before_the_dot():
    """``e = max(-(d - rs), |d|) / 3``: negation, abs, maximum, division and a row value from a slot."""
    epilogue = [t.Binary(v("t1", R, C), BinaryOp.SUB, D, v("rsb", R, C)), t.Unary(v("t2", R, C), UnaryOp.NEG, v("t1", R, C)),
                t.Unary(v("t3", R, C), UnaryOp.ABS, D), t.Binary(v("t4", R, C), BinaryOp.MAX, v("t2", R, C), v("t3", R, C)),
                _constant("three", 3.0), t.Binary(E, BinaryOp.DIV, v("t4", R, C), v("three", R, C))]
    assert not _own_pass(_run(_program(_row_sum(), epilogue)))


def test_a_per_row_value_computed_after_the_dot_is_not_available_to_it():
    epilogue = _row_sum() + [t.Binary(E, BinaryOp.SUB, D, v("rsb", R, C))]
    assert _own_pass(_run(_program([], epilogue)))


def test_another_reader_of_the_dot_keeps_the_dot_stored():
    epilogue = [_constant("c", 0.125), t.Binary(E, BinaryOp.MUL, D, v("c", R, C))]
    assert _own_pass(_run(_program([], epilogue, store_d=True)))


def test_an_op_without_a_vector_form_keeps_the_pass():
    epilogue = [t.Unary(v("t1", R, C), UnaryOp.ABS, D), t.Unary(E, UnaryOp.SQRT, v("t1", R, C))]
    assert _own_pass(_run(_program([], epilogue)))


def _nests(text: str) -> set[str]:
    return set(re.findall(r'^"?([\w]+)\.0\.header"?:', text, re.M))


@pytest.mark.parametrize("body,taken", [(attention, True), (softcap_attention, False)])
def test_attention_bodies_equal_numpy_with_the_epilogue(body, taken, monkeypatch):
    """Attention's scale ``s * scale`` is computed in the micro-kernel: against the same module built without
    epilogues, one loop nest fewer. The softcap's ``50 * tanh(s * scale / 50)`` is not (``tanh`` has no
    vector form)."""
    rng = np.random.default_rng(6)
    q, k, vv = (rng.standard_normal((1, 2, 256, 64)).astype(np.float32) for _ in range(3))
    kern = rf.kernel(body, backend="cpu")
    nests = _nests(str(kern.lower(q, k, vv).stages["llvm"]))
    monkeypatch.setattr(stmts, "dot_epilogue", lambda em, op: None)
    without = _nests(str(rf.kernel(body, backend="cpu").lower(q, k, vv).stages["llvm"]))
    assert len(without - nests) == taken and nests <= without
    monkeypatch.undo()
    want = body(*(a.astype(np.float64) for a in (q, k, vv))).astype(np.float32)
    assert_close(kern(q, k, vv), want, np.float32, 256)
