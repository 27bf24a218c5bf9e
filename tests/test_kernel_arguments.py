"""How a kernel takes its arguments: static values keyed by type and exact value, numpy scalars, keyword
arguments and defaults, array subclasses, and options checked when the kernel is made."""
from __future__ import annotations

import functools
import math
import os
import types

import numpy as np
import pytest

import redfuser as rf

BACKENDS = ("interpret", "cpu", "simulate")
X = np.array([1.0, -2.0, 3.0, 2.0**20], np.float32)


def scaled(x, c):
    return x * c


def reciprocal(x, c):
    return x / c


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("first,second", [(2, 2.0), (2.0, 2), (1, True), (True, 1), (0.0, -0.0),
                                          (np.float32(2), 2.0), (np.float16(2), np.float32(2)),
                                          (float("nan"), float("inf"))])
def test_static_values_that_compare_equal_do_not_share_a_kernel(backend, first, second):
    """``2 == 2.0 == True`` and ``0.0 == -0.0`` in Python, but numpy computes different things with them."""
    k = rf.kernel(reciprocal if isinstance(first, float) and first == 0 else scaled, backend=backend)
    x = X if isinstance(first, float | np.generic) else np.array([1, -3, 2**30, -2**30], np.int32)  # 2x wraps
    for value in (first, second, first):
        got = k(x, value)
        expected = k.__wrapped__(x, value)
        assert got.dtype == expected.dtype, (value, got.dtype, expected.dtype)
        np.testing.assert_array_equal(got, expected)
    assert k.cache_size == 2


def test_a_nan_static_value_is_one_specialization():
    k = rf.kernel(scaled, backend="interpret")
    k(X, float("nan"))
    k(X, float("nan"))
    assert k.cache_size == 1


@pytest.mark.parametrize("scalar", [np.float32(0.5), np.float16(3), np.int32(-3), np.int64(7), np.bool_(True),
                                    np.float64(0.25)])
def test_numpy_scalars_are_static_with_their_numpy_type(scalar):
    x16 = X.astype(np.float16)
    k = rf.kernel(scaled, backend="cpu")
    got, expected = k(x16, scalar), scaled(x16, scalar)
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)


def test_a_numpy_scalar_of_an_unsupported_dtype_is_refused():
    with pytest.raises(rf.DTypeError, match="numpy uint8 scalar"):
        rf.kernel(scaled, backend="interpret")(X, np.uint8(2))


