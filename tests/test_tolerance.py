"""The tolerance rule: its numbers, its NaN/inf handling, and that it separates rounding from bugs."""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from redfuser.testing import assert_close, tolerance
from redfuser.testing.tolerance import C, eps


def test_rule_numbers():
    assert tolerance(np.float32, 256) == pytest.approx((C * 2.0**-23 * 9, C * 2.0**-23 * 9))
    assert tolerance(np.float16, 1)[0] == pytest.approx(C * 2.0**-10)
    assert tolerance(ml_dtypes.bfloat16, 4096)[0] == pytest.approx(C * 2.0**-7 * 13)
    assert tolerance(ml_dtypes.float8_e4m3fn, 1)[0] == pytest.approx(C * 0.125)
    assert tolerance(np.float32, 0) == tolerance(np.float32, 1)  # an empty reduction is exact
    assert tolerance(np.float32, 1000, magnitude=10.0)[1] == pytest.approx(10 * tolerance(np.float32, 1000)[0])
    for d in (np.int32, np.int64, np.bool_):
        assert tolerance(d, 1000) == (0.0, 0.0)
    rtols = [tolerance(np.float32, n)[0] for n in (1, 2, 64, 4096)]
    assert rtols == sorted(rtols)
    assert eps(np.float32) == 2.0**-23 and eps(ml_dtypes.bfloat16) == 2.0**-7


def test_accepts_ir_dtypes():
    from redfuser.ir import types as T

    assert tolerance(T.bfloat16, 8) == tolerance(ml_dtypes.bfloat16, 8)


def f32(*values):
    return np.array(values, np.float32)


def test_nan_positions_must_match_exactly():
    assert_close(f32(1, np.nan, 3), f32(1, np.nan, 3), np.float32, 1)
    with pytest.raises(AssertionError, match="NaN positions differ"):
        assert_close(f32(1, 2, 3), f32(1, np.nan, 3), np.float32, 1)
    with pytest.raises(AssertionError, match="NaN positions differ"):
        assert_close(f32(1, np.nan, 3), f32(1, 2, 3), np.float32, 1000)


def test_infinities_must_match_exactly_with_sign():
    assert_close(f32(np.inf, -np.inf, 0), f32(np.inf, -np.inf, 0), np.float32, 1)
    with pytest.raises(AssertionError, match="infinities differ"):
        assert_close(f32(-np.inf, 1), f32(np.inf, 1), np.float32, 1)
    with pytest.raises(AssertionError, match="infinities differ"):
        assert_close(f32(3e38, 1), f32(np.inf, 1), np.float32, 1)
    with pytest.raises(AssertionError, match="infinities differ"):
        assert_close(f32(np.inf, 1), f32(3e38, 1), np.float32, 1)


def test_shape_and_dtype_must_match():
    with pytest.raises(AssertionError, match="shape"):
        assert_close(f32(1, 2), f32(1, 2, 3), np.float32, 1)
    with pytest.raises(AssertionError, match="dtype"):
        assert_close(f32(1, 2), f32(1, 2).astype(np.float16), np.float32, 1)


def test_integers_and_bools_are_exact():
    assert_close(np.array([1, 2]), np.array([1, 2]), np.int64, 100)
    with pytest.raises(AssertionError, match="1 of 2 values differ"):
        assert_close(np.array([1, 3]), np.array([1, 2]), np.int64, 100)


def test_atol_scales_with_the_largest_reference_value():
    """A cancelled sum near 0 may be off by rounding of its (large) terms: relative to max|reference|."""
    expected = f32(1000.0, 1e-4)
    actual = f32(1000.0, 1e-4 + 1e-3)  # 10x its own value off, yet below atol = rtol * 1000 = 1.9e-3 (n = 2)
    assert_close(actual, expected, np.float32, 2)
    with pytest.raises(AssertionError, match="outside the tolerance"):
        assert_close(f32(1000.0, 1.0), expected, np.float32, 2)
    assert_close(f32(1.0, 1.0 + 5e-4), f32(1.0, 1.0), np.float32, 1, scale=1000.0)
    with pytest.raises(AssertionError, match="outside the tolerance"):
        assert_close(f32(1.0, 1.0 + 5e-4), f32(1.0, 1.0), np.float32, 1)


def test_failure_message_names_the_worst_element():
    with pytest.raises(AssertionError) as info:
        assert_close(f32(1, 2, 30), f32(1, 2, 3), np.float32, 1, "my program")
    text = str(info.value)
    assert text.startswith("my program") and "worst at (2,)" in text and "rtol" in text


