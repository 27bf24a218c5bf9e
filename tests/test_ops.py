"""Per-op tests: every op of the namespace, traced and interpreted, against the undecorated body on numpy.

Each test runs the same body twice: as a kernel on ``backend="interpret"`` and as
plain Python on the numpy arrays (the reference). Elementwise ops, casts and views
must be bit-exact (same numpy function on the same values); reductions and
matmul use the suite's tolerance rule. Separately, ``rf.<op>`` on plain arrays
must return exactly what numpy returns.
"""
from __future__ import annotations

import zlib

import ml_dtypes
import numpy as np
import pytest

import redfuser as rf
from redfuser.testing import assert_close

FLOATS = [np.float32, np.float16, ml_dtypes.bfloat16]
ALL_EXPORTED = [rf.float32, rf.float16, rf.bfloat16, rf.float8_e4m3fn, rf.int32, rf.int64, rf.bool_]
_CALLS = [0]


@pytest.fixture(autouse=True)
def _fresh_data():
    """Restart `data`'s sequence per test, so a test sees the same values however the suite is ordered."""
    _CALLS[0] = 0


def data(shape, dtype=np.float32, positive=False, scale=1.0):
    """Test values of `dtype` (positive ones for log/sqrt): the n-th call of a test always gives the same."""
    _CALLS[0] += 1
    key = repr((_CALLS[0], shape, np.dtype(dtype).name, positive, scale))
    rng = np.random.default_rng(zlib.crc32(key.encode()))
    x = rng.standard_normal(shape) * scale
    if positive:
        x = np.abs(x) + 0.25
    return np.asarray(x).astype(dtype)


def assert_identical(actual, expected, err_msg=""):
    """Same shape, dtype and values, bit for bit in value (NaN equal to NaN, signed zeros distinguished)."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, f"{err_msg} shape {actual.shape} != {expected.shape}"
    assert actual.dtype == expected.dtype, f"{err_msg} dtype {actual.dtype} != {expected.dtype}"
    if expected.dtype.kind in "biu":
        np.testing.assert_array_equal(actual, expected, err_msg=err_msg)
        return
    a, e = actual.astype(np.float64), expected.astype(np.float64)
    assert np.array_equal(a, e, equal_nan=True), f"{err_msg}\nactual   {a}\nexpected {e}"
    assert np.array_equal(np.signbit(a), np.signbit(e)), f"{err_msg} signs of zero differ"


def assert_numpy_result(actual, expected):
    """``rf.<op>`` on plain arrays: exactly numpy's result, down to its Python type (array or scalar)."""
    assert type(actual) is type(expected), f"{type(actual)} is not numpy's {type(expected)}"
    assert_identical(actual, expected, "rf op on plain arrays")


def both(body, *arrays):
    """(kernel result on the interpreter, reference result of the plain body)."""
    with np.errstate(all="ignore"):
        expected = body(*arrays)
    actual = rf.kernel(body, backend="interpret")(*arrays)
    return actual, expected


def check_exact(body, *arrays):
    actual, expected = both(body, *arrays)
    if isinstance(expected, tuple | list):
        assert type(actual) is type(expected) and len(actual) == len(expected)     # (a list gives a list)
        for a, e in zip(actual, expected):
            assert_identical(a, e)
    else:
        assert_identical(actual, expected)


def check_close(body, *arrays, n, dtype=None):
    actual, expected = both(body, *arrays)
    expected = np.asarray(expected)
    assert_close(actual, expected, dtype or expected.dtype, n)


