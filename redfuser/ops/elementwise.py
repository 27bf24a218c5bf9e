"""Elementwise ops: arithmetic, math functions, comparisons, logic, `where`, `astype`."""
from __future__ import annotations

import operator
from typing import Callable, Sequence

import numpy as np

from ..ir import (
    Binary,
    BinaryOp,
    Compute,
    DType,
    DTypeError,
    Expr,
    Select,
    Unary,
    UnaryOp,
    UnsupportedError,
)
from ..ir import types as T
from ..probes import ProbeLength
from ..source_info import user_loc
from ..tracer import Tracer
from .common import (
    _builder,
    _check_operand,
    _traced,
    broadcast_shapes,
    cast,
    constant,
    describe,
    is_numpy_scalar,
    operand,
    probe,
    result_dtype,
    static_scalar,
)


def _elementwise(op: str, np_fn: Callable, args: Sequence[object], make: Callable[[list[Expr], DType], Expr],
                 operand_dtype: Callable[[DType], DType] | None = None) -> Tracer:
    args = [static_scalar(a) for a in args]
    for a in args:
        _check_operand(op, a)
    loc = user_loc()
    shape = broadcast_shapes(op, *args)
    out_dtype = result_dtype(op, np_fn, *args)
    in_dtype = operand_dtype(out_dtype) if operand_dtype else out_dtype
    builder = _builder(op, *args)
    axes = builder.axes(shape)
    exprs = [operand(a, axes, in_dtype) for a in args]
    return builder.emit(op, out_dtype, shape, lambda out: Compute(out, axes, make(exprs, out_dtype), loc=loc))


def _unary(op: UnaryOp, np_fn: Callable) -> Callable:
    def fn(x):
        if not _traced(x):
            return np_fn(x)
        # numpy's abs of a bool is the bool itself; the Loop IR has no arithmetic on bools (ir/loop/verifier.py)
        return _elementwise(op.value, np_fn, [x],
                            lambda e, d: e[0] if d.is_bool and op is UnaryOp.ABS else Unary(op, e[0], d))

    fn.__name__ = fn.__qualname__ = op.value
    fn.__doc__ = f"Elementwise ``{op.value}``; numpy's result on arrays."
    return fn


def _rsqrt_numpy(x):
    x = np.asarray(x) if not isinstance(x, np.generic) else x
    return 1 / np.sqrt(x)


exp = _unary(UnaryOp.EXP, np.exp)
exp2 = _unary(UnaryOp.EXP2, np.exp2)
log = _unary(UnaryOp.LOG, np.log)
log2 = _unary(UnaryOp.LOG2, np.log2)
sqrt = _unary(UnaryOp.SQRT, np.sqrt)
rsqrt = _unary(UnaryOp.RSQRT, _rsqrt_numpy)
rsqrt.__doc__ = "Elementwise ``1 / sqrt(x)`` (numpy: ``1 / np.sqrt(x)``)."
abs = _unary(UnaryOp.ABS, np.abs)
negative = _unary(UnaryOp.NEG, np.negative)


def positive(x):
    """``+x``: numpy's ``np.positive``, a new array equal to `x` (so ``y = +x; y += 1`` leaves ``x`` as it is),
    refused for bools as numpy refuses them (it has no bool loop)."""
    if not _traced(x):
        return np.positive(x)
    return _elementwise("positive", np.positive, [x], lambda e, d: e[0])


def logical_not(x):
    """Elementwise ``~x`` on bool (numpy's ``logical_not``)."""
    if not _traced(x):
        return np.logical_not(x)
    return _elementwise("not", np.logical_not, [x], lambda e, d: Unary(UnaryOp.NOT, _truth(e[0]), d),
                        operand_dtype=lambda d: e_dtype(x))


def e_dtype(x: object) -> DType:
    return x.ir_dtype if isinstance(x, Tracer) else T.from_numpy(np.asarray(x).dtype)


def _truth(e: Expr) -> Expr:
    return e if e.dtype.is_bool else Binary(BinaryOp.NE, e, constant(0, e.dtype), T.bool_)


