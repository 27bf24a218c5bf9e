"""Shift-stable fused sums (docs/fusion.md "Shift-stable sums"): a sum that is a polynomial in ``u - c``, with
``c`` a running max or running mean of ``u``, is kept centred on the running statistic instead of being
expanded into sums that cancel. Each body is judged on interpret, cpu and simulate (whose PTX is assembled)
against the float64 evaluation of the body: within 20 times numpy-f32's own error, within the tolerance
rule against numpy-f32, NaN where numpy-f32 is NaN and nowhere else."""
from __future__ import annotations

import numpy as np
import pytest
from helpers import run_backend

import redfuser as rf
from redfuser.fusion.merge import merge_partials
from redfuser.fusion.numeric_check import evaluate64
from redfuser.fusion.separability import Decomposition
from redfuser.ir import Binary, BinaryOp, FusedLoop, IndexValue, Load, format_expr
from redfuser.ir.loop.expr import walk
from redfuser.ir.loop.interpreter import Env, run_fused_loop, run_stmt
from redfuser.testing.tolerance import assert_close

BACKENDS = ("interpret", "cpu", "simulate")
# small chunks: the centre moves many times (the shift law is used at every chunk)
SMALL_CHUNKS = {"interpret": {"interpret_chunk": 4}, "cpu": {"block_n": 16}, "simulate": {"block_n": 16}}
EPS32 = float(np.finfo(np.float32).eps)


def variance(x):
    n = x.shape[-1]
    mu = rf.sum(x, axis=-1, keepdims=True) / n
    return rf.sum((x - mu) ** 2, axis=-1) / n


def fourth_moment(x):
    n = x.shape[-1]
    mu = rf.sum(x, axis=-1, keepdims=True) / n
    return rf.sum((x - mu) ** 4, axis=-1) / n


def entropy(x):
    m = rf.max(x, axis=-1, keepdims=True)
    e = rf.exp(x - m)
    l = rf.sum(e, axis=-1, keepdims=True)  # noqa: E741
    p = e / l
    return -rf.sum(p * rf.log(p), axis=-1)


def centred_exp_sum(x):
    m = rf.max(x, axis=-1, keepdims=True)
    return rf.sum(rf.exp(x - m) * (x - m), axis=-1)


def _outputs(backend: str, body, *inputs: np.ndarray, **options) -> np.ndarray:
    """The kernel's result on `backend` (on simulate its PTX for sm_80 and sm_90 is assembled too)."""
    if backend == "simulate":
        (actual,), _ = run_backend(backend, body, *inputs, **options)
        return actual
    return rf.kernel(body, backend=backend, **options)(*inputs)


def _judge(actual: np.ndarray, body, x: np.ndarray | tuple, n: int) -> None:
    """The issue's rule: NaN exactly where numpy-f32 has it, the tolerance rule against numpy-f32, and an
    error against float64 within 20 times numpy-f32's own (at least one f32 ulp of the largest value).
    `x` is the input, or a tuple of the inputs."""
    inputs = x if isinstance(x, tuple) else (x,)
    with np.errstate(all="ignore"):
        r32 = np.asarray(body(*inputs))
        r64 = np.asarray(body(*(a.astype(np.float64) for a in inputs)))
    assert actual.dtype == r32.dtype and actual.shape == r32.shape
    assert np.array_equal(np.isnan(actual), np.isnan(r32)), (actual, r32)
    assert_close(actual, r32, np.float32, n)
    finite = np.isfinite(r64) & np.isfinite(r32)
    if finite.any():
        own = max(float(np.abs(r32 - r64)[finite].max()), EPS32 * float(np.abs(r64[finite]).max()))
        err = float(np.abs(actual.astype(np.float64) - r64)[finite].max())
        assert err <= 20 * own, f"error {err:.3g} against float64, numpy-f32's own {own:.3g}"


def _rows_around_300(shape=(8, 300), seed=0) -> np.ndarray:
    return (300 + np.random.default_rng(seed).standard_normal(shape)).astype(np.float32)


@pytest.mark.parametrize("small", [False, True], ids=["default-chunks", "small-chunks"])
@pytest.mark.parametrize("body", [variance, fourth_moment])
@pytest.mark.parametrize("backend", BACKENDS)
def test_central_moments_of_rows_far_from_zero(backend, body, small):
    x = _rows_around_300((4, 300) if backend == "simulate" else (8, 300))
    actual = _outputs(backend, body, x, **(SMALL_CHUNKS[backend] if small else {}))
    _judge(actual, body, x, 300)


@pytest.mark.parametrize("offset", [0.0, 1e3, 1e4])
@pytest.mark.parametrize("backend", BACKENDS)
def test_softmax_entropy_at_large_logit_offsets(backend, offset):
    """Offset 0 is the control (the expanded form was accurate there); 1e3 and 1e4 lost digits expanded."""
    rng = np.random.default_rng(1)
    x = (offset + 3 * rng.standard_normal((4, 200))).astype(np.float32)
    _judge(_outputs(backend, entropy, x, **SMALL_CHUNKS[backend]), entropy, x, 200)


# Rows near the f32 range. Row 0: numpy's terms are 0 and -0 (sum 0), the expanded sums overflow to
# inf - inf. Rows 1-2: an x - m overflows to -inf in numpy (0 * -inf: NaN), in the same chunk as the max or
# in an earlier one (the centre moves by an infinite amount). Row 3: large but finite, 0.
NEAR_RANGE = np.array([[3e38, 3e38, 1.0, 2.0, 0.5, -1.0, 7.0, 3e38],
                       [3e38, -3e38, 1.0, 2.0, 0.5, -1.0, 7.0, 5.0],
                       [-3e38, 1.0, 2.0, 0.5, -1.0, 7.0, 5.0, 3e38],
                       [1e38, -1e38, 5.0, 0.0, 1.0, 2.0, 3.0, 4.0]], np.float32)