# ---------------------------------------------------------------------------------------------
# elementwise
# ---------------------------------------------------------------------------------------------
UNARY = {
    "neg": (lambda x: -x, np.negative, False),
    "negative": (lambda x: rf.negative(x), np.negative, False),
    "pos": (lambda x: +x, np.positive, False),
    "abs": (lambda x: rf.abs(x), np.abs, False),
    "abs_builtin": (lambda x: abs(x), np.abs, False),
    "exp": (lambda x: rf.exp(x), np.exp, False),
    "exp2": (lambda x: rf.exp2(x), np.exp2, False),
    "log": (lambda x: rf.log(x), np.log, True),
    "log2": (lambda x: rf.log2(x), np.log2, True),
    "sqrt": (lambda x: rf.sqrt(x), np.sqrt, True),
    "rsqrt": (lambda x: rf.rsqrt(x), lambda x: 1 / np.sqrt(x), True),
}


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name", list(UNARY))
def test_unary(name, dtype):
    body, np_fn, positive = UNARY[name]
    x = data((3, 5), dtype, positive=positive)
    check_exact(body, x)
    with np.errstate(all="ignore"):
        assert_numpy_result(body(x), np_fn(x))


def test_unary_special_values():
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -1.0, 1e-30, 88.0, 89.0], np.float32)
    for name, (body, _, _) in UNARY.items():
        check_exact(body, x)


BINARY = {
    "add": (lambda a, b: a + b, np.add),
    "sub": (lambda a, b: a - b, np.subtract),
    "mul": (lambda a, b: a * b, np.multiply),
    "div": (lambda a, b: a / b, np.true_divide),
    "rf.add": (lambda a, b: rf.add(a, b), np.add),
    "rf.subtract": (lambda a, b: rf.subtract(a, b), np.subtract),
    "rf.multiply": (lambda a, b: rf.multiply(a, b), np.multiply),
    "rf.divide": (lambda a, b: rf.divide(a, b), np.true_divide),
    "maximum": (lambda a, b: rf.maximum(a, b), np.maximum),
    "minimum": (lambda a, b: rf.minimum(a, b), np.minimum),
}
BROADCASTS = [((3, 5), (3, 5)), ((3, 5), (5,)), ((3, 1), (1, 5)), ((2, 1, 4), (3, 1)), ((), (2, 3)),
              ((4, 1), ()), ((1,), (7,)), ((2, 3, 1, 5), (3, 4, 1))]


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name", list(BINARY))
def test_binary(name, dtype):
    body, np_fn = BINARY[name]
    a, b = data((3, 5), dtype), data((3, 5), dtype)
    check_exact(body, a, b)
    assert_numpy_result(body(a, b), np_fn(a, b))


@pytest.mark.parametrize("shapes", BROADCASTS, ids=str)
@pytest.mark.parametrize("name", ["add", "mul", "div", "maximum"])
def test_binary_broadcasting(name, shapes):
    body = BINARY[name][0]
    check_exact(body, data(shapes[0]), data(shapes[1]))
    check_exact(body, data(shapes[1], np.float16), data(shapes[0]))


def test_binary_special_values():
    a = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 1.0, np.inf, 0.0], np.float32)
    b = np.array([np.inf, np.inf, 1.0, 0.0, 0.0, 0.0, 0.0, -1.0], np.float32)
    for body, _ in BINARY.values():
        check_exact(body, a, b)
        check_exact(body, b, a)


@pytest.mark.parametrize("left,right", [(np.float32, np.float16), (np.float16, ml_dtypes.bfloat16),
                                        (np.float32, ml_dtypes.bfloat16), (np.int32, np.float32),
                                        (np.int32, np.int64), (np.bool_, np.float16), (np.int64, np.float16)])
def test_mixed_dtype_promotion(left, right):
    a, b = data((2, 3), np.float32, scale=4).astype(left), data((2, 3), np.float32, scale=4).astype(right)
    for body, _ in list(BINARY.values())[:4]:
        check_exact(body, a, b)


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("body", [
    lambda x: x + 1, lambda x: 2 * x, lambda x: x - 0.5, lambda x: 1.5 - x, lambda x: x / 3, lambda x: 3 / x,
    lambda x: x * True, lambda x: rf.maximum(x, 0.0), lambda x: rf.minimum(0.25, x),
    lambda x: rf.maximum(x, -rf.inf), lambda x: x + rf.inf, lambda x: x * 0.1,
], ids=["x+1", "2*x", "x-0.5", "1.5-x", "x/3", "3/x", "x*True", "max(x,0)", "min(0.25,x)", "max(x,-inf)",
        "x+inf", "x*0.1"])