BOOL_FORMS: dict[BinaryOp, BinaryOp] = {
    BinaryOp.ADD: BinaryOp.OR, BinaryOp.MUL: BinaryOp.AND, BinaryOp.MAX: BinaryOp.OR, BinaryOp.MIN: BinaryOp.AND,
}
"""numpy's add, multiply, maximum and minimum of bools are logical or, and, or, and (``True + True`` is
``True``). The tracer writes them so: the Loop IR has no arithmetic on bools (ir/loop/verifier.py), so no
backend can read a bool ``+`` as the 1-bit integer add (xor) LLVM's ``i1`` would compute."""


def _binary(op: BinaryOp, np_fn: Callable, name: str) -> Callable:
    def fn(a, b):
        if not _traced(a, b):
            return np_fn(a, b)
        return _elementwise(name, np_fn, [a, b],
                            lambda e, d: Binary(BOOL_FORMS.get(op, op) if d.is_bool else op, e[0], e[1], d))

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"Elementwise ``{op.value}`` with broadcasting; numpy's result on arrays."
    _ufunc_methods_refused(fn, name)
    return fn


REDUCTION_OF = {"add": "rf.sum", "multiply": "rf.prod", "maximum": "rf.max", "minimum": "rf.min",
                 "logical_and": "rf.all", "logical_or": "rf.any"}
"""The reduction a binary op's ``.reduce`` is, for the refusals' hints (``rf.add.reduce``, ``np.add.reduce``)."""


def _ufunc_methods_refused(fn: Callable, name: str) -> None:
    """Give `fn` numpy's ufunc methods (``reduce``, ``accumulate``, ``outer``, ``at``, ``reduceat``), each
    refusing with a `redfuser` error that names the op and the user's line (a bare AttributeError before)."""
    for method in ("reduce", "accumulate", "outer", "at", "reduceat"):
        def refuse(*args, _method=method, **kwargs):
            hint = f"; write {REDUCTION_OF[name]}(x, axis=...)" if _method == "reduce" and name in REDUCTION_OF \
                else ""
            raise UnsupportedError(f"numpy's ufunc method {name}.{_method} is not in RedFuser's op subset{hint}",
                                   op=f"{name}.{_method}", loc=user_loc())
        refuse.__name__ = refuse.__qualname__ = f"{name}.{method}"
        setattr(fn, method, refuse)


add = _binary(BinaryOp.ADD, np.add, "add")
_subtract = _binary(BinaryOp.SUB, np.subtract, "subtract")


def subtract(a, b):
    """Elementwise ``-`` with broadcasting; numpy's result on arrays (numpy refuses bool - bool)."""
    if _traced(a, b) and _is_bool(a) and _is_bool(b):
        raise DTypeError(f"numpy does not subtract bools ({describe(a)} - {describe(b)}); for logical xor use "
                         "a ^ b (rf.logical_xor), for 'a and not b' use a & ~b", op="subtract", loc=user_loc())
    return _subtract(a, b)
multiply = _binary(BinaryOp.MUL, np.multiply, "multiply")
divide = _binary(BinaryOp.DIV, np.true_divide, "divide")


def _integer_division(op: BinaryOp, np_fn: Callable, name: str) -> Callable:
    """numpy's ``//`` or ``%`` of integers (floored; a zero divisor gives 0, ``INT_MIN // -1`` wraps:
    codegen/int_division.py). Of floats numpy has its own fmod-based rules; not in the subset yet."""
    integers = _binary(op, np_fn, name)

    def fn(a, b):
        if not _traced(a, b):
            return np_fn(a, b)
        for x in (a, b):
            _check_operand(name, x)
        d = result_dtype(name, np_fn, a, b)
        if not d.is_int:
            raise UnsupportedError(f"{op.value} of {describe(a)} and {describe(b)} gives {d}: RedFuser has "
                                   f"numpy's {op.value} of integers only (for floats write rf.floor(a / b)"
                                   f"{' and a - b * rf.floor(a / b)' if op is BinaryOp.MOD else ''}, whose "
                                   "rounding differs from numpy's at the edges)", op=name, loc=user_loc())
        return integers(a, b)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"numpy's ``{name}`` (``{op.value}``) of integers: floored, 0 for a zero divisor."
    return fn


