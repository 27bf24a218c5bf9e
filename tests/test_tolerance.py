"""The tolerance rule: its numbers, its NaN/inf handling, and that it separates rounding from bugs."""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from redfuser.testing import assert_close, tolerance
from redfuser.testing.tolerance import C, ROUNDINGS, eps, wide_reference


def test_rule_numbers():
    assert tolerance(np.float32, 256) == pytest.approx((C * 2.0**-23 * 9, C * 2.0**-23 * 9))
    r32 = C * 2.0**-23 * 13                                       # the f32 part at n = 4096
    f16 = (r32 + 3 * 2.0**-11, r32 + 2.0**-11 + 3 * 2.0**-25)     # + 3 halves of f16's smallest subnormal
    assert tolerance(np.float16, 4096, roundings=2) == pytest.approx(f16)
    assert tolerance(ml_dtypes.bfloat16, 4096, 10.0, roundings=1)[0] == pytest.approx(r32 + 2 * 2.0**-8)
    assert tolerance(ml_dtypes.bfloat16, 4096, 10.0, roundings=1)[1] == pytest.approx(10 * r32)
    assert tolerance(np.float16, 1) == tolerance(np.float16, 1, roundings=ROUNDINGS["float16"])
    assert tolerance(ml_dtypes.bfloat16, 1) == tolerance(ml_dtypes.bfloat16, 1, roundings=16)
    assert tolerance(np.float16, 1)[0] == pytest.approx(C * 2.0**-23 + 9 * 2.0**-11)       # 0.44%
    assert tolerance(ml_dtypes.float8_e4m3fn, 1)[0] == pytest.approx(C * 2.0**-23 + 9 / 16)
    assert tolerance(np.float32, 4096, roundings=1) == tolerance(np.float32, 4096)   # f32: one rule
    assert tolerance(np.float32, 0) == tolerance(np.float32, 1)  # an empty reduction is exact
    with pytest.raises(ValueError, match="roundings"):
        tolerance(np.float16, 1, roundings=-1)
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


def test_rule_is_the_documented_formula():
    for n in (1, 3, 256, 10**6):
        r32 = C * 2.0**-23 * (1 + math.log2(n))
        for roundings in (0, 1, 7):
            rtol, atol = tolerance(np.float16, n, 2.0, roundings=roundings)
            assert rtol == pytest.approx(r32 + (1 + roundings) * 2.0**-11)
            assert atol == pytest.approx((r32 + max(roundings - 1, 0) * 2.0**-11) * 2 + (1 + roundings) * 2.0**-25)


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


# ---------------------------------------------------------------------------------------------
# f16 and bf16: compiled kernels pass, planted 1% bugs fail (the module docstring's measurements)
# ---------------------------------------------------------------------------------------------
import redfuser as rf  # noqa: E402
from redfuser import workloads as W  # noqa: E402

BF16 = ml_dtypes.bfloat16
WIDE_ROUNDINGS = {np.dtype(np.float16): 2, np.dtype(BF16): 1}   # against `wide_reference`
KERNEL_ROUNDINGS = {"moe_routing": 3}   # exp values, kept weights and their sum, rounded by the kernel too
BODY_ROUNDINGS = {"softmax": 4, "log_softmax": 5, "attention": 7, "causal_attention": 7, "moe_routing": 6}


def _rows(shape):
    return lambda rng, d: ((rng.standard_normal(shape) * 3).astype(d),)


def _qkv(queries, keys, head, heads=2):
    return lambda rng, d: tuple(rng.standard_normal((1, heads, n, head)).astype(d) for n in (queries, keys, keys))


CASES = {   # name: (body, inputs, reduction length); heads of 16 and 64: the score scale is exact in f16
    "softmax": (W.softmax, _rows((16, 1024)), 1024),
    "log_softmax": (W.log_softmax, _rows((16, 1024)), 1024),
    "attention": (W.attention, _qkv(32, 256, 64), 256),
    "causal_attention": (W.causal_attention, _qkv(128, 128, 16, heads=1), 128),
    "decoding": (W.attention, _qkv(1, 4096, 64, heads=4), 4096),
    "moe_routing": (W.moe_routing, _rows((256, 64)), 64),
}


def _close_to_wide(actual, args, body, dtype, n, name):
    """`assert_close` of each output against `wide_reference` (top-k indices: equal, or a near-tie)."""
    ref = wide_reference(body, *args)
    if name != "moe_routing":
        assert_close(actual, ref, ref.dtype, n, roundings=WIDE_ROUNDINGS[np.dtype(dtype)])
        return
    (weights, experts), (ref_w, ref_e) = actual, ref
    p = np.sort(W.softmax(args[0].astype(np.float64)), axis=-1)[:, ::-1]
    same = (experts == ref_e).all(-1)
    assert (p[~same, 1] - p[~same, 2] <= 4 * eps(dtype) * p[~same, 1]).all()  # only near-ties may swap
    roundings = WIDE_ROUNDINGS[np.dtype(dtype)] + KERNEL_ROUNDINGS[name]
    assert_close(weights[same], ref_w[same], dtype, n, roundings=roundings)