def test_python_scalars(body, dtype):
    check_exact(body, data((4, 3), dtype))


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("body", [
    lambda x: np.float32(2) * x, lambda x: np.float16(0.5) + x, lambda x: np.float32(1) - x,
    lambda x: np.float32(3) / x, lambda x: np.int32(3) * x, lambda x: np.float32(0) < x,
    lambda x: x ** np.float32(2), lambda x: rf.maximum(np.float16(0.5), x),
], ids=["f32*x", "f16+x", "f32-x", "f32/x", "i32*x", "f32<x", "x**f32", "max(f16,x)"])
def test_numpy_scalars(body, dtype):
    """NumPy scalars are strong types (NEP 50): the kernel promotes exactly as numpy does."""
    check_exact(body, data((4, 3), dtype))


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("exponent", [2, 3, 0.5, -1, 2.5, 0, -2.0])
def test_power_constant_exponent(exponent, dtype):
    body = lambda x: x ** exponent  # noqa: E731
    x = data((3, 4), dtype, positive=True)
    check_close(body, x, n=1)
    check_close(lambda x: rf.power(x, exponent), x, n=1)
    assert_numpy_result(rf.power(x, exponent), np.power(x, exponent))


COMPARISONS = {
    "<": (lambda a, b: a < b, np.less), "<=": (lambda a, b: a <= b, np.less_equal),
    ">": (lambda a, b: a > b, np.greater), ">=": (lambda a, b: a >= b, np.greater_equal),
    "==": (lambda a, b: a == b, np.equal), "!=": (lambda a, b: a != b, np.not_equal),
    "rf.less": (lambda a, b: rf.less(a, b), np.less), "rf.equal": (lambda a, b: rf.equal(a, b), np.equal),
    "rf.greater_equal": (lambda a, b: rf.greater_equal(a, b), np.greater_equal),
    "rf.less_equal": (lambda a, b: rf.less_equal(a, b), np.less_equal),
    "rf.greater": (lambda a, b: rf.greater(a, b), np.greater),
    "rf.not_equal": (lambda a, b: rf.not_equal(a, b), np.not_equal),
}


