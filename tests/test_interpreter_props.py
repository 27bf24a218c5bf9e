"""Properties of trace + interpret against the numpy body, over random shapes, dtypes and programs.

Most properties run the traced program as is (``fuse=False``): they test the
tracer and the interpreter, the oracle everything else is checked against. The
``default_pipeline`` properties run what a user gets (the fusion engine on).

The number of examples comes from the hypothesis profile (tests/conftest.py):
``HYPOTHESIS_PROFILE=fuzz`` turns this file into a long fuzzing run.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, note
from hypothesis import strategies as st

import redfuser as rf
from redfuser.ir import Program, verify_program
from redfuser.testing import assert_close
from helpers import as_tuple
from redfuser.testing.strategies import FLOAT_DTYPES, arrays, broadcast_shape_pairs, programs, shapes

dtypes = st.sampled_from(FLOAT_DTYPES)


def run_both(body, *args, fuse=False):
    """(interpreted kernel outputs, reference outputs), checking the inputs come back untouched."""
    copies = [a.copy() for a in args]
    with np.errstate(all="ignore"):
        expected = as_tuple(body(*args))
    kernel = rf.kernel(body, backend="interpret", fuse=fuse)
    actual = as_tuple(kernel(*args))
    for a, c in zip(args, copies):
        assert a.dtype == c.dtype and a.shape == c.shape and a.tobytes() == c.tobytes(), "an input was modified"
    for stage in kernel.lower(*args).stages.values():
        if isinstance(stage, Program):
            verify_program(stage)
    return actual, expected


ELEMENTWISE = [
    lambda a, b: a + b, lambda a, b: a - b, lambda a, b: a * b, lambda a, b: a / (rf.abs(b) + 1.0),
    lambda a, b: rf.maximum(a, b), lambda a, b: rf.where(a < b, rf.exp(a), b * 0.5),
    lambda a, b: rf.sqrt(rf.abs(a)) - rf.log(rf.abs(b) + 2.0) * 3,
]


@given(st.data(), broadcast_shape_pairs(allow_zero=True), dtypes, dtypes, st.sampled_from(range(len(ELEMENTWISE))))
def test_elementwise_with_broadcasting_is_bit_exact(data, shape_pair, da, db, which):
    if {da, db} == {np.dtype(np.float16), FLOAT_DTYPES[2]}:
        db = da  # numpy has no common type for where(f16, bf16): covered in test_errors
    a = data.draw(arrays(da, shape_pair[0], neg_inf=True))
    b = data.draw(arrays(db, shape_pair[1], large=True))
    actual, expected = run_both(ELEMENTWISE[which], a, b)
    assert_close(actual[0], np.asarray(expected[0]), expected[0].dtype, 1)
    # same numpy ops on the same values: identical, NaN for NaN
    assert np.array_equal(actual[0].astype(np.float64), np.asarray(expected[0]).astype(np.float64), equal_nan=True)


@st.composite
def axes_for(draw, ndim):
    kind = draw(st.sampled_from(["none", "int", "tuple"]))
    if kind == "none" or ndim == 0:
        return None
    if kind == "int":
        return draw(st.integers(-ndim, ndim - 1))
    dims = draw(st.lists(st.integers(0, ndim - 1), min_size=1, max_size=ndim, unique=True))
    return tuple(d - ndim if draw(st.booleans()) else d for d in dims)


@given(st.data(), shapes(max_dims=4, allow_zero=True), dtypes, st.sampled_from(["sum", "max", "min"]), st.booleans())
def test_reductions(data, shape, dtype, name, keepdims):
    axis = data.draw(axes_for(len(shape)))
    dims = range(len(shape)) if axis is None else [d % len(shape) for d in np.atleast_1d(axis)]
    n = math.prod(shape[d] for d in dims)
    if name != "sum" and n == 0:
        name = "sum"  # max/min of nothing is an error, in numpy too
    x = data.draw(arrays(dtype, shape, neg_inf=True))
    actual, expected = run_both(lambda x: getattr(rf, name)(rf.exp(rf.minimum(x, 3.0)), axis=axis,
                                                            keepdims=keepdims), x)
    assert_close(actual[0], np.asarray(expected[0]), dtype, n)


@st.composite
def matmul_operands(draw):
    m, k, n = (draw(st.sampled_from([1, 2, 3, 5, 8, 13, 16])) for _ in range(3))
    batch = draw(shapes(max_dims=2, max_side=4))
    a_shape = draw(st.sampled_from([(k,), (m, k), draw(st.just(batch)) + (m, k)]))
    b_batch = tuple(1 if draw(st.booleans()) else s for s in batch)[draw(st.integers(0, len(batch))):]
    b_shape = draw(st.sampled_from([(k,), (k, n), b_batch + (k, n)]))
    dtype = draw(dtypes)
    return draw(arrays(dtype, a_shape)), draw(arrays(draw(st.sampled_from([dtype, np.float32])), b_shape)), k


@given(matmul_operands(), st.booleans())
def test_matmul(operands, transpose_b):
    a, b, k = operands
    if transpose_b and b.ndim >= 2:
        b = np.ascontiguousarray(b.swapaxes(-1, -2))
        body = lambda a, b: a @ b.mT  # noqa: E731
    else:
        body = lambda a, b: a @ b  # noqa: E731
    actual, expected = run_both(body, a, b)
    # numpy multiplies f16 by f16 into an f32 sum rounded once to f16, and bf16 (or mixed) operands into f32
    expected = np.asarray(expected[0])
    assert_close(actual[0], expected, expected.dtype, k, roundings=1)


@given(programs(allow_zero=False))
def test_random_programs(program):
    note(repr(program))
    actual, expected = run_both(program.body, *program.inputs)
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert_close(a, np.asarray(e), program.dtype, program.reduction_length, repr(program), scale=program.scale)


@given(programs(allow_zero=True, max_steps=4))
def test_random_programs_with_empty_dims(program):
    note(repr(program))
    actual, expected = run_both(program.body, *program.inputs)
    for a, e in zip(actual, expected):
        assert_close(a, np.asarray(e), program.dtype, program.reduction_length, repr(program), scale=program.scale)


@given(programs(neg_inf=False))
def test_random_programs_default_pipeline(program):
    """What a user gets (fusion on), on finite inputs: see the -inf case below."""
    note(repr(program))
    actual, expected = run_both(program.body, *program.inputs, fuse=True)
    for a, e in zip(actual, expected):
        assert_close(a, np.asarray(e), program.dtype, program.reduction_length, repr(program), scale=program.scale)


@pytest.mark.xfail(strict=True, reason="fusion distributes x3 @ (v0 + x2) into sum(x3)*v0 + x3@x2: with -inf in x3 "
                                       "that is -inf + (inf - inf) = NaN where the reference gives -inf")
def test_fused_sum_of_terms_keeps_the_references_infinities():
    x = np.array([0.125, -0.125, 0.625, 0.125, -0.5, 0.375, 1.25], np.float32)
    masked = np.where(np.arange(7) % 2 == 0, x, -np.inf).astype(np.float32)

    def body(x2, x1, x3):
        v0 = x2 @ x1
        return x3 @ (v0 + x2)

    actual, expected = run_both(body, x, x, masked, fuse=True)
    assert_close(actual[0], np.asarray(expected[0]), np.float32, 49)


@pytest.mark.xfail(strict=True, reason="the centred sum (x - m_run) @ w meets w = -inf at the running max, 0 * -inf = NaN, "
                                       "where the reference's (x - m) < 0 gives +inf (fuzz: seed 53, example 866)")
def test_centred_sum_keeps_an_infinite_factor_at_a_running_max():
    x = np.array([1.0, 2.0, 3.0], np.float32)
    w = np.array([[1.0], [-np.inf], [1.0]], np.float32)

    def body(x, w):
        return (x - rf.max(x, axis=-1, keepdims=True)) @ w

    with np.errstate(all="ignore"):
        got = rf.kernel(body, backend="interpret", interpret_chunk=1)(x, w)
        want = body(x, w)
    assert np.isinf(got[0]) and got[0] == want[0]


def attention(q, k, v):
    s = (q @ rf.swapaxes(k, -1, -2)) * 0.125
    m = rf.max(s, axis=-1, keepdims=True)
    p = rf.exp(s - m)
    l = rf.sum(p, axis=-1, keepdims=True)  # noqa: E741
    return (p / l) @ v


@given(st.data(), st.sampled_from([(1, 1, 1, 4), (1, 2, 7, 3), (2, 1, 16, 8), (1, 1, 33, 5)]), dtypes,
       st.booleans(), st.booleans())
def test_attention_with_masks_and_large_scores(data, shape, dtype, causal, fuse):
    q = data.draw(arrays(dtype, shape, large=True))
    k = data.draw(arrays(dtype, shape, large=True))
    v = data.draw(arrays(dtype, shape))

    def body(q, k, v):
        s = (q @ rf.swapaxes(k, -1, -2)) * 0.125
        if causal:
            n = s.shape[-1]
            s = rf.where(rf.arange(n)[None, :] <= rf.arange(n)[:, None], s, -rf.inf)
        m = rf.max(s, axis=-1, keepdims=True)
        p = rf.exp(s - m)
        return (p / rf.sum(p, axis=-1, keepdims=True)) @ v

    actual, expected = run_both(body, q, k, v, fuse=fuse)
    scale = float(np.max(np.abs(v.astype(np.float64)), initial=0.0))
    expected = np.asarray(expected[0])   # f32 for bf16 inputs (numpy's bf16 matmul gives f32): the f32 rule
    assert_close(actual[0], expected, expected.dtype, shape[-2] * shape[-1], scale=scale)


def test_attention_at_full_size():
    """The issue's example at ``[2,4,256,64]`` float32: interpreted equal to the numpy body."""
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((2, 4, 256, 64)).astype(np.float32) for _ in range(3))
    for fuse in (False, True):
        actual, expected = run_both(attention, q, k, v, fuse=fuse)
        assert_close(actual[0], expected[0], np.float32, 256)
        rel = np.abs(actual[0] - expected[0]).max() / np.abs(expected[0]).max()
        assert rel < 1e-5  # the acceptance bound
