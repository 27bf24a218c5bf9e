"""Where numpy's operators are not its ufuncs, kernels follow the operator the body wrote.

- ``x ** 0.5``: numpy's float32/float64 loops and the ``**`` operator's fast path for float16 take a square
  root (``sqrt(-inf)`` is NaN, ``sqrt(-0.0)`` is -0.0), while ``np.power`` of float16 and every power of
  bfloat16 and float8 is C's ``pow`` (+inf and +0.0 there). Kernels strength-reduced every ``0.5`` to a
  square root, and the interpreter used ``np.power`` where the body wrote ``**``.
- ``bool ** 2`` is int8 in numpy (``np.square``); kernels gave int64. RedFuser has no int8: a DTypeError.
  (numpy 2.3.0 and 2.3.1 gave int64; the kernel follows the installed numpy.)
- An int array compared with a Python int outside its dtype's range is compared exactly by numpy; kernels
  raised a DTypeError (the common dtype came from ``np.add``, which overflows).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import redfuser as rf

BACKENDS = ("interpret", "cpu", "simulate")
SPECIAL = [-np.inf, -0.0, 0.0, 2.0, np.inf, np.nan, -3.0]


def same(got, expected) -> bool:
    """Equal values and dtype, NaN where numpy has NaN, and the sign of every number (zeros included)."""
    got, expected = np.asarray(got), np.asarray(expected)
    numbers = ~np.isnan(expected.astype(np.float64))
    return (got.dtype == expected.dtype and np.array_equal(got, expected, equal_nan=True)
            and np.array_equal(np.signbit(got[numbers]), np.signbit(expected[numbers])))


HALF_POWERS = {"operator": lambda x: x ** 0.5, "np.power": lambda x: rf.power(x, 0.5),
               "f32 exponent": lambda x: x ** np.float32(0.5)}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float16, np.float32, ml_dtypes.bfloat16], ids=["f16", "f32", "bf16"])
@pytest.mark.parametrize("form", sorted(HALF_POWERS))
def test_half_powers_at_minus_inf_and_minus_zero(form, dtype, backend):
    x = np.array(SPECIAL, dtype)
    body = HALF_POWERS[form]
    assert same(rf.kernel(body, backend=backend)(x), body(x))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.bool_])
def test_half_powers_of_integers_and_bools_are_float64_roots(dtype, backend):
    x = np.array([0, 1, 2, 9, -4], dtype) if dtype is not np.bool_ else np.array([True, False])
    for body in HALF_POWERS.values():
        assert same(rf.kernel(body, backend=backend)(x), body(x))


@pytest.mark.parametrize("backend", BACKENDS)
def test_bool_squared_follows_numpys_operator(backend):
    """numpy's ``bool ** 2`` is int8 (np.square), except in numpy 2.3.0 and 2.3.1 (int64, numpy#29392): the
    kernel asks the installed numpy, and raises a DTypeError where numpy's answer is a dtype RedFuser lacks."""
    x = np.array([True, False])
    expected = x ** 2
    if expected.dtype == np.int8:
        with pytest.raises(rf.DTypeError, match="int8"):
            rf.kernel(lambda x: x ** 2, backend=backend)(x)
    else:
        assert same(rf.kernel(lambda x: x ** 2, backend=backend)(x), expected)
    got = rf.kernel(lambda x: rf.power(x, 2), backend=backend)(x)   # np.power: int64
    assert same(got, np.power(x, 2))


COMPARISONS = {
    "lt": lambda x: x < 2**40, "ge_left": lambda x: 2**40 <= x, "eq": lambda x: x == -2**70,
    "ne": lambda x: x != 2**40, "gt_bool": lambda x: x.astype(rf.bool_) > 2, "le_i64": lambda x: x <= -2**63 - 1,
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(COMPARISONS))
def test_comparisons_with_python_ints_beyond_the_dtype_are_exact(name, backend):
    x = np.array([1, -5, 2**31 - 1, -2**31], np.int32)
    if name == "le_i64":
        x = x.astype(np.int64)
    body = COMPARISONS[name]
    assert same(rf.kernel(body, backend=backend)(x), body(x))


def test_an_arange_numpy_refuses_is_a_dtype_error():
    with pytest.raises(rf.DTypeError, match="arange"):
        rf.kernel(lambda x: x * rf.arange(3, dtype=x.dtype), backend="interpret")(np.ones(3, bool))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("exponent", [2, -1, 1, 0, np.float32(2), 2.0])
@pytest.mark.parametrize("dtype", [np.float16, np.float32], ids=["f16", "f32"])
def test_the_operators_shortcut_exponents_are_traced_as_numpy_takes_them(dtype, exponent, backend):
    """numpy's ``x ** 2`` is ``np.square(x)``, not ``np.power`` (in numpy 2.0 float32 ``np.power(x, 2)`` is an
    ulp off on a tenth of the values): the kernel computes what the operator computes, bit for bit."""
    x = np.concatenate([np.array(SPECIAL), np.random.default_rng(3).standard_normal(200) * 3]).astype(dtype)
    body = lambda x: x ** exponent  # noqa: E731
    assert same(rf.kernel(body, backend=backend)(x), body(x))
    traced = str(rf.kernel(body, backend="interpret").lower(x).stages["traced"])
    assert "**" not in traced.split("\n", 2)[-1]