@pytest.mark.parametrize("dtype", FLOATS + [np.int32], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name", list(COMPARISONS))
def test_comparisons(name, dtype):
    body, np_fn = COMPARISONS[name]
    a = np.array([[0, 1, 2, -1], [3, 3, -2, np.nan if dtype != np.int32 else 7]], np.float32).astype(dtype)
    b = np.array([1, 1, -1, 3], np.float32).astype(dtype)
    check_exact(body, a, b)
    check_exact(lambda x: body(x, 1), a)
    check_exact(lambda x: body(0.5, x), a)
    with np.errstate(all="ignore"):
        assert_numpy_result(body(a, b), np_fn(a, b))


def test_comparisons_mixed_dtypes():
    a, b = data((3, 4), np.float16), data((4,), np.float32)
    for body, _ in COMPARISONS.values():
        check_exact(body, a, b)
        check_exact(body, b, a.astype(np.int32))


@pytest.mark.parametrize("body,np_fn", [
    (lambda a, b: (a > 0) & (b > 0), lambda a, b: np.logical_and(a > 0, b > 0)),
    (lambda a, b: (a > 0) | (b > 0), lambda a, b: np.logical_or(a > 0, b > 0)),
    (lambda a, b: ~(a > b), lambda a, b: np.logical_not(a > b)),
    (lambda a, b: rf.logical_and(a > 0, b < 0), lambda a, b: np.logical_and(a > 0, b < 0)),
    (lambda a, b: rf.logical_or(a > 0, True), lambda a, b: np.logical_or(a > 0, True)),
    (lambda a, b: rf.logical_not(a < 0), lambda a, b: np.logical_not(a < 0)),
    (lambda a, b: ((a > 0) & ~(b > 0)) | (a == b), lambda a, b: ((a > 0) & ~(b > 0)) | (a == b)),
], ids=["&", "|", "~", "logical_and", "logical_or_scalar", "logical_not", "combined"])
def test_logical(body, np_fn):
    a, b = data((3, 5)), data((5,))
    check_exact(body, a, b)
    assert_numpy_result(body(a, b), np_fn(a, b))


def test_logical_on_bool_inputs():
    a, b = data((3, 4)) > 0, data((3, 1)) > 0
    check_exact(lambda a, b: a & b, a, b)
    check_exact(lambda a, b: a | ~b, a, b)
    check_exact(lambda a, b: rf.where(a, 1.0, b), a, b)


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
def test_where(dtype):
    x, y = data((3, 5), dtype), data((5,), dtype)
    c = data((3, 1)) > 0
    check_exact(lambda x, y: rf.where(x > y, x, y), x, y)
    check_exact(lambda x, y: rf.where(x > 0, x, -rf.inf), x, y)
    check_exact(lambda x, y: rf.where(x > 0, 0.0, y), x, y)
    check_exact(lambda x, y, c: rf.where(c, x, y), x, y, c)
    check_exact(lambda x, y: rf.where(x > 0, x.astype(rf.float32), y), x, y)
    assert_numpy_result(rf.where(c, x, y), np.where(c, x, y))


@pytest.mark.parametrize("source", [rf.float32, rf.float16, rf.bfloat16, rf.int32, rf.int64, rf.bool_,
                                    rf.float8_e4m3fn], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("target", ALL_EXPORTED, ids=lambda d: np.dtype(d).name)
def test_astype(source, target):
    x = (data((3, 4), scale=8) if np.dtype(source).kind != "b" else data((3, 4)) > 0).astype(source)
    check_exact(lambda x: x.astype(target), x)
    check_exact(lambda x: rf.astype(x, target), x)
    assert_numpy_result(rf.astype(x, target), x.astype(target))


def test_astype_special_values_to_low_precision():
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e5, 500.0, 449.0, 1e-9, 65519.0, 65520.0], np.float32)
    for target in (rf.float16, rf.bfloat16, rf.float8_e4m3fn):
        check_exact(lambda x: x.astype(target), x)


def test_astype_by_dtype_of_another_argument():
    x, y = data((2, 3)), data((2, 3), np.float16)
    check_exact(lambda x, y: x.astype(y.dtype) + y, x, y)


# ---------------------------------------------------------------------------------------------
# reductions
# ---------------------------------------------------------------------------------------------
AXES = [None, 0, 1, -1, -2, (0, 2), (2, 0), (-1, 0), (0, 1, 2), ()]


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("axis", AXES, ids=str)
@pytest.mark.parametrize("name", ["sum", "max", "min"])
def test_reductions(name, axis, keepdims, dtype):
    x = data((4, 5, 6), dtype)
    fn = getattr(rf, name)
    dims = range(3) if axis is None else np.atleast_1d(axis).astype(int)
    n = int(np.prod([x.shape[d] for d in dims]))
    check_close(lambda x: fn(x, axis=axis, keepdims=keepdims), x, n=n)
    check_close(lambda x: getattr(x, name)(axis=axis, keepdims=keepdims), x, n=n)
    assert_numpy_result(fn(x, axis=axis, keepdims=keepdims), getattr(np, name)(x, axis=axis, keepdims=keepdims))


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.bool_], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name", ["sum", "max", "min"])
def test_reductions_of_integers_and_bools(name, dtype):
    x = (data((3, 4), scale=50) if dtype != np.bool_ else data((3, 4)) > 0).astype(dtype)
    for axis in (None, 0, -1):
        check_exact(lambda x: getattr(rf, name)(x, axis=axis), x)


