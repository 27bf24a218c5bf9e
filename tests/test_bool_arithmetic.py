"""Arithmetic on bools means what numpy says on every backend: ``+`` and ``maximum`` are or, ``*`` and
``minimum`` are and, ``sum`` counts, ``@`` is an or of ands, ``abs`` is the identity.

Before the tracer wrote these as logical ops, the ``cpu`` backend computed LLVM's 1-bit add and multiply
(``a + b`` and ``a * b`` were xor) and ``simulate`` failed its verifier; a sliding-window mask written the
numpy way, ``(j <= i) * (j > i - 8)``, gave attention off by 2.2 with no error.
"""
from __future__ import annotations

import numpy as np
import pytest

import redfuser as rf
from redfuser.ir import Binary, BinaryOp, Buffer, BufferType, Compute, Load, Program, VerifyError, verify_program
from redfuser.ir import types as T
from redfuser.ir.loop.expr import Axis
from redfuser.testing import assert_close

BACKENDS = ("interpret", "cpu", "simulate")
A = np.array([True, False, True, False, True, True, False])
B = np.array([True, True, False, False, False, True, True])

BODIES = {
    "multiply": lambda a, b: a * b,
    "add": lambda a, b: a + b,
    "sum_of_add": lambda a, b: rf.sum(a + b),
    "sum_of_multiply": lambda a, b: rf.sum(a * b, axis=0, keepdims=True),
    "outer_product": lambda a, b: a[:, None] @ b[None, :],
    "inner_product": lambda a, b: a @ b,
    "plus_true": lambda a, b: a + True,
    "times_false": lambda a, b: a * False,
    "abs": lambda a, b: rf.abs(a),
    "maximum": lambda a, b: rf.maximum(a, b),
    "minimum": lambda a, b: rf.minimum(a, b),
    "xor": lambda a, b: a ^ b,
    "logical_xor": lambda a, b: rf.logical_xor(a, b),
    "invert": lambda a, b: ~a,
    "mixed_with_int": lambda a, b: a + b * 3,
    "mixed_with_float": lambda a, b: (a + b) * 0.5 + a * b,
    "max_of_products": lambda a, b: rf.max(a[:, None] * b[None, :], axis=0),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(BODIES))
def test_bool_arithmetic_is_numpys(name, backend):
    body = BODIES[name]
    expected = body(A, B)
    got = rf.kernel(body, backend=backend)(A, B)
    assert np.asarray(got).dtype == np.asarray(expected).dtype
    np.testing.assert_array_equal(got, expected)


def _sliding_window_attention(q, k, v):
    s = (q @ k.mT) * 0.125
    i = rf.arange(s.shape[-2])[:, None]
    j = rf.arange(s.shape[-1])[None, :]
    keep = (j <= i) * (j > i - 8)
    s = rf.where(keep, s, -rf.inf)
    m = rf.max(s, axis=-1, keepdims=True)
    p = rf.exp(s - m)
    return (p / rf.sum(p, axis=-1, keepdims=True)) @ v


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_sliding_window_mask_written_with_multiply(backend):
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 37, 16)).astype(np.float32) for _ in range(3))
    expected = _sliding_window_attention(q, k, v)
    got = rf.kernel(_sliding_window_attention, backend=backend)(q, k, v)
    assert_close(got, expected, np.float32, 37)


@pytest.mark.parametrize("op", [BinaryOp.ADD, BinaryOp.MUL, BinaryOp.SUB, BinaryOp.MAX])
def test_the_loop_ir_has_no_arithmetic_on_bools(op):
    """A pass that wrote a bool ``+`` would hand backends a meaning they disagree on: the verifier refuses it."""
    a = Buffer("a", BufferType(T.bool_, (4,)))
    out = Buffer("out", BufferType(T.bool_, (4,)))
    i = Axis("i0", 4)
    value = Binary(op, Load(a, (i,)), Load(a, (i,)), T.bool_)
    program = Program("p", (a,), (out,), (Compute(out, (i,), value),))
    with pytest.raises(VerifyError, match="on bool"):
        verify_program(program, pass_name="test")