def softmax_scaled(x, scale=0.5, *, axis=-1, shift=None):
    s = x * scale
    if shift is not None:
        s = s - shift
    m = rf.max(s, axis=axis, keepdims=True)
    e = rf.exp(s - m)
    return e / rf.sum(e, axis=axis, keepdims=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_defaults_keywords_and_keyword_only_parameters(backend):
    x = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    k = rf.kernel(softmax_scaled, backend=backend)
    for args, kwargs in [((x,), {}), ((x, 2.0), {}), ((x,), {"scale": 2.0}), ((x,), {"axis": 0}),
                         ((), {"x": x, "shift": 1.0, "axis": -2})]:
        np.testing.assert_allclose(k(*args, **kwargs), softmax_scaled(*args, **kwargs), rtol=1e-6, atol=1e-7)
    assert k.cache_size == 4          # scale=2.0 by position or by name is one specialization


def _plus(self, a):
    return self + a


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_parameter_named_self_is_passed_by_name(backend):
    """``k(self=x, a=y)`` raised a bare TypeError ("got multiple values for argument 'self'"): the kernel's own
    methods took ``self`` as an ordinary parameter. It is positional-only in them now."""
    k = rf.kernel(_plus, backend=backend)
    np.testing.assert_array_equal(k(self=X, a=X + 1), _plus(self=X, a=X + 1))
    np.testing.assert_array_equal(k(X, a=X), X + X)
    assert k.lower(self=X, a=X).name == "_plus"
    assert "_plus" in k.explain(self=X, a=X)
    assert k.output_types(self=X, a=X)[0].shape == X.shape


def test_a_default_and_the_same_value_passed_share_a_kernel():
    k = rf.kernel(softmax_scaled, backend="interpret")
    k(X)
    k(X, 0.5)
    k(X, scale=0.5, axis=-1)
    assert k.cache_size == 1


def _scaled(x, s=2.0):
    return x * s


def _scaled_by_keyword(x, *, s=2.0):
    return x * s


@pytest.mark.parametrize("backend", ["interpret", "cpu"])
def test_a_default_changed_after_the_kernel_is_made_is_taken(backend):
    """(Found by a helper.) Replacing ``__defaults__`` or ``__kwdefaults__``, or changing a partial's keywords,
    after the kernel was made left the kernel on the old default (2x) where the body run by Python used the
    new one (5x): the kernel bound its arguments by the signature it took when it was made."""
    for fn in (_scaled, _scaled_by_keyword):
        body = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
        body.__kwdefaults__ = dict(fn.__kwdefaults__) if fn.__kwdefaults__ else None
        k = rf.kernel(body, backend=backend)
        np.testing.assert_array_equal(k(X), X * 2.0)
        if body.__kwdefaults__:
            body.__kwdefaults__["s"] = 5.0         # (changed in place)
        else:
            body.__defaults__ = (5.0,)
        np.testing.assert_array_equal(k(X), body(X), err_msg=fn.__name__)
    partial = functools.partial(_scaled, s=2.0)
    k = rf.kernel(partial, backend=backend)
    np.testing.assert_array_equal(k(X), X * 2.0)
    partial.keywords["s"] = 5.0
    np.testing.assert_array_equal(k(X), X * 5.0)


@pytest.mark.parametrize("call", ["missing", "unknown", "twice", "too_many"])
def test_bad_calls_are_argument_errors_at_the_users_line(call):
    k = rf.kernel(softmax_scaled, backend="interpret")
    calls = {"missing": lambda: k(scale=2.0), "unknown": lambda: k(X, gamma=2.0),
             "twice": lambda: k(X, 2.0, scale=3.0), "too_many": lambda: k(X, 1.0, 2.0)}
    with pytest.raises(rf.ArgumentError) as info:
        calls[call]()
    assert info.value.op == "softmax_scaled" and info.value.loc.file == __file__


def test_varargs_and_a_parameter_named_stream_are_refused_when_the_kernel_is_made():
    def varargs(x, *rest):
        return x

    def streamed(x, stream):
        return x

    with pytest.raises(rf.UnsupportedError, match=r"\*rest") as info:
        rf.kernel(varargs)
    assert info.value.loc.line == varargs.__code__.co_firstlineno
    with pytest.raises(rf.ArgumentError, match="cannot be named 'stream'"):
        rf.kernel(streamed)


@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
@pytest.mark.parametrize("make", [lambda: np.ma.masked_array(np.array([1.0, 100.0, 2.0], np.float32),
                                                              mask=[False, True, False]),
                                  lambda: np.matrix(np.ones((2, 2), np.float32))])
def test_array_subclasses_that_carry_meaning_are_refused(make):
    """A masked row summed to 103 where numpy gives 3: the mask was silently dropped."""
    value = make()
    with pytest.raises(rf.ArgumentError, match="subclass") as info:
        rf.kernel(lambda x: rf.sum(x), backend="cpu")(value)
    assert type(value).__name__ in str(info.value)


def test_a_memmap_is_a_plain_array(tmp_path):
    m = np.memmap(tmp_path / "x.bin", dtype=np.float32, mode="w+", shape=(4,))
    m[:] = X
    np.testing.assert_array_equal(rf.kernel(lambda x: x * 2, backend="cpu")(m), X * 2)


@pytest.mark.parametrize("option,value", [("num_threads", -1), ("num_threads", 10**6), ("interpret_chunk", 0), ("block_m", 0),
                                          ("block_n", 2.5), ("split", 0), ("num_warps", 3), ("sm", "sm_1"),
                                          ("llvm_opt", 5), ("fuse", "yes"), ("prefetch", 1),
                                          ("min_blocks_per_sm", 33), ("skip_masked", "yes")])
def test_bad_option_values_are_refused_when_the_kernel_is_made(option, value):
    with pytest.raises(rf.ArgumentError) as info:
        rf.kernel(scaled, **{option: value})
    assert f"option {option} must be" in str(info.value) and repr(value) in str(info.value)
    assert info.value.loc.file == __file__


def test_a_bad_redfuser_backend_variable_is_named(monkeypatch):
    monkeypatch.setenv("REDFUSER_BACKEND", "bogus")
    with pytest.raises(rf.BackendError, match="REDFUSER_BACKEND='bogus'"):
        rf.kernel(scaled)(X, 2.0)


def test_unknown_rf_names_are_redfuser_errors_and_attribute_errors():
    assert not hasattr(rf, "arctanh") and getattr(rf, "arctanh", None) is None
    with pytest.raises(rf.UnknownNameError) as info:
        rf.arctanh  # noqa: B018
    assert isinstance(info.value, AttributeError) and info.value.loc.file == __file__
    assert "redfuser has no 'arctanh'" in str(info.value)
    assert rf.testing.assert_close is not None          # subpackages still load on first use


def test_math_functions_on_traced_values_point_at_rf_ops():
    with pytest.raises(rf.TracerBoolError) as info:
        rf.kernel(lambda x: math.exp(x), backend="interpret")(X)
    assert "rf.exp" in str(info.value) and "rf.where" not in str(info.value)


@pytest.mark.parametrize("body,error,text", [
    (lambda x: x // 2, rf.UnsupportedError, "//"), (lambda x: 2 % x, rf.UnsupportedError, "%"),
    (lambda x: x << 1, rf.UnsupportedError, "<<"), (lambda x: x ^ x, rf.DTypeError, "bitwise"),
    (lambda x: ~x, rf.DTypeError, "numpy has no ~ of floats"), (lambda x: round(x), rf.UnsupportedError, "round"),
    (lambda x: ~x.astype(rf.int32), rf.DTypeError, "bitwise not of integers"),
    (lambda x: (x > 0) - (x > 1), rf.DTypeError, "a ^ b"),
])
def test_operators_outside_the_subset_are_redfuser_errors(body, error, text):
    with pytest.raises(error, match=None) as info:
        rf.kernel(body, backend="interpret")(X)
    assert text in str(info.value) and info.value.loc.file == __file__
    assert "bitwise_xor, the" not in str(info.value)     # numpy's hint names a function RedFuser lacks


def test_item_assignment_is_a_redfuser_error():
    def body(x):
        x[0] = 1.0
        return x

    with pytest.raises(rf.UnsupportedError, match="item assignment") as info:
        rf.kernel(body, backend="interpret")(X.copy())
    assert info.value.loc.line == body.__code__.co_firstlineno + 1
    assert os.path.samefile(info.value.loc.file, __file__)


def test_a_dump_folder_that_cannot_be_written_warns_at_the_users_line(monkeypatch, tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("a file, not a folder")
    monkeypatch.setenv("REDFUSER_DUMP_DIR", str(blocked / "stages"))
    with pytest.warns(RuntimeWarning, match="REDFUSER_DUMP_DIR") as record:
        out = rf.kernel(scaled, backend="interpret")(X, 2.0)
    np.testing.assert_array_equal(out, X * 2.0)
    assert record[0].filename == __file__


_TORCH_VIEWS = {
    "negative bit": (lambda torch: torch.complex(torch.ones(3, 4), torch.arange(12.0).reshape(3, 4)).conj().imag,
                     "negative bit set"),
    "conjugate bit": (lambda torch: torch.ones(3, 4, dtype=torch.complex64).conj(), "conjugate bit set"),
    "sparse": (lambda torch: torch.eye(4).to_sparse(), "pass x.to_dense()"),
    "meta": (lambda torch: torch.empty(3, 4, device="meta"), "meta device"),
    "nested": (lambda torch: torch.nested.nested_tensor([torch.ones(2, 4), torch.ones(3, 4)]), "nested torch tensor"),
}


@pytest.mark.parametrize("backend", ["interpret", "cpu"])
@pytest.mark.parametrize("case", sorted(_TORCH_VIEWS))
def test_torch_tensors_that_are_not_their_memory_are_refused(case, backend):
    """A tensor whose values are not its memory as DLPack exports it is refused, naming the argument and the
    user's line: a lazily negated view (``c.conj().imag``) was read as ``-x``, a silently wrong result, on
    the first call and on the cached call path; sparse, meta, conjugated and nested tensors escaped as
    torch's own errors."""
    torch = pytest.importorskip("torch")
    import warnings

    make, says = _TORCH_VIEWS[case]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")      # (nested tensors are a prototype: torch warns on making one)
        x = make(torch)
    kernel = rf.kernel(lambda x: x * 2.0, backend=backend)
    kernel(torch.ones(3, 4))                 # (the cached path exists for dense float32 tensors)
    with pytest.raises(rf.ArgumentError, match=says) as caught:
        kernel(x)
    assert "argument 'x'" in str(caught.value) and "test_kernel_arguments.py" in str(caught.value)
    if case == "negative bit":
        np.testing.assert_array_equal(kernel(x.resolve_neg()).numpy(), -2.0 * np.arange(12.0).reshape(3, 4))


@pytest.mark.parametrize("backend", ["interpret", "cpu"])
def test_static_zero_d_results_of_rf_ops_are_static_scalars(backend):
    """``rf.where``/``rf.astype`` of static values return numpy 0-d arrays in a kernel, as in numpy; numpy
    promotes them as the scalars they hold, and so does the kernel (they were refused as captured arrays).
    A 1-d array made from static values is refused, on either side of the operator, with the same advice."""
    x = np.random.default_rng(2).standard_normal((4, 8)).astype(np.float32)
    bodies = [lambda x: x + rf.where(True, 1.0, 2.0), lambda x: x * rf.astype(2.5, rf.float16),
              lambda x: rf.where(x > 0, rf.astype(0.5, rf.float16), x) ** rf.where(False, 3, 2)]
    for body in bodies:
        got, want = rf.kernel(body, backend=backend)(x), body(x)
        assert got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=1e-6)
    for body in (lambda x: x[:, :2] + rf.stack([1.0, 2.0]), lambda x: rf.stack([1.0, 2.0]) + x[:, :2]):
        with pytest.raises(rf.UnsupportedError, match=r"add: a numpy array f64\[2\] mixed with traced values: a "
                                                      r"kernel reads arrays only through its arguments"):
            rf.kernel(body, backend=backend)(x)


def test_an_array_of_the_other_byte_order_is_named_as_such():
    """A big-endian float32 array was refused with a list of supported dtypes that has float32 in it."""
    x = np.ones((2, 3), ">f4")
    with pytest.raises(rf.DTypeError, match=r"argument 'x' has dtype >f4, float32 in the other byte order"):
        rf.kernel(scaled, backend="cpu")(x, 2.0)
    native = x.astype("=f4")
    np.testing.assert_array_equal(rf.kernel(scaled, backend="cpu")(native, 2.0), scaled(native, 2.0))
