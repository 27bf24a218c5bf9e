"""Rounding, sign, classification and clipping (`redfuser/ops/numeric.py`): refusals that name the op, and the
ops inside cascades, where the fusion engine must treat them as what they are (the conformance table,
`tests/conformance_table.py`, checks every dtype and special value elementwise)."""
from __future__ import annotations

import numpy as np
import pytest

import redfuser as rf

BACKENDS = ("interpret", "cpu", "simulate")
RNG = np.random.default_rng(24)


def rounded_at_two_places(x):
    return rf.round(x, 2)


def sign_of(x):
    return rf.sign(x)


def clip_without_bounds(x):
    return rf.clip(x)


@pytest.mark.parametrize("fn,x,error,match", [
    (rounded_at_two_places, np.ones(4, np.float16), rf.UnsupportedError, r"round: decimals=2 of f16\[4\]: only float32 and float64"),
    (sign_of, np.ones(4, bool), rf.DTypeError, r"sign: not defined for bool\[4\]"),
    (clip_without_bounds, np.ones(4, bool), rf.DTypeError, r"clip: not defined for bool\[4\]"),
])
def test_refusals_name_the_op_and_the_line(fn, x, error, match):
    with pytest.raises(error, match=match) as info:
        rf.kernel(fn, backend="interpret")(x)
    assert "test_numeric_ops.py" in str(info.value)


def clipped_without_bounds_plus_one(x):
    return rf.clip(x, None, None) + 1


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32])
def test_clip_without_bounds_is_numpys(backend, dtype):
    """``clip(x, None, None)`` is a copy of ``x`` in numpy 2.1 and later (earlier ones raise, and so does the
    kernel there, saying which numpy): it was refused whatever numpy said. Found by a helper (hunt_gaps/02)."""
    x = np.arange(-3, 5).astype(dtype)
    try:
        want = clipped_without_bounds_plus_one(x)
    except ValueError:
        with pytest.raises(rf.UnsupportedError, match="clip needs a_min or a_max"):
            rf.kernel(clipped_without_bounds_plus_one, backend=backend)(x)
        return
    got = rf.kernel(clipped_without_bounds_plus_one, backend=backend)(x)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def quantized_rows(x):
    """int8-style per-row quantization written with numpy's names: scale by the row's absmax, round, clip."""
    scale = rf.max(rf.abs(x), axis=-1, keepdims=True) / 127.0
    q = rf.clip(rf.rint(x / scale), -127.0, 127.0)
    return q, rf.sum(q * scale, axis=-1)


def floor_of_shifted(x):
    m = rf.max(x, axis=-1, keepdims=True)
    return rf.sum(rf.floor(x - m), axis=-1), rf.sum(rf.isfinite(x - m), axis=-1)


def clipped_softmax_max(x):
    m = rf.max(x, axis=-1, keepdims=True)
    p = rf.exp(x - m) / rf.sum(rf.exp(x - m), axis=-1, keepdims=True)
    return rf.max(rf.clip(p, 0.05, 0.5), axis=-1)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn", [quantized_rows, floor_of_shifted, clipped_softmax_max])
def test_cascades_with_the_numeric_ops_equal_numpy(backend, fn):
    """The roundings, `isfinite` and `clip` of a value that reads an earlier result mix x and y (the fusion
    engine cannot factor them, `floor(x - m)`) or sit on a reduction's input; whatever the engine decides,
    the result is numpy's, exactly for the rounded and counted values."""
    x = (RNG.standard_normal((6, 300)) * 4).astype(np.float32)
    x[2, 7] = np.inf
    x[3, :] = -np.inf
    with np.errstate(all="ignore"):
        got, want = rf.kernel(fn, backend=backend)(x), fn(x)
    got, want = (got, want) if isinstance(want, tuple) else ((got,), (want,))
    if fn is quantized_rows:   # its sum fuses, rounding with the running absmax (fusion/grid_quantization.py):
        g, w = got[1].astype(np.float64), want[1].astype(np.float64)   # each term within one grid step
        step = np.abs(np.where(np.isfinite(x), x, 0)).max(axis=-1) / 127.0
        assert np.array_equal(np.isnan(g), np.isnan(w)) and np.array_equal(np.isinf(g), np.isinf(w))
        finite = np.isfinite(w)
        assert np.all(np.abs(g - w)[finite] <= (x.shape[-1] * step * (1 + 2.0**-10))[finite])
        got, want = got[:1], want[:1]   # q itself is computed with the final scale: exact
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        finite = np.isfinite(w)
        assert np.array_equal(np.isnan(g), np.isnan(w)) and np.array_equal(g[~finite & ~np.isnan(w)],
                                                                            w[~finite & ~np.isnan(w)])
        np.testing.assert_allclose(g[finite], w[finite], rtol=1e-5, atol=1e-4)


def test_floor_of_a_value_read_with_an_earlier_result_is_not_fused():
    """``floor(x - m)`` jumps where x - m crosses an integer: no ``G(x) H(m)`` factorization exists."""
    x = np.zeros((2, 64), np.float32)
    groups = rf.kernel(floor_of_shifted, backend="interpret").lower(x).groups
    refused = [g for g in groups if g.reason]
    assert refused and any("floor" in g.reason for g in refused), [(g.reductions, g.reason) for g in groups]


def python_round(x):
    return round(x)


def math_floor(x):
    import math

    return math.floor(x)


