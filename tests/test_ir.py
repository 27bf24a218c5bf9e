"""The Loop IR by hand: the verifier rejects broken programs, the printer's golden text, fused loops."""
from __future__ import annotations

import numpy as np
import pytest

import redfuser as rf

from redfuser.ir import (
    Axis,
    Binary,
    BinaryOp,
    Buffer,
    BufferType,
    Cast,
    Compute,
    Const,
    FusedLoop,
    Length,
    Load,
    OnlineState,
    Program,
    Reduce,
    ReduceOp,
    Select,
    SourceLoc,
    Unary,
    UnaryOp,
    VerifyError,
    format_program,
    run_program,
    verify_program,
)
from redfuser.ir import types as T
from redfuser.testing import assert_close

F32 = T.float32
R, N = 4, 8
X = Buffer("x", BufferType(F32, (R, N)))
I0, I1, R0 = Axis("i0", R), Axis("i1", N), Axis("r0", N)


def buf(name, *shape, dtype=F32):
    return Buffer(name, BufferType(dtype, shape))


def softmax_program() -> Program:
    """``m = max(x); e = exp(x - m); s = sum(e); out = e / s`` along the last axis of ``x[4,8]``."""
    m, e, s, out = buf("m", R), buf("e", R, N), buf("s", R), buf("out", R, N)
    loc_m = SourceLoc("/home/user/softmax.py", 7, "    m = rf.max(x, axis=-1, keepdims=True)")
    loc_e = SourceLoc("/home/user/softmax.py", 8, "    e = rf.exp(x - m)")
    return Program("softmax", (X,), (out,), (
        Reduce(m, (I0,), (R0,), ReduceOp.MAX, Load(X, (I0, R0)), loc=loc_m),
        Compute(e, (I0, I1), Unary(UnaryOp.EXP, Binary(BinaryOp.SUB, Load(X, (I0, I1)), Load(m, (I0,)), F32), F32),
                loc=loc_e),
        Reduce(s, (I0,), (R0,), ReduceOp.SUM, Load(e, (I0, R0)), loc=loc_e),
        Compute(out, (I0, I1), Binary(BinaryOp.DIV, Load(e, (I0, I1)), Load(s, (I0,)), F32)),
    ))


GOLDEN_SOFTMAX = """\
kernel softmax(x: f32[4,8]) -> (out: f32[4,8])
  # softmax.py:7  m = rf.max(x, axis=-1, keepdims=True)
  m: f32[4] = for i0<4: max over r0<8 of x[i0,r0]
  # softmax.py:8  e = rf.exp(x - m)
  e: f32[4,8] = for i0<4, i1<8: exp(x[i0,i1] - m[i0])
  s: f32[4] = for i0<4: sum over r0<8 of e[i0,r0]
  out: f32[4,8] = for i0<4, i1<8: e[i0,i1] / s[i0]"""


def test_printer_golden_softmax():
    assert format_program(softmax_program()) == GOLDEN_SOFTMAX
    assert str(softmax_program()) == GOLDEN_SOFTMAX


def test_printer_parenthesizes_by_precedence():
    a, b = Load(X, (I0, I1)), Const(2.0, F32)
    e = Binary(BinaryOp.MUL, Binary(BinaryOp.ADD, a, b, F32), Unary(UnaryOp.NEG, Binary(BinaryOp.SUB, a, b, F32), F32), F32)
    p = Program("p", (X,), (buf("y", R, N),), (Compute(buf("y", R, N), (I0, I1), e),))
    assert "(x[i0,i1] + 2.0) * -(x[i0,i1] - 2.0)" in str(p)
    c = Select(Binary(BinaryOp.LT, a, Const(float("-inf"), F32), T.bool_), Cast(a, T.float16), Const(0.5, T.float16),
               T.float16)
    q = Program("q", (X,), (buf("z", R, N, dtype=T.float16),), (Compute(buf("z", R, N, dtype=T.float16), (I0, I1), c),))
    assert "where(x[i0,i1] < -inf, f16(x[i0,i1]), 0.5)" in str(q)



