"""Error paths: the error class, what the message says, and that it points at the user's line.

Every user error must name the op and the shapes/dtypes involved, and its text
must show this file, the line number and the source line of the offending
statement (each marked below with a ``# <- name`` comment that the checks look up).
"""
from __future__ import annotations

import os
import traceback

import numpy as np
import pytest

import redfuser as rf
from redfuser.source_info import is_internal

with open(__file__) as _f:
    SOURCE = _f.read().splitlines()

W = np.ones((3, 4), np.float32)  # a module-level array a kernel body must not capture


def line_of(marker: str) -> int:
    """The line number (1-based) of the line ending with ``# <- marker``."""
    hits = [n for n, line in enumerate(SOURCE, 1) if line.rstrip().endswith(f"# <- {marker}")]
    assert len(hits) == 1, f"marker {marker!r} found {len(hits)} times"
    return hits[0]


def raises_at(cls, marker, fn, *args, contains=()):
    """Call `fn(*args)`; check the error's class, its text, and that it points at the marked line."""
    with pytest.raises(cls) as info:
        fn(*args)
    err, text, line = info.value, str(info.value), line_of(marker)
    assert f"{os.path.basename(__file__)}:{line}" in text, f"no file:line {line} in\n{text}"
    assert err.loc.line == line and os.path.samefile(err.loc.file, __file__)
    code = SOURCE[line - 1].split("# <-")[0].strip()
    assert code in text, f"source line {code!r} not in\n{text}"
    for part in contains:
        assert part in text, f"{part!r} not in\n{text}"
    return err


def interp(fn):
    return rf.kernel(fn, backend="interpret")


X = np.zeros((3, 4), np.float32)
Y = np.zeros((5,), np.float32)


# ---------------------------------------------------------------------------------------------
# arguments
# ---------------------------------------------------------------------------------------------
def test_wrong_number_of_arguments():
    k = interp(lambda x, y: x + y)
    err = raises_at(rf.ArgumentError, "argcount", lambda: k(X))  # <- argcount
    assert "takes 2 argument(s) (x, y) but 1 were given" in str(err)
    raises_at(rf.ArgumentError, "argcount3", lambda: k(X, X, X), contains=("but 3 were given",))  # <- argcount3


@pytest.mark.parametrize("value,said", [([1.0, 2.0], "must be an array"), ({"a": 1}, "must be an array"),
                                        ((1.0, [2.0]), "a tuple holding a list at y[1]")])
def test_non_array_argument(value, said):
    k = interp(lambda x, y: x + y)
    raises_at(rf.ArgumentError, "nonarray", lambda: k(X, value),  # <- nonarray
              contains=("argument 'y'", said, type(value).__name__))


@pytest.mark.parametrize("value", ["abc", None])
def test_a_static_string_or_none_reaching_arithmetic_names_the_op(value):
    def body(x, y):
        return x + y  # <- static_operand

    raises_at(rf.UnsupportedError, "static_operand", interp(body), X, value,
              contains=("add", type(value).__name__, "not an array or a scalar"))


@pytest.mark.parametrize("dtype", [np.complex64, np.float64, np.uint8])
def test_unsupported_argument_dtype(dtype):
    k = interp(lambda x: x * 2)
    raises_at(rf.DTypeError, "dtype", lambda: k(np.zeros(3, dtype)),  # <- dtype
              contains=("argument 'x'", np.dtype(dtype).name, "not supported", "float32", "bfloat16"))


# ---------------------------------------------------------------------------------------------
# shapes
# ---------------------------------------------------------------------------------------------
def test_broadcast_mismatch():
    def body(x, y):
        return x + y  # <- broadcast

    raises_at(rf.ShapeError, "broadcast", interp(body), X, Y, contains=("add", "f32[3,4]", "f32[5]", "broadcast"))


