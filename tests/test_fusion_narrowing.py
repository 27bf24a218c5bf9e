"""Narrowing casts inside a cascade: FlashAttention's own numerics.

``(p.astype(f16) @ v) / l`` and ``(p / l).astype(bf16) @ v`` with ``p = exp(s - m)`` fuse into one pass:
the loop rounds ``exp(s - m_t)`` with the running max, rescales its accumulator per chunk and applies
``1/l`` after the loop ("rounding moved before normalization"). Both programs round every term once, so
both are within `rounded_terms_bound` of the exact sum; NaN and infinity positions are numpy's exactly.
A cast whose rounded value the program cannot bound (it could overflow in the loop where the reference
does not) is refused with a reason and runs unfused, still correct.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from helpers import run_backend

import redfuser as rf
from redfuser.testing.tolerance import assert_close, rounded_terms_bound, wide_reference

BACKENDS = ("interpret", "cpu", "simulate")
DTYPES = {"f16": (rf.float16, np.float16), "bf16": (rf.bfloat16, ml_dtypes.bfloat16)}
ROWS, N, D, HEAD = 24, 80, 16, 16
SCALE = 0.25                       # 1/sqrt(HEAD): exact in every type


def attention_a(dt):
    """The f16 way (FlashAttention's kernel): round P, multiply, divide by l at the end."""
    def body(q, k, v):
        s = q.astype(rf.float32) @ k.astype(rf.float32).T * SCALE
        m = rf.max(s, axis=-1, keepdims=True)
        p = rf.exp(s - m)
        l = rf.sum(p, axis=-1, keepdims=True)
        return (p.astype(dt) @ v) / l
    return body


def attention_b(dt):
    """The bf16 way: normalize, round the probabilities, multiply."""
    def body(q, k, v):
        s = q.astype(rf.float32) @ k.astype(rf.float32).T * SCALE
        m = rf.max(s, axis=-1, keepdims=True)
        p = rf.exp(s - m)
        l = rf.sum(p, axis=-1, keepdims=True)
        return (p / l).astype(dt) @ v.astype(rf.float32)
    return body


def scaled_b(dt):
    """A constant factor inside the cast: |2·exp(s - m_t)| <= 2 is still bounded."""
    def body(q, k, v):
        s = q.astype(rf.float32) @ k.astype(rf.float32).T * SCALE
        m = rf.max(s, axis=-1, keepdims=True)
        p = rf.exp(s - m)
        l = rf.sum(p, axis=-1, keepdims=True)
        return (p * 2.0 / l).astype(dt) @ v.astype(rf.float32)
    return body


def scores_a(dt):
    """Scores given directly (special values, masks)."""
    def body(s, v):
        m = rf.max(s, axis=-1, keepdims=True)
        p = rf.exp(s - m)
        l = rf.sum(p, axis=-1, keepdims=True)
        return (p.astype(dt) @ v.astype(rf.float32)) / l
    return body


def scores_b(dt):
    def body(s, v):
        m = rf.max(s, axis=-1, keepdims=True)
        p = rf.exp(s - m)
        l = rf.sum(p, axis=-1, keepdims=True)
        return (p / l).astype(dt) @ v.astype(rf.float32)
    return body


def causal_b(dt):
    """A causal mask written as -inf scores before the max."""
    def body(s, mask, v):
        s = rf.where(mask, s, -np.inf)
        m = rf.max(s, axis=-1, keepdims=True)
        p = rf.exp(s - m)
        l = rf.sum(p, axis=-1, keepdims=True)
        return (p / l).astype(dt) @ v.astype(rf.float32)
    return body


def unbounded_factor(s, x, v):
    """x·exp(s - m) rounded to f16: x is any f32, so the loop's value (1/l not yet applied) can overflow."""
    m = rf.max(s, axis=-1, keepdims=True)
    p = rf.exp(s - m)
    l = rf.sum(p, axis=-1, keepdims=True)
    return (x * p / l).astype(rf.float16) @ v.astype(rf.float32)


def other_max(s, x, v):
    """exp(s - max(x)): not bounded by 1, since m is not the running max of s."""
    m = rf.max(x, axis=-1, keepdims=True)
    p = rf.exp(s - m)
    l = rf.sum(p, axis=-1, keepdims=True)
    return (p / l).astype(rf.float16) @ v.astype(rf.float32)


def _qkv(dtype, seed: int = 0, spread: float = 1.0):
    rng = np.random.default_rng(seed)
    q = (spread * rng.standard_normal((ROWS, HEAD))).astype(dtype)
    k = (spread * rng.standard_normal((N, HEAD))).astype(dtype)
    v = rng.standard_normal((N, D)).astype(dtype)
    return q, k, v


def _bound(s64: np.ndarray, v: np.ndarray, cast_dtype, roundings: int = 0) -> np.ndarray:
    """`rounded_terms_bound` for ``Σ_k cast(p_k / l)·v_k`` (either form: 1/l <= 1 is applied after the
    rounding in one of them, which keeps the bound), from the float64 scores."""
    v64 = np.asarray(v).astype(np.float64)
    with np.errstate(all="ignore"):
        m = s64.max(-1, keepdims=True)
        p = np.exp(s64 - m)
        w = p / p.sum(-1, keepdims=True)
    magnitude = np.nan_to_num(w, nan=0.0) @ np.abs(v64)
    weight = np.broadcast_to(np.abs(v64).sum(0), magnitude.shape)
    return rounded_terms_bound(cast_dtype, magnitude, weight, s64.shape[-1], roundings=roundings)


def _one_fused_loop(kernel, *args) -> None:
    """Every reduction of the cascade, the GEMM included, in one pass: one loop and no reduction after it."""
    lowered = kernel.lower(*args)
    (g,) = lowered.groups
    assert g.fused and g.reason is None and g.fused_members == g.reductions, g.reason
    lines = str(lowered.program).splitlines()
    (start,) = [n for n, line in enumerate(lines) if "fused loop over" in line]
    body = [line for line in lines[start + 1:] if line.startswith("    ")]          # the loop's states
    after = [line for line in lines[start + 1:] if line.startswith("  ") and not line.startswith(("    ", "  #"))]
    assert any("sum over j" in line for line in body), lines
    assert not any("sum over" in line for line in after), lines


def _reduction_roundings(body_maker, dtype: str = "f16") -> int:
    """A's f16 matmul result: rounded once by numpy (which accumulates it in f32) and once by the fused loop,
    after it (every backend, the interpreter too, carries the f16 state in f32, whatever the chunking); a bf16
    matmul gives f32 in numpy: nothing to count."""
    if body_maker is not attention_a or dtype != "f16":
        return 0
    return 2


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("maker", [attention_a, attention_b, scaled_b])
def test_attention_with_a_narrowing_cast_fuses_and_is_within_the_bound(backend, dtype, maker):
    dt, ndt = DTYPES[dtype]
    body = maker(dt)
    q, k, v = _qkv(ndt, seed=1, spread=1.5)
    kernel = rf.kernel(body, backend="interpret")
    _one_fused_loop(kernel, q, k, v)
    text = kernel.explain(q, k, v)
    moved = "before the running values are final" if maker is attention_a else "before normalization"
    assert f"rounding moved {moved}: G's cast" in text and "NOT fused" not in text
    assert ("is applied after the loop" in text) == (maker is not attention_a)
    actual, expected = run_backend(backend, body, q, k, v)
    s64 = q.astype(np.float64) @ k.astype(np.float64).T * SCALE
    c = 2.0 if maker is scaled_b else 1.0
    bound = c * _bound(s64, v, ndt, _reduction_roundings(maker, dtype))
    assert_close(actual[0], expected[0], np.float32, N, bound=bound)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_the_bound_catches_a_one_percent_error(dtype):
    """The tolerance is the rounding bound, not a blanket: the fused result times 1.01 fails it (measured:
    9.5 times over in f16, 1.4 times in bf16; a correct result uses at most half of it)."""
    dt, ndt = DTYPES[dtype]
    body = attention_b(dt)
    q, k, v = _qkv(ndt, seed=1, spread=1.5)
    _one_fused_loop(rf.kernel(body, backend="interpret"), q, k, v)
    actual, expected = run_backend("interpret", body, q, k, v)
    s64 = q.astype(np.float64) @ k.astype(np.float64).T * SCALE
    bound = _bound(s64, v, ndt)
    assert_close(actual[0], expected[0], np.float32, N, bound=bound)
    with pytest.raises(AssertionError, match="outside the tolerance"):
        assert_close(actual[0] * np.float32(1.01), expected[0], np.float32, N, bound=bound)


@pytest.mark.parametrize("chunk", [1, 7, 80])
@pytest.mark.parametrize("maker", [attention_a, attention_b])
def test_every_chunking_is_within_the_bound(maker, chunk):
    """The loop rounds exp(s - m_t) with every running max the chunking meets."""
    dt = rf.float16
    q, k, v = _qkv(np.float16, seed=3, spread=2.0)
    kernel = rf.kernel(maker(dt), backend="interpret", interpret_chunk=chunk)
    _one_fused_loop(kernel, q, k, v)
    with np.errstate(all="ignore"):
        expected = maker(dt)(q, k, v)
    s64 = q.astype(np.float64) @ k.astype(np.float64).T * SCALE
    bound = _bound(s64, v, np.float16, _reduction_roundings(maker))
    assert_close(kernel(q, k, v), expected, np.float32, N, bound=bound)


SPECIAL = np.array([0.0, 1.0, -1.0, 30.0, -30.0, np.inf, -np.inf, np.nan], np.float32)


def _special_scores(seed: int):
    rng = np.random.default_rng(seed)
    s = rng.standard_normal((16, 12)).astype(np.float32)
    pick = rng.random((16, 12)) < 0.3
    s[pick] = rng.choice(SPECIAL, int(pick.sum()))
    s[0] = -np.inf                      # a fully masked row: numpy's exp(-inf - -inf) is NaN
    s[1, :6] = -np.inf                  # masked prefix, then finite scores
    s[2, 7] = np.inf
    s[3, 4] = np.nan
    v = rng.standard_normal((12, 5)).astype(np.float16)
    return s, v


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("maker", [scores_a, scores_b])
def test_masked_rows_nan_and_inf_are_numpys(backend, maker):
    body = maker(rf.float16)
    for seed in range(4):
        s, v = _special_scores(seed)
        _one_fused_loop(rf.kernel(body, backend="interpret"), s, v)
        chunking = {"interpret_chunk": 4} if backend == "interpret" else {"block_n": 4}
        actual, expected = run_backend(backend, body, s, v, **chunking)
        assert np.isnan(expected[0][0]).all() and np.isnan(expected[0][2]).all() and np.isnan(expected[0][3]).all()
        bound = _bound(s.astype(np.float64), v, np.float16)
        assert_close(actual[0], expected[0], np.float32, 12, bound=bound)


@pytest.mark.parametrize("backend", BACKENDS)
def test_causal_mask_fuses_and_is_within_the_bound(backend):
    body = causal_b(rf.bfloat16)
    rng = np.random.default_rng(4)
    s = (2.0 * rng.standard_normal((ROWS, N))).astype(np.float32)
    mask = np.tril(np.ones((ROWS, N), bool), k=N - ROWS)
    mask[5] = False                     # a fully masked row: NaN, as numpy
    v = rng.standard_normal((N, D)).astype(ml_dtypes.bfloat16)
    kernel = rf.kernel(body, backend="interpret")
    _one_fused_loop(kernel, s, mask, v)
    actual, expected = run_backend(backend, body, s, mask, v)
    assert np.isnan(expected[0][5]).all()
    bound = _bound(np.where(mask, s, -np.inf).astype(np.float64), v, ml_dtypes.bfloat16)
    assert_close(actual[0], expected[0], np.float32, N, bound=bound)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("maker", [attention_a, attention_b])
def test_split_reduction_merges_the_rounded_states(backend, maker):
    """Flash decoding: slices of the keys in separate programs, merged by the rescale rule."""
    body = maker(rf.float16)
    q, k, v = _qkv(np.float16, seed=5, spread=1.5)
    q = q[:2]
    _one_fused_loop(rf.kernel(body, backend="interpret"), q, k, v)
    actual, expected = run_backend(backend, body, q, k, v, split=3, block_n=8)
    s64 = q.astype(np.float64) @ k.astype(np.float64).T * SCALE
    bound = _bound(s64, v, np.float16, _reduction_roundings(maker))
    assert_close(actual[0], expected[0], np.float32, N, bound=bound)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("body, why", [(unbounded_factor, "not bounded by f16's largest finite value"),
                                       (other_max, "not the very body its running max reduces")])
def test_unbounded_rounding_is_refused_and_correct(backend, body, why):
    rng = np.random.default_rng(6)
    s = rng.standard_normal((8, 20)).astype(np.float32)
    x = (rng.standard_normal((8, 20)) * 3e4).astype(np.float32)
    x[0, 0] = 1e6                       # x·exp(s - m_t) overflows f16 although x·p/l may not
    v = rng.standard_normal((20, 4)).astype(np.float32)
    kernel = rf.kernel(body, backend="interpret")
    (g,) = kernel.lower(s, x, v).groups
    assert why in g.reason and "overflow" in g.reason, g.reason
    assert "NOT fused" in kernel.explain(s, x, v)
    actual, expected = run_backend(backend, body, s, x, v)
    with np.errstate(all="ignore"):
        m = (x if body is other_max else s).astype(np.float64).max(-1, keepdims=True)
        p = np.exp(s.astype(np.float64) - m)
        terms = p / p.sum(-1, keepdims=True) * (x if body is unbounded_factor else 1.0)
    v64 = np.abs(v.astype(np.float64))
    bound = rounded_terms_bound(np.float16, np.abs(terms) @ v64, np.broadcast_to(v64.sum(0), (8, 4)), 20)
    assert_close(actual[0], expected[0], np.float32, 20, bound=bound)


def where_inside_the_cast(s, mask, v):
    """A where (condition on x only) inside the rounding: cast(where(c, a, b)) = where(c, cast(a), cast(b))."""
    m = rf.max(s, axis=-1, keepdims=True)
    p = rf.where(mask, rf.exp(s - m), 0.0)
    l = rf.sum(p, axis=-1, keepdims=True)
    return (p.astype(rf.float16) @ v.astype(rf.float32)) / l


def normalized_where_inside_the_cast(s, mask, v):
    """1/l inside the where inside the cast: refused, as the where's rule refuses 1/l inside a where (numpy's
    0/l is NaN where a row is fully masked, a factor taken out of the where would not be)."""
    m = rf.max(s, axis=-1, keepdims=True)
    p = rf.where(mask, rf.exp(s - m), 0.0)
    l = rf.sum(p, axis=-1, keepdims=True)
    return (p / l).astype(rf.float16) @ v.astype(rf.float32)


def _masked_inputs(seed: int):
    rng = np.random.default_rng(seed)
    s = (2.0 * rng.standard_normal((10, 20))).astype(np.float32)
    mask = rng.random((10, 20)) < 0.7
    v = rng.standard_normal((20, 4)).astype(np.float32)
    mask[1] = False                     # a fully masked row: l = 0, numpy's 0/0 = NaN
    s[2] = -np.inf                      # only -inf scores: NaN
    s[3, :6] = -np.inf                  # a masked prefix
    s[4, 5] = np.nan
    mask[5, 3:] = False
    s[5, :3] = -np.inf                  # only -inf scores survive the mask: numpy gives 0/0 = NaN
    return s, mask, v


def _masked_bound(s, mask, v):
    with np.errstate(all="ignore"):
        p = np.where(mask, np.exp(s - s.max(-1, keepdims=True)), 0.0).astype(np.float64)
        w = np.nan_to_num(p / p.sum(-1, keepdims=True))
    v64 = np.abs(v.astype(np.float64))
    return rounded_terms_bound(np.float16, w @ v64, np.broadcast_to(v64.sum(0), w.shape[:1] + v64.shape[1:]), 20,
                               roundings=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_where_inside_the_cast_fuses_and_keeps_numpys_nan_rows(backend):
    for seed in range(3):
        s, mask, v = _masked_inputs(seed)
        kernel = rf.kernel(where_inside_the_cast, backend="interpret", interpret_chunk=4)
        _one_fused_loop(kernel, s, mask, v)
        text = kernel.explain(s, mask, v)
        assert "H comes out of the where" in text and "rounding moved before the running values are final" in text
        chunking = {"interpret_chunk": 4} if backend == "interpret" else {"block_n": 4}
        actual, expected = run_backend(backend, where_inside_the_cast, s, mask, v, **chunking)
        assert np.isnan(expected[0][[1, 2, 4, 5]]).all()
        assert_close(actual[0], expected[0], np.float32, 20, bound=_masked_bound(s, mask, v))


@pytest.mark.parametrize("backend", BACKENDS)
def test_factor_inside_a_rounded_where_is_refused_and_correct(backend):
    s, mask, v = _masked_inputs(4)
    (g,) = rf.kernel(normalized_where_inside_the_cast, backend="interpret").lower(s, mask, v).groups
    assert "the term where(mask[" in g.reason and "does not factor into where(c(x)" in g.reason, g.reason
    actual, expected = run_backend(backend, normalized_where_inside_the_cast, s, mask, v)
    assert_close(actual[0], expected[0], np.float32, 20, bound=_masked_bound(s, mask, v))


def test_fp8_quantization_keeps_its_own_form():
    """The per-token FP8 GEMM is still the quantization rule (a running absmax inside the cast, rescaled by
    a_prev / a), not a moved rounding."""
    from redfuser.workloads import WORKLOADS
    args = WORKLOADS["fp8_quant_gemm"].make_inputs(np.random.default_rng(0))
    kernel = rf.kernel(WORKLOADS["fp8_quant_gemm"].fn, backend="interpret")
    (g,) = kernel.lower(*args).groups
    assert g.fused and g.reason is None
    text = kernel.explain(*args)
    assert "rounding moved" not in text and "rescaled per chunk by where((a_prev[i0] == -inf) | (a_prev[i0] == 0.0), 1.0, a_prev[i0]) / " in text


def shifted_max(s, v):
    """exp(s - m - 1): the exponent is the running max's body minus m plus a constant <= 0."""
    m = rf.max(s, axis=-1, keepdims=True)
    p = rf.exp(s - m - 1.0)
    l = rf.sum(p, axis=-1, keepdims=True)
    return (p / l).astype(rf.float16) @ v.astype(rf.float32)


def running_min(s, v):
    """exp(m - s) with m the running min of s: at most 1 as well."""
    m = rf.min(s, axis=-1, keepdims=True)
    p = rf.exp(m - s)
    l = rf.sum(p, axis=-1, keepdims=True)
    return (p / l).astype(rf.float16) @ v.astype(rf.float32)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("body", [shifted_max, running_min])
def test_other_exponents_bounded_by_a_running_extremum_fuse(backend, body):
    rng = np.random.default_rng(8)
    s = (2.0 * rng.standard_normal((ROWS, N))).astype(np.float32)
    v = rng.standard_normal((N, D)).astype(np.float16)
    _one_fused_loop(rf.kernel(body, backend="interpret"), s, v)
    actual, expected = run_backend(backend, body, s, v)
    sign = -1.0 if body is running_min else 1.0
    assert_close(actual[0], expected[0], np.float32, N, bound=_bound(sign * s.astype(np.float64), v, np.float16))


def e4m3_probabilities(s, v):
    """Probabilities rounded to float8_e4m3fn (u = 2^-4, subnormals from 2^-9): the same rule and bound."""
    m = rf.max(s, axis=-1, keepdims=True)
    p = rf.exp(s - m)
    l = rf.sum(p, axis=-1, keepdims=True)
    return (p / l).astype(rf.float8_e4m3fn).astype(rf.float32) @ v


@pytest.mark.parametrize("backend", BACKENDS)
def test_e4m3_probabilities_fuse_within_the_bound(backend):
    rng = np.random.default_rng(9)
    s = (2.0 * rng.standard_normal((16, 70))).astype(np.float32)
    v = rng.standard_normal((70, 8)).astype(np.float32)
    s[0] = -np.inf
    s[1, 3] = np.nan
    _one_fused_loop(rf.kernel(e4m3_probabilities, backend="interpret"), s, v)
    actual, expected = run_backend(backend, e4m3_probabilities, s, v)
    assert np.isnan(expected[0][:2]).all()
    assert_close(actual[0], expected[0], np.float32, 70, bound=_bound(s.astype(np.float64), v, ml_dtypes.float8_e4m3fn))


def bounded_factor(s, x, v):
    """x·exp(s - m) rounded to bf16 with x loaded as f16: |x| <= 65504 fits bf16's range, so it fuses."""
    m = rf.max(s, axis=-1, keepdims=True)
    p = rf.exp(s - m)
    l = rf.sum(p, axis=-1, keepdims=True)
    return (x * p / l).astype(rf.bfloat16) @ v.astype(rf.float32)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_factor_whose_type_fits_the_target_fuses(backend):
    rng = np.random.default_rng(10)
    s = rng.standard_normal((8, 20)).astype(np.float32)
    x = (rng.standard_normal((8, 20)) * 3e4).astype(np.float16)
    x[0, 0] = 65504.0
    v = rng.standard_normal((20, 4)).astype(np.float32)
    kernel = rf.kernel(bounded_factor, backend="interpret")
    _one_fused_loop(kernel, s, x, v)
    assert "rounding moved before normalization" in kernel.explain(s, x, v)
    actual, expected = run_backend(backend, bounded_factor, s, x, v)
    with np.errstate(all="ignore"):
        p = np.exp(s.astype(np.float64) - s.max(-1, keepdims=True))
        terms = p / p.sum(-1, keepdims=True) * x.astype(np.float64)
    v64 = np.abs(v.astype(np.float64))
    bound = rounded_terms_bound(ml_dtypes.bfloat16, np.abs(terms) @ v64, np.broadcast_to(v64.sum(0), (8, 4)), 20)
    assert_close(actual[0], expected[0], np.float32, 20, bound=bound)


def test_the_interpreter_rounds_a_16_bit_constant_before_widening_it():
    """Inside a fused loop the interpreter computes 16-bit terms in f32 (`ir.loop.rewrite.widened`), as the
    compiled kernels do; it widened an f16 constant with its Python value, where numpy (and the compiled
    kernels) round it to f16 first: ``x * 0.3`` of f16 is ``x * 0.30005``. The running max then missed the
    max element's own value: ``exp(y - m)`` was 1.032 there, not 1, and ``y == m`` marked nothing. Found by
    a helper."""
    def numerator(x):
        y = x * 0.3
        m = rf.max(y, axis=-1, keepdims=True)
        return rf.exp(y - m), m, y == m

    x = (np.random.default_rng(3).standard_normal((8, 3)) * 100).astype(np.float16)
    x[0] = (200.25, 1.0, -3.0)
    want = numerator(x)
    got = rf.kernel(numerator, backend="interpret")(x)
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[2], want[2])
    assert_close(got[0], want[0], np.float16, 3, roundings=4)


# -- a finished 16-bit result is read rounded ------------------------------------------------------------------
def _scaled_equals_max(x):
    y = x * 0.3
    return y == rf.max(y, axis=-1, keepdims=True)


def _scaled_at_least_max(x):
    y = x * 0.3
    return y >= rf.max(y, axis=-1, keepdims=True)


def _floor_below_max(x):
    y = x * 0.3
    return rf.floor(y - rf.max(y, axis=-1, keepdims=True))


def _ceil_above_min(x):
    y = x * 0.3
    return rf.ceil(y - rf.min(y, axis=-1, keepdims=True))


def _sign_below_max(x):
    y = x * 0.3
    return rf.sign(y - rf.max(y, axis=-1, keepdims=True))


def _gap_to_max_as_bool(x):
    y = x * 0.3
    return (y - rf.max(y, axis=-1, keepdims=True)).astype(rf.bool_)


def _softmax_one_hot(x):
    p = rf.exp(x - rf.max(x, axis=-1, keepdims=True))
    p = p / rf.sum(p, axis=-1, keepdims=True)
    return p == rf.max(p, axis=-1, keepdims=True)


def _two_steps_equal_max(x):
    y = (x * 0.3) * 7
    return y == rf.max(y, axis=-1, keepdims=True)


def _tanh_steps_floor_below_max(x):
    y = rf.tanh(x * 0.01) * 30
    return rf.floor((y - rf.max(y, axis=-1, keepdims=True)) * 64)


def _two_steps_one_hot_beside_softmax(x):
    y = (x * 0.03) * 7
    m = rf.max(y, axis=-1, keepdims=True)
    e = rf.exp(y - m)
    return y == m, e / rf.sum(e, axis=-1, keepdims=True)


READ_ROUNDED = [_scaled_equals_max, _scaled_at_least_max, _floor_below_max, _ceil_above_min, _sign_below_max,
                _gap_to_max_as_bool, _softmax_one_hot, _two_steps_equal_max, _tanh_steps_floor_below_max,
                _two_steps_one_hot_beside_softmax]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("body", READ_ROUNDED, ids=lambda f: f.__name__.strip("_"))
def test_a_fused_16_bit_result_is_read_as_numpy_rounds_it(backend, dtype, body):
    """A max or min the program holds in f16 or bf16 is read after the loop rounded to that type, as numpy's
    result is (a sum or epilogue value where it is a comparison's operand). The running state is f32: compared with operands rounded as numpy rounds them
    (`schedule.exprs._decided`), the unrounded f32 max of ``x * 0.3`` equalled no element (f16 ``x = [196,
    1]``: 58.8125 against 58.8096) and ``floor(y - max y)`` gave -1 for numpy's 0; a softmax's one-hot ``p ==
    max(p)`` marked nothing in any row (its max is the epilogue ``max(e) / l``, read unrounded). Bool and
    integral results: numpy's exactly. bf16 ``sign`` returns its operand where it is ±0, and returned the f32
    difference there (-0.047 for numpy's 0): a select's branch that is the value its condition compares is
    read as the comparison read it. A max of values computed in two or more steps (``(x * 0.3) * 7``) is
    numpy's max only where its terms round as numpy's do: it runs over them so (`fusion.numpy_extrema`);
    before, ``y == max(y)`` marked no element in 20-30% of rows. Beside it a softmax's probabilities are
    the softmax's alone (to a 16-bit ulp: its exponentials are not shared with the loop's where the one-hot
    is computed beside them), whatever kernels the schedule splits the program into."""
    np_dtype = DTYPES[dtype][1]
    rng = np.random.default_rng(7)
    rows, n = (4, 40) if backend == "simulate" else (32, 150)
    x = (rng.standard_normal((rows, n)) * (3 if body is _softmax_one_hot else 100)).astype(np_dtype)
    x[0, :2] = [196.0, 1.0]
    actual, expected = run_backend(backend, body, x)
    assert actual[0].dtype == expected[0].dtype
    np.testing.assert_array_equal(actual[0], expected[0])
    if body in (_scaled_equals_max, _softmax_one_hot, _two_steps_equal_max, _two_steps_one_hot_beside_softmax):
        assert expected[0].any(axis=-1).all()     # (the data marks a max in every row)
    if body is _two_steps_one_hot_beside_softmax:    # (the softmax is the one computed without the one-hot)
        (alone,), _ = run_backend(backend, lambda x: _two_steps_one_hot_beside_softmax(x)[1], x)
        assert_close(actual[1], alone, np_dtype, n, roundings=2)


def test_a_softmax_max_of_16_bit_inputs_is_not_rounded_again():
    """The running max of f16 inputs is an f16 value already (`states._already_narrow`): the sweep reuses the
    loop's exponentials of a one-chunk row instead of computing them again from a rounded copy of the max."""
    x = np.random.default_rng(0).standard_normal((8, 256)).astype(np.float16)
    def softmax(x):
        e = rf.exp(x - rf.max(x, axis=-1, keepdims=True))
        return e / rf.sum(e, axis=-1, keepdims=True)
    tile = str(rf.kernel(softmax, backend="cpu").lower(x).stages["tile"])
    assert tile.count("= exp2") == 2, tile      # (the rescale's and the row's, as before)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_select_returns_the_value_its_condition_compared_as_the_comparison_read_it(backend):
    """f16 ``sign(y - y)`` with ``y = x * 1000``: numpy's ``y`` overflows to ±inf at |x| = 70, so ``y - y`` is
    NaN and its sign NaN. The comparisons inside ``sign`` read the difference rounded as numpy rounds it (NaN:
    neither < 0, > 0 nor == 0), and its NaN branch returned the f32 difference, 0."""
    def body(x):
        y = x * 1000.0
        return rf.sign(y - y)
    x = np.array([[1.0, 70.0, -70.0, 0.5, -0.0]], np.float16)
    actual, expected = run_backend(backend, body, x)
    assert np.isnan(expected[0][0, 1:3]).all()
    np.testing.assert_array_equal(actual[0], expected[0])


def _tempered_softmax(logits):
    x = logits * 1.5                      # a 16-bit value the kernel computes, not one it loads
    m = rf.max(x, axis=-1, keepdims=True)
    e = rf.exp(x - m)
    return e / rf.sum(e, axis=-1, keepdims=True)


def _softmax_of(x):
    m = rf.max(x, axis=-1, keepdims=True)
    e = rf.exp(x - m)
    return e / rf.sum(e, axis=-1, keepdims=True)


def _tempered_reference(body, logits):
    """`body` of ``logits`` (which computes ``x = logits * 1.5`` and takes its max) in float64 from numpy's
    rounded ``x`` on: the kernels compute ``x`` as numpy does where it meets its max (`fusion.numpy_extrema`),
    and numpy's own bf16 sums are too coarse to check them (docs/testing.md, "Which reference")."""
    return wide_reference(body, logits * 1.5)


def _below_own_max(logits):
    x = logits * 1.5
    return x - rf.max(x, axis=-1, keepdims=True)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_a_max_of_computed_16_bit_values_shifts_the_sum_and_the_epilogue_alike(backend, dtype):
    """(Found by a helper.) The loop sums ``exp(x - m)`` with the running f32 max of the computed ``x``; the
    epilogue read ``m`` rounded to its type, so each probability of a bf16 softmax of ``logits * 1.5`` was off
    by ``exp(m - bf16(m))``, up to 1.65 (every backend: the interpreter rounded the finished max too). Now the
    epilogue's arithmetic reads the f32 max the loop used; ``x - max(x)`` is then exactly 0 at the max, as in
    numpy."""
    np_dtype = DTYPES[dtype][1]
    rng = np.random.default_rng(1)
    rows, n = (8, 48) if backend == "simulate" else (16, 64)
    logits = (rng.standard_normal((rows, n)) * 4 + 20).astype(np_dtype)
    logits[rows // 2:] += 80
    (p,), _ = run_backend(backend, _tempered_softmax, logits)
    # (against the body in float64 from numpy's x on: numpy adds bf16 one term at a time in bf16, 2.4% off here)
    assert_close(p, _tempered_reference(_softmax_of, logits), np_dtype, n, roundings=2)
    assert p.astype(np.float64).max() <= 1.0
    np.testing.assert_allclose(p.astype(np.float64).sum(axis=-1), 1.0, atol=n * 2.0 ** -8)
    (shifted,), _ = run_backend(backend, _below_own_max, logits)
    np.testing.assert_array_equal(shifted.astype(np.float32).max(axis=-1), 0.0)


def _attention_f16(q, k, v):
    s = q @ rf.swapaxes(k, -1, -2)
    m = rf.max(s, axis=-1, keepdims=True)
    p = rf.exp(s - m)
    return (p / rf.sum(p, axis=-1, keepdims=True)) @ v


def _f16_centred_squares(x):
    d = x - rf.mean(x, axis=-1, keepdims=True)
    return rf.sum(d * d, axis=-1)


def test_a_fused_loops_own_16_bit_sums_keep_their_f32_range_in_the_interpreter():
    """The interpreter rounded every finished 16-bit sum to its type after the loop, fusion's own states too:
    attention's unnormalized ``out_acc`` over 8192 keys of values 10 (81920) was inf in f16, so the result was
    inf where numpy's is 10; a centred sum of squares over 65536 f16 values was NaN (its count, 65536, inf in
    f16). The compiled kernels keep them in f32, and so does the interpreter now (`held_results`)."""
    n = 8192
    q, k = np.zeros((1, 16, 16), np.float16), np.zeros((1, n, 16), np.float16)
    v = np.full((1, n, 16), 10.0, np.float16)
    (out,), (want,) = run_backend("interpret", _attention_f16, q, k, v)
    np.testing.assert_array_equal(out, want)
    x = (0.01 * np.random.default_rng(3).standard_normal((1, 65536))).astype(np.float16)
    (got,), (want,) = run_backend("interpret", _f16_centred_squares, x)
    assert_close(got, want, np.float16, x.shape[-1])


def _top_probabilities(logits):
    x = logits * 1.5
    m = rf.max(x, axis=-1, keepdims=True)
    e = rf.exp(x - m)
    return rf.topk(e / rf.sum(e, axis=-1, keepdims=True), 4, axis=-1)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_a_max_that_a_later_kernel_reads_is_the_one_its_sum_used(backend, dtype):
    """(Found by a helper.) A later kernel reads a 16-bit max from memory, rounded: a softmax of computed bf16
    values split in two (its probabilities written by a kernel of their own), or before a top-k, divided ``exp(x
    - bf16(m))`` by the sum of ``exp(x - m)`` taken with the f32 max: probabilities up to 1.65 on cpu and
    simulate (top-1 0.6 for numpy's 1). Such a max now runs over numpy's values, so every kernel reads the same
    one (`numpy_valued_extrema`)."""
    np_dtype = DTYPES[dtype][1]
    rng = np.random.default_rng(1)
    rows, n = (4, 96) if backend == "simulate" else (8, 300)
    logits = (rng.standard_normal((rows, n)) * 4 + 20).astype(np_dtype)
    logits[rows // 2:] += 80
    (p,), _ = run_backend(backend, _tempered_softmax, logits, **({} if backend == "interpret" else {"split": 2}))
    assert p.astype(np.float64).max() <= 1.0
    assert_close(p, _tempered_reference(_softmax_of, logits), np_dtype, n, roundings=2)
    (top, idx), _ = run_backend(backend, _top_probabilities, logits)
    want = _tempered_reference(lambda x: rf.topk(_softmax_of(x), 4, axis=-1), logits)[0]
    assert top.astype(np.float64).max() <= 1.0
    assert_close(top, want, np_dtype, n, roundings=2)


def _softmax_with_a_scaled_16_bit_bias(x, bias):
    s = x + bias * 300.7
    m = rf.max(s, axis=-1, keepdims=True)
    p = rf.exp(s - m)
    return p / rf.sum(p, axis=-1, keepdims=True)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_a_16_bit_value_computed_then_widened_is_one_value_in_the_max_and_the_sum(backend, dtype):
    """numpy rounds ``bias * 300.7`` to the bias's 16-bit type (bf16 300, f16 300.75) before adding f32 ``x``;
    the kernels round it at the widening cast. The algebra saw through that cast, and the fused sum's exponent
    read ``300.7 * f32(bias)`` while the max read the rounded value: rows summed to 0.5 (bf16) or 1.05 (f16)
    on every backend (found by a helper). A widening cast of a computed 16-bit value is one atom now."""
    np_dtype = DTYPES[dtype][1]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 40)).astype(np.float32)
    bias = (rng.random((4, 40)) < 0.3).astype(np_dtype)
    _one_fused_loop(rf.kernel(_softmax_with_a_scaled_16_bit_bias, backend="interpret"), x, bias)
    actual, expected = run_backend(backend, _softmax_with_a_scaled_16_bit_bias, x, bias)
    assert_close(actual[0], expected[0], np.float32, 40)


def _probabilities_of_a_widened_bf16_product(xb):
    y = (xb * 0.3).astype(rf.float32) * 7
    m = rf.max(y, axis=-1, keepdims=True)
    p = rf.exp(y - m)
    l = rf.sum(p, axis=-1, keepdims=True)
    return rf.sum((p / l).astype(rf.bfloat16), axis=-1), rf.max(p.astype(rf.float16), axis=-1) / l[:, 0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_widened_16_bit_product_is_rounded_in_every_fused_term(backend):
    """``(xb * 0.3).astype(f32)`` of bf16 ``xb``: numpy rounds the product to bf16 before widening, and the
    compiled kernels do at the cast. The interpreter widened the product to f32 inside a fused term that holds
    a narrowing cast (``sum((p / l).astype(bf16))``), so that term's exponent was no longer ``y - max(y)``:
    rows summed to 1.039, ``max(p16) / l`` was 5% high (found by a helper)."""
    xb = (np.random.default_rng(4).standard_normal((6, 100)) * 4).astype(ml_dtypes.bfloat16)
    actual, expected = run_backend(backend, _probabilities_of_a_widened_bf16_product, xb)
    for a, e in zip(actual, expected):
        assert np.abs(a.astype(np.float64) - e.astype(np.float64)).max() <= 0.01, (a, e)


def _softmax_and_its_shift(x):
    y = x * 0.75
    m = rf.max(y, axis=-1, keepdims=True)
    return y - m, rf.exp(y - m) / rf.sum(rf.exp(y - m), axis=-1, keepdims=True)


def _softmax_with_a_sum_over_the_other_axis(x):
    y = x * 3.0
    m = rf.max(y, axis=-1, keepdims=True)
    return rf.sum(rf.exp(y - m), axis=-1), rf.sum(y - m, axis=0)


def _two_softmaxes_of_computed_values(a, b):
    x, y = a + b, a - b
    mx = rf.max(x, axis=-1, keepdims=True)
    my = rf.min(y, axis=-1, keepdims=True)
    px = rf.exp(x - mx)
    qy = rf.exp(my - y)
    return px / rf.sum(px, axis=-1, keepdims=True), qy / rf.sum(qy, axis=-1, keepdims=True)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_values_beside_a_max_a_later_kernel_reads_are_numpys(backend, dtype):
    """(Found by helpers.) A 16-bit max that a later kernel reads runs over numpy's rounded ``y``
    (`numpy_valued_extrema`); the terms beside it computed ``y`` in f32, so ``exp(y - m)`` at the max was
    ``exp`` of half an ulp of ``y``: a row of one bf16 value 3e38 gave a NaN softmax on cpu (its probabilities
    written by a kernel of their own, ``y - m`` = -6.6e35 for numpy's 0), and the sum beside a max that a
    reduction over the other axis reads was 0.94 for a row whose max term alone is 1. Every value equal to
    the max's term is now computed as numpy computes it where it meets that max (`beside_numpy_extrema`),
    also where fusion wrote it in another order (``my - (a - b)`` as ``b + my - a``)."""
    np_dtype = DTYPES[dtype][1]
    big = 65504.0 if dtype == "f16" else 3.0e38
    x = np.array([[big], [-3.0], [1001.0]]).astype(np_dtype)
    actual, expected = run_backend(backend, _softmax_and_its_shift, x)
    for a, e in zip(actual, expected):
        np.testing.assert_array_equal(a.astype(np.float64), e.astype(np.float64))

    x = (np.random.default_rng(0).standard_normal((4, 7)) * 40).astype(np_dtype)
    actual, expected = run_backend(backend, _softmax_with_a_sum_over_the_other_axis, x)
    assert actual[0].astype(np.float64).min() >= 1.0       # the max's own term is exp(0) = 1
    assert_close(actual[0], expected[0], np_dtype, 7, roundings=2)

    rng = np.random.default_rng(2)
    a, b = ((rng.standard_normal((4, 2)) * 20).astype(np_dtype) for _ in range(2))
    actual, expected = run_backend(backend, _two_softmaxes_of_computed_values, a, b)
    for p, e in zip(actual, expected):
        # (where the max is not numpy's, the kernel's ``y`` is the f32 one, and numpy's differs from it by half an
        # ulp of ``y``: a few percent of a probability at |y| ~ 40; the rows' sums are the invariant)
        assert p.astype(np.float64).max() <= 1.0
        assert_close(p.astype(np.float64).sum(-1), np.ones(4), np_dtype, 2, roundings=2)
        assert np.abs(p.astype(np.float64) - e.astype(np.float64)).max() <= 0.05


def _argmax_beside_a_one_hot(xb):
    y = xb * 0.3
    m = rf.max(y, axis=-1, keepdims=True)
    p = rf.exp(y - m)
    q = p / rf.sum(p, axis=-1, keepdims=True)
    return rf.argmax(q, axis=-1), q >= rf.max(q, axis=-1, keepdims=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_epilogue_value_a_later_kernel_reads_is_one_value_in_every_kernel(backend):
    """(Found by a helper.) bf16 ``argmax(q)`` beside ``q >= max(q)`` of a softmax ``q``: the later kernels
    read ``l`` rounded, as numpy holds it, while the loop's own kernel divided ``max(e)`` by its f32 ``l``, so
    ``max(q)`` was no element's value and the one-hot marked nothing in half the rows (cpu, simulate). A 16-bit
    epilogue value a later kernel reads is read as it is stored in its own kernel too."""
    xb = (np.random.default_rng(4).standard_normal((6, 100)) * 4).astype(ml_dtypes.bfloat16)
    actual, expected = run_backend(backend, _argmax_beside_a_one_hot, xb)
    np.testing.assert_array_equal(actual[0], expected[0])
    np.testing.assert_array_equal(actual[1], expected[1])


def _softmax_of_a_value_shifted_by_a_sum(x, z):
    y = x * 0.7 - rf.sum(z, axis=-1, keepdims=True)
    m = rf.max(y, axis=-1, keepdims=True)
    return y - m, rf.sum(rf.exp(y - m), axis=-1, keepdims=True), m, y


@pytest.mark.parametrize("np_dtype", [np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_finished_sum_a_later_kernel_reads_is_one_value_in_every_kernel(backend, np_dtype):
    """(Found by a helper.) ``y = x * 0.7 - sum(z)`` beside ``y - max(y)``: the program splits in kernels, the
    first finishing ``max(y)`` as ``max(x) * 0.7 - sum`` with its f32 sum while the later ones compute ``y``
    from the stored, rounded sum, so bf16 ``y - max(y)`` was -0.5 at the max and a softmax's sum 0.88 (cpu,
    simulate). A finished 16-bit sum a later kernel reads is read as it is stored in its own kernel too."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((16, 48)) * 4).astype(np_dtype)
    z = (rng.standard_normal((16, 48)) * 4).astype(np_dtype)
    (shift, l, m, _), (want_shift, _, want_m, _) = run_backend(backend, _softmax_of_a_value_shifted_by_a_sum, x, z)
    assert shift.astype(np.float64).max(axis=-1).tolist() == [0.0] * 16    # the max is one of the y it meets
    assert l.astype(np.float64).min() >= 1.0
    # (numpy's 16-bit sum rounds each addition, the kernel's once: errors scale with the sum of |z|)
    scale = float(np.abs(z.astype(np.float64)).sum(axis=-1).max())
    assert_close(m, want_m, np_dtype, 48, scale=scale, roundings=3)
    assert_close(shift, want_shift, np_dtype, 48, scale=scale, roundings=3)


def _softmax_sum_of_centred_values(x):
    y = x - rf.mean(x, axis=-1, keepdims=True)
    m = rf.max(y, axis=-1, keepdims=True)
    return m, rf.sum(rf.exp(y - m), axis=-1, keepdims=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_max_finished_after_its_loop_meets_its_values_as_numpys(backend):
    """(Found by a helper.) f16 ``y = x - mean(x)``: the max is ``max(x) - mean`` rounded once after the loop
    (numpy's max of ``y``, rounding being monotone), and the sum, a second pass, computed ``exp(y - m)`` with
    the f32 ``y``: ``l`` 0.95-1.29 for numpy's 1-1.37 (each row's max term alone is 1). ``y`` is numpy's
    where it meets such a max too (`fusion.numpy_extrema`)."""
    x = (np.random.default_rng(0).standard_normal((8, 64)) * 100).astype(np.float16)
    (m, l), (want_m, want_l) = run_backend(backend, _softmax_sum_of_centred_values, x)
    np.testing.assert_array_equal(m, want_m)
    assert l.astype(np.float64).min() >= 1.0
    assert_close(l, want_l, np.float16, 64)


def _five_x(x):
    return 2 * x + 3 * x


def _negated_scaled(x):
    return -x * 1.5


def _scaled_minus_its_mean(x):
    y = x * 0.3
    return y - rf.mean(y, axis=-1, keepdims=True)


def _tanh_scaled_minus_a_mean(x):
    return rf.tanh(x) * 30 - rf.mean(x, axis=-1, keepdims=True)


def _scaled_minus_its_own_max(x):
    y = x * 0.7
    return y - rf.max(y, axis=-1, keepdims=True)


def _scaled_plus_a_max(x):
    return x * 0.7 + rf.max(x, axis=-1, keepdims=True)


def _clipped_scaled(x):
    return rf.minimum(x, 2.5) * 0.7


def _through_e4m3(x):
    return x.astype(rf.float8_e4m3fn).astype(x.dtype) * 0.7


NOT_MATCHED = (_clipped_scaled, _through_e4m3)
"""Values that agree with ``x * 0.7`` near 1 but are not it: their maxima keep the f32 ``y`` (docs/fusion.md)."""


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("make_y", [_five_x, _negated_scaled, _scaled_minus_its_mean, _tanh_scaled_minus_a_mean,
                                    _scaled_minus_its_own_max, _scaled_plus_a_max, _clipped_scaled, _through_e4m3],
                         ids=lambda f: f.__name__.strip("_"))
def test_a_max_meets_its_values_however_fusion_wrote_them(backend, dtype, make_y):
    """(Found by a helper.) Fusion's algebra writes ``2x + 3x`` as ``5x`` and ``-x * 1.5`` as ``-1.5 x`` in the
    loop's sum, and finishes ``max(x * 0.3 - mu)`` as ``max(x) * 0.3 - mu``: matched by the form of ``y``, those
    meetings kept the f32 ``y`` against numpy's max, and ``sum(exp(y - max y))`` was 0.02-20 for numpy's >= 1,
    probabilities up to 1.65, ``y - max(y)`` -0.58..0.46 at the max. Meetings are matched by value now
    (`fusion.numpy_extrema`): ``y - max(y)`` is exactly 0 at the max, as numpy's. A second helper found the
    value check too narrow (``minimum(x, 2.5) * 0.7`` and a value rounded through e4m3 taken for ``x * 0.7``:
    the user's ``x * 0.7 - max`` became 0 for numpy's 3.15) and meetings beside a second max (``x * 0.7 -
    max(x * 0.7)``, ``x * 0.7 + max(x)``) left in f32: ``y - max(y)`` up to 0.013 at the max."""
    np_dtype = DTYPES[dtype][1]
    rows, n = (3, 24) if backend == "simulate" else (8, 64)
    x = (np.random.default_rng(5).standard_normal((rows, n)) * 4).astype(np_dtype)

    def body(x):
        y = make_y(x)
        m = rf.max(y, axis=-1, keepdims=True)
        e = rf.exp(y - m)
        return y - m, rf.sum(e, axis=-1, keepdims=True), e / rf.sum(e, axis=-1, keepdims=True)

    (shift, l, p), (want_shift, _, _) = run_backend(backend, body, x)
    np.testing.assert_array_equal(shift.astype(np.float64).max(axis=-1), 0.0)
    if make_y not in NOT_MATCHED and (dtype == "f16" or "mean" not in make_y.__name__):
        np.testing.assert_array_equal(shift, want_shift)     # (numpy's bf16 mean adds in bf16: another y)
    assert l.astype(np.float64).min() >= 1.0
    assert p.astype(np.float64).max() <= 1.0
    assert_close(p, wide_reference(_softmax_of, make_y(x)), np_dtype, n, roundings=2)


def _max_of_a_masked_value_beside_its_input(x):
    y = rf.where(rf.arange(x.shape[-1]), x, -rf.inf)
    return x - rf.max(y, axis=-1, keepdims=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_meeting_whose_value_reads_the_loop_position_is_left_as_it_was(backend):
    """(Fuzz seed 108, example 651, shrunk.) ``y = where(arange(n), x, -inf)`` met by ``x - max(y)`` after the
    loop was put there with the loop's position in it: a VerifyError ("value of axis j used outside its
    loop") on every backend. A ``y`` that reads a position is not matched (its max keeps the f32 ``y``)."""
    x = np.array([[-3.0, 0.0, 2.5, -1.0]], np.float16)
    (got,), (want,) = run_backend(backend, _max_of_a_masked_value_beside_its_input, x)
    np.testing.assert_array_equal(got, want)


def _greedy_log_probability(logits):
    x = logits * 1.5
    m = rf.max(x, axis=-1, keepdims=True)
    lse = m + rf.log(rf.sum(rf.exp(x - m), axis=-1, keepdims=True))
    return rf.take_along_axis(x - lse, rf.argmax(x, axis=-1)[:, None], axis=-1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_meeting_beside_other_terms_is_matched_by_its_own_terms(backend):
    """``x - (m + log(l))`` meets the max with ``log(l)`` beside ``x``: the terms reading ``x`` are matched
    and the others kept. Unmatched, the max stayed f32 while the gather's kernel read it stored, and the bf16
    greedy token's log-probability came out +0.014 (numpy: at most 0; a helper's reproducer of an earlier
    session, broken by this pass's first version)."""
    rng = np.random.default_rng(12)
    rng.standard_normal((16, 256))
    n = 64 if backend == "simulate" else 256
    logits = (rng.standard_normal((16, 256)) * 4 + 30).astype(ml_dtypes.bfloat16)[:, :n]
    (got,), _ = run_backend(backend, _greedy_log_probability, logits)
    assert got.astype(np.float64).max() <= 0.0