floor_divide = _integer_division(BinaryOp.FLOORDIV, np.floor_divide, "floor_divide")
remainder = _integer_division(BinaryOp.MOD, np.remainder, "remainder")


maximum = _binary(BinaryOp.MAX, np.maximum, "maximum")
minimum = _binary(BinaryOp.MIN, np.minimum, "minimum")


def _power(a, b, numpy_fn: Callable, name: str):
    b = static_scalar(b)
    if isinstance(b, Tracer) or not isinstance(a, Tracer):
        raise UnsupportedError(f"only a constant exponent is supported, got {describe(a)} ** {describe(b)}",
                               op=name, loc=user_loc())
    _check_operand(name, b)
    if isinstance(b, ProbeLength):
        # ``x ** x.shape[-1]``: the exponent is compiled in (an integer power's multiplications, numpy's
        # shortcuts), so the length is read as a number and its axis kept static (the host computed an int
        # power of a run-time exponent as 0)
        b.note_read()
    half = isinstance(b, float | np.floating) and float(b) == 0.5
    if half and result_dtype(name, numpy_fn, a, b).is_float:
        return _elementwise(name, numpy_fn, [a, b], _half_power(a, b, numpy_fn))
    shortcut = _OPERATOR_SHORTCUTS.get(_exponent_value(b)) if numpy_fn is operator.pow else None
    if shortcut is not None and np.dtype(a.dtype).type in (np.float16, np.float32, np.float64) \
            and not is_numpy_scalar(a):   # numpy scalars' ** is np.power
        return _elementwise(name, numpy_fn, [a, b], lambda e, d: shortcut(e[0], d))
    return _elementwise(name, numpy_fn, [a, b], lambda e, d: Binary(BinaryOp.POW, e[0], e[1], d))


def _exponent_value(b: object) -> float | None:
    return float(b) if isinstance(b, int | float | np.integer | np.floating) and not isinstance(b, bool) else None


_OPERATOR_SHORTCUTS: dict[float, Callable[[Expr, DType], Expr]] = {
    2.0: lambda x, d: Binary(BinaryOp.MUL, x, x, d),
    -1.0: lambda x, d: Binary(BinaryOp.DIV, constant(1, d), x, d),
    1.0: lambda x, d: x,
    0.0: lambda x, d: constant(1, d),
}
"""numpy's ``**`` on a float16/32/64 array with these scalar exponents is not ``np.power`` but a shortcut
(``np.square``, ``np.reciprocal``, ``np.positive``, ``np.ones_like``; 0.5 is `_half_power`), whose results
can differ from ``np.power``'s by an ulp (numpy 2.0's float32 ``np.power(x, 2)``): the body is traced as the
shortcut numpy takes. bfloat16 and float8 arrays (ml_dtypes' types) take no shortcut."""


def _half_power(a: Tracer, b: object, numpy_fn: Callable) -> Callable[[list[Expr], DType], Expr]:
    """``x ** 0.5`` as numpy computes it for these operands, asked of numpy itself at the two points where
    the answers differ: a square root (``sqrt(-inf)`` is NaN, ``sqrt(-0.0)`` is -0.0; numpy's float32 and
    float64 loops, and the ``**`` operator's fast path for float16) or C's ``pow`` (``pow(-inf, 0.5)`` is
    +inf, ``pow(-0.0, 0.5)`` is +0.0; ``np.power`` of float16, every power of bfloat16 and float8)."""
    if a.ir_dtype.is_float:
        with np.errstate(all="ignore"):
            at_minus_inf = np.asarray(numpy_fn(probe(a, -np.inf), b))
            at_minus_zero = np.asarray(numpy_fn(probe(a, -0.0), b))
        like_sqrt = bool(np.isnan(at_minus_inf).all()) and bool(np.signbit(at_minus_zero).all())
    else:   # integers and bools hold neither -inf nor -0.0: both answers agree
        like_sqrt = True

    def make(e: list[Expr], d: DType) -> Expr:
        root = Unary(UnaryOp.SQRT, e[0], d)
        if like_sqrt:
            return root
        is_minus_inf = Binary(BinaryOp.EQ, e[0], constant(-np.inf, d), T.bool_)
        return Select(is_minus_inf, constant(np.inf, d), Unary(UnaryOp.ABS, root, d), d)

    return make