def test_broadcast_mismatch_in_where():
    def body(x, y):
        return rf.where(x > 0, x, y)  # <- where

    raises_at(rf.ShapeError, "where", interp(body), X, Y, contains=("where", "f32[3,4]", "f32[5]"))


def test_matmul_contracted_dimension_mismatch():
    def body(x, y):
        return x @ y  # <- matmul_k

    raises_at(rf.ShapeError, "matmul_k", interp(body), X, np.zeros((5, 6), np.float16),
              contains=("matmul", "f32[3,4]", "f16[5,6]", "4 vs 5"))


def test_matmul_batch_mismatch():
    def body(x, y):
        return x @ y  # <- matmul_batch

    raises_at(rf.ShapeError, "matmul_batch", interp(body), np.zeros((2, 3, 4), np.float32),
              np.zeros((3, 4, 5), np.float32), contains=("matmul", "batch", "f32[2,3,4]", "f32[3,4,5]"))


def test_matmul_of_a_zero_dim_value():
    def body(x, y):
        return rf.sum(x) @ y  # <- matmul_0d

    raises_at(rf.ShapeError, "matmul_0d", interp(body), X, Y, contains=("matmul", "at least one dimension", "f32[]"))


@pytest.mark.parametrize("axis", [2, -3, (0, 2)])
def test_reduction_axis_out_of_range(axis):
    def body(x):
        return rf.sum(x, axis=axis)  # <- axis

    raises_at(rf.ShapeError, "axis", interp(body), X, contains=("sum", "out of bounds", "f32[3,4]"))


def test_repeated_reduction_axis():
    def body(x):
        return rf.max(x, axis=(1, -1))  # <- repeated

    raises_at(rf.ShapeError, "repeated", interp(body), X, contains=("max", "repeated axis"))


@pytest.mark.parametrize("op", ["sum", "max", "mean", "var", "std", "any", "prod"])
def test_a_reduction_axis_given_as_a_list_is_refused_as_numpy_refuses_it(op):
    """(Found by a helper.) numpy's reductions raise a TypeError for ``axis=[0, 1]``, so the body, the kernel's
    reference, cannot run; the kernel reduced over both axes instead."""
    fn = getattr(rf, op)

    def body(x):
        return fn(x, axis=[0, 1])  # <- listed

    raises_at(rf.UnsupportedError, "listed", interp(body), X, contains=(op, "list", "axis=(0, 1)"))


@pytest.mark.parametrize("op, hint", [("maximum", "rf.max"), ("add", "rf.sum"), ("logical_or", "rf.any"),
                                      ("subtract", "ufunc method")])
def test_a_ufunc_method_of_an_op_is_refused_with_the_reduction_to_write(op, hint):
    """(Found by a helper.) ``rf.maximum.reduce(x, axis=-1)`` was a bare AttributeError."""
    fn = getattr(rf, op)

    def body(x):
        return fn.reduce(x, axis=-1)  # <- method

    raises_at(rf.UnsupportedError, "method", interp(body), X, contains=(f"{op}.reduce", hint))


def test_swapaxes_and_transpose_axes_out_of_range():
    def swap(x):
        return rf.swapaxes(x, 0, 2)  # <- swap

    def perm(x):
        return rf.transpose(x, (0, 0))  # <- perm

    raises_at(rf.ShapeError, "swap", interp(swap), X, contains=("swapaxes", "axis 2", "f32[3,4]"))
    raises_at(rf.ShapeError, "perm", interp(perm), X, contains=("transpose", "not a permutation"))


def test_max_over_an_empty_axis():
    def body(x):
        return rf.max(x, axis=0)  # <- empty

    raises_at(rf.ShapeError, "empty", interp(body), np.zeros((0, 3), np.float32),
              contains=("max", "empty axis", "f32[0,3]", "no identity"))


