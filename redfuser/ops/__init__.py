"""The op namespace a kernel body uses (``rf.exp``, ``rf.sum``, ``@``...).

Every op has one definition here. On plain numpy arrays (no traced argument)
it returns exactly what numpy returns, so the undecorated kernel body is the
reference. On traced values it records one loop nest into the active trace;
result dtypes are found by asking numpy itself (on one-element arrays), so
promotion always matches the reference, including NEP 50 weak Python scalars.

| file            | ops                                                                  |
|-----------------|----------------------------------------------------------------------|
| elementwise.py  | + - * / ** neg abs exp exp2 log log2 sqrt rsqrt maximum minimum      |
|                 | comparisons, & | ~, where, astype                                    |
| reductions.py   | sum max min, matmul, topk                                            |
| views.py        | swapaxes transpose, indexing, arange                                 |
| common.py       | operand helpers shared by all                                        |
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..tracer import _install_operators
from .common import describe, inf, result_dtype
from .elementwise import (
    abs,
    add,
    astype,
    divide,
    equal,
    exp,
    exp2,
    greater,
    greater_equal,
    less,
    less_equal,
    log,
    log2,
    logical_and,
    logical_not,
    logical_or,
    maximum,
    minimum,
    multiply,
    negative,
    not_equal,
    power,
    rsqrt,
    sqrt,
    subtract,
    where,
)
from .reductions import matmul, max, min, normalize_axes, sum, topk
from .views import arange, getitem, swapaxes, transpose

UFUNC_OPERATORS: dict[np.ufunc, Callable] = {
    np.add: add, np.subtract: subtract, np.multiply: multiply, np.true_divide: divide, np.power: power,
    np.less: less, np.less_equal: less_equal, np.greater: greater, np.greater_equal: greater_equal,
    np.equal: equal, np.not_equal: not_equal, np.matmul: matmul,
}

_install_operators()