# ---------------------------------------------------------------------------------------------
# calibration: rounding passes, bugs fail
# ---------------------------------------------------------------------------------------------
def attention(q, k, v, scale=0.125, drop=None):
    s = (q @ np.swapaxes(k, -1, -2)) * q.dtype.type(scale)
    if drop is not None:
        s[..., drop] = -np.inf
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def online_attention(q, k, v, chunk):
    """FlashAttention-2's order of operations in float32 (what a fused kernel computes)."""
    q, k, v = (x.astype(np.float32) for x in (q, k, v))
    m = np.full(q.shape[:-1] + (1,), -np.inf, np.float32)
    l = np.zeros_like(m)  # noqa: E741
    acc = np.zeros(q.shape[:-1] + (v.shape[-1],), np.float32)
    for start in range(0, k.shape[-2], chunk):
        s = (q @ np.swapaxes(k[..., start:start + chunk, :], -1, -2)) * np.float32(0.125)
        m_new = np.maximum(m, s.max(-1, keepdims=True))
        r, p = np.exp(m - m_new), np.exp(s - m_new)
        l, acc, m = l * r + p.sum(-1, keepdims=True), acc * r + p @ v[..., start:start + chunk, :], m_new
    return acc / l


def qkv(dtype, std=1.0, seed=0, keys=256):
    rng = np.random.default_rng(seed)
    q = (rng.standard_normal((2, 2, 32, 64)) * std).astype(dtype)
    k = (rng.standard_normal((2, 2, keys, 64)) * std).astype(dtype)
    v = rng.standard_normal((2, 2, keys, 64)).astype(dtype)
    return q, k, v


@pytest.mark.parametrize("std", [1.0, 3.0])
@pytest.mark.parametrize("chunk", [16, 64])
def test_f32_attention_over_256_keys_passes_in_another_order(std, chunk):
    for seed in range(3):
        q, k, v = qkv(np.float32, std, seed)
        assert_close(online_attention(q, k, v, chunk), attention(q, k, v), np.float32, 256)
        exact = attention(*(x.astype(np.float64) for x in (q, k, v))).astype(np.float32)
        assert_close(exact, attention(q, k, v), np.float32, 256)


@pytest.mark.parametrize("bug", ["dropped key", "dropped last key", "wrong scale", "normalized over queries"])
def test_f32_attention_bugs_fail(bug):
    q, k, v = qkv(np.float32)
    reference = attention(q, k, v)
    if bug == "dropped key":
        wrong = attention(q, k, v, drop=100)
    elif bug == "dropped last key":
        wrong = attention(q, k, v, drop=255)
    elif bug == "wrong scale":
        wrong = attention(q, k, v, scale=0.13)
    else:
        s = (q @ np.swapaxes(k, -1, -2)) * np.float32(0.125)
        p = np.exp(s - s.max(-1, keepdims=True))
        wrong = (p / p.sum(-2, keepdims=True)) @ v
    with pytest.raises(AssertionError, match="outside the tolerance"):
        assert_close(wrong, reference, np.float32, 256)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_low_precision_attention_computed_in_f32_passes(dtype):
    q, k, v = qkv(dtype)
    reference = attention(q, k, v)  # numpy's bf16 matmul gives float32: the result keeps the reference's dtype
    fused = online_attention(q, k, v, 64).astype(dtype).astype(reference.dtype)
    assert_close(fused, reference, dtype, 256)


def test_rule_is_the_documented_formula():
    for n in (1, 3, 256, 10**6):
        assert tolerance(np.float16, n)[0] == pytest.approx(C * 2.0**-10 * (1 + math.log2(n)))


def test_any_nonfinite_matches_nan_and_infinities_only_with_each_other():
    ref = np.array([np.inf, -np.inf, np.nan, 1.0], np.float32)
    swapped = np.array([np.nan, np.inf, -np.inf, 1.0], np.float32)
    with pytest.raises(AssertionError, match="NaN positions differ"):
        assert_close(swapped, ref, np.float32, 4)
    assert_close(swapped, ref, np.float32, 4, any_nonfinite=True)
    with pytest.raises(AssertionError, match="NaN positions differ"):      # finite where the reference is not
        assert_close(np.array([np.nan, np.inf, 0.0, 1.0], np.float32), ref, np.float32, 4, any_nonfinite=True)
    with pytest.raises(AssertionError):                                  # finite values still within tolerance
        assert_close(np.array([np.nan, np.inf, -np.inf, 1.5], np.float32), ref, np.float32, 4, any_nonfinite=True)
