"""Cascades users write, found computing other numbers than their numpy bodies (trying the project as a new
user would, 2026-12-05), each on every backend against the body run on numpy arrays."""
import numpy as np
import pytest

import redfuser as rf
from redfuser.testing import assert_close

BACKENDS = ("interpret", "cpu", "simulate")


def _variance_under_softmax(x):
    m = rf.max(x, axis=-1, keepdims=True)
    p = rf.exp(x - m)
    l = rf.sum(p, axis=-1, keepdims=True)  # noqa: E741
    mu = rf.sum(p * x, axis=-1, keepdims=True) / l
    return rf.sum(p * (x - mu) ** 2, axis=-1) / l[:, 0]


def _squares_about_a_mean_over_a_count(x, w):
    mu = rf.sum(x, axis=-1, keepdims=True) / rf.sum(w, axis=-1, keepdims=True)
    return rf.sum((x - mu) ** 2, axis=-1)


def _weighted_covariance(x, y, w):
    sw = rf.sum(w, axis=-1, keepdims=True)
    mx = rf.sum(w * x, axis=-1, keepdims=True) / sw
    my = rf.sum(w * y, axis=-1, keepdims=True) / sw
    return rf.sum(w * (x - mx) * (y - my), axis=-1) / sw[:, 0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_mean_that_is_a_quotient_of_two_sums_is_centred(backend):
    """A mean written as one earlier result over another (``sum(p x) / sum(p)``, ``sum(x) / sum(w)``): the
    algebra split ``S / W`` into ``S W^-1``, so the pair ``x^2`` beside ``x S W^-1`` was no difference of
    ``x`` and one earlier value, the sum was expanded into three, and they cancelled: a softmax-weighted
    variance near 1000 gave 0.76 for 0.67, squares about a mean near 1e4 gave -1536 for 84, a weighted
    covariance 20.6 for 0.1. ``S / W`` is now one earlier value: an unweighted sum about it is centred on a
    running mean of the compiler's own, and a weighted one (softmax or other weights), whose weights that
    mean does not follow, is a second pass (logits spread by 1e3: 0.16 off for numpy's 0.09 when it was
    centred so, fuzz seed 75, example 937; weights -2 and 65504, fuzz seed 81, example 605)."""
    rng = np.random.default_rng(0)
    k = rf.kernel(_variance_under_softmax, backend=backend)
    for x in ((1000 + rng.standard_normal((2, 64))).astype(np.float32),
              (rng.standard_normal((33, 5)) * 1000).astype(np.float32)):
        assert_close(k(x), _variance_under_softmax(x), np.float32, x.shape[-1])
    assert "second pass" in k.explain(x)

    x = (1e4 + rng.standard_normal((2, 64))).astype(np.float32)
    w = np.ones((2, 64), np.float32)
    kc = rf.kernel(_squares_about_a_mean_over_a_count, backend=backend)
    assert_close(kc(x, w), _squares_about_a_mean_over_a_count(x, w), np.float32, 64)
    assert "centred on its own running mean" in kc.explain(x, w)

    y = (1e4 + rng.standard_normal((2, 64))).astype(np.float32)
    w = rng.uniform(0.5, 1, (2, 64)).astype(np.float32)
    got = rf.kernel(_weighted_covariance, backend=backend)(x, y, w)
    exact = _weighted_covariance(*(a.astype(np.float64) for a in (x, y, w)))
    # the reference rounds each mean to f32 (an error up to eps |mean|), which every way of computing the
    # covariance from those means carries, times |x - mean| <= 4: the exact value is held to that
    atol = 2 * 4 * np.finfo(np.float32).eps * 1e4
    np.testing.assert_allclose(got, exact, rtol=0, atol=atol)
    np.testing.assert_allclose(_weighted_covariance(x, y, w), exact, rtol=0, atol=atol)   # (the rule holds numpy)


def _kl_of_shifted_logits(a, b):
    ma = rf.max(a, axis=-1, keepdims=True)
    mb = rf.max(b, axis=-1, keepdims=True)
    p = rf.exp(a - ma)
    return rf.sum(p * ((a - ma) - (b - mb)), axis=-1)


def _kl_of_log_softmaxes(a, b):
    lpa = a - rf.max(a, axis=-1, keepdims=True)
    lpa = lpa - rf.log(rf.sum(rf.exp(lpa), axis=-1, keepdims=True))
    lpb = b - rf.max(b, axis=-1, keepdims=True)
    lpb = lpb - rf.log(rf.sum(rf.exp(lpb), axis=-1, keepdims=True))
    return rf.sum(rf.exp(lpa) * (lpa - lpb), axis=-1)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("body", [_kl_of_shifted_logits, _kl_of_log_softmaxes])
def test_a_difference_with_another_cascades_result_is_summed_as_written(backend, body):
    """A KL divergence: ``b - max(b)`` (``max(b)`` a result of another cascade, known before this loop) was
    distributed out of ``(a - ma) - (b - mb)`` into ``sum p b - mb sum p``, which cancel for logits near
    -1e4 (errors of 1e-3 on 4.76). A sum of reduced values and values known before the loop is kept whole
    as a term, as it is as a factor, and is computed element by element as the body writes it."""
    rng = np.random.default_rng(3)
    a = (-1e4 + rng.standard_normal((2, 200))).astype(np.float32)
    b = (-1e4 + rng.standard_normal((2, 200))).astype(np.float32)
    assert_close(rf.kernel(body, backend=backend)(a, b), body(a, b), np.float32, 200)


def _entropy(x):
    m = rf.max(x, axis=-1, keepdims=True)
    p = rf.exp(x - m)
    q = p / rf.sum(p, axis=-1, keepdims=True)
    return -rf.sum(q * rf.log(q), axis=-1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_entropy_is_nan_where_a_probability_underflows_as_in_the_reference(backend):
    """``q log q`` with ``q = exp(x - m) / l``: numpy's ``q`` underflows to 0 for a logit 200 below the max, and
    ``0 · log 0`` is NaN; the algebra's ``log q = (x - m) - log l`` is finite there, and the fused loop
    returned 0.58. The body is now also evaluated, after the loop, at the element farthest from the max
    (the first to underflow), and the result is NaN where the reference's term is."""
    x = np.array([[0.0, -200.0, 1.0], [0.0, -20.0, 1.0], [0.0, -np.inf, 1.0], [-1e4, -1e4 - 100, -1e4 - 0.5]],
                 np.float32)
    with np.errstate(all="ignore"):
        want = _entropy(x)
        got = rf.kernel(_entropy, backend=backend)(x)
    assert np.isnan(want[[0, 2]]).all() and np.isfinite(want[[1, 3]]).all()
    assert_close(got, want, np.float32, 3)


def _softmax(x):
    m = rf.max(x, axis=-1, keepdims=True)
    return rf.exp(x - m) / rf.sum(rf.exp(x - m), axis=-1, keepdims=True)


def _sum_log_p(x):
    return rf.sum(rf.log(_softmax(x)), axis=-1)


def _focal_loss(x):
    p = _softmax(x)
    return -rf.sum((1 - p) ** 2 * rf.log(p), axis=-1)


def _sum_of_squared_log_p(x):
    return rf.sum(rf.log(_softmax(x)) ** 2, axis=-1)


@pytest.mark.parametrize("body", [_sum_log_p, _focal_loss, _sum_of_squared_log_p])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_sum_of_log_probabilities_is_infinite_where_a_probability_underflows(backend, body):
    """``log p`` with ``p = exp(x - m) / l`` is ``-inf`` in numpy where ``p`` underflows to 0 (a logit 1000 below
    the max in f32, about 17 in f16), so a sum of it, a focal loss or a sum of its squares is infinite; the
    algebra's ``log p = (x - m) - log l`` is finite there, and the fused loop returned -1006.6 for numpy's
    -inf. The body is now evaluated after the loop at the element farthest from the max, as for an entropy's
    NaN, and an infinity there is the sum's. Found by a helper."""
    for dtype, gap in ((np.float32, 1000.0), (np.float16, 30.0)):
        x = np.array([[0.0, -gap, 1.0, 2.0], [0.0, -1.0, 1.0, 2.0], [0.0, -np.inf, 1.0, 2.0]], dtype)
        with np.errstate(all="ignore"):
            want = body(x)
            got = rf.kernel(body, backend=backend)(x)
        assert np.isinf(want[[0, 2]]).all() and np.isfinite(want[1])
        assert_close(got, want, dtype, 4, roundings=8)


def _soft_target_cross_entropy(x, t):
    return -rf.sum(t * rf.log(_softmax(x)), axis=-1)


@pytest.mark.xfail(strict=True, reason="docs/fusion.md, 'Limits': where the body reads another array along the row "
                   "(t * log p), the element farthest from the max does not tell the reference's infinity or NaN")
def test_a_weighted_sum_of_log_probabilities_where_a_probability_underflows():
    x = np.array([[0.0, -1000.0, 1.0, 2.0]], np.float32)
    t = np.array([[0.5, 0.0, 0.25, 0.25]], np.float32)
    with np.errstate(all="ignore"):
        want = _soft_target_cross_entropy(x, t)
    assert np.isnan(want).all()
    assert_close(rf.kernel(_soft_target_cross_entropy, backend="cpu")(x, t), want, np.float32, 4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_f16_entropy_is_nan_where_the_f16_probability_underflows(backend):
    """The same with f16 logits: the reference's ``q`` is f16 and underflows for a logit 20 below the max,
    which the compiled kernels' f32 ``q`` does not (they returned 3e-07 for numpy's NaN, on ordinary logits of
    std 3 too); the body at the farthest element is now rounded to f16 at each step, as numpy rounds it."""
    x = np.zeros((3, 8), np.float16)
    x[0, 0] = 20.0
    x[1, 0] = 5.0
    x[2] = np.random.default_rng(0).standard_normal(8).astype(np.float16) * 3
    x[2, 3] = 21.0
    with np.errstate(all="ignore"):
        want = _entropy(x)
        got = rf.kernel(_entropy, backend=backend)(x)
    assert np.isnan(want[[0, 2]]).all() and np.isfinite(want[1])
    assert_close(got, want, np.float16, 8)


def _softmax_in_base_2(x):
    s = x * 1.4426950408889634
    m = rf.max(s, axis=-1, keepdims=True)
    p = rf.exp2(s - m)
    return p / rf.sum(p, axis=-1, keepdims=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_sum_of_one_term_accumulates_the_body_as_written(backend):
    """A softmax in base 2 (``exp2(x log2(e) - m)``, as fast kernels write it): the algebra reads ``exp2(a)`` as
    ``exp(a ln 2)`` and ``x log2(e) ln 2`` as ``x``, so the loop summed ``exp(x - 0.693 m)``, without numpy's
    rounding of ``x log2(e)``, while the numerator kept it: rows near -1000 summed to 1 + 2.4e-5 (near 1e4,
    3e-4). A sum of one separable term now accumulates the body as written (its deferred factors 1), as a
    sum of several already did."""
    x = np.array([[-1000.0, -1000.1, -1003.0, -1010.0], [1e4, 1e4 - 0.3, 1e4 - 1.7, 1e4 + 0.9]], np.float32)
    got = rf.kernel(_softmax_in_base_2, backend=backend)(x)
    assert_close(got, _softmax_in_base_2(x), np.float32, 4)
    assert abs(got.astype(np.float64).sum(-1) - 1).max() < 4 * np.finfo(np.float32).eps


def _max_scaled_norm(x):
    a = rf.max(rf.abs(x), axis=-1, keepdims=True)
    return a[:, 0] * rf.sqrt(rf.sum((x / a) ** 2, axis=-1))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_division_by_a_running_max_is_applied_online(backend):
    """A "safe" norm ``a sqrt(sum((x / a)^2))`` with ``a = max(abs(x))``: the division was deferred, the loop
    summed ``x^2``, which underflows below about 1e-19 and overflows above 1e19, and ``0 · inf`` gave NaN
    where numpy gives the norm (the very rows the scaling is for). The term now divides by the running max,
    each chunk rescaled by ``(a_prev / a)^2``; a row of zeros is NaN as in numpy (``0 / 0``)."""
    x = np.array([[3e-25, 4e-25], [3e25, 4e25], [3.0, 4.0], [0.0, 0.0], [1.0, np.inf]], np.float32)
    y = (np.random.default_rng(0).standard_normal((3, 300)) * np.array([[1e-30], [1.0], [1e30]])).astype(np.float32)
    options = {"interpret_chunk": 7} if backend == "interpret" else {}
    k = rf.kernel(_max_scaled_norm, backend=backend, **options)
    with np.errstate(all="ignore"):
        assert_close(k(x), _max_scaled_norm(x), np.float32, 2)
        assert_close(k(y), _max_scaled_norm(y), np.float32, 300)
    text = k.explain(y)
    assert "scaled online" in text
    # G is the reduced values' part alone, H the running max's: G·H is the body (G once printed x / a too)
    lines = [line.strip() for line in text.splitlines()]
    assert "G(x) = x[i0,j] ** 2.0" in lines and "H(y) = 1.0 / a[i0] ** 2.0" in lines, text


def _exp_of_other_values_less_a_max(x, y):
    m = rf.max(x, axis=-1, keepdims=True)
    return rf.sum(rf.exp(y - m), axis=-1)


def _reversed_softmax_denominator(x):
    m = rf.max(x, axis=-1, keepdims=True)
    return rf.sum(rf.exp(x[:, ::-1] - m), axis=-1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_exponential_not_bounded_by_its_running_max_is_a_second_pass(backend):
    """``exp(y - max x)`` with a large ``y`` before the max of ``x``: the loop's ``exp(y - m_run)`` overflowed
    to inf and the rescale ``exp(m_prev - m)`` made NaN of numpy's 1.0 (and of ``exp(x[::-1] - max x)`` on
    values near 1e4). A reduction whose exponent the running values do not bound by 1 is now a second pass;
    a softmax's own ``exp(x - max x)``, and ``exp(a - max a - log Σ exp(a - max a))`` read by a later sum,
    stay fused."""
    x = np.zeros((2, 256), np.float32)
    y = np.zeros((2, 256), np.float32)
    x[:, -1], y[:, 0] = 200.0, 200.0
    kernel = rf.kernel(_exp_of_other_values_less_a_max, backend=backend)
    np.testing.assert_allclose(kernel(x, y), _exp_of_other_values_less_a_max(x, y), rtol=1e-6)
    group = kernel.lower(x, y).groups[0]
    assert "second pass" in group.reason and "exp(" in group.reason
    z = np.full((1, 300), 1e4, np.float32)
    z[0, :150] = 1e4 - 200.0
    z[0, 0] = 1e4 + 1.0
    np.testing.assert_allclose(rf.kernel(_reversed_softmax_denominator, backend=backend)(z),
                               _reversed_softmax_denominator(z), rtol=1e-5)
    a, b = np.random.default_rng(1).standard_normal((2, 3, 40)).astype(np.float32)
    assert rf.kernel(_kl_of_log_softmaxes, backend=backend).lower(a, b).groups[0].fused


def _focal_loss(x):
    m = rf.max(x, axis=-1, keepdims=True)
    lp = x - m - rf.log(rf.sum(rf.exp(x - m), axis=-1, keepdims=True))
    return -rf.sum((1 - rf.exp(lp)) ** 2 * lp, axis=-1)


def _one_minus_p_times_shifted_logit(x):
    m = rf.max(x, axis=-1, keepdims=True)
    return rf.sum((1 - rf.exp(x - m)) * (x - m), axis=-1)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("body", [_one_minus_p_times_shifted_logit, _focal_loss])
def test_a_centred_sum_is_the_references_infinity_at_a_masked_logit(backend, body):
    """A focal loss with a masked (-inf) class: numpy's term there is ``(1 - 0)·(-inf)``, so the loss is inf;
    the centred sum, expanded into ``Σ(x - m) - Σ exp(x - m)(x - m)``, met it as ``0·(-inf)`` and returned
    NaN. Where the body at the element farthest from the max is infinite, the sum is that infinity; a
    +inf logit (an infinite max) and a NaN stay NaN, as in numpy."""
    x = np.random.default_rng(0).standard_normal((5, 300)).astype(np.float32)
    x[0, 5] = -np.inf
    x[1, 7] = np.inf
    x[2, 9] = np.nan
    x[3, 3], x[3, 4] = -3e38, 3e38
    with np.errstate(all="ignore"):
        want = body(x)
        got = rf.kernel(body, backend=backend)(x)
    assert np.isinf(want[[0, 3]]).all() and np.isnan(want[[1, 2]]).all()
    assert_close(got, want, np.float32, 300)


def _effective_sample_size(w):
    p = w / rf.sum(w, axis=-1, keepdims=True)
    return 1.0 / rf.sum(p * p, axis=-1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_division_by_a_squared_sum_is_not_deferred_out_of_range(backend):
    """An effective sample size ``1 / Σ (w / Σw)**2``: the division was deferred, the loop summed ``w**2``, which
    underflows for weights near 1e-25 and overflows near 1e19 (NaN for numpy's 4). The reference divides
    first; where G's range can leave f32 such a reduction is a second pass. A softmax's ``Σ p**2``, whose G
    is an exponential at most 1, stays fused."""
    w = np.array([[1e-25] * 4, [1e19] * 4, [1.0, 2.0, 3.0, 4.0]], np.float32)
    got = rf.kernel(_effective_sample_size, backend=backend)(w)
    np.testing.assert_allclose(got, _effective_sample_size(w), rtol=1e-5)

    def collision(x):
        e = rf.exp(x - rf.max(x, axis=-1, keepdims=True))
        p = e / rf.sum(e, axis=-1, keepdims=True)
        return rf.sum(p * p, axis=-1)

    assert rf.kernel(collision, backend=backend).lower(w).groups[0].fused


def _quantized_step(x):
    return rf.rint(x * 0.37).astype(rf.int32)


def _count_above(x):
    return rf.sum(x * 0.3 > 0.2, axis=-1)


def _count_at_max(x):
    p = x * 0.3
    m = rf.max(p, axis=-1, keepdims=True)
    return rf.sum(p == m, axis=-1), rf.sum(p > m, axis=-1)


def _count_at_max_recast(x):
    p = (x * 0.3).astype(rf.float16)
    return rf.sum(p == rf.max(p, axis=-1, keepdims=True), axis=-1)


def _top_log_probability_ties(x):
    m = rf.max(x, axis=-1, keepdims=True)
    lp = x - (m + rf.log(rf.sum(rf.exp(x - m), axis=-1, keepdims=True)))
    return rf.sum(lp == rf.max(lp, axis=-1, keepdims=True), axis=-1)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("body", [_quantized_step, _count_above, _count_at_max, _count_at_max_recast,
                                  _top_log_probability_ties])
def test_a_decision_on_a_16_bit_value_sees_it_rounded_as_numpy_does(backend, dtype, body):
    """The compiled kernels compute 16-bit arithmetic in f32 and round on store; a comparison, a rounding to an
    integer or a cast jumps where its operand crosses a threshold, so the unrounded value decided otherwise:
    ``rint(x * 0.37)`` gave 5 for numpy's 6, ``x * 0.3 == max(x * 0.3)`` (the max stored rounded) matched no
    element, nor did ``lp == max(lp)`` of a log-softmax. Such operands are rounded after each step as numpy
    rounds them, and an additive max's final value too."""
    import ml_dtypes

    dt = np.float16 if dtype == "float16" else ml_dtypes.bfloat16
    rows = [[14.86, -14.86, 0.6665, 1.0], [0.1, 2.2, -1.0, 0.7], [1.1, 0.3, -0.2, 0.9]]
    x = np.concatenate([np.array(rows, np.float32),
                        np.random.default_rng(4).standard_normal((5, 4)).astype(np.float32) * 3]).astype(dt)
    want = body(x)
    got = rf.kernel(body, backend=backend)(x)
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        np.testing.assert_array_equal(g, w)


# -- divided by a running max, and a variance that overflows (found trying kernels users write) ------------
def _sum_over_max(x):
    return rf.sum(x / rf.max(x, axis=-1, keepdims=True), axis=-1)


def _normalized_gemm(x, w):
    return (x / rf.max(x, axis=-1, keepdims=True)) @ w


def _min_over_max(x):
    return rf.min(x / rf.max(x, axis=-1, keepdims=True), axis=-1)


def _row_through_zero() -> np.ndarray:
    """A row whose running max sits at exactly 0 for its first thousand elements (-1s and 0s), then grows."""
    row = np.zeros(2048, np.float32)
    row[:1000:2] = -1.0
    row[1500], row[1600] = 4.0, 1.0
    return row[None, :]


@pytest.mark.parametrize("backend", BACKENDS)
def test_terms_divided_by_a_running_max_that_sat_at_zero_are_kept(backend):
    """``sum(x / max x)``: while the running max is 0 its terms are divided by the guard's 1, so when the max
    grows they move by guard(old) / new, not old / new = 0 (which dropped every -1: 1.25 for -123.75)."""
    tiny = np.array([[-1.0, 0.0, 2.0, 3.0]], np.float32)
    got = rf.kernel(_sum_over_max, backend=backend, interpret_chunk=1, block_n=1, block_k=1)(tiny)
    assert_close(got, _sum_over_max(tiny.astype(np.float64)).astype(np.float32), np.float32, 4)
    row, w = _row_through_zero(), np.ones((2048, 2), np.float32)
    assert_close(rf.kernel(_sum_over_max, backend=backend)(row), np.float32([-123.75]), np.float32, 2048)
    assert_close(rf.kernel(_normalized_gemm, backend=backend)(row, w), np.float32([[-123.75, -123.75]]),
                 np.float32, 2048)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_max_or_min_over_a_running_max_that_may_change_sign_is_a_second_pass(backend):
    """``min(x / max x)``: rescaled by ``m_prev / m``, negative where the running max crosses 0, the running
    min became a running max (-0.5 for numpy's -1.5); that cannot be shown positive, so it is not fused."""
    x = np.array([[-1.0, -3.0, 2.0]], np.float32)
    kernel = rf.kernel(_min_over_max, backend=backend, interpret_chunk=1, block_n=1, block_k=1)
    np.testing.assert_array_equal(kernel(x), np.float32([-1.5]))
    assert "may be negative" in kernel.explain(x)
    row = _row_through_zero()
    np.testing.assert_array_equal(rf.kernel(_min_over_max, backend=backend)(row), _min_over_max(row))


def _max_over_absmax(x):
    m = rf.max(rf.abs(x), axis=-1, keepdims=True)
    return rf.max(x / m, axis=-1)


def test_a_max_over_a_running_absmax_is_refused_for_a_zero_absmax_not_a_sign_change():
    """``max(x / max |x|)``: the running absmax never crosses 0, so the refusal said a cause that cannot occur
    ("may be negative (a running max that crosses 0)"); what keeps it a second pass is that the absmax is 0
    until a nonzero element is seen, where ``1 / m`` is undefined."""
    x = np.array([[0.0, 0.0, -2.0, 1.0], [3.0, 0.0, -1.0, 0.5]], np.float32)
    kernel = rf.kernel(_max_over_absmax, backend="interpret", interpret_chunk=1)
    text = kernel.explain(x).split("fused Loop IR")[0]
    assert "not fused" in text and "crosses 0" not in text and "may be negative" not in text
    assert "m[i0] is a running max of values never negative, but it is 0 while every element seen so far is 0" in text
    np.testing.assert_array_equal(kernel(x), _max_over_absmax(x))
    assert "may be negative (a running max that crosses 0)" in rf.kernel(_min_over_max).explain(x)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_variance_that_overflows_is_infinite_as_numpys(backend):
    """Values near 1e25 square past f32's range: numpy's variance is inf, and the layer norm of such a row
    0 (``(x - mu) / sqrt(inf)``). Moving the centre of an infinite sum by the shift law made inf - inf."""
    x = np.array([[1e25, 0.0, 1e25, 0.0]], np.float32)
    var = rf.kernel(lambda x: rf.var(x, axis=-1), backend=backend, interpret_chunk=1, block_n=1, block_k=1)
    np.testing.assert_array_equal(var(x), np.float32([np.inf]))
    big = (np.random.default_rng(7).standard_normal((2, 256)) * 1e30).astype(np.float32)
    np.testing.assert_array_equal(rf.kernel(lambda x: rf.std(x, axis=-1), backend=backend)(big), [np.inf, np.inf])

    def layer_norm_gemm(x, w):
        mu = rf.mean(x, axis=-1, keepdims=True)
        return (x - mu) / rf.sqrt(rf.var(x, axis=-1, keepdims=True) + 1e-5) @ w

    w = np.random.default_rng(8).standard_normal((256, 4)).astype(np.float32)
    assert np.all(rf.kernel(layer_norm_gemm, backend=backend)(big, w) == 0.0)


def _clip_loss(x):
    diag = rf.take_along_axis(x, rf.arange(x.shape[0])[:, None], axis=1)[:, 0]
    rows = rf.sum(rf.exp(x - rf.max(x, axis=1)[:, None]), axis=1)      # each row's softmax denominator
    cols = rf.sum(rf.exp(x - rf.max(x, axis=0)[None]), axis=0)         # each column's
    return rf.sum(rows - diag) + rf.sum(cols - diag)


def _clip_loss_columns_first(x):
    diag = rf.take_along_axis(x, rf.arange(x.shape[0])[:, None], axis=1)[:, 0]
    rows = rf.sum(rf.exp(x - rf.max(x, axis=1)[:, None]), axis=1)
    cols = rf.sum(rf.exp(x - rf.max(x, axis=0)[None]), axis=0)
    return rf.sum(cols - diag) + rf.sum(rows - diag)


@pytest.mark.parametrize("body", [_clip_loss, _clip_loss_columns_first], ids=["rows_first", "columns_first"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_two_cascades_each_summed_with_the_others_results_are_two_loops_in_order(backend, body):
    """(Found by a helper porting a CLIP loss.) The sum over rows of ``rows - diag`` joined the column
    softmax's loop (it runs over rows too) and the sum of ``cols - diag`` the row softmax's: each loop then
    needed the other's results first, and every backend raised an internal VerifyError ("load of s1 before
    it is defined"). A reduction no longer joins a group while it reads a later group's results."""
    x = np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)
    got = rf.kernel(body, backend=backend)(x)
    assert_close(got, body(x), np.float32, 8 * 8)
    lowered = rf.kernel(body, backend=backend).lower(x)
    assert str(lowered.stages["fused"]).count("fused loop") >= 2     # (both softmaxes still one pass each)
