"""Conditions that read only the reduced values: ``where(c(x), G1(x)·H(y), G2(x)·H(y)) = where(c(x), G1, G2)·H(y)``.

A masked softmax written with `rf.where` after the exponential fuses like the one written with a
multiplication by the mask, and gives numpy's values on every input: masked-out rows (0/0 = NaN), -inf
scores, rows of only -inf. A where whose condition reads an earlier result does not factor and runs unfused.
"""
from __future__ import annotations

import numpy as np
import pytest
from helpers import run_backend

import redfuser as rf
from redfuser.testing.tolerance import assert_close

BACKENDS = ("interpret", "cpu", "simulate")
ROWS, N, D = 6, 40, 8


def attention_normalized(s, mask, v):
    m = rf.max(s, axis=-1, keepdims=True)
    p = rf.where(mask, rf.exp(s - m), 0.0)
    l = rf.sum(p, axis=-1, keepdims=True)
    return (p / l) @ v


def attention_deferred(s, mask, v):
    m = rf.max(s, axis=-1, keepdims=True)
    p = rf.where(mask, rf.exp(s - m), 0.0)
    l = rf.sum(p, axis=-1, keepdims=True)
    return p @ v / l


def condition_on_scores(s, mask, v):
    """The condition reads the reduced operand itself (not a mask argument), the other branch is G2·H."""
    m = rf.max(s, axis=-1, keepdims=True)
    p = rf.where(s > 0.25, rf.exp(s - m), 0.5 * s * rf.exp(s - m))
    l = rf.sum(p, axis=-1, keepdims=True)
    return p @ v / l


def condition_on_max(s, mask, v):
    """The condition reads m, an earlier result: no factorization, a second pass."""
    m = rf.max(s, axis=-1, keepdims=True)
    p = rf.where(s > m - 1.0, rf.exp(s - m), 0.0)
    l = rf.sum(p, axis=-1, keepdims=True)
    return p @ v / l


def condition_only_on_max(s, mask, v):
    m = rf.max(s, axis=-1, keepdims=True)
    p = rf.where(m > 0.0, rf.exp(s - m), 0.0)
    return rf.sum(p, axis=-1)


def branches_with_other_h(s, mask, v):
    m = rf.max(s, axis=-1, keepdims=True)
    p = rf.where(mask, rf.exp(s - m), rf.exp(s - 2.0 * m))
    return rf.sum(p, axis=-1)


def _inputs(kind: str, seed: int = 0):
    rng = np.random.default_rng(seed)
    s = (2.0 * rng.standard_normal((ROWS, N))).astype(np.float32)
    v = rng.standard_normal((N, D)).astype(np.float32)
    if kind == "causal":
        mask = np.tril(np.ones((ROWS, N), bool), k=N - ROWS)
    else:
        mask = rng.random((ROWS, N)) < 0.6
    mask[1] = False                         # a fully masked row: l = 0, the reference's 0/0 = NaN
    s[2, ::3] = -np.inf                     # -inf scores among finite ones
    s[3] = -np.inf                          # a row of only -inf: m = -inf, exp(-inf - -inf) = NaN
    s[4, :5] = -np.inf
    mask[4, 5:] = False                     # only -inf scores survive the mask
    return s, mask, v


def _fused(lowered) -> bool:
    (g,) = lowered.groups
    return g.fused and g.reason is None


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["causal", "random"])
@pytest.mark.parametrize("body", [attention_normalized, attention_deferred, condition_on_scores])
def test_where_on_the_reduced_values_fuses_and_matches_numpy(backend, kind, body):
    s, mask, v = _inputs(kind)
    k = rf.kernel(body, backend="interpret", interpret_chunk=7)
    lowered = k.lower(s, mask, v)
    (g,) = lowered.groups
    assert g.fused and g.reason is None and g.fused_members == g.reductions
    if body is not condition_on_scores:
        assert "where(mask[" in k.explain(s, mask, v) and "H comes out of the where" in k.explain(s, mask, v)
    actual, expected = run_backend(backend, body, s, mask, v)
    assert np.isnan(expected[0][3]).all()                 # the row of only -inf
    if body is not condition_on_scores:
        assert np.isnan(expected[0][1]).all()             # the fully masked row
    for a, e in zip(actual, expected):
        assert_close(a, e, np.float32, N)


@pytest.mark.parametrize("chunk", [1, 5, 64])
def test_masked_softmax_matches_numpy_for_every_chunk(chunk):
    s, mask, v = _inputs("random", seed=3)
    k = rf.kernel(attention_normalized, backend="interpret", interpret_chunk=chunk)
    assert _fused(k.lower(s, mask, v))
    with np.errstate(all="ignore"):
        expected = attention_normalized(s, mask, v)
    assert_close(k(s, mask, v), expected, np.float32, N)


def test_where_and_mask_multiplication_fuse_alike():
    def multiplied(s, mask, v):
        m = rf.max(s, axis=-1, keepdims=True)
        p = rf.exp(s - m) * mask.astype(rf.float32)
        l = rf.sum(p, axis=-1, keepdims=True)
        return p @ v / l

    s, mask, v = _inputs("random", seed=1)
    for body in (multiplied, attention_deferred):
        lowered = rf.kernel(body, backend="interpret").lower(s, mask, v)
        assert _fused(lowered)
        assert [d.kind for d in lowered.groups[0].decompositions.values()] == ["independent", "separable",
                                                                               "separable"]