@pytest.mark.parametrize("body", [
    lambda x, y: rf.where((x > 0.0) & (x < 1.0), x, 0.0),
    lambda x, y: (x < y) == (y > 0.0),
    lambda x, y: ((x > 0.0) | (y > 0.0)) & (x < y),
    lambda x, y: (x > 0.0) | ((y > 0.0) & (x < y)),
    lambda x, y: (x - y) * (x + 1.0) ** 2.0 > y,
], ids=["and-of-comparisons", "comparison-of-comparisons", "or-then-and", "and-under-or", "arithmetic"])
def test_printed_expressions_read_as_python_reads_them(body):
    """A body's printed expression (the fused stage, one expression per output), evaluated as Python with the arrays for ``x[i0,i1]``, is the body's
    value: Python's precedence (``&``/``|`` above comparisons, which chain) is the printer's."""
    x, y = (np.random.default_rng(s).standard_normal((3, 5)).astype(np.float32) for s in (0, 1))
    text = str(rf.kernel(body, backend="interpret").lower(x, y).stages["fused"]).splitlines()[-1]
    expr = text.split("i1<5: ", 1)[1].replace("[i0,i1]", "")
    value = eval(expr, {"x": x, "y": y, "where": np.where, "f32": np.float32})   # noqa: S307 (our own text)
    np.testing.assert_array_equal(value, body(x, y))

def test_softmax_program_verifies_and_interprets():
    p = verify_program(softmax_program())
    x = np.random.default_rng(0).standard_normal((R, N)).astype(np.float32)
    (out,) = run_program(p, [x])
    e = np.exp(x - x.max(-1, keepdims=True))
    assert_close(out, e / e.sum(-1, keepdims=True), np.float32, N)


def test_programs_are_values():
    assert softmax_program() == softmax_program() and hash(softmax_program()) == hash(softmax_program())
    moved = Program("softmax", (X,), softmax_program().outputs,
                    tuple(Compute(s.out, s.axes, s.value) if isinstance(s, Compute) else s for s in softmax_program().body))
    assert moved == softmax_program()  # source locations do not take part in equality


# ---------------------------------------------------------------------------------------------
# the verifier rejects broken programs
# ---------------------------------------------------------------------------------------------
Y = buf("y", R, N)


def one(stmt, inputs=(X,), outputs=None) -> Program:
    return Program("bad", inputs, outputs if outputs is not None else (stmt.out,), (stmt,))