def test_index_out_of_range_and_too_many_indices():
    def out_of_range(x):
        return x[3]  # <- index_oob

    def too_many(x):
        return x[0, 0, 0]  # <- too_many

    raises_at(rf.ShapeError, "index_oob", interp(out_of_range), X, contains=("getitem", "index 3", "f32[3,4]"))
    raises_at(rf.ShapeError, "too_many", interp(too_many), X, contains=("getitem", "too many indices"))


# ---------------------------------------------------------------------------------------------
# Python on traced values
# ---------------------------------------------------------------------------------------------
def test_python_if_on_a_traced_value():
    def body(x):
        if rf.max(x) > 0:  # <- if
            return x
        return -x

    raises_at(rf.TracerBoolError, "if", interp(body), X, contains=("bool()", "bool[]", "rf.where"))


@pytest.mark.parametrize("backend", ["interpret", "cpu"])
def test_python_if_on_a_traced_value_inside_the_bodys_own_try(backend):
    # the body swallows the TracerBoolError (it is an Exception raised in the body's frame): the trace must not
    # go on down the handler's path, which numpy's body never takes (here a - 1 where numpy gives a + 1)
    def body(a):
        try:
            if rf.sum(a) > 0:  # <- swallowed_if
                return a + 1
        except Exception:
            pass
        return a - 1

    k = rf.kernel(body, backend=backend)
    raises_at(rf.TracerBoolError, "swallowed_if", k, X + 1, contains=("bool()", "bool[]", "rf.where"))


def test_float_of_a_traced_value_swallowed_by_a_handler_that_raises_another_error():
    # the first conversion is what went wrong, not the handler's own error
    def body(a):
        try:
            scale = float(rf.max(a))  # <- swallowed_float
        except Exception:
            raise ValueError("no scale") from None
        return a * scale

    raises_at(rf.TracerBoolError, "swallowed_float", interp(body), X, contains=("float()",))


def test_python_and_on_a_traced_value():
    def body(x):
        return (x > 0) and (x < 1)  # <- and

    raises_at(rf.TracerBoolError, "and", interp(body), X, contains=("bool()", "bool[3,4]"))


def test_float_of_a_traced_value():
    def body(x):
        return x * float(rf.sum(x))  # <- float

    raises_at(rf.TracerBoolError, "float", interp(body), X, contains=("float()", "f32[]"))


def test_iteration_over_a_traced_value():
    def body(x):
        return [row * 2 for row in x]  # <- iter

    raises_at(rf.TracerBoolError, "iter", interp(body), X, contains=("iteration", "f32[3,4]"))


@pytest.mark.parametrize("name", ["sum", "tanh", "arctanh", "exp", "mean", "maximum"])
def test_numpy_function_in_the_body(name):
    fn = getattr(np, name)

    def body(x):
        return fn(x) if name != "maximum" else fn(x, 0.0)  # <- numpy

    hint = f"use rf.{name}" if hasattr(rf, name) else f"RedFuser has no {name}"
    err = raises_at(rf.UnsupportedError, "numpy", interp(body), X, contains=(f"numpy.{name}", hint))
    if not hasattr(rf, name):   # a hint never points at an op that does not exist
        assert f"rf.{name}" not in str(err)


def test_numpy_function_on_a_list_of_traced_values():
    def body(x):
        return np.concatenate([x, x])  # <- concatenate

    raises_at(rf.UnsupportedError, "concatenate", interp(body), X, contains=("numpy.concatenate",))


def test_unsupported_method():
    def body(x):
        return x.flatten()  # <- flatten

    raises_at(rf.UnsupportedError, "flatten", interp(body), X, contains=("flatten", "subset"))


def test_numpys_view_method_is_refused_as_an_unsupported_method():
    """(Found by a helper.) ``x.view(np.int32)`` was a bare TypeError: the tracer's own positions were an
    attribute named ``view``, which hid the method."""
    def body(x):
        return x.view(np.int32)  # <- reinterpret

    raises_at(rf.UnsupportedError, "reinterpret", interp(body), X, contains=("'view'", "subset"))