def _kernel_and_args(name, dtype, seed=0, backend="cpu", **options):
    body, make, n = CASES[name]
    args = make(np.random.default_rng(seed), dtype)
    out = rf.kernel(body, backend=backend, **options)(*args)
    return body, args, n, out


def _scaled(out, factor):
    if isinstance(out, tuple):
        return ((out[0].astype(np.float64) * factor).astype(out[0].dtype), out[1])
    return (out.astype(np.float64) * factor).astype(out.dtype)


@pytest.mark.parametrize("dtype", [np.float16, BF16])
@pytest.mark.parametrize("name", list(CASES))
def test_a_kernel_passes_and_its_output_scaled_by_1_percent_fails(name, dtype):
    """Against the float64 evaluation of the body: every compiled kernel passes, the same output times
    1.01 fails. bf16 MoE routing rounds three intermediates to bf16 itself (up to 1.2%): 1% passes, 5% fails."""
    body, args, n, out = _kernel_and_args(name, dtype)
    _close_to_wide(out, args, body, dtype, n, name)
    factor = 1.05 if (name, dtype) == ("moe_routing", BF16) else 1.01
    with pytest.raises(AssertionError, match="outside the tolerance"):
        _close_to_wide(_scaled(out, factor), args, body, dtype, n, name)
    if factor != 1.01:
        _close_to_wide(_scaled(out, 1.01), args, body, dtype, n, name)   # the documented limit


@pytest.mark.parametrize("name", ["softmax", "log_softmax", "attention", "causal_attention", "moe_routing"])
def test_f16_against_the_f16_body_counts_its_roundings(name):
    """Against numpy's own f16 evaluation, with the roundings on its path counted: a kernel passes, 1% fails."""
    body, args, n, out = _kernel_and_args(name, np.float16, seed=1)
    ref, out = body(*args), out
    if name == "moe_routing":
        assert (out[1] == ref[1]).mean() > 0.98
        keep = (out[1] == ref[1]).all(-1)
        ref, out = ref[0][keep], out[0][keep]
    assert_close(out, ref, np.float16, n, roundings=BODY_ROUNDINGS[name])
    with pytest.raises(AssertionError, match="outside the tolerance"):
        assert_close(_scaled(out, 1.01), ref, np.float16, n, roundings=BODY_ROUNDINGS[name])


def _attention_with(scale_factor=1.0, dropped=None):
    def body(q, k, v):
        s = (q @ rf.swapaxes(k, -1, -2)) * (scale_factor / q.shape[-1] ** 0.5)
        if dropped is not None:
            s = rf.where(rf.arange(k.shape[-2])[None, :] != dropped, s, -rf.inf)
        m = rf.max(s, axis=-1, keepdims=True)
        p = rf.exp(s - m)
        return (p / rf.sum(p, axis=-1, keepdims=True)) @ v
    return body


@pytest.mark.parametrize("dtype", [np.float16, BF16])
@pytest.mark.parametrize("bug", ["one key of 64 dropped", "softmax scale 1% off"])
def test_planted_attention_bugs_fail(bug, dtype):
    """Compiled kernels with a bug, against the correct body's float64 evaluation."""
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((1, 2, n, 64)).astype(dtype) for n in (32, 64, 64))
    wrong = _attention_with(dropped=37) if bug.startswith("one key") else _attention_with(scale_factor=1.01)
    ref = wide_reference(W.attention, q, k, v)
    honest = rf.kernel(_attention_with(), backend="cpu")(q, k, v)
    assert_close(honest, ref, ref.dtype, 64, roundings=WIDE_ROUNDINGS[np.dtype(dtype)])
    with pytest.raises(AssertionError, match="outside the tolerance"):
        assert_close(rf.kernel(wrong, backend="cpu")(q, k, v), ref, ref.dtype, 64,
                     roundings=WIDE_ROUNDINGS[np.dtype(dtype)])


def _online_softmax(x, chunk, accumulator):
    """Softmax as a fused loop computes it, in f32, the running sum kept in `accumulator`; rounded to x's dtype."""
    xf = x.astype(np.float32)
    m = xf.max(-1, keepdims=True)
    total = np.zeros_like(m)
    for start in range(0, x.shape[-1], chunk):
        total = (total + np.exp(xf[:, start:start + chunk] - m).sum(-1, keepdims=True)).astype(accumulator)
        total = total.astype(np.float32)
    return (np.exp(xf - m) / total).astype(x.dtype)