BAD = {
    "undefined buffer": (one(Compute(Y, (I0, I1), Load(buf("ghost", R, N), (I0, I1)))), "ghost"),
    "wrong index arity": (one(Compute(Y, (I0, I1), Load(X, (I0,)))), "1 indices for 2 dims"),
    "axis extent mismatch": (one(Compute(buf("y", R, 5), (I0, Axis("i1", 5)), Load(X, (I0, Axis("i1", 5))))),
                             "runs to 5"),
    "loops do not cover the output": (one(Compute(Y, (I0,), Load(X, (I0, 0)))), "do not cover"),
    "dtype mismatch": (one(Compute(buf("y", R, N, dtype=T.float16), (I0, I1), Load(X, (I0, I1)))),
                       "value has dtype f32"),
    "comparison not bool": (one(Compute(Y, (I0, I1), Binary(BinaryOp.LT, Load(X, (I0, I1)), Const(0.0, F32), F32))),
                            "must give bool"),
    "where condition not bool": (one(Compute(Y, (I0, I1), Select(Load(X, (I0, I1)), Const(1.0, F32),
                                                                  Const(0.0, F32), F32))), "condition must be bool"),
    "out-of-bounds fixed index": (one(Compute(buf("y", R), (I0,), Load(X, (I0, N)))), "outside [0, 8)"),
    "negative fixed index": (one(Compute(buf("y", R), (I0,), Load(X, (I0, -1)))), "outside [0, 8)"),
    "axis not in scope": (one(Compute(buf("y", R), (I0,), Load(X, (I0, R0)))), "not in scope"),
    "repeated axis names": (one(Reduce(buf("y", R), (I0,), (Axis("i0", N),), ReduceOp.SUM, Load(X, (I0, I0)))),
                            "repeat"),
    "written twice": (Program("bad", (X,), (Y,), (Compute(Y, (I0, I1), Load(X, (I0, I1))),
                                                   Compute(Y, (I0, I1), Load(X, (I0, I1))))), "written twice"),
    "input overwritten": (Program("bad", (X,), (X,), (Compute(X, (I0, I1), Const(0.0, F32)),)), "written twice"),
    "output never computed": (Program("bad", (X,), (Y,), ()), "never computed"),
    "read before written": (Program("bad", (X,), (Y,), (Compute(buf("z", R, N), (I0, I1), Load(Y, (I0, I1))),
                                                        Compute(Y, (I0, I1), Load(X, (I0, I1))))), "before it is defined"),
    "buffer read with another type": (one(Compute(Y, (I0, I1), Cast(Load(buf("x", R, N, dtype=T.float16), (I0, I1)),
                                                                     F32))), "different type"),
    # an f32 operand in 16-bit arithmetic: the interpreter computes it as typed and rounds (the shift law's
    # carry of an f16 variance was typed so; its f32 sums were rounded to f16 at every chunk)
    "arithmetic narrower than an operand": (
        one(Compute(buf("y", R, N, dtype=T.float16), (I0, I1),
                    Binary(BinaryOp.MUL, Const(2.0, T.float16), Load(X, (I0, I1)), T.float16))), "narrows an operand"),
    # a mean's count (`Length`) is f32 or f64, as numpy divides a 16-bit sum in f32
    "a length as a 16-bit number": (
        one(Compute(buf("y", R, N, dtype=T.float16), (I0, I1), Length((N,), T.float16))), "a length is an integer"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_verifier_rejects(name):
    program, message = BAD[name]
    with pytest.raises(VerifyError, match="internal error") as info:
        verify_program(program, pass_name="handmade")
    assert message in str(info.value), str(info.value)
    assert "handmade" in str(info.value)


# ---------------------------------------------------------------------------------------------
# fused loops: a hand-built online softmax (attention's cascade) against numpy
# ---------------------------------------------------------------------------------------------
def online_attention(rows: int, keys: int, dim: int) -> Program:
    """``out = softmax(s) @ v`` over `keys` as one fused loop with states m, l, o, divided by l at the end.

    Follows `OnlineState`'s rules: a running max is read inside exponentials as
    ``where(m == -inf, 0, m)``, so chunks seen while a row is still all -inf add 0.
    """
    s, v = buf("s", rows, keys), buf("v", keys, dim)
    i, d, k = Axis("i0", rows), Axis("i1", dim), Axis("k", keys)
    m, m_prev = buf("m", rows), buf("m_prev", rows)
    l, l_prev = buf("l", rows), buf("l_prev", rows)
    o, o_prev = buf("o", rows, dim), buf("o_prev", rows, dim)
    neg_inf = Const(float("-inf"), F32)

    def safe(e):
        return Select(Binary(BinaryOp.EQ, e, neg_inf, T.bool_), Const(0.0, F32), e, F32)

    def exp_minus(a, b):
        return Unary(UnaryOp.EXP, Binary(BinaryOp.SUB, a, b, F32), F32)

    p = exp_minus(Load(s, (i, k)), safe(Load(m, (i,))))
    rescale = exp_minus(Load(m_prev, (i,)), safe(Load(m, (i,))))
    states = (
        OnlineState(m, m_prev, (i,), ReduceOp.MAX, Load(s, (i, k))),
        OnlineState(l, l_prev, (i,), ReduceOp.SUM, p, rescale),
        OnlineState(o, o_prev, (i, d), ReduceOp.SUM, Binary(BinaryOp.MUL, p, Load(v, (k, d)), F32), rescale),
    )
    out = buf("out", rows, dim)
    return Program("online_attention", (s, v), (out,), (
        FusedLoop(k, (), states),
        Compute(out, (i, d), Binary(BinaryOp.DIV, Load(o, (i, d)), Load(l, (i,)), F32)),
    ))


def test_verifier_error_shows_the_program_around_the_bad_statement():
    good = softmax_program()
    s16 = buf("s", R, dtype=T.float16)
    bad = Program(good.name, good.inputs, good.outputs,
                  good.body[:2] + (Reduce(s16, (I0,), (R0,), ReduceOp.SUM, Load(good.body[1].out, (I0, R0))),)
                  + good.body[3:])
    with pytest.raises(VerifyError) as info:
        verify_program(bad, pass_name="handmade")
    lines = str(info.value).splitlines()
    assert lines[0] == "internal error after pass handmade: value has dtype f32 but s is f16"
    assert [line.split("|", 1)[1] for line in lines[1:]] == [
        " ...",
        "   m: f32[4] = for i0<4: max over r0<8 of x[i0,r0]",
        "   # softmax.py:8  e = rf.exp(x - m)",
        "   e: f32[4,8] = for i0<4, i1<8: exp(x[i0,i1] - m[i0])",
        "   s: f16[4] = for i0<4: sum over r0<8 of e[i0,r0]",
        "   out: f32[4,8] = for i0<4, i1<8: e[i0,i1] / s[i0]"]
    assert [line.split("|")[0].split() for line in lines[2:]] == [["3"], ["4"], ["5"], [">>", "6"], ["7"]]


def test_verifier_error_keeps_its_message_when_the_program_cannot_be_printed():
    good = softmax_program()
    bad = Program(good.name, good.inputs, good.outputs,
                  (Compute(buf("m", R, dtype=T.float16), (I0,), Load(X, (I0, I1))), "not a statement"))
    with pytest.raises(VerifyError, match="value has dtype f32 but m is f16") as info:
        verify_program(bad, pass_name="handmade")
    assert ">>" not in str(info.value)


def test_verifier_error_marks_the_bad_state_of_a_fused_loop():
    good = online_attention(8, 16, 4)
    loop = good.body[0]
    o = loop.states[2]
    bad_o = OnlineState(o.acc, o.prev, o.axes, o.op, Cast(o.term, T.float64), o.rescale)
    bad = Program(good.name, good.inputs, good.outputs,
                  (FusedLoop(loop.axis, loop.locals, loop.states[:2] + (bad_o,)),) + good.body[1:])
    with pytest.raises(VerifyError, match="term has dtype f64") as info:
        verify_program(bad, pass_name="handmade")
    marked = [line for line in str(info.value).splitlines() if ">>" in line]
    assert len(marked) == 1 and "|     o: f32[8,4] = for i0<8, i1<4: o_prev[i0,i1]" in marked[0]
    assert "m, l, o = fused loop over k<16, chunk by chunk:" in str(info.value)


def reference_attention(s, v):
    with np.errstate(all="ignore"):
        m = s.max(-1, keepdims=True)
        p = np.exp(s - m)
        return (p / p.sum(-1, keepdims=True)) @ v


def scores(rows, keys, seed=0):
    rng = np.random.default_rng(seed)
    s = (rng.standard_normal((rows, keys)) * 3).astype(np.float32)
    s[1, :] = -np.inf  # a fully masked row: NaN, like the reference
    s[2, : keys // 2 + 1] = -np.inf  # the first chunks masked
    s[3, :-1] = -np.inf  # only the last key survives
    s[4, 0] = 80.0  # a large score in the first chunk
    s[5, -1] = 80.0  # a large score in the last chunk (rescales everything before it)
    s[6, ::2] = -np.inf
    return s


@pytest.mark.parametrize("chunk", [1, 3, 4, 7, 64])
def test_fused_online_attention_matches_numpy(chunk):
    rows, keys, dim = 8, 21, 5
    program = verify_program(online_attention(rows, keys, dim))
    s = scores(rows, keys)
    v = np.random.default_rng(1).standard_normal((keys, dim)).astype(np.float32)
    (out,) = run_program(program, [s, v], chunk=chunk)
    expected = reference_attention(s, v)
    assert np.isnan(expected[1]).all()
    assert_close(out, expected, np.float32, keys, f"chunk {chunk}")


def test_fused_loop_prints_its_states():
    text = str(online_attention(2, 6, 3))
    assert "m, l, o = fused loop over k<6, chunk by chunk:" in text
    assert "max over k of s[i0,k]" in text
    assert "out: f32[2,3] = for i0<2, i1<3: o[i0,i1] / l[i0]" in text


def test_verifier_rejects_a_fused_state_read_before_its_turn():
    good = online_attention(2, 6, 3)
    loop = good.body[0]
    m_state, l_state, o_state = loop.states
    # l reads o, which is updated after it in cascade order
    bad_l = OnlineState(l_state.acc, l_state.prev, l_state.axes, ReduceOp.SUM,
                        Load(o_state.acc, (Axis("i0", 2), 0)), l_state.rescale)
    bad = Program(good.name, good.inputs, good.outputs,
                  (FusedLoop(loop.axis, (), (m_state, bad_l, o_state)),) + good.body[1:])
    with pytest.raises(VerifyError, match="before it is defined"):
        verify_program(bad)