@pytest.mark.parametrize("which, hint", [(0, "rf.abs"), (1, "~ operator"), (2, "rf.sum"), (3, "no ufunc methods")],
                         ids=["absolute", "invert", "add.reduce", "subtract.accumulate"])
def test_a_numpy_ufunc_names_what_redfuser_spells_it(which, hint):
    """(Found by a helper.) ``np.abs`` said "RedFuser has no absolute", ``np.invert`` "no invert", and
    ``np.add.reduce`` pointed at the elementwise ``rf.add``."""
    def body(x, which):
        return [np.abs, lambda v: np.invert(v > 0), np.add.reduce, np.subtract.accumulate][which](x)  # <- spelled

    err = raises_at(rf.UnsupportedError, "spelled", interp(body), X, which, contains=(hint,))
    assert "has no absolute" not in str(err) and "has no invert" not in str(err)


def test_an_update_of_an_indexed_part_is_refused_as_item_assignment():
    """(Found by a helper.) ``y[0] += 1`` was refused as an update that other views see, with ``x = x + y``
    to write instead (which ``y[0] = y[0] + 1`` is not either): it is item assignment."""
    def body(x):
        y = x * 1
        y[0] += 1  # <- indexed update
        return y

    raises_at(rf.UnsupportedError, "indexed update", interp(body), X, contains=("item assignment", "rf.where"))


def test_a_tuple_argument_holding_an_array_names_the_element():
    """(Found by a helper.) ``k((1.0, x))`` said the argument must be "a tuple of those, got tuple"."""
    def body(t):
        return t[0] + t[1]

    with pytest.raises(rf.ArgumentError, match=r"holding a ndarray at t\[1\]") as info:
        interp(body)((1.0, X))
    assert os.path.basename(__file__) in str(info.value)


def test_reshape_refuses_what_numpy_refuses():
    def body(x):
        return x.reshape(5, 3)  # <- size
    raises_at(rf.ShapeError, "size", interp(body), X, contains=("reshape", "size 12", "(5, 3)", "f32[3,4]"))

    def body2(x):
        return x.reshape(-1, -1)  # <- two unknown
    raises_at(rf.ShapeError, "two unknown", interp(body2), X, contains=("reshape", "one unknown dimension"))

    def body3(x):
        return rf.reshape(x, (2, 6), order="F")  # <- order
    raises_at(rf.UnsupportedError, "order", interp(body3), X, contains=("reshape", "C order"))

    def body4(x):
        return x.reshape(2.0, 6)  # <- float shape
    raises_at(rf.UnsupportedError, "float shape", interp(body4), X, contains=("reshape", "static ints"))


def test_slice_step_zero():
    def body(x):
        return x[:, ::0]  # <- step
    raises_at(rf.ShapeError, "step", interp(body), X, contains=("getitem", "step cannot be zero"))


def test_slice_bound_must_be_a_static_int():
    def body(x):
        return x[:, 1.5:]  # <- float bound
    raises_at(rf.UnsupportedError, "float bound", interp(body), X, contains=("getitem", "static ints", "1.5"))


def test_concatenate_of_mismatched_shapes():
    def body(x, y):
        return rf.concatenate([x, y], axis=0)  # <- mismatch
    raises_at(rf.ShapeError, "mismatch", interp(body), X, Y,
              contains=("concatenate", "same number of dimensions", "f32[3,4]", "f32[5]"))

    def body2(x):
        return rf.concatenate((x, x[:, :2]), axis=0)  # <- other axis
    raises_at(rf.ShapeError, "other axis", interp(body2), X,
              contains=("concatenate", "except for the concatenation axis 0", "f32[3,2]"))

    def body3(x):
        return rf.concatenate((x, x), axis=2)  # <- axis out of range
    raises_at(rf.ShapeError, "axis out of range", interp(body3), X, contains=("concatenate", "axis 2"))


