"""``rf.prod``: numpy's product reduction, a monoid to the whole compiler (identity 1, combine ``*``).

It joins a fused pass when its body reads no earlier result, or reads one only inside an exponential (the product
law, tests/test_product_law.py); a product of ``G(x)·h(y)`` with another factor of y, ``x / max(x)``, is refused
with that reason (and stays exact). Integer products wrap as numpy's do, in any order; bools give int64; an empty axis gives 1.
"""
from __future__ import annotations


import numpy as np
import pytest

import redfuser as rf
from helpers import assemble_without_spills

BACKENDS = ("interpret", "cpu", "simulate")
RNG = np.random.default_rng(11)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("axis", [-1, 0, None, (0, 2)])
def test_prod_equals_numpy(backend, axis):
    x = RNG.uniform(0.6, 1.6, (3, 5, 41)).astype(np.float32)
    got, want = rf.kernel(lambda v: rf.prod(v, axis=axis), backend=backend)(x), np.prod(x, axis=axis)
    assert got.dtype == want.dtype and got.shape == np.shape(want)
    rf.testing.assert_close(got, want, np.float32, x.size)


@pytest.mark.parametrize("backend", BACKENDS)
def test_integer_products_wrap_like_numpys_and_bools_count_as_int64(backend):
    xi = RNG.integers(-9, 10, (4, 33)).astype(np.int32)       # overflows int64 and wraps
    xb = RNG.random((4, 33)) < 0.97
    empty = np.zeros((4, 0), np.int32)
    k = rf.kernel(lambda a, b, e: (a.prod(axis=-1), rf.prod(b, axis=0), rf.prod(e, axis=-1)), backend=backend)
    got, want = k(xi, xb, empty), (xi.prod(axis=-1), np.prod(xb, axis=0), np.prod(empty, axis=-1))
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and np.array_equal(g, w)


def _softmax_sum_and_prod(x):
    m = rf.max(x, axis=-1, keepdims=True)
    return rf.sum(rf.exp(x - m), axis=-1), rf.prod(x, axis=-1)


def _prod_of_scaled(x):
    return rf.prod(x / rf.max(x, axis=-1, keepdims=True), axis=-1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_independent_prod_joins_the_pass_and_one_scaled_by_an_earlier_result_does_not(backend):
    x = RNG.uniform(0.8, 1.25, (6, 200)).astype(np.float32)
    k = rf.kernel(_softmax_sum_and_prod, backend=backend)
    assert [g.fused for g in k.lower(x).groups] == [True]
    for g, w in zip(k(x), _softmax_sum_and_prod(x)):
        rf.testing.assert_close(g, w, np.float32, 200)
    k = rf.kernel(_prod_of_scaled, backend=backend)
    (group,) = k.lower(x).groups
    assert not group.fused and "not an exponential of earlier results" in group.reason
    rf.testing.assert_close(k(x), _prod_of_scaled(x), np.float32, 200)


def test_ptx_assembles_for_sm80_and_sm90():
    x = RNG.uniform(0.8, 1.25, (6, 200)).astype(np.float32)
    assemble_without_spills(rf.kernel(_softmax_sum_and_prod, backend="cuda", sm="sm_80").lower(x))

def _sum_over_prod(x):
    return rf.sum(rf.exp(x - rf.prod(x, axis=-1, keepdims=True)), axis=-1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_product_read_by_a_later_member_is_not_taken_for_a_running_max(backend):
    """A running product is no running max or min: in ``exp(x - prod x)`` (an online exponent) the engine read a
    product equal to its identity 1 as 0, as it reads a max still at -inf (`nan_guard.running_extrema`): e times
    numpy's sum on a row whose product is exactly 1."""
    x = np.array([[2.0, 0.5, 1.0, 4.0, 0.25, 1.0], [1.5, 2.0, 1.0, 1.0, 1.0, 0.5]], np.float32)
    got, want = rf.kernel(_sum_over_prod, backend=backend)(x), _sum_over_prod(x)
    rf.testing.assert_close(got, want, np.float32, 6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_exp_of_a_bool_max_at_false_is_not_an_unseen_row(backend):
    """Fuzz seed 1, example 4009 at 17e4aa1: ``std(exp(x1 @ x3))`` of bools whose product is False: a bool max
    at its identity False is an ordinary value, not a row that saw nothing (NaN for numpy's 0)."""
    def body(x1, x3):
        return rf.std(rf.exp(x1 @ x3), axis=-1, keepdims=True)

    x1, x3 = np.array([True]).reshape(1, 1, 1), np.array([False]).reshape(1, 1, 1)
    got, want = rf.kernel(body, backend=backend)(x1, x3), body(x1, x3)
    assert np.array_equal(np.asarray(got, np.float64), np.asarray(want, np.float64))
