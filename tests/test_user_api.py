"""The API as a new user tries it (2026-12-05): numpy's rules where they differed, and clear errors."""
import dataclasses
import functools

import numpy as np
import pytest

import redfuser as rf

BACKENDS = ("interpret", "cpu", "simulate")


def _same(got, want):
    got, want = (got if isinstance(got, tuple) else (got,)), (want if isinstance(want, tuple) else (want,))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        w = np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=1e-6)


def _variances(x):
    return rf.var(x, axis=1, ddof=np.int64(1)), rf.std(x, axis=1, ddof=np.float32(1))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_a_numpy_scalar_ddof_keeps_the_dtype(backend, dtype):
    """``ddof=np.int64(1)`` made the divisor a numpy scalar, which promoted an f32 variance to f64 (an f16
    one to f64 or f32), where numpy's ``var`` keeps the input's dtype."""
    x = np.arange(12, dtype=dtype).reshape(3, 4)
    _same(rf.kernel(_variances, backend=backend)(x), _variances(x))


def _alias_updated(a):
    b = a
    b += 1
    return a


def _fresh_updated(a, w):
    s = a * 2
    s += w
    s *= 0.5
    s -= 1
    s /= 4
    i = a.astype(rf.int32)
    i += 2
    i //= 3
    return rf.sum(s, axis=-1), i


@pytest.mark.parametrize("backend", BACKENDS)
def test_in_place_operators_update_every_name_of_the_array(backend):
    """numpy's ``b = a; b += 1`` changes ``a``; in a kernel ``+=`` made ``b`` a new value and ``a`` was returned
    unchanged. In-place operators now keep numpy's aliasing, dtype and shape, and never write the caller's
    array."""
    x = np.zeros((2, 3), np.float32)
    w = np.arange(3, dtype=np.float32)
    _same(rf.kernel(_alias_updated, backend=backend)(x), _alias_updated(x.copy()))
    _same(rf.kernel(_fresh_updated, backend=backend)(x, w), _fresh_updated(x, w))
    assert (x == 0).all()


def _updates_a_viewed_array(a):
    t = a.T
    a += 1
    return t


def _updates_an_int_with_a_float(a):
    i = a.astype(rf.int32)
    i += 1.5
    return i


def _grows_in_place(a, b):
    a += b
    return a


def test_in_place_operators_numpy_or_a_kernel_cannot_do_are_refused():
    """An update another traced view would have to see (refused where that view is read), one numpy's same_kind
    rule refuses, one that would broadcast the updated array: each a clear error at the user's line, not a
    different result."""
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(rf.UnsupportedError, match="an in-place update") as err:
        rf.kernel(_updates_a_viewed_array, backend="interpret")(x)
    update_line = _updates_a_viewed_array.__code__.co_firstlineno + 2
    assert f":{update_line})" in str(err.value) and err.value.loc.line == update_line + 1
    with pytest.raises(rf.DTypeError, match="same_kind"):
        rf.kernel(_updates_an_int_with_a_float, backend="interpret")(x)
    with pytest.raises(rf.ShapeError, match="does not fit"):
        rf.kernel(_grows_in_place, backend="interpret")(np.zeros(3, np.float32), np.zeros((2, 3), np.float32))


def _updates_an_argument(a, b):
    a += 1
    return a + b


def _updates_a_lone_argument(a):
    a += rf.arange(4).astype(rf.float32)
    return a


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_argument_updated_in_place_whose_memory_numpy_would_change_elsewhere_is_refused(backend):
    """``a += 1; return a + b`` called as ``f(x, x)`` is ``2x + 2`` in numpy (its update changes ``b`` too) and
    was ``2x + 1``; overlapping views likewise; a self-overlapping ``a`` (numpy writes each place once for
    every element there) gave numpy's values for distinct elements; a read-only ``a`` (numpy raises) was
    accepted. Each is now refused at the line that updates ``a``, at every call (the first, and cached
    ones), and a call with separate arrays still runs. Found by a helper trying exotic views."""
    x = np.arange(8, dtype=np.float32)
    kernel = rf.kernel(_updates_an_argument, backend=backend)
    np.testing.assert_array_equal(kernel(x, x.copy()), 2 * x + 1)
    for a, b in ((x, x), (x[1:], x[:-1]), (x[:4], x[2:6])):
        with pytest.raises(rf.ArgumentError, match="updates argument 'a' in place, but argument 'b' shares") as err:
            kernel(a, b)
        assert "a += 1" in str(err.value)
    np.testing.assert_array_equal(kernel(x[:4], x[4:]), x[:4] + 1 + x[4:])   # apart: runs
    assert (x == np.arange(8)).all()
    lone = rf.kernel(_updates_a_lone_argument, backend=backend)
    overlapping = np.lib.stride_tricks.as_strided(np.arange(10, dtype=np.float32), (3, 4), (16, 16), writeable=True)
    with pytest.raises(rf.ArgumentError, match="two of its elements share memory"):
        lone(overlapping)
    with pytest.raises(rf.ArgumentError, match="read-only"):
        lone(np.broadcast_to(np.ones(4, np.float32), (3, 4)))
    np.testing.assert_array_equal(lone(np.ones((3, 4), np.float32)), np.ones((3, 4)) + np.arange(4))


