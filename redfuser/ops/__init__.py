"""The op namespace a kernel body uses (``rf.exp``, ``rf.sum``, ``@``...).

Every op has one definition here. On plain numpy arrays (no traced argument)
it returns exactly what numpy returns, so the undecorated kernel body is the
reference. On traced values it records one loop nest into the active trace;
result dtypes are found by asking numpy itself (on one-element arrays), so
promotion always matches the reference, including NEP 50 weak Python scalars.

| file            | ops                                                                  |
|-----------------|----------------------------------------------------------------------|
| elementwise.py  | + - * / // % ** neg abs exp exp2 log log2 sqrt rsqrt maximum minimum |
|                 | comparisons, & | ^ ~ (on bools), logical_xor, where, astype          |
| numeric.py      | floor ceil trunc rint round sign isnan isinf isfinite clip           |
| functions.py    | tanh expm1 log1p sin cos erf logaddexp                               |
| reductions.py   | sum max min prod, matmul, topk                                       |
| statistics.py   | mean var std any all (written with the IR's reductions, as numpy)   |
| argextrema.py   | argmax argmin (written with topk)                                    |
| views.py        | swapaxes transpose reshape, indexing and slicing, arange             |
| joining.py      | concatenate stack                                                    |
| gather.py       | take_along_axis                                                      |
| common.py       | operand helpers shared by all                                        |
| operators.py    | `Tracer`'s Python operators and methods, forwarded to the ops above  |
"""
from __future__ import annotations

import functools
import inspect
from typing import Callable

import numpy as np

from ..ir import UnsupportedError
from ..source_info import user_loc
from .common import describe, inf, result_dtype
from .elementwise import (
    abs,
    add,
    astype,
    bitwise_and,
    bitwise_or,
    bitwise_xor,
    divide,
    equal,
    exp,
    floor_divide,
    exp2,
    greater,
    greater_equal,
    invert,
    less,
    less_equal,
    log,
    log2,
    logical_and,
    logical_not,
    logical_or,
    logical_xor,
    maximum,
    minimum,
    multiply,
    negative,
    not_equal,
    power,
    power_operator,
    remainder,
    rsqrt,
    sqrt,
    subtract,
    where,
)
from .argextrema import argmax, argmin
from .functions import cos, erf, expm1, log1p, logaddexp, sin, tanh
from .numeric import ceil, clip, floor, isfinite, isinf, isnan, rint, round, sign, trunc
from .reductions import matmul, max, min, normalize_axes, prod, sum, topk
from .statistics import all, any, mean, std, var
from .views import arange, getitem, reshape, swapaxes, transpose
from .joining import concatenate, stack
from .gather import take_along_axis

UFUNC_OPERATORS: dict[np.ufunc, Callable] = {
    np.add: add, np.subtract: subtract, np.multiply: multiply, np.true_divide: divide, np.power: power,
    np.less: less, np.less_equal: less_equal, np.greater: greater, np.greater_equal: greater_equal,
    np.equal: equal, np.not_equal: not_equal, np.matmul: matmul,
    np.floor_divide: floor_divide, np.remainder: remainder,
    # a numpy bool scalar on the left of & | ^ hands over numpy's bitwise ufuncs: on bools they are logical
    np.bitwise_and: bitwise_and, np.bitwise_or: bitwise_or, np.bitwise_xor: bitwise_xor,
}
"""The numpy ufunc behind each Python operator, for a numpy scalar on its left (``np.float32(2) * x``)."""

from .operators import install_operators  # noqa: E402 - after the ops it forwards to

install_operators()


def _arguments_checked(fn: Callable) -> Callable:
    """`fn`, where a call Python refuses (an unknown keyword such as ``dtype=``, a missing or an extra
    argument) is an `UnsupportedError` naming the op and the user's line, not a bare `TypeError`."""

    @functools.wraps(fn)
    def op(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except TypeError as exc:
            if exc.__traceback__ is None or exc.__traceback__.tb_next is not None:
                raise   # raised inside the op (numpy's own refusal on arrays): not about the call
            raise UnsupportedError(f"{exc}; RedFuser's {fn.__name__} takes {inspect.signature(fn)}",
                                   op=fn.__name__, loc=user_loc()) from None

    return op


PUBLIC = ("abs", "add", "all", "any", "arange", "argmax", "argmin", "astype", "ceil", "clip", "concatenate", "cos",
          "divide", "equal", "erf", "exp", "exp2", "expm1", "floor", "floor_divide", "greater", "greater_equal",
          "isfinite", "isinf", "isnan", "less", "less_equal", "log", "log1p", "log2", "logaddexp", "logical_and",
          "logical_not", "logical_or", "logical_xor", "matmul", "max", "maximum", "mean", "min", "minimum",
          "multiply", "negative", "not_equal", "power", "prod", "remainder", "reshape", "rint", "round", "rsqrt",
          "sign", "sin", "sqrt", "stack", "std", "subtract", "sum", "swapaxes", "take_along_axis", "tanh", "topk",
          "transpose", "trunc", "var", "where")
"""The ops `redfuser` exports (its namespace, README "Op subset")."""
for _name in PUBLIC:
    globals()[_name] = _arguments_checked(globals()[_name])