def power(a, b):
    """``np.power(a, b)`` with a constant (Python or numpy scalar) exponent."""
    if not _traced(a, b):
        return np.power(a, b)
    return _power(a, b, np.power, "power")


def power_operator(a, b):
    """``a ** b`` with a constant exponent: numpy's operator, which is not always ``np.power`` (``bool ** 2``
    is int8, through ``np.square``; ``float16 ** 0.5`` is a square root)."""
    if not _traced(a, b):
        return a ** b
    return _power(a, b, operator.pow, "power")


def _comparison(op: BinaryOp, np_fn: Callable, name: str) -> Callable:
    def fn(a, b):
        if not _traced(a, b):
            return np_fn(a, b)
        fixed = _beyond_range(np_fn, a, b)
        if fixed is not None:
            return _elementwise(name, np_fn, [a, b], lambda e, d: constant(fixed, d), operand_dtype=lambda d: d)
        common = result_dtype(name, np.add, a, b) if not (_is_bool(a) and _is_bool(b)) else T.bool_
        return _elementwise(name, np_fn, [a, b], lambda e, d: Binary(op, e[0], e[1], d),
                            operand_dtype=lambda d: common)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"Elementwise ``{op.value}``, giving bool; numpy's result on arrays."
    return fn


def _beyond_range(np_fn: Callable, a: object, b: object) -> bool | None:
    """The result of comparing an integer (or bool) array with a Python int outside its dtype's range:
    numpy compares such ints exactly (NEP 50), so the answer is the same for every element (asked of
    numpy at the dtype's two extremes). None when the comparison is an ordinary one."""
    array, value = (a, b) if isinstance(a, Tracer) else (b, a)
    if not isinstance(array, Tracer) or not isinstance(value, int) or isinstance(value, bool):
        return None
    if not (array.ir_dtype.is_int or array.ir_dtype.is_bool):
        return None
    info = np.iinfo(array.dtype) if array.ir_dtype.is_int else None
    low, high = (int(info.min), int(info.max)) if info else (0, 1)
    if low <= value <= high:
        return None
    if isinstance(value, ProbeLength):     # (an int8 array against x.shape[-1]: past int8 at the probes, not at 5)
        value.note_read()
    extremes = np.array([low, high], array.dtype)
    try:
        with np.errstate(all="ignore"):
            answers = np_fn(extremes, value) if array is a else np_fn(value, extremes)
    except OverflowError as err:     # (numpy's own: a bool array against an int past int64, `x < 2**63`)
        raise DTypeError(f"not defined for {describe(array)} and the Python int {value} ({err})",
                         op=np_fn.__name__, loc=user_loc()) from None
    return bool(answers[0])


def _is_bool(x: object) -> bool:
    return isinstance(x, bool | np.bool_) or (isinstance(x, Tracer) and x.ir_dtype.is_bool)


less = _comparison(BinaryOp.LT, np.less, "less")
less_equal = _comparison(BinaryOp.LE, np.less_equal, "less_equal")
greater = _comparison(BinaryOp.GT, np.greater, "greater")
greater_equal = _comparison(BinaryOp.GE, np.greater_equal, "greater_equal")
equal = _comparison(BinaryOp.EQ, np.equal, "equal")
not_equal = _comparison(BinaryOp.NE, np.not_equal, "not_equal")


def _logical(op: BinaryOp, np_fn: Callable, name: str) -> Callable:
    def fn(a, b):
        if not _traced(a, b):
            return np_fn(a, b)
        return _elementwise(name, np_fn, [a, b],
                            lambda e, d: Binary(op, _truth(e[0]), _truth(e[1]), d),
                            operand_dtype=lambda d: d)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"Elementwise logical ``{op.value}`` (truth values), giving bool."
    return fn