def _field_view(values: list[float]) -> np.ndarray:
    """A float32 field of a structured array: byte strides (6) that are not whole elements, which a kernel
    reads through a dense copy."""
    records = np.zeros(len(values), dtype=[("a", "<f4"), ("b", "<f2")])
    records["a"] = values
    return records["a"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_view_read_through_a_copy_is_checked_as_the_callers_array(backend):
    """A view whose strides are not whole elements is copied before the kernel reads it, and the sharing and
    read-only checks looked at the copies: ``f(u, u)`` of ``a += 1; return a + b`` gave ``2u + 1`` where
    numpy's body gives ``2u + 2``, a read-only such view updated in place ran (numpy raises), and an ``out=``
    that is that very view was taken. Found by a helper (hunt_outs/01)."""
    kernel = rf.kernel(_updates_an_argument, backend=backend)
    u = _field_view([0, 1, 2, 3])
    assert u.strides == (6,)
    with pytest.raises(rf.ArgumentError, match="updates argument 'a' in place, but argument 'b' shares"):
        kernel(u, u)
    frozen = _field_view([0, 1, 2, 3])
    frozen.flags.writeable = False
    with pytest.raises(rf.ArgumentError, match="read-only"):
        kernel(frozen, np.ones(4, np.float32))
    np.testing.assert_array_equal(kernel(u, _field_view([1, 1, 1, 1])), [2, 3, 4, 5])    # apart: runs
    np.testing.assert_array_equal(u, [0, 1, 2, 3])
    doubled = rf.kernel(_doubled, backend=backend)
    with pytest.raises(rf.ArgumentError, match="share"):
        doubled(u, out=u)


def _doubled(x):
    return x * 2


TABLE = np.arange(4, dtype=np.float32)


def _updates_then_reads_the_table(a):
    a += 1
    return a * TABLE.max()


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_argument_updated_in_place_that_is_a_captured_array_is_refused(backend):
    """``a += 1; return a * TABLE.max()`` called with ``TABLE`` itself: numpy's body reads ``TABLE`` updated
    (``[4, 8, 12, 16]``), the trace read its maximum as it was (``[3, 6, 9, 12]``, silently). Refused now,
    as an argument sharing memory with another is; a copy runs. Found by a helper (hunt_outs/02)."""
    kernel = rf.kernel(_updates_then_reads_the_table, backend=backend)
    with pytest.raises(rf.ArgumentError, match="captured array TABLE"):
        kernel(TABLE)
    with pytest.raises(rf.ArgumentError, match="captured array TABLE"):
        kernel(TABLE[1:3])
    np.testing.assert_array_equal(kernel(TABLE.copy()), (TABLE + 1) * 3)
    np.testing.assert_array_equal(TABLE, np.arange(4))


SCALE = 2.0


def _scaled(a):
    return a * SCALE


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_changed_global_or_closure_scalar_is_traced_again(backend):
    """A global or closure scalar is fixed into the traced program; changing it kept returning the old
    result from the in-memory cache. The kernel now traces again when one of them changes."""
    global SCALE
    x = np.ones(3, np.float32)
    k = rf.kernel(_scaled, backend=backend)
    try:
        SCALE = 2.0
        assert (k(x) == 2).all()
        SCALE = 3.0
        assert (k(x) == 3).all()
        SCALE = float("nan")
        k(x)
        k(x)
        assert k.cache_info().hits >= 1       # a NaN is the same value from call to call
    finally:
        SCALE = 2.0

    offset = 1.0

    def shifted(a):
        return a + offset

    ks = rf.kernel(shifted, backend=backend)
    assert (ks(x) == 2).all()
    offset = 5.0
    assert (ks(x) == 6).all()


def _scale(a, s):
    return rf.sum(a * s, axis=-1)


class _RowMax:
    def __call__(self, a):
        return rf.max(a, axis=-1)


def test_a_partial_or_a_callable_object_is_a_kernel():
    """``rf.kernel(functools.partial(f, s=3.0))`` and ``rf.kernel(obj)`` failed with AttributeError
    ``__name__`` on every call: a bare internal traceback."""
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    k = rf.kernel(functools.partial(_scale, s=3.0), backend="cpu")
    np.testing.assert_array_equal(k(x), _scale(x, 3.0))
    assert "_scale" in repr(k) and "_scale" in k.explain(x)
    c = rf.kernel(_RowMax(), backend="cpu")
    np.testing.assert_array_equal(c(x), _RowMax()(x))
    assert "_RowMax" in repr(c)


_doubled_kernel = rf.kernel(lambda a: a * 2, backend="interpret")


def _calls_a_kernel(a):
    return _doubled_kernel(a) + 1


@pytest.mark.parametrize("backend", ["interpret", "cpu"])
def test_a_kernel_called_in_a_kernel_or_made_a_kernel_again_is_traced_inline(backend):
    """A kernel called inside another kernel's body, and ``rf.kernel(a_kernel)``, failed with "argument 'a' must
    be an array ... got Tracer" (an internal class) though the user passed a numpy array. The inner kernel's body
    is traced into the outer one now, and a kernel of a kernel is a kernel of its body with the new options."""
    x = np.arange(4, dtype=np.float32)
    outer = rf.kernel(_calls_a_kernel, backend=backend)
    for _ in range(2):
        np.testing.assert_array_equal(outer(x), x * 2 + 1)
    assert _doubled_kernel.cache_size == 0          # (traced inline: nothing compiled of its own)
    again = rf.kernel(rf.kernel(_calls_a_kernel, backend="interpret"), backend=backend)
    assert again.__wrapped__ is _calls_a_kernel and again.backend == backend
    np.testing.assert_array_equal(again(x), x * 2 + 1)


def _flat_arg(x):
    return rf.argmax(x), rf.argmin(x, keepdims=True), x.argmax()


@pytest.mark.parametrize("backend", BACKENDS)
def test_argmax_without_an_axis_is_the_flat_index(backend):
    """``rf.argmax(x)`` of a 2-d array was refused ("no reshape yet"); numpy gives the flattened index."""
    x = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    got, want = rf.kernel(_flat_arg, backend=backend)(x), _flat_arg(x)
    for g, w in zip(got, want):
        w = np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape and (g == w).all()


def _reductions_of_a_0d_array_along_axis_0(x):
    return (rf.sum(x, axis=0), rf.max(x, axis=-1, keepdims=True), rf.prod(x, axis=0), rf.any(x, axis=-1),
            rf.argmax(x, axis=0), rf.argmin(x, axis=-1))


@pytest.mark.parametrize("backend", BACKENDS)
def test_numpys_ufunc_reductions_take_axis_0_of_a_0d_array(backend):
    """numpy's ufunc reductions (and argmax) take ``axis=0`` or ``-1`` of a 0-d array as "over nothing" (its one
    element); the kernel refused them as out of bounds. A tuple ``(0,)``, and mean, still are, as in numpy."""
    x = np.array(1.5, np.float32)
    got, want = rf.kernel(_reductions_of_a_0d_array_along_axis_0, backend=backend)(x), \
        _reductions_of_a_0d_array_along_axis_0(x)
    for g, w in zip(got, want):
        w = np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape and (g == w).all()
    for refused in (lambda x: rf.sum(x, axis=(0,)), lambda x: rf.mean(x, axis=0)):
        with pytest.raises(rf.ShapeError, match="out of bounds"):
            rf.kernel(refused, backend=backend)(x)


def _row_sums(a):
    return rf.sum(a, axis=-1)


def test_a_dynamic_axis_the_argument_does_not_have_is_an_error():
    """``dynamic={"a": (5,)}`` on a 2-d argument was silently ignored."""
    with pytest.raises(rf.ArgumentError, match="names axis 5, but a has 2 dimensions"):
        rf.kernel(_row_sums, backend="interpret", dynamic={"a": (5,)})(np.ones((2, 3), np.float32))


def test_ranking_int64_names_the_ops_it_refuses():
    """The refusal of an int64 argmin on a compiled backend spoke of top-k, which the user never wrote."""
    with pytest.raises(rf.BackendError, match=r"rf\.argmax, rf\.argmin"):
        rf.kernel(lambda x: rf.argmin(x, axis=1), backend="cpu")(np.arange(6, dtype=np.int64).reshape(2, 3))


def test_topk_of_zero_is_refused_on_arrays_as_in_a_kernel():
    """``rf.topk(x, 0)`` returned empty arrays on numpy arrays (the body, the reference) while every kernel
    refused it: the reference and the kernel now refuse it alike."""
    def best_none(x):
        return rf.topk(x, 0)

    x = np.ones((3, 4), np.float32)
    with pytest.raises(rf.ShapeError, match=r"topk: k must be an int in \[1, 4\]"):
        best_none(x)
    with pytest.raises(rf.ShapeError, match=r"topk: k must be an int in \[1, 4\]"):
        rf.kernel(best_none, backend="interpret")(x)


@pytest.mark.parametrize("op", ["argmax", "argmin"])
def test_an_arg_extremum_over_an_empty_axis_names_itself(op):
    """It said ``topk: k must be an int in [1, 0]``, naming an op the user never wrote."""
    def arg(x):
        return getattr(rf, op)(x, axis=1)

    with pytest.raises(rf.ShapeError, match=rf"{op}: attempt to get {op} of an empty sequence"):
        rf.kernel(arg, backend="interpret")(np.ones((3, 0), np.float32))


_CONFIG = {"scale": 2.0}
_TABLE = [1.0, 3.0]


def _configured(x):
    return rf.sum(x * _CONFIG["scale"] + _TABLE[1], axis=-1)


class _Scaled:
    def __init__(self):
        self.scale = 2.0

    def __call__(self, x):
        return rf.sum(x * self.scale, axis=-1)


@pytest.mark.parametrize("backend", ["interpret", "cpu"])
def test_a_changed_config_table_or_attribute_is_read_again(backend):
    """A dict or list of scalars the body reads from its module (a config table) and a callable object's
    scalar attribute were fixed at the first trace: after the user changed them the kernel kept returning
    the old result. They are compared per call like captured scalars, and the kernel traces again."""
    x = np.ones((2, 4), np.float32)
    k = rf.kernel(_configured, backend=backend)
    try:
        np.testing.assert_array_equal(k(x), _configured(x))
        _CONFIG["scale"], _TABLE[1] = 5.0, 1.0
        np.testing.assert_array_equal(k(x), _configured(x))
    finally:
        _CONFIG["scale"], _TABLE[1] = 2.0, 3.0
    scaled = _Scaled()
    k = rf.kernel(scaled, backend=backend)
    np.testing.assert_array_equal(k(x), [8.0, 8.0])
    scaled.scale = 7.0
    np.testing.assert_array_equal(k(x), [28.0, 28.0])


def _doubled_in_a_comprehension(x):
    parts = [x * SCALE for _ in range(2)]
    return parts[0] + parts[1]


def _scaled_by_a_lambda(x):
    scale = lambda t: t * SCALE        # noqa: E731
    return scale(x)


def _scaled_by_an_inner_function(x):
    def scale(t):
        return t * _TABLE[1]

    return scale(x)


@pytest.mark.parametrize("backend", ["interpret", "cpu"])
def test_a_global_read_in_a_comprehension_lambda_or_inner_function_is_traced_again(backend):
    """On Python 3.11 a comprehension, a lambda and an inner function have code objects of their own, and
    only the body's own names were scanned: a global scalar they read was fixed at the first trace, and the
    kernel kept returning the old result after it changed. The nested code's reads are followed now."""
    global SCALE
    x = np.ones((2, 3), np.float32)
    try:
        for fn in (_doubled_in_a_comprehension, _scaled_by_a_lambda, _scaled_by_an_inner_function):
            SCALE, _TABLE[1] = 2.0, 3.0
            k = rf.kernel(fn, backend=backend)
            np.testing.assert_array_equal(k(x), fn(x))
            SCALE, _TABLE[1] = 5.0, 7.0
            np.testing.assert_array_equal(k(x), fn(x), err_msg=fn.__name__)
    finally:
        SCALE, _TABLE[1] = 2.0, 3.0


def _passing_through(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)

    return wrapper


@_passing_through
@_passing_through
def _scaled_and_decorated(x):
    return x * SCALE + _TABLE[1]


@pytest.mark.parametrize("backend", ["interpret", "cpu"])
def test_a_global_read_by_a_wrapped_body_is_traced_again(backend):
    """A body decorated with ``functools.wraps``: only the wrapper's code was scanned (it reads the body from a
    cell, no globals), so after ``SCALE = 3.0`` the kernel kept x * 2 while the body gave x * 3. The
    ``__wrapped__`` chain is followed, as the kernel's signature follows it."""
    global SCALE
    x = np.ones(3, np.float32)
    try:
        SCALE, _TABLE[1] = 2.0, 3.0
        k = rf.kernel(_scaled_and_decorated, backend=backend)
        np.testing.assert_array_equal(k(x), x * 2.0 + 3.0)
        SCALE = 3.0
        np.testing.assert_array_equal(k(x), x * 3.0 + 3.0)
        _TABLE[1] = 1.0
        np.testing.assert_array_equal(k(x), x * 3.0 + 1.0)
    finally:
        SCALE, _TABLE[1] = 2.0, 3.0


_W = np.array([2.0, 1.0], np.float32)      # captured by the bodies below (rebound by the tests)
_W0 = np.array(2.0, np.float32)


def _scaled_by_an_element(x):
    return x * _W[0] + _W.max()


def _shifted_by_a_length(x):
    return x + _W.shape[0]


def _scaled_by_a_0d_array(x):
    return x * _W0


class _Weighted:
    def __init__(self):
        self.w = np.array([2.0], np.float32)

    def __call__(self, x):
        return x * self.w[0]


@pytest.mark.parametrize("backend", ["interpret", "cpu"])
def test_a_captured_array_read_while_tracing_is_traced_again_when_it_changes(backend):
    """What a trace reads of a captured numpy array (an element, its maximum, its length, a 0-d array used as a
    scalar) was baked in, and only the array's type was compared: after ``_W[0] = 7`` or ``_W = <another
    array>`` the kernel kept computing with the first values. Small arrays are compared by shape, dtype and
    bytes on each call now."""
    global _W, _W0
    x = np.arange(4, dtype=np.float32)
    first, first0 = _W, _W0
    try:
        for fn in (_scaled_by_an_element, _shifted_by_a_length, _scaled_by_a_0d_array):
            _W, _W0 = np.array([2.0, 1.0], np.float32), np.array(2.0, np.float32)
            k = rf.kernel(fn, backend=backend)
            np.testing.assert_array_equal(k(x), fn(x))
            _W[0], _W0[()] = 7.0, 5.0                                    # changed in place
            np.testing.assert_array_equal(k(x), fn(x), err_msg=f"{fn.__name__} in place")
            _W, _W0 = np.array([9.0, 1.0, 0.0], np.float32), np.array(3.0, np.float32)   # rebound
            np.testing.assert_array_equal(k(x), fn(x), err_msg=f"{fn.__name__} rebound")
            _W0 = np.array(3.0, np.float16)                               # another dtype
            np.testing.assert_array_equal(k(x), fn(x), err_msg=f"{fn.__name__} dtype")
    finally:
        _W, _W0 = first, first0
    w = np.array([2.0], np.float32)
    k = rf.kernel(lambda a: a * w[0], backend=backend)                    # a closure's array
    np.testing.assert_array_equal(k(x), x * 2.0)
    w[0] = 3.0
    np.testing.assert_array_equal(k(x), x * 3.0)
    weighted = _Weighted()
    k = rf.kernel(weighted, backend=backend)                              # an attribute's
    np.testing.assert_array_equal(k(x), x * 2.0)
    weighted.w[0] = 4.0
    np.testing.assert_array_equal(k(x), x * 4.0)


def test_a_large_captured_array_read_while_tracing_is_refused():
    """An array too large to compare on each call (`CAPTURED_ARRAY_BYTES`) is refused when the kernel traces,
    naming it, rather than baked in unchecked."""
    global _W
    first = _W
    try:
        _W = np.ones(4096, np.float32)
        k = rf.kernel(_shifted_by_a_length, backend="interpret")
        with pytest.raises(rf.UnsupportedError, match=r"captured numpy array _W .*pass it as a kernel argument"):
            k(np.ones(3, np.float32))
        _W = np.ones(2, np.float32)                  # small again: traces
        np.testing.assert_array_equal(k(np.ones(3, np.float32)), np.full(3, 3.0))
        _W = np.ones(4096, np.float32)              # a cached kernel sees it rebound, and refuses
        with pytest.raises(rf.UnsupportedError, match="_W"):
            k(np.ones(3, np.float32))
    finally:
        _W = first


_LONG_TABLE = [float(i) for i in range(100)]
_DEEP_CONFIG = {"a": {"b": {"c": {"d": 1.0}}}}
_PARAMS = (np.array([2.0, 1.0], np.float32), 3.0)


def _scaled_by_a_table_entry(x):
    return x * _LONG_TABLE[5]


def _scaled_by_a_nested_config(x):
    return x * _DEEP_CONFIG["a"]["b"]["c"]["d"]


def _scaled_by_an_array_in_a_tuple(x):
    return x * _PARAMS[0][1]


def _scaled_by_a_bound_array(w, x):
    return x * w[1]


@pytest.mark.parametrize("backend", ["interpret", "cpu"])
def test_a_captured_container_is_compared_whatever_it_holds(backend):
    """(Found by a helper.) A list of more than 64 scalars, a dict nested 3 deep, an array in a tuple and an
    array bound by ``functools.partial`` were compared by type alone: changed after the first call, the kernel
    kept the first values (``x * _LONG_TABLE[5]`` gave 5x for numpy's 7x). They are compared by what they hold."""
    global _LONG_TABLE, _DEEP_CONFIG, _PARAMS
    x = np.arange(4, dtype=np.float32)
    first = _LONG_TABLE, _DEEP_CONFIG, _PARAMS
    try:
        for fn, change in ((_scaled_by_a_table_entry, lambda: _LONG_TABLE.__setitem__(5, 7.0)),
                           (_scaled_by_a_nested_config, lambda: _DEEP_CONFIG["a"]["b"]["c"].__setitem__("d", 4.0)),
                           (_scaled_by_an_array_in_a_tuple, lambda: _PARAMS[0].__setitem__(1, 5.0))):
            _LONG_TABLE, _DEEP_CONFIG = [float(i) for i in range(100)], {"a": {"b": {"c": {"d": 1.0}}}}
            _PARAMS = (np.array([2.0, 1.0], np.float32), 3.0)
            k = rf.kernel(fn, backend=backend)
            np.testing.assert_array_equal(k(x), fn(x))
            change()
            np.testing.assert_array_equal(k(x), fn(x), err_msg=fn.__name__)
    finally:
        _LONG_TABLE, _DEEP_CONFIG, _PARAMS = first
    w = np.array([2.0, 1.0], np.float32)
    k = rf.kernel(functools.partial(_scaled_by_a_bound_array, w), backend=backend)
    np.testing.assert_array_equal(k(x), x)
    w[1] = 5.0
    np.testing.assert_array_equal(k(x), x * 5.0)


def test_a_captured_container_too_large_to_compare_is_refused():
    """A container holding more than `CONTAINER_LEAVES` values, nested deeper than `CONTAINER_DEPTH`, or
    holding an array over `CAPTURED_ARRAY_BYTES`, is refused when the kernel traces, naming it and why,
    rather than baked in unchecked."""
    global _LONG_TABLE, _DEEP_CONFIG, _PARAMS
    from redfuser.captured import CONTAINER_DEPTH, CONTAINER_LEAVES
    x = np.ones(3, np.float32)
    first = _LONG_TABLE, _DEEP_CONFIG, _PARAMS
    try:
        _LONG_TABLE = [1.0] * (CONTAINER_LEAVES + 1)
        with pytest.raises(rf.UnsupportedError, match=r"captured list _LONG_TABLE, too large .*more than 1024 values"):
            rf.kernel(_scaled_by_a_table_entry, backend="interpret")(x)
        deep: object = 1.0
        for _ in range(CONTAINER_DEPTH + 1):
            deep = {"d": deep}
        _DEEP_CONFIG = {"a": {"b": {"c": deep}}}
        with pytest.raises(rf.UnsupportedError, match=r"_DEEP_CONFIG, too large .*nest deeper than 8"):
            rf.kernel(_scaled_by_a_nested_config, backend="interpret")(x)
        _PARAMS = (np.ones(5000, np.float32), 3.0)
        k = rf.kernel(_scaled_by_an_array_in_a_tuple, backend="interpret")
        with pytest.raises(rf.UnsupportedError, match=r"tuple _PARAMS, too large .*array of 20000 bytes"):
            k(x)
        _PARAMS = (np.ones(2, np.float32), 3.0)           # small again: traces
        np.testing.assert_array_equal(k(x), x)
        _LONG_TABLE = [1.0] * (CONTAINER_LEAVES + 1)
        k = rf.kernel(functools.partial(_scaled_by_a_bound_array, np.ones(5000, np.float32)), backend="interpret")
        with pytest.raises(rf.UnsupportedError, match="captured numpy array an argument bound by functools.partial"):
            k(x)
    finally:
        _LONG_TABLE, _DEEP_CONFIG, _PARAMS = first


class _Layer:
    shift = 0.0               # (a class default the object overrides later)

    def __init__(self):
        self.scale = 2.0

    def body(self, x):
        return rf.sum(x, axis=-1) * self.scale + self.shift


def _weighted(weights, x):
    return x * weights[0]


@pytest.mark.parametrize("backend", ["interpret", "cpu"])
def test_a_bound_method_or_a_partial_sees_its_objects_attributes_change(backend):
    """``rf.kernel(layer.body)``: a bound method forwards ``__code__`` to its function, so it was taken for
    a plain function and ``self.scale`` was never compared: after ``layer.scale = 3.0`` the kernel returned
    the old result (so did ``functools.partial(Layer.body, layer)``, and a list bound by a partial changed
    in place). The object's attributes are compared now, one first set after the kernel was made too."""
    x = np.ones((2, 4), np.float32)
    layer = _Layer()
    for k in (rf.kernel(layer.body, backend=backend), rf.kernel(functools.partial(_Layer.body, layer),
                                                                backend=backend)):
        layer.scale = 2.0
        layer.__dict__.pop("shift", None)
        np.testing.assert_array_equal(k(x), [8.0, 8.0])
        layer.scale = 3.0
        np.testing.assert_array_equal(k(x), [12.0, 12.0])
        layer.shift = 1.0              # (not in the object's __dict__ when the kernel was made)
        np.testing.assert_array_equal(k(x), [13.0, 13.0])
    weights = [2.0]
    k = rf.kernel(functools.partial(_weighted, weights), backend=backend)
    np.testing.assert_array_equal(k(x), np.full((2, 4), 2.0))
    weights[0] = 4.0
    np.testing.assert_array_equal(k(x), np.full((2, 4), 4.0))


class _ClassScaled:
    scale = 2.0               # (a class attribute: not in the object's __dict__)

    def __call__(self, x):
        return x * self.scale


@dataclasses.dataclass(slots=True)
class _SlotScaled:
    scale: float = 2.0        # (a slot: the object has no __dict__)

    def __call__(self, x):
        return x * self.scale


class _PropertyScaled:
    def __init__(self):
        self._scale = 2.0

    @property
    def scale(self):
        return self._scale

    def body(self, x):
        return x * self.scale


class _GetattrScaled(_PropertyScaled):
    """An object whose class has a ``__getattr__`` (as an ``nn.Module`` has)."""

    def __getattr__(self, name):
        raise AttributeError(name)

    def body(self, x):
        return x * self.scale + self.shift


@pytest.mark.parametrize("backend", ["interpret", "cpu"])
def test_an_attribute_outside_the_objects_dict_is_traced_again(backend):
    """``self.scale`` was compared only where it was in the object's ``__dict__``: a class attribute, a
    ``__slots__`` slot (``dataclass(slots=True)``) and a property read as "not bound" before and after a change,
    and the kernel kept returning x * 2 after the body's x * 3. Attributes are looked up as the body looks them
    up now."""
    x = np.ones(3, np.float32)
    slots, prop = _SlotScaled(), _PropertyScaled()
    cases = [(_ClassScaled(), lambda: setattr(_ClassScaled, "scale", 3.0)),
             (functools.partial(_SlotScaled.__call__, slots), lambda: setattr(slots, "scale", 3.0)),
             (slots, lambda: setattr(slots, "scale", 3.0)),
             (prop.body, lambda: setattr(prop, "_scale", 3.0))]
    try:
        for fn, change in cases:
            _ClassScaled.scale, slots.scale, prop._scale = 2.0, 2.0, 2.0
            k = rf.kernel(fn, backend=backend)
            np.testing.assert_array_equal(k(x), x * 2.0)
            change()
            np.testing.assert_array_equal(k(x), x * 3.0, err_msg=repr(fn))
    finally:
        _ClassScaled.scale = 2.0
    odd = _GetattrScaled()
    odd.shift = 1.0
    k = rf.kernel(odd.body, backend=backend)
    np.testing.assert_array_equal(k(x), x * 2.0 + 1.0)
    odd._scale, odd.shift = 3.0, 2.0
    np.testing.assert_array_equal(k(x), x * 3.0 + 2.0)


def _scaled_later(x):
    return x * _BOUND_LATER


@pytest.mark.parametrize("backend", ["interpret", "cpu"])
def test_a_global_bound_after_the_kernel_is_made_is_traced_again(backend):
    """A global the body reads was kept only if it held a scalar when the kernel was made: a constant a
    module defines below its kernel (or a notebook defines later), or one holding a placeholder object at
    first, was never compared, and the kernel kept the first value it traced. Every global the body reads is
    looked up on each call now, except names holding a module, a class or a function when the kernel was
    made: a body that reads only those (``rf``, ``range``) costs its calls nothing."""
    from redfuser.workloads import softmax

    x = np.ones(3, np.float32)
    k = rf.kernel(_scaled_later, backend=backend)
    try:
        globals()["_BOUND_LATER"] = 2.0
        np.testing.assert_array_equal(k(x), x * 2.0)
        globals()["_BOUND_LATER"] = 3.0
        np.testing.assert_array_equal(k(x), x * 3.0)
        globals()["_BOUND_LATER"] = object()          # a placeholder when the kernel is made
        k = rf.kernel(_scaled_later, backend=backend)
        globals()["_BOUND_LATER"] = 4.0
        np.testing.assert_array_equal(k(x), x * 4.0)
        globals()["_BOUND_LATER"] = 5.0
        np.testing.assert_array_equal(k(x), x * 5.0)
    finally:
        globals().pop("_BOUND_LATER", None)

    holder = object()

    def closed_over(a):
        return a * holder

    kc = rf.kernel(closed_over, backend=backend)
    holder = 6.0
    np.testing.assert_array_equal(kc(x), x * 6.0)
    holder = 7.0
    np.testing.assert_array_equal(kc(x), x * 7.0)
    assert rf.kernel(softmax)._captured is None      # (it reads only the module `rf`)


def test_threads_calling_a_new_kernel_at_once_compile_it_once():
    """Six threads making the first call of a kernel together compiled it six times (each a miss, the
    results right): finding or making a specialization is one thread at a time."""
    import threading

    from redfuser.workloads import softmax

    k = rf.kernel(softmax, backend="cpu")
    x = np.random.default_rng(0).standard_normal((64, 300)).astype(np.float32)
    out = [None] * 6

    def run(i):
        out[i] = k(x)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert k.cache_info().misses == 1 and all(np.array_equal(o, out[0]) for o in out)


_LOG: list = []
_RATE = 2.0


def _logging(x):
    _LOG.append(x.shape)          # (a side effect of tracing: the list the body changes is not a reason to trace)
    return x * _RATE


def test_a_scalar_changed_while_a_compile_runs_is_read_again_and_a_log_is_not(monkeypatch):
    """The values a trace read are noted right after it (`compiler.AFTER_TRACE`), a scalar as it was before
    the trace (another thread that changed it during the rest of the compile, here the verifier's turn,
    was taken as traced: stale results on every later call), a list as the trace left it (a body that
    logs to one would otherwise trace on every call)."""
    global _RATE
    from redfuser import compiler

    x = np.ones((2, 3), np.float32)
    k = rf.kernel(_logging, backend="cpu")
    real = compiler.verify_program

    def verify_then_change(program, **kw):
        global _RATE
        _RATE = 5.0                   # what another thread does while this one compiles
        return real(program, **kw)

    monkeypatch.setattr(compiler, "verify_program", verify_then_change)
    try:
        np.testing.assert_array_equal(k(x), np.full((2, 3), 2.0))
        monkeypatch.setattr(compiler, "verify_program", real)
        np.testing.assert_array_equal(k(x), np.full((2, 3), 5.0))
        misses = k.cache_info().misses
        for _ in range(3):
            k(x)
        assert k.cache_info().misses == misses          # the log grew; nothing traced again
    finally:
        _RATE = 2.0
        _LOG.clear()


_TABLE_READ = [1.0]


def _table_scaled(x):
    return rf.sum(x, axis=-1) * _TABLE_READ[0]


def test_a_list_changed_in_place_while_a_compile_runs_is_read_again(monkeypatch):
    """A captured list changed in place by another thread after the trace, while the rest of the compile runs
    (here the verifier's turn), was noted again at the end of the compile as the values traced: every later
    call kept the old ``TABLE[0]`` for good. Each trace now notes the values right after it, and only then.
    Found by a helper (hunt_conc/01)."""
    from redfuser import compiler

    x = np.ones((2, 3), np.float32)
    k = rf.kernel(_table_scaled, backend="cpu")
    real = compiler.verify_program

    def verify_then_change(program, **kw):
        _TABLE_READ[0] = 4.0          # what another thread does while this one compiles
        return real(program, **kw)

    monkeypatch.setattr(compiler, "verify_program", verify_then_change)
    try:
        np.testing.assert_array_equal(k(x), [3.0, 3.0])
        monkeypatch.setattr(compiler, "verify_program", real)
        np.testing.assert_array_equal(k(x), [12.0, 12.0])
        np.testing.assert_array_equal(k(x), [12.0, 12.0])
    finally:
        _TABLE_READ[0] = 1.0


def test_a_call_that_sees_a_change_while_another_thread_compiles_gets_the_new_value(monkeypatch):
    """Thread T compiles the first call with the old value; meanwhile the value changes and another call
    drops the specializations (without the compile lock) and waits for T: T then cached what it made from
    the old value, the waiting call found it, and every later call returned the old result. A compile during
    which the specializations were dropped keeps nothing (`Kernel._dropped`)."""
    import threading
    import time

    global _RATE
    from redfuser import compiler

    x = np.ones((2, 3), np.float32)
    k = rf.kernel(_logging, backend="cpu")
    real, traced, go = compiler.verify_program, threading.Event(), threading.Event()
    first, second = [], []

    def verify_and_wait(program, **kw):
        if threading.current_thread() is compiling:
            traced.set()
            go.wait(20)
        return real(program, **kw)

    monkeypatch.setattr(compiler, "verify_program", verify_and_wait)
    compiling = threading.Thread(target=lambda: first.append(k(x)))
    try:
        compiling.start()
        assert traced.wait(20)
        _RATE = 5.0
        waiting = threading.Thread(target=lambda: second.append(k(x)))
        waiting.start()
        time.sleep(0.3)                 # (it has seen the change and waits for the compile lock)
        go.set()
        compiling.join(30)
        waiting.join(30)
        np.testing.assert_array_equal(first[0], np.full((2, 3), 2.0))
        np.testing.assert_array_equal(second[0], np.full((2, 3), 5.0))
        np.testing.assert_array_equal(k(x), np.full((2, 3), 5.0))
    finally:
        go.set()
        _RATE = 2.0
        _LOG.clear()


@rf.kernel(backend="interpret")
def pickled_by_reference(a):
    return a * 2.0


class _DecoratedLayer:
    def __init__(self, scale):
        self.scale = scale

    @rf.kernel(backend="cpu")
    def body(self, a):
        return a * self.scale


def test_a_kernel_decorating_a_method_binds_self_per_instance():
    """``@rf.kernel`` on a method: ``obj.body(x)`` called the kernel without ``self`` ('takes 2 arguments but
    1 were given'). It is now the kernel of the bound method, one per instance, whose ``self`` attributes are
    tracked like any captured value. Found by a helper trying function forms."""
    x = np.arange(4, dtype=np.float32)
    a, b = _DecoratedLayer(2.0), _DecoratedLayer(3.0)
    np.testing.assert_array_equal(a.body(x), x * 2)
    np.testing.assert_array_equal(b.body(x), x * 3)
    # (bound as a method is: equal for one instance, one kernel and its specializations per instance)
    assert a.body == a.body and a.body != b.body and _DecoratedLayer.body is _DecoratedLayer.__dict__["body"]
    assert a.body.cache_info().currsize == 1 and b.body.cache_info().currsize == 1
    a.scale = 5.0
    np.testing.assert_array_equal(a.body(x), x * 5)


def test_a_module_level_kernel_pickles_and_deep_copies_by_reference():
    """Pickling a module-level kernel raised 'not the same object as ...' (the function it wraps was looked
    up), deepcopy a bare 'cannot pickle _thread.RLock'. Both are by reference now, as for functions; a
    kernel not found where its name says cannot be pickled, with a message naming it."""
    import copy
    import pickle

    assert pickle.loads(pickle.dumps(pickled_by_reference)) is pickled_by_reference
    assert copy.deepcopy(pickled_by_reference) is pickled_by_reference
    with pytest.raises(pickle.PicklingError, match="by reference"):
        pickle.dumps(rf.kernel(lambda a: a + 1.0))


def _doubles_through_a_view(x):
    t = x[:]
    t += x
    return x


def _reads_the_right_hand_side_after(x):
    t = x.T
    x += t
    return rf.sum(t, axis=-1)


def _updates_a_transpose(x):
    y = x.T
    y += 1
    return y


def _centres_groups_in_place(x):
    y = x.reshape(3, 2, 3)
    y -= rf.max(y, axis=-1, keepdims=True)
    return rf.sum(rf.exp(y), axis=-1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_in_place_update_through_one_view_refuses_reading_another(backend):
    """(Found by a helper, hunt_indexing/01-02.) An update's right-hand side was left out of the views it
    changes: ``t = x[:]; t += x; return x`` gave ``x`` for numpy's ``2 x``, silently. Every other view of the
    array is stale after it, and reading one is refused; a body that never reads one again runs, where any
    update of a viewed array was refused before (``y = x.T; y += 1``, a group norm's reshaped ``y -= max``)."""
    x = np.arange(18, dtype=np.float32).reshape(3, 6) / 7
    for body in (_doubles_through_a_view, _reads_the_right_hand_side_after):
        with pytest.raises(rf.UnsupportedError, match="an in-place update"):
            rf.kernel(body, backend=backend)(x[:, :3].copy())
    _same(rf.kernel(_updates_a_transpose, backend=backend)(x), _updates_a_transpose(x.copy()))
    _same(rf.kernel(_centres_groups_in_place, backend=backend)(x), _centres_groups_in_place(x.copy()))


def _adds_one_in_place(a, b):
    a += 1
    return a + b


def _twice(x):
    return x * 2.0


@pytest.mark.parametrize("backend", ("interpret", "cpu"))
def test_interleaved_views_that_share_no_element_are_not_refused(backend):
    """(Found by a helper, hunt_indexing/03.) ``y[:, ::2]`` and ``y[:, 1::2]`` share no element, but their byte
    spans meet, and both the in-place check and ``out=`` refused them as sharing memory. Spans that meet are
    now asked element by element (numpy's exact ``shares_memory``); views that do share stay refused."""
    y = np.arange(24, dtype=np.float32).reshape(4, 6)
    even, odd = y[:, ::2], y[:, 1::2]
    _same(rf.kernel(_adds_one_in_place, backend=backend)(even, odd), _adds_one_in_place(even.copy(), odd))
    out = rf.kernel(_twice, backend=backend)(even, out=odd)
    assert out is odd
    np.testing.assert_array_equal(y[:, 1::2], y[:, ::2] * 2)
    with pytest.raises(rf.ArgumentError, match="shares"):
        rf.kernel(_adds_one_in_place, backend=backend)(y[:, :3], y[:, 2:5])
    with pytest.raises(rf.ArgumentError, match="shares memory"):
        rf.kernel(_twice, backend=backend)(y[:, :3], out=y[:, ::2])