def test_concatenate_and_stack_refuse_what_numpy_refuses():
    def body(x):
        return rf.concatenate([rf.sum(x), x[0, 0]])  # <- 0-d
    raises_at(rf.ShapeError, "0-d", interp(body), X, contains=("concatenate", "zero-dimensional"))

    def body2(x):
        return rf.concatenate(x)  # <- not a list
    raises_at(rf.UnsupportedError, "not a list", interp(body2), X, contains=("concatenate", "tuple or list"))

    def body3(x):
        return rf.stack([x, x[:, 1:]])  # <- stack shapes
    raises_at(rf.ShapeError, "stack shapes", interp(body3), X, contains=("stack", "same shape", "f32[3,3]"))


def test_array_index_is_unsupported():
    def body(x):
        return x[np.array([0, 1])]  # <- fancy

    raises_at(rf.UnsupportedError, "fancy", interp(body), X, contains=("getitem", "not supported"))


def test_captured_numpy_array():
    def right(x):
        return x + W  # <- captured_right

    def left(x):
        return W * x  # <- captured_left

    raises_at(rf.UnsupportedError, "captured_right", interp(right), X,
              contains=("add", "numpy array f32[3,4]", "kernel argument"))
    raises_at(rf.UnsupportedError, "captured_left", interp(left), X, contains=("multiply", "kernel argument"))


def test_traced_exponent():
    def scalar_base(x):
        return 2.0 ** x  # <- rpow

    def traced_both(x):
        return x ** x  # <- pow

    raises_at(rf.UnsupportedError, "rpow", interp(scalar_base), X, contains=("power", "constant exponent"))
    raises_at(rf.UnsupportedError, "pow", interp(traced_both), X, contains=("power", "f32[3,4] ** f32[3,4]"))


@pytest.mark.parametrize("target", [np.complex64, np.uint8, "not-a-dtype"])
def test_bad_astype_target(target):
    def body(x):
        return x.astype(target)  # <- astype

    raises_at(rf.DTypeError, "astype", interp(body), X, contains=("astype", "f32[3,4]", "supported dtypes"))


def test_logical_operator_on_non_bool():
    def body(x):
        return x & (x > 0)  # <- and_float

    raises_at(rf.DTypeError, "and_float", interp(body), X, contains=("bitwise_and", "bool", "f32[3,4]"))


def test_mixed_float_dtypes_follow_numpys_result_type():
    """f16 with bf16: numpy's own promotion decides (ml_dtypes < 0.7 refuses it, 0.7 gives f32), and the
    kernel follows whichever the installed numpy says: the same dtype and values, or a DTypeError."""
    def body(x, y):
        return rf.where(x > 0, x, y)  # <- no_common

    x = np.array([1.5, -2.0, 0.0], np.float16)
    y = np.array([0.25, 3.0, -1.0], rf.bfloat16)
    try:
        expected = np.where(x > 0, x, y)
    except TypeError:
        raises_at(rf.DTypeError, "no_common", interp(body), x, y, contains=("where", "f16[3]", "bf16[3]"))
        return
    got = interp(body)(x, y)
    assert got.dtype == expected.dtype == np.result_type(np.float16, rf.bfloat16)
    np.testing.assert_array_equal(got, expected)


def test_an_operation_numpy_refuses_is_a_dtype_error():
    def body(x, y):
        return (x > 0) - (y > 0)  # <- bool_subtract

    raises_at(rf.DTypeError, "bool_subtract", interp(body), X, X, contains=("subtract", "bool[3,4]"))


def test_returning_a_non_array():
    def body(x):
        return 1.0  # <- return

    raises_at(rf.UnsupportedError, "return", interp(body), X, contains=("return", "float"))