@pytest.mark.parametrize("options", [{}, {"block_n": 2}], ids=["one-chunk", "chunks-of-2"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_centred_exponential_sum_near_the_float32_range_keeps_numpys_nans(backend, options):
    if backend == "interpret" and options:
        options = {"interpret_chunk": 2}
    actual = _outputs(backend, centred_exp_sum, NEAR_RANGE, **options)
    with np.errstate(all="ignore"):
        expected = centred_exp_sum(NEAR_RANGE)
    assert np.array_equal(np.isnan(expected), [False, True, True, False])
    assert np.array_equal(np.isnan(actual), np.isnan(expected)) and np.all(actual[~np.isnan(expected)] == 0)


@pytest.mark.parametrize("n", [1, 2, 7, 65])
@pytest.mark.parametrize("body", [variance, fourth_moment, entropy])
@pytest.mark.parametrize("backend", ["interpret", "cpu"])
def test_short_and_ragged_axes(backend, body, n):
    """An axis of length 1 reads x[i, 0] (a value the same at every k): still centred, so the moments are
    numpy's exact 0, not the expansion's 3584; ragged last chunks count only the elements they hold."""
    x = _rows_around_300((3, n), seed=n)
    options = {"interpret_chunk": 4} if backend == "interpret" else {"block_n": 4}
    _judge(_outputs(backend, body, x, **options), body, x, n)


def squares_below_the_max(x):
    m = rf.max(x, axis=-1, keepdims=True)
    return rf.sum((x - m) ** 2, axis=-1)


def cubes_above_the_min(x):
    m = rf.min(x, axis=-1, keepdims=True)
    return rf.sum((x - m) ** 3 * 0.5, axis=-1)


def _special_rows() -> np.ndarray:
    x = np.random.default_rng(5).standard_normal((6, 20)).astype(np.float32)
    x[0, 3], x[1, 5], x[2], x[3, 7], x[4, :10] = np.inf, -np.inf, -np.inf, np.nan, -np.inf
    return x


@pytest.mark.parametrize("body", [squares_below_the_max, cubes_above_the_min, variance, fourth_moment, entropy,
                                  centred_exp_sum])
@pytest.mark.parametrize("backend", BACKENDS)
def test_infinite_and_nan_elements_give_numpys_infinities_and_nans(backend, body):
    """A centre that stays put must not multiply an infinite lower power by 0 (NaN where numpy has inf); a
    max/min centre still at its identity gives numpy's -inf - -inf = NaN."""
    x = _special_rows()
    actual = _outputs(backend, body, x, **({"interpret_chunk": 3} if backend == "interpret" else {"block_n": 4}))
    _judge(actual, body, x, 20)


@pytest.mark.parametrize("body", [variance, fourth_moment, entropy])
@pytest.mark.parametrize("backend", ["cpu", "simulate"])
def test_split_reductions_merge_by_the_shift_law(backend, body):
    x = _rows_around_300((3, 300), seed=2) if body is not entropy else \
        (1e3 + 3 * np.random.default_rng(2).standard_normal((3, 300))).astype(np.float32)
    kernel = rf.kernel(body, backend=backend, split=3, block_n=16)
    assert [k.name.rsplit("_", 1)[-1] for k in kernel.lower(x).stages["tile"].kernels] == ["partial", "combine"]
    _judge(_outputs(backend, body, x, split=3, block_n=16), body, x, 300)


@pytest.mark.parametrize("cut", [1, 37, 150, 299])
@pytest.mark.parametrize("body", [variance, fourth_moment, entropy])
def test_merge_of_two_partial_states_is_the_shift_to_the_merged_centre(body, cut):
    """The Loop IR's merge rule (what a split's combine step runs): two halves merged equal the whole."""
    x = _rows_around_300((3, 300), seed=3) if body is not entropy else \
        (1e4 + 3 * np.random.default_rng(3).standard_normal((3, 300))).astype(np.float32)
    lowered = rf.kernel(body, backend="interpret").lower(x)
    env = Env({b.name: a for b, a in zip(lowered.program.inputs, (x,))})
    loop = next(s for s in lowered.program.body if isinstance(s, FusedLoop))
    assert any(st.carry is not None for st in loop.states)
    whole = run_fused_loop(loop, env, chunk=300)
    a = run_fused_loop(loop, env, chunk=7, span=(0, cut))
    b = run_fused_loop(loop, env, chunk=5, span=(cut, 300))
    # a lower power such as sum (x - mean) is near 0: its rounding is relative to the data (|x| per term)
    scale = float(np.abs(x).max()) * 300
    for merged in (merge_partials(loop, a, b), merge_partials(loop, b, a)):
        for name, value in whole.items():
            assert_close(merged[name], value, np.float32, 300, err_msg=name, scale=scale)
    env.update(merge_partials(loop, a, b))
    after = lowered.program.body[lowered.program.body.index(loop) + 1:]
    for s in after:
        env[s.out.name] = run_stmt(s, env)
    _judge(env[lowered.program.outputs[0].name], body, x, 300)


def test_explain_says_which_centre_was_chosen():
    x = _rows_around_300((2, 64))
    text = rf.kernel(variance, backend="interpret").explain(x)
    assert "shift-stable sum" in text and "centred on the running mean (shift-stable)" in text
    assert "carried only to move the higher powers with the centre" in text
    text = rf.kernel(entropy, backend="interpret").explain(x)
    assert "centred on the running max m[i0] (shift-stable)" in text
    assert "expanded into" not in text   # no cancellation note: nothing is expanded


# Polynomials with no single root every term vanishes at (fusion/taylor.py and own_centre.split_by_pair): before,
# each was fused expanded (sum x^2 - (Y + Z) sum x + N Y Z), losing every digit on rows near 300.
@pytest.mark.parametrize("body", [variance, fourth_moment, entropy, centred_exp_sum])
def test_explained_g_times_h_is_the_term_each_centred_state_accumulates(body):
    """explain prints each term's G(x) and H(y) beside the state that accumulates it: their product must be that
    term. The entropy's G printed 1.0 and ``x - m`` for states summing ``exp(x - m)`` and
    ``exp(x - m) * (x - m)`` (G lost the exponential's reduced part, alpha·u)."""
    x = _rows_around_300((2, 64))
    groups = rf.kernel(body, backend="interpret").lower(x).groups
    accs = [acc for g in groups for dec in g.decompositions.values() if isinstance(dec, Decomposition)
            and dec.kind == "shift-stable sum" for acc in dec.accumulators]
    assert accs
    rng = np.random.default_rng(1)
    for acc in accs:
        product = Binary(BinaryOp.MUL, acc.G, acc.H, acc.term.dtype)
        leaves = {n for e in (product, acc.term) for n in walk(e) if isinstance(n, Load | IndexValue)}
        values = {leaf: rng.uniform(-2.0, 2.0, 64) for leaf in leaves}
        np.testing.assert_allclose(evaluate64(product, values), evaluate64(acc.term, values), rtol=1e-12,
                                   err_msg=f"G = {format_expr(acc.G)}, H = {format_expr(acc.H)}, "
                                           f"term = {format_expr(acc.term)}")


def product_about_two_results(x, z):
    y = rf.max(z, axis=-1, keepdims=True)
    s = rf.sum(z, axis=-1, keepdims=True) / z.shape[-1]
    return rf.sum((x - y) * (x - s), axis=-1)


def product_about_a_result_and_a_sum(x, z):
    y = rf.max(z, axis=-1, keepdims=True)
    s = rf.sum(z, axis=-1, keepdims=True) / z.shape[-1]
    return rf.sum((x - y) * (s - x + 0.5), axis=-1)


def square_plus_values(x, z):
    y = rf.max(z, axis=-1, keepdims=True)
    return rf.sum((x - y) ** 2 + x, axis=-1)


def square_plus_an_exponential(x, z):
    y = rf.max(z, axis=-1, keepdims=True)
    return rf.sum((x - y) ** 2 + rf.exp(z - y), axis=-1)


SEVERAL_ROOT_BODIES = [product_about_two_results, product_about_a_result_and_a_sum, square_plus_values,
                       square_plus_an_exponential]


def _near_300(shape, seed) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = (300 + rng.standard_normal(shape)).astype(np.float32)
    return x, (299.5 + 0.1 * rng.standard_normal(shape)).astype(np.float32)


@pytest.mark.parametrize("small", [False, True], ids=["default-chunks", "small-chunks"])
@pytest.mark.parametrize("body", SEVERAL_ROOT_BODIES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_polynomials_with_several_roots_or_other_terms_are_centred(backend, body, small):
    inputs = _near_300((4, 300) if backend == "simulate" else (8, 300), seed=11)
    group = rf.kernel(body, backend="interpret").lower(*inputs).groups[-1]
    assert group.fused and group.decompositions[group.reductions[-1]].stable is not None
    actual = _outputs(backend, body, *inputs, **(SMALL_CHUNKS[backend] if small else {}))
    _judge(actual, body, inputs, 300)


@pytest.mark.parametrize("backend", ["cpu", "simulate"])
def test_split_reductions_merge_the_taylor_form(backend):
    inputs = _near_300((3, 300), seed=12)
    _judge(_outputs(backend, product_about_two_results, *inputs, split=3, block_n=16), product_about_two_results,
           inputs, 300)


@pytest.mark.parametrize("backend", BACKENDS)
def test_taylor_form_keeps_numpys_infinities_and_nans(backend):
    x, z = _near_300((6, 20), seed=13)
    x[0, 3], x[1, 5], x[2, 7], x[3, :] = np.inf, -np.inf, np.nan, -np.inf
    x[4, 2], x[4, 9] = np.inf, -np.inf
    actual = _outputs(backend, product_about_two_results, x, z,
                      **({"interpret_chunk": 3} if backend == "interpret" else {"block_n": 4}))
    _judge(actual, product_about_two_results, (x, z), 20)


def deviation_times_weights_plus_a_product(x, z, w, v):
    y = rf.max(z, axis=-1, keepdims=True)
    return ((x - y) * w + x * y / 300.0) @ v


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_sum_is_split_into_the_terms_that_cancel_and_the_others(backend):
    """``((x - y) w + x y / 300) @ v``: the product distributes over the sum, ``(x - y) w v`` is centred on the
    compiler's own mean of x, ``x y v / 300`` is summed as usual beside it (a GEMM whose weights are
    another reduced value: no Taylor form of the whole applies)."""
    x, z = _near_300((4, 64), seed=17)
    rng = np.random.default_rng(18)
    w = (1 + 0.01 * rng.standard_normal((4, 64))).astype(np.float32)
    v = rng.standard_normal((64, 8)).astype(np.float32)
    inputs = (x, z, w, v)
    group = rf.kernel(deviation_times_weights_plus_a_product, backend="interpret").lower(*inputs).groups[-1]
    assert group.fused and "centred on its own running mean of x" in group.decompositions[group.reductions[-1]].stable.words
    actual = _outputs(backend, deviation_times_weights_plus_a_product, *inputs, **SMALL_CHUNKS[backend])
    _judge(actual, deviation_times_weights_plus_a_product, inputs, 64)


def test_a_sum_that_adds_after_a_product_is_not_centred():
    """``x / s + 0.25``: the expansion ``sum x / s + 0.25 N`` is what the reference rounds too (it divides
    before it adds), so nothing is centred or refused (forms_difference)."""
    def scaled_plus_constant(x):
        s = rf.sum(rf.abs(x), axis=-1, keepdims=True) + 1.0
        return rf.sum(x / s + 0.25, axis=-1)

    x = np.random.default_rng(19).standard_normal((3, 40)).astype(np.float32)
    group = rf.kernel(scaled_plus_constant, backend="interpret").lower(x).groups[0]
    assert group.fused and group.decompositions["out"].stable is None


def test_explain_names_the_taylor_form():
    inputs = _near_300((2, 64), seed=14)
    text = rf.kernel(product_about_two_results, backend="interpret").explain(*inputs)
    assert "in Taylor form around its own running mean of x[i0,j] (shift-stable)" in text
    assert "each p^(j)(mean) computed as the body is written" in text
    # the coefficients after the loop are the body and its derivative at the mean, as written
    assert "(out_mean[i0] - y[i0]) * (out_mean[i0] - s_sum[i0] / 64.0)" in text
    assert "expanded into" not in text


def softmax_weighted_square_about_another_max(x, z):
    y = rf.max(z, axis=-1, keepdims=True)
    m = rf.max(x, axis=-1, keepdims=True)
    return rf.sum(rf.exp(x - m) * (x - y) ** 2, axis=-1)


def softmax_weighted_square_about_a_mean(x, z):
    y = rf.sum(z, axis=-1, keepdims=True) / z.shape[-1]
    m = rf.max(x, axis=-1, keepdims=True)
    return rf.sum(rf.exp(x - m) * (x - y) ** 2, axis=-1)


@pytest.mark.parametrize("body", [softmax_weighted_square_about_another_max, softmax_weighted_square_about_a_mean])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_softmax_weighted_square_is_a_second_pass(backend, body):
    """``sum exp(x - m) (x - Y)^2``: the Taylor form centred it on the plain running mean of x, far from the
    softmax's weight, and its three sums cancel where Y is near the weighted values: a softmax-weighted
    variance about its own stored weighted mean was 11% off (found by a helper). Such a sum is a second pass."""
    inputs = _near_300((4, 300) if backend == "simulate" else (8, 300), seed=21)
    group = rf.kernel(body, backend="interpret").lower(*inputs).groups[-1]
    assert not group.fused and "the weighted sums around it cancel" in group.reason
    actual = _outputs(backend, body, *inputs, **SMALL_CHUNKS[backend])
    if body is softmax_weighted_square_about_another_max:
        _judge(actual, body, inputs, 300)
        return
    # Y = sum(z) / N is rounded in another order by the fused loop (chunks) than by numpy (pairwise): one ulp
    # of Y moves sum (x - Y)^2 by 3e-5 relative here, the unweighted body's too. So this one is judged
    # against float64 alone, by the issue's rule (20 times numpy-f32's own error), not against numpy-f32.
    with np.errstate(all="ignore"):
        r32 = np.asarray(body(*inputs)).astype(np.float64)
        r64 = np.asarray(body(*(a.astype(np.float64) for a in inputs)))
    assert np.isfinite(actual).all()
    assert np.abs(actual - r64).max() <= 20 * np.abs(r32 - r64).max()


def test_a_sum_without_a_stable_form_is_refused_with_the_reason():
    """No stable form: the difference inside exp times the difference (no polynomial, and the exp reads Y,
    so it is no weight either). Refused, computed in a second pass, and still right."""
    def exponential_times_square(x, z):
        y = rf.max(z, axis=-1, keepdims=True)
        return rf.sum(rf.exp((x - y) * 0.01) * (x - y) ** 2, axis=-1)

    x, z = _near_300((3, 64), seed=15)
    group = rf.kernel(exponential_times_square, backend="interpret").lower(x, z).groups[0]
    assert not group.fused
    assert group.reason.startswith("`out` has no shift-stable fused form, and its expanded sums would cancel")
    assert "it multiplies out x[i0,j] ± y[i0]; y[i0] is not a running max, min or mean of x[i0,j]" in group.reason
    assert "the weighted sums around it cancel" in group.reason
    for backend in ("interpret", "cpu"):
        actual = np.asarray(rf.kernel(exponential_times_square, backend=backend)(x, z))
        with np.errstate(all="ignore"):
            assert_close(actual, exponential_times_square(x, z), np.float32, 64)


def layer_norm_variance(x):
    n = x.shape[-1]
    mu = rf.sum(x, axis=-1, keepdims=True) / n
    return rf.sum((x - mu) ** 2, axis=-1, keepdims=True) / n


def square_about_another_max(x, z):
    y = rf.max(z, axis=-1, keepdims=True)
    return rf.sum((x - y) ** 2, axis=-1)


@pytest.mark.parametrize("body", [layer_norm_variance, square_about_another_max, product_about_two_results])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_16_bit_sums_are_centred_with_an_f32_count(backend, dtype, body):
    """A 16-bit mean's count is an f32 state (f16 counts exactly only to 2048, bf16 to 256), so 16-bit
    variances and polynomials are centred too. Before, an f16 layer-norm variance over 4096 elements of
    magnitude 4 was expanded, and sum x^2 overflowed f16 (NaN where numpy gives a finite variance)."""
    dt = getattr(rf, dtype)
    rng = np.random.default_rng(20)
    x = (4.0 + rng.standard_normal((4, 4096))).astype(dt)
    z = (3.5 + 0.1 * rng.standard_normal((4, 4096))).astype(dt)
    inputs = (x,) if body is layer_norm_variance else (x, z)
    group = rf.kernel(body, backend="interpret").lower(*inputs).groups[-1]
    assert group.fused and group.decompositions[group.reductions[-1]].stable is not None
    assert any(s.acc.dtype.name == "f32" and "count" in s.acc.name for s in group.states)
    actual = np.asarray(_outputs(backend, body, *inputs)).astype(np.float64)
    with np.errstate(all="ignore"):
        r16 = np.asarray(body(*inputs)).astype(np.float64)
        r64 = np.asarray(body(*(a.astype(np.float64) for a in inputs)))
    assert np.isfinite(actual).all()
    own = max(float(np.abs(r16 - r64).max()), float(np.finfo(np.float16).eps) * float(np.abs(r64).max()))
    assert float(np.abs(actual - r64).max()) <= 20 * own


def square_about_the_mean_of_a_computed_value(x):
    y = x * 1.3
    mu = rf.mean(y, axis=-1, keepdims=True)
    return rf.sum((y - mu) ** 2, axis=-1)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_16_bit_value_the_body_computes_is_centred_as_numpy_rounds_it(backend, dtype):
    """``y = x * 1.3`` in f16 or bf16, then ``sum((y - mean(y))**2)``: the algebra took ``y`` apart and centred
    the sum on ``x`` (``1.69 (x - mean / 1.3)**2``), never rounding the product, so a constant row, whose
    numpy ``y - mean`` is exactly 0 (and the float64 body's), summed 64 squares of ``y``'s rounding error:
    0.05 (f16) and 0.075 (bf16) on cpu. ``y`` is now rounded where it meets the mean, one atom, centred on
    its own running mean. Found by a helper (hunt_gaps/01)."""
    dt = getattr(rf, dtype)
    body = square_about_the_mean_of_a_computed_value
    constant = np.full((2, 64), 31.0, dt)
    group = rf.kernel(body, backend="interpret").lower(constant).groups[-1]
    assert group.fused and group.decompositions[group.reductions[-1]].stable is not None
    actual = _outputs(backend, body, constant)
    np.testing.assert_array_equal(np.asarray(actual).astype(np.float64), [0.0, 0.0])
    rng = np.random.default_rng(21)
    x = (30.0 + rng.standard_normal((3, 300))).astype(dt)
    actual = np.asarray(_outputs(backend, body, x)).astype(np.float64)
    r64 = body(x.astype(np.float64))
    r16 = np.asarray(body(x)).astype(np.float64) if dtype == "float16" else r64   # (numpy's bf16 sums stagnate)
    own = max(float(np.abs(r16 - r64).max()), float(np.finfo(np.float16).eps) * float(np.abs(r64).max()))
    assert float(np.abs(actual - r64).max()) <= 20 * own


# One accumulator whose body the normal form expanded inside the term: x - 300 (a constant) or x - y (y reduced
# before the cascade, over another axis) is no difference with an earlier result, but expanded per element it
# cancelled in every element (errors 4e-4 and 1.5e-3 against numpy-f32's 1e-7). The loop now accumulates the body
# as written.
def weighted_square_about_a_constant(x, z):
    m = rf.max(x, axis=-1, keepdims=True)
    return rf.sum(rf.exp(x - m) * (x - 300.0) ** 2, axis=-1)


def weighted_square_about_a_result_before_the_cascade(x, z):
    y = rf.max(z, axis=-1, keepdims=True)
    m = rf.max(x, axis=-1, keepdims=True)
    return rf.sum(rf.exp(x - m) * (x - y) ** 2 / 3.0, axis=-1)


@pytest.mark.parametrize("body", [weighted_square_about_a_constant, weighted_square_about_a_result_before_the_cascade])
@pytest.mark.parametrize("backend", BACKENDS)
def test_one_accumulator_sums_the_body_as_written(backend, body):
    x, z = _near_300((4, 256), seed=16)
    inputs = (x, z[:, :8].copy())   # y reduces an axis of another length: computed before the cascade
    group = rf.kernel(body, backend="interpret").lower(*inputs).groups[-1]
    assert group.fused and not group.notes
    actual = _outputs(backend, body, *inputs, **SMALL_CHUNKS[backend])
    _judge(actual, body, inputs, 256)


def test_harmless_expanded_sums_still_fuse():
    """Expanded terms that are no multiplied-out difference of x and an earlier result are not refused."""
    def two_exponentials(x):
        m = rf.max(x, axis=-1, keepdims=True)
        return rf.sum(rf.exp(x - m) + rf.exp(2.0 * (x - m)), axis=-1)

    x = np.random.default_rng(4).standard_normal((2, 40)).astype(np.float32)
    lowered = rf.kernel(two_exponentials, backend="interpret").lower(x)
    assert lowered.groups[0].fused
    _judge(rf.kernel(two_exponentials, backend="interpret")(x), two_exponentials, x, 40)


# The compiler's own centre (fusion/own_centre.py): the earlier result Y is no running statistic of the reduced x
# (a dot product's mean, a max of other data), but Y is close to the values, so the expansion
# sum x^2 - 2 Y sum x + N Y^2 cancelled. Each sum is kept centred on a running mean of x the compiler adds.
def square_about_a_dot_mean(x, v):
    n = x.shape[-1]
    y = rf.sum(x * v, axis=-1, keepdims=True) / n
    return rf.sum((x - y) ** 2, axis=-1)


def fourth_power_about_another_max(x, z):
    y = rf.max(z, axis=-1, keepdims=True)
    return rf.sum((x - y) ** 4, axis=-1)


def weighted_deviation_from_another_max(x, z):
    y = rf.max(z, axis=-1, keepdims=True)
    return rf.sum((x - y) * (z / 300.0), axis=-1)


def square_about_twice_another_max(x, z):
    y = rf.max(z, axis=-1, keepdims=True)
    return rf.sum((x - 2.0 * y) ** 2 * 0.5, axis=-1)


OWN_CENTRE_BODIES = [square_about_a_dot_mean, fourth_power_about_another_max, weighted_deviation_from_another_max,
                     square_about_twice_another_max]


def _own_centre_inputs(body, shape=(8, 300), seed=6) -> tuple[np.ndarray, np.ndarray]:
    """Rows N(300, 1) and a second input that puts Y near them: weights N(1, 0.001) for a dot product's
    mean, or other data whose max is about 300 (about 150 for the centre at 2 Y)."""
    rng = np.random.default_rng(seed)
    x = (300 + rng.standard_normal(shape)).astype(np.float32)
    if body is square_about_a_dot_mean:
        other = 1 + 1e-3 * rng.standard_normal(shape)
    elif body is square_about_twice_another_max:
        other = 149.5 + 0.1 * rng.standard_normal(shape)
    else:
        other = 299.5 + 0.1 * rng.standard_normal(shape)
    return x, other.astype(np.float32)


@pytest.mark.parametrize("small", [False, True], ids=["default-chunks", "small-chunks"])
@pytest.mark.parametrize("body", OWN_CENTRE_BODIES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_polynomials_about_an_earlier_result_near_the_data_are_centred_on_an_own_mean(backend, body, small):
    inputs = _own_centre_inputs(body, (4, 300) if backend == "simulate" else (8, 300))
    actual = _outputs(backend, body, *inputs, **(SMALL_CHUNKS[backend] if small else {}))
    _judge(actual, body, inputs, 300)


@pytest.mark.parametrize("body", OWN_CENTRE_BODIES)
@pytest.mark.parametrize("backend", ["cpu", "simulate"])
def test_split_reductions_merge_the_own_centre_by_the_shift_law(backend, body):
    inputs = _own_centre_inputs(body, (3, 300), seed=7)
    kernel = rf.kernel(body, backend=backend, split=3, block_n=16)
    assert [k.name.rsplit("_", 1)[-1] for k in kernel.lower(*inputs).stages["tile"].kernels] == ["partial", "combine"]
    _judge(_outputs(backend, body, *inputs, split=3, block_n=16), body, inputs, 300)


@pytest.mark.parametrize("body", OWN_CENTRE_BODIES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_own_centre_keeps_numpys_infinities_and_nans(backend, body):
    """The own centre skips non-finite values (it stays finite), and where the highest power's sum is infinite
    the lower powers are dropped: +inf, -inf and both in one row give numpy's inf or NaN, not inf - inf."""
    x, other = _own_centre_inputs(body, (6, 20), seed=8)
    x[0, 3], x[1, 5], x[2, 7], x[3, :] = np.inf, -np.inf, np.nan, -np.inf
    x[4, 2], x[4, 9] = np.inf, -np.inf
    actual = _outputs(backend, body, x, other,
                      **({"interpret_chunk": 3} if backend == "interpret" else {"block_n": 4}))
    _judge(actual, body, (x, other), 20)


def test_explain_says_the_sum_is_centred_on_its_own_mean():
    x, z = _own_centre_inputs(fourth_power_about_another_max, (2, 64))
    lowered = rf.kernel(fourth_power_about_another_max, backend="interpret").lower(x, z)
    group = lowered.groups[0]
    assert group.fused and not group.notes
    text = rf.kernel(fourth_power_about_another_max, backend="interpret").explain(x, z)
    assert ("centred on its own running mean of x[i0,j] (shift-stable): (x[i0,j] - y[i0]) = (x[i0,j] - mean) + "
            "(mean - y[i0])") in text
    assert "out_delta" in text and "expanded into" not in text


@pytest.mark.parametrize("k", [2e-7, 2.0**-20])
@pytest.mark.parametrize("backend", ["interpret", "cpu"])
def test_a_centre_at_a_tiny_multiple_of_an_earlier_result_keeps_its_tiny_coefficients(backend, k):
    """``(x - k Y)^2`` with ``k`` 2e-7, or 2^-20 (a mean over 2^20 elements): the change of variables leaves
    ``k^2 Y^2`` terms of 4e-14 and 1e-12. An absolute cut-off for rounding residue (1e-12) dropped them, the
    wrong root ``u = 2 k Y`` then looked like a centre, and the sum was -5e10 for numpy's 850 (rows at 1e4; at
    100 here: -5e6 for 524); residue is
    now judged against the magnitudes each coefficient was summed from."""
    def square_about_a_scaled_dot(x, v):
        y = rf.sum(x * v, axis=-1, keepdims=True) * k
        return rf.sum((x - y) ** 2, axis=-1)

    rng = np.random.default_rng(8)
    x = (100 + rng.standard_normal((2, 512))).astype(np.float32)
    v = ((1 / (k * 512)) * (1 + 1e-3 * rng.standard_normal((2, 512)))).astype(np.float32)
    kernel = rf.kernel(square_about_a_scaled_dot, backend=backend)
    assert "centred on its own running mean of x[i0,j]" in kernel.explain(x, v)
    _judge(kernel(x, v), square_about_a_scaled_dot, (x, v), 512)


def test_a_linear_form_of_several_reduced_values_is_centred_as_one():
    """(x + v - Y)^2: centring x alone would leave sum v^2 - 2 delta sum v + ... to cancel; the root read off
    the two highest powers of Y is u = x + v, so the mean of x + v is the centre."""
    def square_of_a_sum_about_a_max(x, v, z):
        y = rf.max(z, axis=-1, keepdims=True)
        return rf.sum((x + v - y) ** 2, axis=-1)

    rng = np.random.default_rng(9)
    x = (600 + rng.standard_normal((4, 100))).astype(np.float32)
    v = (-300 + rng.standard_normal((4, 100))).astype(np.float32)
    z = (299.5 + 0.1 * rng.standard_normal((4, 100))).astype(np.float32)
    kernel = rf.kernel(square_of_a_sum_about_a_max, backend="interpret", interpret_chunk=8)
    assert "centred on its own running mean of" in kernel.explain(x, v, z)
    _judge(kernel(x, v, z), square_of_a_sum_about_a_max, (x, v, z), 100)


def _variance_about_own_mean(x):
    mu = rf.sum(x, axis=-1, keepdims=True) / x.shape[-1]
    return rf.sum((x - mu) ** 2, axis=-1) / x.shape[-1]


@pytest.mark.parametrize("chunk", [1, 2, 3])
def test_a_variance_whose_mean_moves_past_the_range_is_inf_not_nan(chunk):
    """The shift law's cross term ``2 d T1`` with ``T1 = sum (x - c)`` exactly 0 (the sum about the mean itself)
    and ``2 d`` overflowing (a move of 3e38), or ``d`` infinite (the running sum of four 1e38 overflows): 0 * inf
    was NaN, where numpy's squares are inf. Found by a helper (interpret_chunk=1)."""
    x = np.array([[3e38, -3e38, 0.0, 0.0], [-3e38, 3e38, 0.0, 0.0], [1e38, 1e38, 1e38, 1e38], [1, 2, 3, 4]],
                 np.float32)
    with np.errstate(all="ignore"):
        want = _variance_about_own_mean(x)
        for kernel in (rf.kernel(_variance_about_own_mean, backend="interpret", interpret_chunk=chunk),
                       rf.kernel(_variance_about_own_mean, backend="cpu", block_n=chunk),
                       rf.kernel(_variance_about_own_mean, backend="simulate", block_n=chunk)):
            np.testing.assert_array_equal(kernel(x), want)


def test_long_rows_keep_their_running_sums_compensated():
    """A loop adds one chunk partial at a time to a row's running sum: a chain of n / chunk additions whose
    roundings piled up in one direction (a helper measured, against float64: one f32 row of 4M values
    1e4 + N(0, 1) summed 2.2e-4 off on cpu, numpy's pairwise sum 1e-8; a variance centred on that running mean
    6.2 for 1.0 with block_n=16; the interpreter's 2.5 for 0.99 on 1e5 values near 1e6). Per-row f32 sums keep
    a Kahan compensation now (`schedule.reduce.compensated_add`, the interpreter likewise)."""
    rng = np.random.default_rng(5)
    x = (1e4 + rng.standard_normal((1, 1 << 22))).astype(np.float32)
    exact = x.astype(np.float64)
    got = rf.kernel(lambda a: rf.sum(a, axis=-1), backend="cpu")(x)
    assert abs(float(got[0]) / float(exact.sum()) - 1) < 1e-6
    var = lambda a: rf.var(a, axis=-1)      # noqa: E731
    assert abs(float(rf.kernel(var, backend="cpu", block_n=16)(x)[0]) / float(exact.var()) - 1) < 1e-3
    y = (1e6 + rng.standard_normal((1, 100_000))).astype(np.float32)
    want = float(y.astype(np.float64).var())
    assert abs(float(rf.kernel(var, backend="interpret")(y)[0]) / want - 1) < 0.05


@pytest.mark.parametrize("backend", ["cpu", "simulate"])
def test_a_long_f32_product_is_the_exact_product_rounded_once(backend):
    """(Found by a helper.) A long f32 product multiplied its chunks' products into an f32 running product:
    products of values near 1 round with a bias, and 2^22 values of 1 +- 5e-5 came out 3% low (numpy's own
    f32 product 0.2-0.4%). The chunks and the running product are f64 now; the reference is the float64
    product, numpy's being that far off."""
    n = (1 << 16) if backend == "cpu" else 1000
    x = (1 + (np.random.default_rng(0).random((2, n), dtype=np.float32) - 0.5) * 1e-4).astype(np.float32)
    got = rf.kernel(lambda a: rf.prod(a, axis=-1), backend=backend, block_n=64)(x).astype(np.float64)
    exact = x.astype(np.float64).prod(axis=-1)
    assert np.abs(got / exact - 1).max() < 2 ** -23, (got, exact)


def test_an_f16_variance_shifts_its_sums_in_f32():
    """The shift law's carry (the sums moved to the new centre) was typed in the centre's dtype, f16 for an
    f16 variance, though the sums it moves are f32 states: the interpreter, which evaluates it as typed,
    rounded the moved sums to f16 at every chunk (65 536 values of 3 + N(0, 1) in chunks of 8: a variance of
    0.58 for 1.0). The carry is now in the sums' dtype, and the verifier refuses arithmetic typed narrower
    than an operand. Compared with the float64 variance: numpy's own f16 sum overflows to inf there
    (docs/testing.md, conformance note [11])."""
    x = (3 + np.random.default_rng(7).standard_normal((2, 1 << 14))).astype(np.float16)
    want = x.astype(np.float64).var(axis=-1)
    for kernel in (rf.kernel(lambda a: rf.var(a, axis=-1), backend="interpret", interpret_chunk=8),
                   rf.kernel(lambda a: rf.var(a, axis=-1), backend="cpu", block_n=16)):
        got = kernel(x).astype(np.float64)
        assert np.abs(got / want - 1).max() < 2e-3, (got, want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_16_bit_variance_is_centred_on_the_mean_of_its_values(backend):
    """(Found by a helper.) The centre of an f16/bf16 variance was its 16-bit sum divided in f32: neither
    numpy's centre (the quotient rounded to f16) nor the exact one, so the std of an f16 constant 100.3125 over
    98 elements was 0.014 (bf16 100.5: 0.071) where numpy's and the exact one are 0. The centre's sum is f32."""
    import ml_dtypes

    for dtype, value in ((np.float16, 100.3125), (ml_dtypes.bfloat16, 100.5)):
        x = np.full((2, 4, 7, 7), value, dtype)
        (got,), (want,) = run_backend(backend, lambda a: rf.std(a, axis=(0, 2, 3)), x)
        np.testing.assert_array_equal(got.astype(np.float64), 0.0)
        if dtype == np.float16:    # (numpy adds bf16 one value at a time in bf16: its bf16 std here is 1.45)
            np.testing.assert_array_equal(want.astype(np.float64), 0.0)
    x = np.full((2, 4, 7, 7), 100.3125, np.float16)
    x[..., ::2] = 100.375                 # two f16 neighbours: numpy's rounded centre makes its variance 2.3x
    (got,), _ = run_backend(backend, lambda a: rf.var(a, axis=(0, 2, 3)), x)
    assert_close(got, x.astype(np.float64).var(axis=(0, 2, 3)).astype(np.float16), np.float16, 98, roundings=2)


def covariance(x):
    xc = x - rf.mean(x, axis=0, keepdims=True)
    return (xc.T @ xc) / (x.shape[0] - 1)


def row_gram(x):
    xc = x - rf.mean(x, axis=-1, keepdims=True)
    return xc @ xc.T


def reversed_product(x):
    xc = x - rf.mean(x, axis=-1, keepdims=True)
    return rf.sum(xc * xc[..., ::-1], axis=-1)


@pytest.mark.parametrize("body", [covariance, row_gram, reversed_product])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_product_of_two_differences_from_running_means_is_not_multiplied_out(backend, body):
    """(Found by a helper.) The covariance ``(x_a - m_a) (x_b - m_b)`` was centred on column ``a``'s running
    mean with ``x_b - m_b`` multiplied out, whose sums cancel where the data sits far from 0: at an offset of
    1e4, 30-300 times numpy's error (the row Gram matrix, ``xc * xc[::-1]`` alike). One running centre takes
    away one difference, so such a sum is a second pass, as written."""
    rng = np.random.default_rng(0)
    shape = (40, 4) if backend == "simulate" else (200, 4)
    x = (rng.standard_normal(shape if body is covariance else shape[::-1]) + 1e4).astype(np.float32)
    actual = _outputs(backend, body, x)
    _judge(actual, body, x, x.shape[0] if body is covariance else x.shape[-1])


def softmax_weighted_variance(x):
    m = rf.max(x, axis=-1, keepdims=True)
    e = rf.exp(x - m)
    p = e / rf.sum(e, axis=-1, keepdims=True)
    mu = rf.sum(p * x, axis=-1, keepdims=True)
    return rf.sum(p * (x - mu) ** 2, axis=-1)


def normalized_weight_variance(x, w):
    q = w / rf.sum(w, axis=-1, keepdims=True)
    mu = rf.sum(q * x, axis=-1, keepdims=True)
    return rf.sum(q * (x - mu) ** 2, axis=-1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_variance_about_a_stored_weighted_mean_is_not_centred_on_the_plain_mean(backend):
    """(Found by a helper.) A weighted mean the body stores first (``mu = sum(q * x)``) was taken for an ordinary
    earlier result, and ``sum(q (x - mu)^2)`` was centred on the compiler's plain running mean of x: with the
    weight on a few values far from the rest, -16 for numpy's 0.29 (and a softmax-weighted variance 11% off).
    A weighted power of 2 or more about such a result is a second pass."""
    rng = np.random.default_rng(5)
    rows, n = (4, 64) if backend == "simulate" else (4, 512)
    x = (30 * rng.standard_normal((rows, n))).astype(np.float32)
    _judge(_outputs(backend, softmax_weighted_variance, x), softmax_weighted_variance, x, n)
    x = (1e4 + rng.standard_normal((rows, n))).astype(np.float32)
    x[:, :n // 2] -= 1e4
    w = np.where(np.arange(n) < n // 2, 1e-3, 1.0).astype(np.float32) * np.ones((rows, 1), np.float32)
    _judge(_outputs(backend, normalized_weight_variance, x, w), normalized_weight_variance, (x, w), n)


def difference_times_weight_plus_a_product(x, w):
    r0 = rf.sum(x, axis=-1, keepdims=True)
    r1 = rf.min((x - r0) * 2.0, axis=-1, keepdims=True)
    return rf.sum((x - r0) * w + x * r1, axis=-1, keepdims=True)


def test_a_sum_of_a_difference_and_another_product_still_fuses():
    """Fuzz seed 101, example 55 (this change's first form): ``(x - r0) w + x r1`` adds a term reading ``w`` to
    one reading ``r1``, which `forms_difference` counts as a written ``w - r1``; only one difference is
    multiplied out, so the sum keeps its own centre and fuses."""
    x, w = (np.random.default_rng(s).standard_normal((3, 40)).astype(np.float32) for s in (1, 2))
    group = rf.kernel(difference_times_weight_plus_a_product, backend="interpret").lower(x, w).groups[-1]
    assert group.fused and group.reason is None
    for backend in BACKENDS:
        _judge(_outputs(backend, difference_times_weight_plus_a_product, x, w), difference_times_weight_plus_a_product,
               (x, w), 40)


def _layer_norm_by_hand(x):
    n = x.shape[-1]
    mu = rf.sum(x, axis=-1, keepdims=True) / n
    var = rf.sum((x - mu) ** 2, axis=-1, keepdims=True) / n
    return (x - mu) / rf.sqrt(var + 1e-5)


@pytest.mark.parametrize("backend", ("interpret", "cpu"))
@pytest.mark.parametrize("split", (1, 3))
def test_a_16_bit_layer_norm_centres_its_variance_on_the_mean_it_subtracts(backend, split):
    """(Found by a helper, hunt_norms/01.) An f16 layer norm by hand, ``mu = sum(x) / n``: its variance was
    centred on the running f32 mean while a split's epilogue subtracted the f16 sum divided (the sum rounded as
    stored), so a constant row of 768 had a variance of 0 and a numerator of 0.0104: 3.29 everywhere for numpy's
    0. The variance now keeps its own centre and is moved after the loop onto the mean the output subtracts,
    so the two agree whatever each rounds: ``|y| <= 1`` on a constant row (numpy's rounded mean gives 0 there,
    the kernel's f32 quotient of the f16 sum 0.96: docs/fusion.md, "A normalization of 16-bit values")."""
    x = np.full((2, 768), 32.84375, np.float16)
    x[1] = 5.0
    got = rf.kernel(_layer_norm_by_hand, backend=backend, split=split)(x).astype(np.float64)
    assert np.abs(got).max() <= 1.0, got.max()
    np.testing.assert_array_equal(got[1], 0.0)


def _layer_norm_of_statistics(x):
    mu = rf.mean(x, axis=-1, keepdims=True)
    by_var = (x - mu) / rf.sqrt(rf.var(x, axis=-1, keepdims=True) + 1e-5)
    return by_var, (x - mu) / (rf.std(x, axis=-1, keepdims=True) + 1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_bf16_layer_norm_of_a_constant_row_is_0(backend):
    """(Found by a helper, hunt_norms/02.) A bf16 mean rounded its f32 sum to bf16 before dividing (numpy's own
    bf16 sum rounds every step), a constant row's mean a bf16 step off its value, while ``var`` centres on the
    f32 mean: a row of 17 values 15.125 normalized to -19.75 (the ``std`` form -6240) for the exact 0. The mean
    now accumulates as f16's does, in f32, rounded once: the exact 0 (numpy's bf16 sum gives 1 there)."""
    import ml_dtypes

    x = np.full((3, 17), 15.125, ml_dtypes.bfloat16)
    x[1], x[2] = 100.5, -3.0
    for got in run_backend(backend, _layer_norm_of_statistics, x)[0]:
        np.testing.assert_array_equal(got.astype(np.float64), 0.0)


def _softmax_row_sum(x):
    m = rf.max(x, axis=-1, keepdims=True)
    return rf.sum(rf.exp(x - m), axis=-1)


def _softmin_row_sum(x):
    m = rf.min(x, axis=-1, keepdims=True)
    return rf.sum(rf.exp(m - x), axis=-1)


@pytest.mark.parametrize("backend,n,options", [("interpret", 4096, {"interpret_chunk": 1}),
                                               ("cpu", 1 << 16, {"block_n": 16})])
def test_a_rescale_repeated_every_chunk_does_not_drift(backend, n, options):
    """(Found by a helper, hunt_extremes/02.) On a row whose max rises by the same step in every chunk (a ramp,
    an ALiBi-like bias) each chunk rescales the running sum by one f32 factor ``exp(m_prev - m)``, rounded the
    same way every time: the errors added up with the number of chunks (4.3e-5 off for 4096 chunks on the
    interpreter, where the rule allows 1.2e-5). The factor's rounding error is now carried in the sum's
    compensation (`ir.loop.rescale_error`): within a few f32 roundings of the float64 sum."""
    x = (np.arange(n, dtype=np.float64) * 2.9e-6).astype(np.float32)[None]
    for body, row in ((_softmax_row_sum, x), (_softmin_row_sum, -x)):
        got = rf.kernel(body, backend=backend, **options)(row).astype(np.float64)
        exact = body(row.astype(np.float64))
        assert np.abs(got / exact - 1).max() < 2e-6, (body.__name__, got, exact)