def test_reductions_keep_nan_and_inf():
    x = np.array([[1.0, np.nan, 2.0], [np.inf, 1.0, -np.inf], [-np.inf, -np.inf, -np.inf], [np.inf, 3, 4]],
                 np.float32)
    for name in ("sum", "max", "min"):
        check_exact(lambda x: getattr(rf, name)(x, axis=-1), x)


def test_sum_over_empty_axis_is_zero():
    x = np.zeros((3, 0), np.float32)
    check_exact(lambda x: rf.sum(x, axis=-1), x)
    check_exact(lambda x: rf.sum(x, axis=0, keepdims=True), x)
    check_exact(lambda x: rf.max(x, axis=0), x)  # reducing the non-empty axis of an empty array is fine


def test_reduction_of_a_zero_dim_value():
    x = data((4, 3))
    check_close(lambda x: rf.sum(rf.sum(x), axis=None), x, n=12)
    check_exact(lambda x: rf.max(rf.max(x, axis=(0, 1)), axis=()), x)


# ---------------------------------------------------------------------------------------------
# matmul
# ---------------------------------------------------------------------------------------------
MATMUL_SHAPES = [((5,), (5,)), ((5,), (5, 3)), ((4, 5), (5,)), ((4, 5), (5, 3)), ((2, 4, 5), (2, 5, 3)),
                 ((2, 4, 5), (5, 3)), ((4, 5), (3, 5, 2)), ((1, 3, 4, 5), (2, 1, 5, 6)), ((2, 4, 5), (5,)),
                 ((5,), (2, 5, 3)), ((1, 1), (1, 1)), ((4, 0), (0, 3)), ((3, 7, 13), (13, 1))]


