"""The scalar ops every IR level shares, and what each one computes, in numpy.

`UnaryOp`, `BinaryOp` and `ReduceOp` are the op vocabulary of the Loop, Tile and SIMT IRs alike;
`UNARY_FUNCS`, `BINARY_FUNCS` and `REDUCERS` are their executable meaning, the one definition that
the Loop and Tile IR interpreters, the SIMT simulator and fusion's float64 numeric check all apply.
"""
from __future__ import annotations

import enum
import math
from typing import Callable

import numpy as np

from .types import DType


class UnaryOp(enum.Enum):
    """An elementwise op of one operand."""

    NEG = "neg"
    ABS = "abs"
    EXP = "exp"
    EXP2 = "exp2"
    EXP2_FTZ = "exp2_ftz"   # 2**x with results below f32's smallest normal (2**-126) flushed to +0: not in the
    #                         op namespace; the scheduler's exp of an f16 or e4m3 result (schedule/exprs.py)
    EXP_NONPOS = "exp_nonpos"  # e**x of an argument proven at most 0 (or NaN): not in the op namespace; the
    #                            scheduler's exp of a value minus its maximum (schedule/shifted_exp.py)
    LOG = "log"
    LOG2 = "log2"
    SQRT = "sqrt"
    RSQRT = "rsqrt"
    FLOOR = "floor"
    CEIL = "ceil"
    TRUNC = "trunc"
    RINT = "rint"           # to the nearest integer, ties to even (numpy's rint and round)
    TANH = "tanh"
    EXPM1 = "expm1"
    LOG1P = "log1p"
    ERF = "erf"             # not a numpy ufunc: math.erf elementwise (computed in float64, see UNARY_FUNCS)
    SIN = "sin"
    COS = "cos"
    NOT = "not"


ROUNDING = frozenset({UnaryOp.FLOOR, UnaryOp.CEIL, UnaryOp.TRUNC, UnaryOp.RINT})
"""The ops that round a float to an integral value of the same type (exact: no rounding error of their own)."""

WIDE_MATH = frozenset({UnaryOp.TANH, UnaryOp.EXPM1, UnaryOp.LOG1P, UnaryOp.ERF, UnaryOp.SIN, UnaryOp.COS})
"""The functions whose f32 form the code generators take from `codegen/wide_math.py` (evaluated in f64, at
most 1 ulp on the whole f32 range)."""

TRANSCENDENTAL = frozenset({UnaryOp.EXP, UnaryOp.EXP2, UnaryOp.EXP2_FTZ, UnaryOp.EXP_NONPOS, UnaryOp.LOG,
                            UnaryOp.LOG2}) | WIDE_MATH
"""The unary ops a GPU computes in f32 only (from ``ex2``/``lg2``, or `WIDE_MATH`'s f32 forms)."""

F32_TINY = 2.0 ** -126
"""f32's smallest normal number: `UnaryOp.EXP2_FTZ` flushes results below it to 0."""


class BinaryOp(enum.Enum):
    """An elementwise op of two operands (comparisons give bool)."""

    ADD = "+"
    SUB = "-"
    MUL = "*"
    DIV = "/"
    POW = "**"
    MAX = "maximum"
    MIN = "minimum"
    LT = "<"
    LE = "<="
    GT = ">"
    GE = ">="
    EQ = "=="
    NE = "!="
    AND = "&"
    OR = "|"
    FLOORDIV = "//"     # integers only (numpy's floored quotient; x // 0 is 0): codegen/int_division.py
    MOD = "%"           # integers only (the divisor's sign; x % 0 is 0)

    @property
    def is_comparison(self) -> bool:
        return self in _COMPARISONS

    @property
    def is_infix(self) -> bool:
        return self not in (BinaryOp.MAX, BinaryOp.MIN)


_COMPARISONS = frozenset({BinaryOp.LT, BinaryOp.LE, BinaryOp.GT, BinaryOp.GE, BinaryOp.EQ, BinaryOp.NE})