@pytest.mark.parametrize("fn,hint", [(python_round, "rf.round"), (math_floor, "rf.floor")])
def test_pythons_own_rounding_of_a_traced_value_points_at_the_op(fn, hint):
    """numpy refuses ``round(array)`` and ``math.floor(array)`` (they would make a Python number)."""
    with pytest.raises(rf.UnsupportedError, match=hint):
        rf.kernel(fn, backend="interpret")(np.ones(3, np.float32))


def moments(x):
    return rf.mean(x, axis=-1), x.var(axis=-1, ddof=1), rf.std(x, axis=-1, keepdims=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_mean_var_std_of_rows_far_from_zero_are_numpys_in_one_pass(backend):
    """The variance written numpy's way (the mean, then the squared deviations) fuses into one pass kept
    centred on the running mean; rows around 1e4 with a spread of 1 keep numpy's value (no cancellation)."""
    x = (1e4 + RNG.standard_normal((5, 3000))).astype(np.float32)
    k = rf.kernel(moments, backend=backend)
    assert any(len(g.fused_members) >= 2 for g in k.lower(x).groups)
    for got, want in zip(k(x), moments(x)):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4)


@pytest.mark.parametrize("dtype", [np.int32, np.bool_, np.float16])
def test_statistics_accumulate_where_numpy_does(dtype):
    """Integers and bools in float64 (float64 results), float16's mean in float32 rounded back to f16."""
    x = (RNG.standard_normal((4, 50)) * 3).astype(dtype)
    got = rf.kernel(moments, backend="cpu")(x)
    for g, w in zip(got, moments(x)):
        assert g.dtype == w.dtype
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=2e-3, atol=1e-6)


def test_statistics_of_e4m3_are_refused_with_the_way_out():
    with pytest.raises(rf.UnsupportedError, match=r"x.astype\(rf.float32\)"):
        rf.kernel(moments, backend="interpret")(np.ones((2, 8), rf.float8_e4m3fn))


def block_causal(q_pos, k_pos):
    """A chunked-attention mask written with numpy's integer ``//``: query and key in the same block of 16."""
    return (q_pos[:, None] // 16 == k_pos[None, :] // 16) & (k_pos[None, :] <= q_pos[:, None])


def floor_ops(a, b):
    return a // b, a % b, -a // 7, a % -3


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_integer_floor_division_and_remainder_are_numpys(backend, dtype):
    """Floored quotient, the divisor's sign for the remainder, 0 for a zero divisor, INT_MIN // -1 wrapping
    (LLVM's sdiv would trap on both: codegen/int_division.py)."""
    lo = np.iinfo(dtype).min
    a = np.array([7, -7, 7, -7, 0, 5, lo, lo, 3, -3, -1, 12], dtype)
    b = np.array([2, 2, -2, -2, 3, 0, -1, 1, 0, 5, 4, -5], dtype)
    with np.errstate(all="ignore"):
        got, want = rf.kernel(floor_ops, backend=backend)(a, b), floor_ops(a, b)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and np.array_equal(g, w), (g, w)
    q = np.arange(40, dtype=np.int32)
    assert np.array_equal(rf.kernel(block_causal, backend=backend)(q, q), block_causal(q, q))


def any_and_all(x):
    return rf.any(x, axis=-1), x.all(axis=-1), rf.any(x > 0.5, axis=0, keepdims=True)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", [(3, 0), (0, 4), (4, 37)])
def test_any_and_all_over_empty_and_special_rows(backend, shape):
    """numpy's any/all: NaN counts as true, an empty axis gives False / True (max and min have no identity
    there, so the op counts instead)."""
    x = (RNG.standard_normal(shape) > 0.7).astype(np.float32)
    if x.size:
        x[1] = 0.0
        x[2] = np.nan
        x[3] = 1.0
    got, want = rf.kernel(any_and_all, backend=backend)(x), any_and_all(x)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape and np.array_equal(g, w)


def greedy_token(logits):
    m = rf.max(logits, axis=-1, keepdims=True)
    p = rf.exp(logits - m) / rf.sum(rf.exp(logits - m), axis=-1, keepdims=True)
    return rf.argmax(p, axis=-1), rf.max(p, axis=-1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_argmax_of_a_softmax_is_numpys_first_index(backend):
    """Greedy decoding: the first index of the largest probability (ties and NaN rows as numpy's argmax)."""
    x = np.round(RNG.standard_normal((6, 257)) * 2).astype(np.float32)   # many ties
    x[2, 5] = np.nan
    with np.errstate(all="ignore"):
        got, want = rf.kernel(greedy_token, backend=backend)(x), greedy_token(x)
    assert got[0].dtype == want[0].dtype and np.array_equal(got[0], want[0])
    np.testing.assert_allclose(got[1], want[1], rtol=1e-6)


def chunk_ids(i):
    return i // 3 % 2, (i % 5) // 2, i // (i % 5 + 1)


def test_every_stage_of_a_kernel_with_floor_division_prints():
    """The Loop IR printer knew no precedence for ``//`` and ``%`` (a KeyError printing the stages, found
    reading the change): they print as Python writes them, parenthesized where the order needs it."""
    lowered = rf.kernel(chunk_ids, backend="simulate").lower(np.arange(8, dtype=np.int32))
    fused = str(lowered.stages["fused"])
    assert "i[i0] // 3 % 2" in fused and "i[i0] % 5 // 2" in fused and "i[i0] // (i[i0] % 5 + 1)" in fused
    assert "kernel" in str(lowered)      # every stage prints