def test_loop_evaluates_the_where_with_the_running_max_inside():
    """exp(s) is never evaluated apart from exp(-m): the loop's term is where(mask, exp(s - m_t), 0)."""
    s, mask, v = _inputs("random")
    s = s + 200.0                           # exp(s) alone overflows f32
    lowered = rf.kernel(attention_deferred, backend="interpret").lower(s, mask, v)
    l_dec = lowered.groups[0].decompositions["l"]
    assert "where(mask[" in rf.ir.format_expr(l_dec.accumulators[0].term)
    assert l_dec.conditions and "exp(s[" in rf.ir.format_expr(l_dec.accumulators[0].term)
    actual, expected = run_backend("interpret", attention_deferred, s, mask, v)
    assert_close(actual[0], expected[0], np.float32, N)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("body", [condition_on_max, condition_only_on_max, branches_with_other_h])
def test_where_reading_an_earlier_result_stays_unfused_and_correct(backend, body):
    s, mask, v = _inputs("random", seed=2)
    lowered = rf.kernel(body, backend="interpret").lower(s, mask, v)
    (g,) = lowered.groups
    assert not g.fused and "where" in g.reason
    actual, expected = run_backend(backend, body, s, mask, v)
    for a, e in zip(actual, expected):
        assert_close(a, e, np.float32, N)


def masked_sum(s, mask, v):
    m = rf.max(s, axis=-1, keepdims=True)
    return rf.sum(rf.where(mask, rf.exp(s - m), 0.0), axis=-1)


def masked_max(s, mask, v):
    m = rf.max(s, axis=-1, keepdims=True)
    return rf.max(rf.where(mask, 0.0, rf.exp(s - m)), axis=-1)


def masked_pv(s, mask, v):
    m = rf.max(s, axis=-1, keepdims=True)
    return rf.where(mask, rf.exp(s - m), 0.0) @ v


def factor_inside_the_where(s, mask, v):
    """1/l inside the where: the where keeps 0 where l is 0 (a fully masked row), a factor after the loop would
    not, so this member is refused (l and m still fuse)."""
    m = rf.max(s, axis=-1, keepdims=True)
    l = rf.sum(rf.where(mask, rf.exp(s - m), 0.0), axis=-1, keepdims=True)
    return rf.where(mask, rf.exp(s - m) / l, 0.0) @ v


SPECIAL = np.array([0.0, 1.0, -1.0, 30.0, np.inf, -np.inf, np.nan], np.float32)


def _special_inputs(seed: int):
    rng = np.random.default_rng(seed)
    s = rng.choice(SPECIAL, (16, 8)).astype(np.float32)
    mask = rng.random((16, 8)) < 0.5
    mask[0] = False
    mask[1] = True
    s[2] = -np.inf
    s[3] = -np.inf
    mask[3] = False                          # only -inf and nothing selected: numpy's sum is 0, not NaN
    v = rng.standard_normal((8, 3)).astype(np.float32)
    return s, mask, v


@pytest.mark.parametrize("chunk", [1, 3, 8])
@pytest.mark.parametrize("body", [masked_sum, masked_max, masked_pv, attention_deferred, factor_inside_the_where])
def test_nan_and_inf_rows_are_numpys(body, chunk):
    """A running max that ends NaN or -inf makes numpy's exp(s - m) NaN, but only in the rows where the
    where selects some element; a row seen before a NaN may have been rescaled to 0 on the way."""
    k = rf.kernel(body, backend="interpret", interpret_chunk=chunk)
    for seed in range(25):
        s, mask, v = _special_inputs(seed)
        with np.errstate(all="ignore"):
            expected = body(s, mask, v)
        assert_close(k(s, mask, v), expected, np.float32, 8)
    (g,) = k.lower(s, mask, v).groups
    if body is factor_inside_the_where:
        assert g.fused_members == ("m", "l") and "outside the where" in g.reason
    elif body is masked_max:
        assert not g.fused and "0 branch would be rescaled" in g.reason
    else:
        assert g.fused and g.reason is None


@pytest.mark.parametrize("backend", ["cpu", "simulate"])
@pytest.mark.parametrize("body", [masked_sum, attention_deferred])
def test_nan_and_inf_rows_on_the_compiled_backends(backend, body):
    s, mask, v = _special_inputs(7)
    actual, expected = run_backend(backend, body, s, mask, v)
    assert_close(actual[0], expected[0], np.float32, 8)


@pytest.mark.parametrize("backend", ["cpu", "simulate"])
def test_split_reduction_merges_the_where_states(backend):
    """Flash decoding: slices of the keys in separate programs, merged (the flag state merges by max)."""
    s, mask, v = _special_inputs(3)
    actual, expected = run_backend(backend, attention_deferred, s, mask, v, split=3, block_n=2)
    assert_close(actual[0], expected[0], np.float32, 8)


def causal_from_indices(s, mask, v):
    """The condition is built from the loop index and the row index, not passed in."""
    r, n = s.shape
    causal = rf.arange(n)[None, :] <= rf.arange(r)[:, None] + (n - r - 8)
    m = rf.max(s, axis=-1, keepdims=True)
    p = rf.where(causal, rf.exp(s - m), 0.0)
    return p @ v / rf.sum(p, axis=-1, keepdims=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_condition_on_the_loop_index_fuses(backend):
    s, mask, v = _inputs("random", seed=4)
    assert _fused(rf.kernel(causal_from_indices, backend="interpret").lower(s, mask, v))
    actual, expected = run_backend(backend, causal_from_indices, s, mask, v)
    assert_close(actual[0], expected[0], np.float32, N)