def _bool_operator(symbol: str, logical: Callable, np_fn: Callable, name: str) -> Callable:
    """The operator `symbol` (``&``, ``|``, ``^``): numpy's `np_fn` on arrays; on traced bools, `logical`. Bitwise
    operations on integers are not in the subset (a `DTypeError` says so, naming numpy's ufunc `name`)."""
    def fn(a, b):
        if not _traced(a, b):
            return np_fn(a, b)
        for x in (a, b):
            _check_operand(name, x)
            if not _is_bool(x):
                raise DTypeError(f"{symbol} is logical {logical.__name__.removeprefix('logical_')} on bools (use "
                                 "comparisons); bitwise "
                                 f"operations on {describe(x)} are not in RedFuser's op subset", op=name,
                                 loc=user_loc())
        return logical(a, b)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"``a {symbol} b``: numpy's on arrays; on traced bools, `{logical.__name__}`."
    return fn


logical_and = _logical(BinaryOp.AND, np.logical_and, "logical_and")
logical_and.__doc__ = "Elementwise logical and (truth values: a nonzero number is true), giving bool."
logical_or = _logical(BinaryOp.OR, np.logical_or, "logical_or")
logical_or.__doc__ = "Elementwise logical or (truth values: a nonzero number is true), giving bool."
logical_xor = _logical(BinaryOp.NE, np.logical_xor, "logical_xor")
logical_xor.__doc__ = "Elementwise logical xor (truth values), giving bool (numpy's ``logical_xor``)."
for _fn in (subtract, logical_and, logical_or, logical_xor):
    _ufunc_methods_refused(_fn, _fn.__name__)
bitwise_and = _bool_operator("&", logical_and, np.bitwise_and, "bitwise_and")
bitwise_or = _bool_operator("|", logical_or, np.bitwise_or, "bitwise_or")
bitwise_xor = _bool_operator("^", logical_xor, np.bitwise_xor, "bitwise_xor")


def invert(x):
    """``~x``: numpy's on arrays; on a traced bool, logical not. Bitwise not of integers is not in the subset
    (a `DTypeError` says so), and numpy has no ``~`` of floats."""
    if not _traced(x):
        return np.invert(x)
    if not _is_bool(x):
        what = "bitwise not of integers is not in RedFuser's op subset" if x.ir_dtype.is_int else \
            "numpy has no ~ of floats"
        raise DTypeError(f"~ is logical not on bools; {what}, got {describe(x)}", op="invert", loc=user_loc())
    return logical_not(x)


def where(cond, a, b):
    """``a`` where ``cond`` is true, else ``b`` (numpy's ``where``, three arguments)."""
    if not _traced(cond, a, b):
        return np.where(cond, a, b)
    cond, a, b = (static_scalar(x) for x in (cond, a, b))
    for x in (cond, a, b):
        _check_operand("where", x)
    value_dtype = result_dtype("where", lambda c, x, y: np.where(True, x, y), cond, a, b)

    def make(e: list[Expr], d: DType) -> Expr:
        return Select(_truth(e[0]), cast(e[1], d), cast(e[2], d), d)

    loc = user_loc()
    shape = broadcast_shapes("where", cond, a, b)
    builder = _builder("where", cond, a, b)
    axes = builder.axes(shape)
    c_dtype = e_dtype(cond) if isinstance(cond, Tracer) else T.bool_
    exprs = [operand(cond, axes, c_dtype), operand(a, axes, value_dtype), operand(b, axes, value_dtype)]
    out = builder.emit("where", value_dtype, shape, lambda out: Compute(out, axes, make(exprs, value_dtype), loc=loc))
    out.array0d = True    # numpy's where returns an ndarray, 0-d ones included
    return out


def astype(x, dtype):
    """``x`` converted to ``dtype`` (one of the dtypes ``redfuser`` exports)."""
    target = T.from_numpy(dtype)
    if not _traced(x):
        return np.asarray(x).astype(dtype) if not isinstance(x, np.ndarray) else x.astype(dtype)
    if target is None:
        raise DTypeError(f"cannot convert {describe(x)} to {dtype!r}: supported dtypes are "
                         f"{', '.join(d.numpy_name for d in T.ALL_DTYPES)}", op="astype", loc=user_loc())
    loc = user_loc()
    builder = x.builder
    axes = builder.axes(x.shape)
    out = builder.emit("astype", target, x.shape, lambda out: Compute(out, axes, cast(x.expr_for(axes), target), loc=loc))
    out.array0d = not is_numpy_scalar(x)   # astype keeps an array an array, a scalar a scalar
    return out