class ReduceOp(enum.Enum):
    """A commutative monoid a reduction combines with."""

    SUM = "sum"
    MAX = "max"
    MIN = "min"
    PROD = "prod"

    @property
    def combine(self) -> "BinaryOp":
        """The binary op folding two partial results (``+``, ``maximum``, ``minimum``, ``*``)."""
        return _COMBINE[self]

    def identity(self, dtype: DType) -> float | int | bool:
        """The monoid's neutral element in `dtype` (what an empty reduction gives)."""
        if self is ReduceOp.SUM:
            return False if dtype.is_bool else 0
        if self is ReduceOp.PROD:
            return True if dtype.is_bool else 1
        if dtype.is_float:
            return -math.inf if self is ReduceOp.MAX else math.inf
        if dtype.is_bool:
            return self is ReduceOp.MIN
        info = np.iinfo(dtype.numpy)
        return int(info.min) if self is ReduceOp.MAX else int(info.max)


_COMBINE = {ReduceOp.SUM: BinaryOp.ADD, ReduceOp.MAX: BinaryOp.MAX, ReduceOp.MIN: BinaryOp.MIN,
            ReduceOp.PROD: BinaryOp.MUL}


def erf(x: np.ndarray) -> np.ndarray:
    """The error function of each element, computed in float64 (``math.erf``) and returned in `x`'s float
    dtype (numpy has no ``erf``; this is what ``scipy.special.erf`` gives for f32 and f64)."""
    x = np.asarray(x)
    wide = np.vectorize(math.erf, otypes=[np.float64])(x.astype(np.float64)) if x.size else x.astype(np.float64)
    return wide.astype(x.dtype)


def _flush_tiny(r: np.ndarray) -> np.ndarray:
    """`r` with values below f32's smallest normal (2**-126) made +0 (`UnaryOp.EXP2_FTZ`; NaN stays)."""
    return np.where(r < F32_TINY, np.zeros_like(r), r)


UNARY_FUNCS: dict[UnaryOp, Callable[[np.ndarray], np.ndarray]] = {
    UnaryOp.NEG: np.negative,
    UnaryOp.ABS: np.abs,
    UnaryOp.EXP: np.exp,
    UnaryOp.EXP_NONPOS: np.exp,
    UnaryOp.EXP2: np.exp2,
    UnaryOp.EXP2_FTZ: lambda x: _flush_tiny(np.exp2(x)),
    UnaryOp.LOG: np.log,
    UnaryOp.LOG2: np.log2,
    UnaryOp.SQRT: np.sqrt,
    UnaryOp.RSQRT: lambda x: np.asarray(1, dtype=x.dtype) / np.sqrt(x),
    UnaryOp.FLOOR: np.floor,
    UnaryOp.CEIL: np.ceil,
    UnaryOp.TRUNC: np.trunc,
    UnaryOp.RINT: np.rint,
    UnaryOp.TANH: np.tanh,
    UnaryOp.EXPM1: np.expm1,
    UnaryOp.LOG1P: np.log1p,
    UnaryOp.ERF: erf,
    UnaryOp.SIN: np.sin,
    UnaryOp.COS: np.cos,
    UnaryOp.NOT: np.logical_not,
}
"""What each unary op computes, elementwise on a numpy array."""

BINARY_FUNCS: dict[BinaryOp, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    BinaryOp.ADD: np.add,
    BinaryOp.SUB: np.subtract,
    BinaryOp.MUL: np.multiply,
    BinaryOp.DIV: np.true_divide,
    BinaryOp.POW: np.power,
    BinaryOp.MAX: np.maximum,
    BinaryOp.MIN: np.minimum,
    BinaryOp.LT: np.less,
    BinaryOp.LE: np.less_equal,
    BinaryOp.GT: np.greater,
    BinaryOp.GE: np.greater_equal,
    BinaryOp.EQ: np.equal,
    BinaryOp.NE: np.not_equal,
    BinaryOp.AND: np.logical_and,
    BinaryOp.OR: np.logical_or,
    BinaryOp.FLOORDIV: np.floor_divide,
    BinaryOp.MOD: np.remainder,
}
"""What each binary op computes, elementwise (numpy broadcasting) on two numpy arrays."""

REDUCERS: dict[ReduceOp, Callable[..., np.ndarray]] = {
    ReduceOp.SUM: np.sum,
    ReduceOp.MAX: np.max,
    ReduceOp.MIN: np.min,
    ReduceOp.PROD: np.prod,
}
"""Each reduction as the numpy reducer taking ``axis=`` (and ``initial=``)."""