@pytest.mark.parametrize("dtype", FLOATS + [np.int32], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shapes", MATMUL_SHAPES, ids=str)
def test_matmul(shapes, dtype):
    a, b = data(shapes[0], scale=3).astype(dtype), data(shapes[1], scale=3).astype(dtype)
    check_close(lambda a, b: a @ b, a, b, n=shapes[0][-1])
    check_close(lambda a, b: rf.matmul(a, b), a, b, n=shapes[0][-1])
    assert_numpy_result(rf.matmul(a, b), np.matmul(a, b))


def test_matmul_mixed_dtypes_and_transposed_operands():
    a, b = data((3, 4, 6), np.float16), data((3, 5, 6))
    check_close(lambda a, b: a @ b.mT, a, b, n=6)
    check_close(lambda a, b: rf.swapaxes(a, -1, -2).mT @ rf.transpose(b, (0, 2, 1)), a, b, n=6)
    check_close(lambda a, b: a[0] @ b[1].T, a, b, n=6)


# ---------------------------------------------------------------------------------------------
# views: transposes, indexing
# ---------------------------------------------------------------------------------------------
VIEWS = {
    "swapaxes": lambda x: rf.swapaxes(x, 0, 2),
    "swapaxes_neg": lambda x: rf.swapaxes(x, -1, -2),
    "swapaxes_same": lambda x: rf.swapaxes(x, 1, 1),
    "swapaxes_method": lambda x: x.swapaxes(0, -1),
    "transpose": lambda x: rf.transpose(x),
    "transpose_perm": lambda x: rf.transpose(x, (1, 2, 0)),
    "transpose_args": lambda x: rf.transpose(x, 2, 0, 1),
    "transpose_method": lambda x: x.transpose(1, 0, 2),
    "transpose_method_tuple": lambda x: x.transpose((2, 1, 0)),
    "T": lambda x: x.T,
    "mT": lambda x: x.mT,
    "None_front": lambda x: x[None],
    "None_middle": lambda x: x[:, None],
    "None_end": lambda x: x[..., None],
    "None_many": lambda x: x[None, :, None, :, :, None],
    "ellipsis": lambda x: x[...],
    "int": lambda x: x[1],
    "int_negative": lambda x: x[:, -1],
    "int_ellipsis": lambda x: x[..., 0],
    "int_all": lambda x: x[1, 2, 3],
    "mixed": lambda x: x[None, 1, ..., None, -2],
    "chain": lambda x: x.mT[0].T[None],
    "full_slices": lambda x: x[:, :, ::1],
    "view_then_op": lambda x: x.mT[..., None] * 2.0,
}


@pytest.mark.parametrize("name", list(VIEWS))
def test_views(name):
    x = data((3, 4, 5))
    check_exact(VIEWS[name], x)


def test_views_of_computed_values_feed_later_ops():
    x, y = data((3, 4)), data((4, 3))
    check_exact(lambda x, y: (x + 1.0).T * y + rf.exp(x.T)[None, :, 0:3], x, y)
    check_exact(lambda x, y: rf.max(x, axis=1, keepdims=True).T + y[0], x, y)


def test_view_functions_on_plain_arrays_are_numpys():
    x = data((3, 4, 5))
    assert_numpy_result(rf.swapaxes(x, 0, 2), np.swapaxes(x, 0, 2))
    assert_numpy_result(rf.transpose(x), np.transpose(x))
    assert_numpy_result(rf.transpose(x, (1, 2, 0)), np.transpose(x, (1, 2, 0)))
    assert_numpy_result(rf.transpose(x, 2, 0, 1), np.transpose(x, (2, 0, 1)))


# ---------------------------------------------------------------------------------------------
# arange, shapes and dtypes at trace time
# ---------------------------------------------------------------------------------------------
def causal_attention_scores(s):
    m, n = s.shape[-2], s.shape[-1]
    return rf.where(rf.arange(n)[None, :] <= rf.arange(m)[:, None], s, -rf.inf)


def test_causal_mask_idiom():
    s = data((2, 5, 7))
    check_exact(causal_attention_scores, s)
    out = rf.kernel(causal_attention_scores, backend="interpret")(s)
    assert np.isneginf(out[:, 0, 1:]).all() and np.isfinite(out[:, 4, :5]).all()


@pytest.mark.parametrize("body", [
    lambda x: x + rf.arange(x.shape[-1]),
    lambda x: x * rf.arange(2, 2 + x.shape[-1]),
    lambda x: x - rf.arange(0, 2 * x.shape[-1], 2),
    lambda x: x + rf.arange(x.shape[-1], dtype=rf.float16),
    lambda x: x + rf.arange(1.5, x.shape[-1] + 1.5),
    lambda x: x[:, 0] < rf.arange(x.shape[0]),
    lambda x: rf.where(rf.arange(x.shape[0])[:, None] == rf.arange(x.shape[1]), x, 0.0),
    lambda x: rf.arange(x.shape[0]).astype(rf.float32)[:, None] * x,
], ids=["arange(n)", "arange(a,b)", "arange(a,b,step)", "arange_dtype", "arange_float", "compare",
        "diagonal", "astype"])
def test_arange(body):
    check_exact(body, data((4, 6)))


def test_arange_outside_a_kernel_is_numpys():
    assert_numpy_result(rf.arange(5), np.arange(5))
    assert_numpy_result(rf.arange(2, 9, 3), np.arange(2, 9, 3))
    assert_numpy_result(rf.arange(4, dtype=rf.float16), np.arange(4, dtype=np.float16))


def test_shape_and_dtype_drive_python_control_flow():
    def body(x, y):
        out = x * (1.0 / x.shape[-1])
        for d in range(len(y.shape)):  # a Python loop over static shapes
            out = out + rf.sum(y, axis=d, keepdims=True)[..., :1].T[0]
        if x.dtype == rf.float16:
            out = out.astype(rf.float32)
        if x.shape == (3, 4):
            out = out * 2.0
        return out, x.ndim * 1.0 + out

    for dtype in (np.float32, np.float16):
        x, y = data((3, 4), dtype), data((4, 1))
        actual, expected = both(body, x, y)
        for a, e in zip(actual, expected):
            assert_close(a, e, dtype, 4)
        assert actual[0].dtype == np.float32


def test_inf_constant():
    assert rf.inf == np.inf and isinstance(rf.inf, float)
    check_exact(lambda x: rf.minimum(x, rf.inf) - rf.inf, data((3,)))
    check_exact(lambda x: rf.where(x > 0, rf.inf, -rf.inf), data((3,)))


def test_exported_dtypes_are_numpys_own():
    assert rf.float32 is np.float32 and rf.float16 is np.float16 and rf.int32 is np.int32
    assert rf.int64 is np.int64 and rf.bool_ is np.bool_
    assert rf.bfloat16 is ml_dtypes.bfloat16 and rf.float8_e4m3fn is ml_dtypes.float8_e4m3fn


def test_multiple_outputs_and_returning_an_input():
    x, y = data((3, 4)), data((4,))
    check_exact(lambda x, y: (x + y, x, x * 2.0), x, y)
    check_exact(lambda x, y: (x.T, y), x, y)
    check_exact(lambda x, y: [x - y, y], x, y)


def test_same_output_twice():
    x = data((3, 4))
    check_exact(lambda x: (rf.exp(x), ) * 2, x)


def test_ops_on_python_and_numpy_scalars_are_numpys():
    for f, g in [(rf.exp, np.exp), (rf.sqrt, np.sqrt), (rf.abs, np.abs), (rf.log2, np.log2), (rf.exp2, np.exp2)]:
        assert_numpy_result(f(2.0), g(2.0))
        assert_numpy_result(f(np.float16(2)), g(np.float16(2)))
    assert_numpy_result(rf.rsqrt(np.float32(4)), 1 / np.sqrt(np.float32(4)))
    assert_numpy_result(rf.maximum(2, 3.5), np.maximum(2, 3.5))
    assert_numpy_result(rf.where(True, 1.0, 2.0), np.where(True, 1.0, 2.0))
    assert_numpy_result(rf.sum(np.float32(3)), np.sum(np.float32(3)))
    assert_numpy_result(rf.less(1, 2.0), np.less(1, 2.0))


@pytest.mark.parametrize("backend", ["interpret", "cpu", "simulate"])
def test_a_16_bit_variance_and_mean_divide_by_their_count_exactly(backend):
    """numpy divides a reduction by its count as an ``intp`` (in float64), then stores the quotient: the count
    was an f16 constant, inf from 65520 elements on, so an f16 variance of 65536 values was 0 on every backend
    (a layer norm of that width 31 times too large); bf16 counts past 256 lost their low bits. Found by a
    helper measuring long rows against float64."""
    import ml_dtypes

    rng = np.random.default_rng(3)
    x = (0.01 * rng.standard_normal((1, 65536))).astype(np.float16)
    exact = np.var(x.astype(np.float64), axis=-1)
    for body, want in ((lambda a: rf.var(a, axis=-1), exact), (lambda a: rf.std(a, axis=-1), np.sqrt(exact))):
        got = rf.kernel(body, backend=backend)(x).astype(np.float64)
        assert_close(got, want, np.float16, x.shape[-1])
    if backend == "interpret":
        return      # (it sums bf16 in bf16 one term at a time, as numpy does: docs/testing.md, the table's note)
    b = (3.0 + rng.standard_normal((1, 100609))).astype(ml_dtypes.bfloat16)
    got = rf.kernel(lambda a: rf.mean(a, axis=-1), backend=backend)(b).astype(np.float64)
    np.testing.assert_allclose(got, b.astype(np.float64).mean(axis=-1), rtol=2 ** -8)