@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_d_results_are_numpy_scalars_in_the_reference(backend):
    """numpy's reductions to 0-d return numpy scalars, whose ** is np.power: a bool's square is int64 (an
    array's is int8), a float16's half power is C's pow (+0.0 at -0.0). Only a 0-d argument is an array."""
    bodies = [lambda x: rf.min(x, axis=None, keepdims=True) ** 2, lambda x: rf.max(x > 0) ** 2]
    for body in bodies:
        x = np.array([True, False]) if body is bodies[1] else np.asarray(True)
        assert same(rf.kernel(body, backend=backend)(x), body(x))
    h = np.array([-0.0, -1.0], np.float16)
    half = lambda x: rf.max(x) ** 0.5  # noqa: E731
    assert same(rf.kernel(half, backend=backend)(h), half(h))
    zero_d = np.asarray(True)                            # a 0-d argument is an array: numpy's int8
    if (zero_d ** 2).dtype == np.int8:
        with pytest.raises(rf.DTypeError, match="int8"):
            rf.kernel(lambda x: x ** 2, backend=backend)(zero_d)


def _argmax_updated_in_place(x):
    s = rf.argmax(x)
    t = s
    s += 1
    return t + x


def _logaddexp_updated_in_place(x):
    s = rf.logaddexp(x[0, 0], x[0, 1])
    t = s
    s += 1
    return t + x


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("body", [_argmax_updated_in_place, _logaddexp_updated_in_place],
                         ids=["argmax", "logaddexp"])
def test_a_scalar_result_updated_in_place_leaves_other_names_alone(backend, body):
    """numpy's argmax of a whole array and a ufunc of scalars return numpy scalars, which ``s += 1`` rebinds;
    both were made with `where`, whose 0-d result is an array, so the update wrote through ``t = s`` too
    (found by a helper: every backend returned ``t + 1 + x``)."""
    x = np.arange(8, dtype=np.float32)[::-1].copy().reshape(2, 4)
    got, want = rf.kernel(body, backend=backend)(x), body(x)
    assert got.dtype == want.dtype and np.array_equal(got, want), (got, want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_python_ints_past_an_int_dtype_are_numpys_in_clip_and_where(backend):
    """``clip(int32, -3, 2**40)`` never clips above (numpy compares the bound exactly); the bound became an i32
    constant of 0 (cpu: [0, 0, -3]; interpret: a bare OverflowError; simulate: an internal VerifyError).
    ``where(c, int32, 2**40)`` holds numpy's wrapped 0 on every backend; a bound numpy refuses is refused.
    Found by a helper sweeping dtype promotion."""
    x = np.array([2 ** 31 - 1, 5, -7], np.int32)
    c = np.array([True, False, True])
    cases = [(lambda a: rf.clip(a, -3, 2 ** 40), (x,)), (lambda a: rf.clip(a, None, 2 ** 31), (x,)),
             (lambda a: rf.clip(a, -2 ** 40, 2 ** 40), (x,)), (lambda a: rf.clip(a, -2 ** 31 - 1, 3), (x,)),
             (lambda c, a: rf.where(c, a, 2 ** 40), (c, x)), (lambda c, a: rf.where(c, a, -2 ** 31 - 1), (c, x))]
    for body, args in cases:
        got, want = rf.kernel(body, backend=backend)(*args), body(*args)
        assert got.dtype == want.dtype and np.array_equal(got, want), (got, want)
    with pytest.raises(rf.DTypeError):
        rf.kernel(lambda a: rf.clip(a, 2 ** 40, None), backend=backend)(x)
    with pytest.raises(rf.DTypeError, match="too large"):
        rf.kernel(lambda c, a: rf.where(c, a, 2 ** 64), backend=backend)(c, x)


@pytest.mark.parametrize("backend", BACKENDS)
def test_unary_plus_is_numpys_positive(backend):
    """``+x`` of bools is refused as numpy refuses it (it returned the array); of numbers it is a new value,
    so ``y = +x; y += 1`` leaves ``x`` as it is (it was ``x`` itself)."""
    def plus_then_update(a):
        y = +a
        y += 1
        return a, y

    a = np.arange(4, dtype=np.float32)
    got = rf.kernel(plus_then_update, backend=backend)(a)
    for g, w in zip(got, plus_then_update(a.copy())):
        np.testing.assert_array_equal(g, w)
    with pytest.raises(rf.DTypeError):
        rf.kernel(lambda b: +b, backend=backend)(np.array([True, False]))
    with pytest.raises(rf.DTypeError, match="2147483648|9223372036854775808"):
        rf.kernel(lambda b: b < 2 ** 63, backend=backend)(np.array([True, False]))


@pytest.mark.parametrize("backend", BACKENDS)
def test_logical_and_and_or_take_numbers_by_truth_as_numpy_does(backend):
    """(Found by a helper.) ``rf.logical_and`` of an int32 array was refused with a message about ``&`` and
    ``|`` while ``rf.logical_xor`` took it; numpy's logical functions take any number by its truth. The
    operators ``&`` and ``|`` stay logical on bools only, refused on numbers as bitwise operations."""
    x = np.array([[-2, 0, 3]], np.int32)
    b = np.array([[True, False, True]])
    for body in (lambda x, b: rf.logical_and(x, b), lambda x, b: rf.logical_or(x, x),
                 lambda x, b: rf.logical_and(x.astype(rf.float32), 2.0)):
        got, want = rf.kernel(body, backend=backend)(x, b), body(x, b)
        assert got.dtype == want.dtype and np.array_equal(got, want), (got, want)
    with pytest.raises(rf.DTypeError, match="bitwise_and: & is logical and on bools"):
        rf.kernel(lambda x, b: x & b, backend=backend)(x, b)