# ---------------------------------------------------------------------------------------------
# kernel configuration
# ---------------------------------------------------------------------------------------------
def test_unknown_backend_name():
    with pytest.raises(rf.BackendError, match="unknown backend 'tpu'") as info:
        rf.kernel(lambda x: x, backend="tpu")
    for name in ("interpret", "cpu", "cuda", "simulate"):
        assert name in str(info.value)


def test_unknown_kernel_option():
    with pytest.raises(rf.ArgumentError, match="unknown option") as info:
        rf.kernel(lambda x: x, backend="interpret", block_size=64)
    assert "block_size" in str(info.value)


def test_all_errors_share_one_base():
    for cls in (rf.CompileError, rf.ShapeError, rf.DTypeError, rf.UnsupportedError, rf.TracerBoolError,
                rf.ArgumentError, rf.BackendError, rf.InternalError, rf.VerifyError):
        assert issubclass(cls, rf.RedFuserError)
    for cls in (rf.ShapeError, rf.DTypeError, rf.UnsupportedError, rf.TracerBoolError, rf.ArgumentError):
        assert issubclass(cls, rf.CompileError)


@pytest.mark.parametrize("entry", ["call", "lower"])
def test_traceback_hides_redfuser_internals(entry):
    def body(x, y):
        return x @ y  # <- tb

    k = interp(body)
    with pytest.raises(rf.ShapeError) as info:
        k(X, Y[:3]) if entry == "call" else k.lower(X, Y[:3])
    frames = traceback.extract_tb(info.value.__traceback__)
    internal = [f for f in frames if is_internal(f.filename)]
    assert [os.path.basename(f.filename) for f in internal] == ["kernel.py"], frames
    assert internal[0].name == "wrapper"
    assert info.value.__cause__ is None and info.value.__suppress_context__
    assert f"test_errors.py:{line_of('tb')}" in str(info.value)


# ---------------------------------------------------------------------------------------------
# found trying the project as a new user (each was a bare internal exception or a meaning picked silently)
# ---------------------------------------------------------------------------------------------
def test_keepdims_that_numpy_refuses_is_refused():
    def body(x):
        return rf.sum(x, axis=-1, keepdims="False")  # <- keepdims string
    raises_at(rf.UnsupportedError, "keepdims string", interp(body), X, contains=("sum", "keepdims must be a bool"))

    def body2(x):
        return rf.max(x, axis=-1, keepdims=None)  # <- keepdims none
    raises_at(rf.UnsupportedError, "keepdims none", interp(body2), X, contains=("max", "None"))
    np.testing.assert_array_equal(interp(lambda x: rf.sum(x, axis=-1, keepdims=1))(X), X.sum(-1, keepdims=1))


def test_argmax_of_a_tuple_of_axes_names_the_op():
    def body(x):
        return rf.argmax(x, axis=(0, 1))  # <- argmax tuple
    raises_at(rf.UnsupportedError, "argmax tuple", interp(body), X, contains=("argmax", "(0, 1)", "one axis"))


def test_matrix_transpose_of_a_vector_names_mT():
    def body(y):
        return y.mT  # <- mT
    raises_at(rf.ShapeError, "mT", interp(body), Y, contains=("mT", "f32[5]", "at least 2 dims"))


def test_values_too_big_for_memory_are_shape_errors():
    def body(x):
        return x.reshape(2**64, -1)  # <- huge reshape
    raises_at(rf.ShapeError, "huge reshape", interp(body), X, contains=("reshape", "18446744073709551616"))

    def body2(x):
        return rf.arange(2**62) + x.shape[0]  # <- huge arange
    raises_at(rf.ShapeError, "huge arange", rf.kernel(body2, backend="cpu"), X, contains=("arange", "too big"))


def test_a_backend_limit_met_in_the_schedule_shows_the_users_line():
    def body(x):
        return rf.argmax(x.astype(np.int64), axis=-1)  # <- int64 argmax
    raises_at(rf.BackendError, "int64 argmax", rf.kernel(body, backend="cpu"), X, contains=("ranking int64",))