def test_a_bf16_accumulator_fails_where_f32_passes():
    x = (np.random.default_rng(2).standard_normal((16, 4096)) * 3).astype(np.float16)
    ref = wide_reference(W.softmax, x)
    assert_close(_online_softmax(x, 64, np.float32), ref, np.float16, 4096, roundings=2)
    with pytest.raises(AssertionError, match="outside the tolerance"):
        assert_close(_online_softmax(x, 64, BF16), ref, np.float16, 4096, roundings=2)


def test_simulated_kernels_at_small_shapes():
    """The program that becomes PTX (tensor-core attention rounds P to f16: the second rounding)."""
    tiles = dict(block_m=16, block_n=16, block_k=16)
    for name, dtype in (("softmax", np.float16), ("attention", np.float16), ("softmax", BF16)):
        body, make, _ = CASES[name]
        args = make(np.random.default_rng(3), dtype)
        args = tuple(a[..., :64, :] if a.ndim == 4 else a[:4, :256] for a in args)
        n = args[-1].shape[-2] if name == "attention" else 256
        out = rf.kernel(body, backend="simulate", **tiles)(*args)
        _close_to_wide(out, args, body, dtype, n, name)
        with pytest.raises(AssertionError, match="outside the tolerance"):
            _close_to_wide(_scaled(out, 1.01), args, body, dtype, n, name)


def test_numpys_bf16_sum_is_no_reference_for_a_long_row():
    """numpy adds bf16 values one at a time in bf16: 4096 values of 0.3 sum to 128. A correct kernel is
    'wrong' by 60% against numpy's bf16 softmax of a long row, so bf16 checks use `wide_reference`."""
    assert float(np.full(4096, 0.3, BF16).sum()) == 128.0
    x = np.random.default_rng(4).standard_normal((8, 4096)).astype(BF16)
    out = rf.kernel(W.softmax, backend="cpu")(x)
    with pytest.raises(AssertionError, match="outside the tolerance"):
        assert_close(out, W.softmax(x), BF16, 4096)
    assert_close(out, wide_reference(W.softmax, x), BF16, 4096, roundings=1)


def test_wide_reference_rounds_once_to_the_bodys_dtypes():
    x = np.array([[1.0, 2.0, 3.0]], BF16)
    out = wide_reference(lambda a: (W.softmax(a), a.sum(-1), (a > 1).sum()), x)
    exact = np.exp([-2.0, -1.0, 0.0]) / np.exp([-2.0, -1.0, 0.0]).sum()
    assert out[0].dtype == BF16 and np.array_equal(out[0], exact[None].astype(BF16))
    assert out[1].dtype == BF16 and out[2] == 2 and x.dtype == BF16


def test_complex_values_are_refused_not_compared_by_their_real_parts():
    """``assert_close(1+1j, 1+0j)`` passed: the values went to float64 and the imaginary parts were dropped."""
    with pytest.raises(AssertionError, match="complex values"):
        assert_close(np.array([1 + 1j]), np.array([1 + 0j]), np.complex64, 1)


def test_the_quantized_gemm_check_wants_the_bodys_shape_and_dtype():
    """`assert_quantized_gemm` accepted an f16 or f64 output where the body gives f32, and a wrong shape
    raised numpy's ValueError instead of an AssertionError."""
    import ml_dtypes

    from redfuser.testing.quantization import assert_quantized_gemm
    from redfuser.workloads import fp8_quant_gemm

    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 32)).astype(np.float32)
    w = rng.standard_normal((32, 8)).astype(ml_dtypes.float8_e4m3fn)
    ws = rng.uniform(0.5, 2.0, 8).astype(np.float32)
    good = fp8_quant_gemm(x, w, ws)
    assert_quantized_gemm(good, x, w, ws)
    for bad in (good.astype(np.float16), good.astype(np.float64), good[:, :4]):
        with pytest.raises(AssertionError, match="the body's is float32"):
            assert_quantized_gemm(bad, x, w, ws)


@pytest.mark.parametrize("extra", [{"bound": np.array(np.nan)}, {"bound": np.array([0.0, np.nan, 0.0])},
                                   {"bound": np.array([0.0, np.inf, 0.0])}, {"bound": -1.0},
                                   {"scale": float("inf")}, {"scale": float("nan")}])
def test_a_bound_or_scale_that_would_accept_anything_is_refused(extra):
    """(Found by a helper fuzzing the testing API.) A NaN ``bound`` made the allowed error NaN, and
    ``err > NaN`` is false: a result 100% off passed silently; an infinite ``scale`` made atol infinite."""
    wrong, right = np.full(3, 2.0, np.float32), np.full(3, 1.0, np.float32)
    with pytest.raises(ValueError, match="bound|scale"):
        assert_close(wrong, right, np.float32, 1, **extra)


def test_a_bound_is_not_read_where_the_reference_is_not_finite():
    got = want = np.array([np.inf, 1.0], np.float32)
    assert_close(got, want, np.float32, 1, bound=np.array([np.inf, 0.0]))
