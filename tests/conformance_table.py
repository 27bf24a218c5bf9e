"""The op x dtype x backend conformance table: one row per op of the subset (README, "Op subset").

Each `Op` is a kernel body over the inputs of its group (`conformance_values.GROUPS`), the dtypes numpy
accepts it for (run on every backend and compared with the same body run on numpy) and the dtypes numpy
refuses (the kernel must raise a `redfuser.DTypeError` naming the op). `DIVERGENCES` lists the cases where
a backend knowingly differs from numpy, with the reason and what the kernel does instead; the tests check
that the kernel does exactly that, and that the divergence still occurs. `tests/test_conformance.py` is
generated from this table; ``python tests/conformance_table.py`` prints it as markdown for docs/testing.md.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

import redfuser as rf
from conformance_values import ALL, DTYPES, FLOATS, INTS

BACKENDS = ("interpret", "cpu", "simulate")
COMPILED = ("cpu", "simulate")


@dataclass(frozen=True)
class Op:
    """One row: `body` over the inputs of `group`, run for `dtypes`, refused by numpy for `errors`."""

    name: str
    group: str
    body: Callable
    dtypes: tuple[str, ...] = ALL
    errors: tuple[str, ...] = ()
    error_op: tuple[str, ...] = ()     # the op names a DTypeError for `errors` may carry (the first is preferred)
    length: int = 1                    # longest accumulation feeding a value (the tolerance rule's n)
    scale: Callable | None = None      # inputs -> magnitude of the accumulated terms, per output element
    signed_zeros: bool = True          # the sign of a zero result is compared (numpy's is exactly defined)
    roundings: int | None = 1          # roundings to an f16/bf16/e4m3 result on numpy's path and the kernel's
                                       # beyond its one store (tolerance rule); None: the rule's default
    exact: tuple[str, ...] = ()        # input dtypes for which the result is numpy's exactly (one rounding of
                                       # an exact value: a cast from a float)


@dataclass(frozen=True)
class Divergence:
    """A case where `backends` knowingly differ from numpy for `op` on `dtypes`, and why.

    Either the kernel raises `raises` (numpy gives a result), or on the elements `affected(op, inputs,
    expected)` selects it gives `gives(op, inputs, expected)` instead of numpy's value (exactly, or under
    the tolerance of dtype `within`); elsewhere it must still equal numpy. `numpy_defined=False` where
    numpy's own value there is undefined (a C cast out of range), so the divergence is only that the
    kernel gives `gives`, whatever numpy gives.
    """

    op: str
    dtypes: tuple[str, ...]
    backends: tuple[str, ...]
    reason: str
    raises: type | None = None
    affected: Callable | None = None
    gives: Callable | None = None
    numpy_defined: bool = True
    within: type | None = None        # compare with `gives` under this dtype's tolerance (default: exactly)


def _abs_sum(i: int, axis: object = None, keepdims: bool = False) -> Callable:
    def scale(inputs):
        x = np.asarray(inputs[i]).astype(np.float64)
        return np.sum(np.where(np.isfinite(x), np.abs(x), 0.0), axis=axis, keepdims=keepdims)
    return scale


def _abs_matmul(left: Callable, right: Callable) -> Callable:
    def scale(inputs):
        a, b = (np.asarray(f(inputs)).astype(np.float64) for f in (left, right))
        return np.matmul(np.where(np.isfinite(a), np.abs(a), 0.0), np.where(np.isfinite(b), np.abs(b), 0.0))
    return scale


NOT_BOOL = FLOATS + INTS
_ACCUMULATED = {"signed_zeros": False, "roundings": None}
"""Reductions and matmuls: the zero's sign follows order and start; the roundings numpy's low-precision
accumulation makes vary by axis and dtype (f16 sums along a row round once, bf16 sums every term), so the
tolerance rule's default count applies."""
SIGNED_ZERO_FREE = "numpy's max/min of -0.0 and +0.0 depends on its loop; a sum's depends on order and start"

OPS: list[Op] = [
    # -- unary (x: (131,), every special value) -------------------------------------------------------
    Op("neg", "unary", lambda x: -x, NOT_BOOL, errors=("bool",), error_op=("neg", "negative")),
    Op("abs", "unary", lambda x: rf.abs(x)),
    Op("exp", "unary", lambda x: rf.exp(x)),
    Op("exp2", "unary", lambda x: rf.exp2(x)),
    Op("log", "unary", lambda x: rf.log(x)),
    Op("log2", "unary", lambda x: rf.log2(x)),
    Op("sqrt", "unary", lambda x: rf.sqrt(x)),
    Op("rsqrt", "unary", lambda x: rf.rsqrt(x), roundings=2),    # numpy: 1 / np.sqrt(x), two roundings
    Op("pow2", "unary", lambda x: x ** 2),
    Op("pow3", "unary", lambda x: x ** 3),
    Op("pow_half", "unary", lambda x: x ** 0.5),
    Op("pow_m1", "unary", lambda x: x ** -1, FLOATS, errors=INTS + ("bool",), error_op=("power",)),
    Op("floor", "unary", lambda x: rf.floor(x)),
    Op("ceil", "unary", lambda x: rf.ceil(x)),
    Op("trunc", "unary", lambda x: rf.trunc(x)),
    Op("rint", "unary", lambda x: rf.rint(x)),
    Op("round", "unary", lambda x: rf.round(x)),
    Op("round_2", "unary", lambda x: rf.round(x, 2), FLOATS + INTS, errors=("bool",), error_op=("round",)),
    Op("round_m1", "unary", lambda x: rf.round(x, -1), FLOATS + INTS, errors=("bool",), error_op=("round",)),
    Op("sign", "unary", lambda x: rf.sign(x), NOT_BOOL, errors=("bool",), error_op=("sign",)),
    Op("isnan", "unary", lambda x: rf.isnan(x)),
    Op("isinf", "unary", lambda x: rf.isinf(x)),
    Op("isfinite", "unary", lambda x: rf.isfinite(x)),
    Op("tanh", "unary", lambda x: rf.tanh(x)),
    Op("sin", "unary", lambda x: rf.sin(x)),
    Op("cos", "unary", lambda x: rf.cos(x)),
    Op("expm1", "unary", lambda x: rf.expm1(x)),
    Op("log1p", "unary", lambda x: rf.log1p(x)),
    Op("erf", "unary", lambda x: rf.erf(x)),
    # -- binary (x: (29, 1), y: (131,), broadcast to every pair; c: a bool condition) ------------------
    Op("add", "binary", lambda x, y, c: x + y),
    Op("sub", "binary", lambda x, y, c: x - y, NOT_BOOL, errors=("bool",), error_op=("subtract",)),
    Op("mul", "binary", lambda x, y, c: x * y),
    Op("div", "binary", lambda x, y, c: x / y),
    Op("maximum", "binary", lambda x, y, c: rf.maximum(x, y), signed_zeros=False),
    Op("minimum", "binary", lambda x, y, c: rf.minimum(x, y), signed_zeros=False),
    Op("where", "binary", lambda x, y, c: rf.where(c, x, y)),
    Op("logaddexp", "binary", lambda x, y, c: rf.logaddexp(x, y)),
    Op("floordiv", "binary", lambda x, y, c: x // y),
    Op("mod", "binary", lambda x, y, c: x % y),
    Op("clip", "binary", lambda x, y, c: rf.clip(x, y, 2), signed_zeros=False),
    Op("clip_max", "binary", lambda x, y, c: rf.clip(y, None, x), signed_zeros=False),
    Op("lt", "binary", lambda x, y, c: x < y),
    Op("le", "binary", lambda x, y, c: x <= y),
    Op("gt", "binary", lambda x, y, c: x > y),
    Op("ge", "binary", lambda x, y, c: x >= y),
    Op("eq", "binary", lambda x, y, c: x == y),
    Op("ne", "binary", lambda x, y, c: x != y),
    Op("and", "binary", lambda x, y, c: x & y, INTS + ("bool",), errors=FLOATS, error_op=("bitwise_and",)),
    Op("or", "binary", lambda x, y, c: x | y, INTS + ("bool",), errors=FLOATS, error_op=("bitwise_or",)),
    Op("invert", "binary", lambda x, y, c: ~x, INTS + ("bool",), errors=FLOATS,
       error_op=("logical_not", "not", "invert")),
    # -- astype from every dtype to every dtype ------------------------------------------------------
    *(Op(f"astype_{t}", "astype", (lambda x, t=t: x.astype(DTYPES[t])) if t != "f16" else
         (lambda x: rf.astype(x, rf.float16)), roundings=2, exact=FLOATS) for t in ALL),  # int -> bf16/e4m3 via f32
    # -- Python and numpy scalars (NEP 50) -------------------------------------------------------------
    Op("add_int", "scalars", lambda x: x + 1),
    Op("mul_float", "scalars", lambda x: x * 2.5),
    Op("div_int", "scalars", lambda x: x / 3),
    Op("rdiv_float", "scalars", lambda x: 2.0 / x),
    Op("add_np_f32", "scalars", lambda x: x + np.float32(0.5)),
    Op("np_f64_mul", "scalars", lambda x: np.float64(2) * x),
    Op("add_np_i64", "scalars", lambda x: x + np.int64(3)),
    Op("add_true", "scalars", lambda x: x + True),
    Op("lt_int", "scalars", lambda x: x < 1),
    Op("ge_float", "scalars", lambda x: x >= -1.5),
    Op("maximum_int", "scalars", lambda x: rf.maximum(x, 0), signed_zeros=False),
    Op("where_float", "scalars", lambda x: rf.where(x > 0, x, 0.5)),
    Op("logaddexp_float", "scalars", lambda x: rf.logaddexp(0.0, x)),           # softplus, as users write it
    Op("logaddexp_np_f32", "scalars", lambda x: rf.logaddexp(x, np.float32(-1.5))),
    Op("add_big_int", "scalars", lambda x: x + 2**40, tuple(d for d in ALL if d != "i32"), errors=("i32",),
       error_op=("add",)),
    Op("lt_big_int", "scalars", lambda x: x < 2**40),
    Op("mul_huge", "scalars", lambda x: x * 1e300),
    # -- mixed array dtypes: x (29, 1) of the row's dtype with a (131,) array of every dtype -----------
    *(Op(f"add_{t}", "promote", lambda x, *ys, i=i: x + ys[i]) for i, t in enumerate(ALL)),
    *(Op(f"lt_{t}", "promote", lambda x, *ys, i=i: x < ys[i]) for i, t in enumerate(ALL)),
    # -- reductions over 1, 37, 259, 300 and 134 elements (the last over axes 0 and 2) -----------------------
    *(op for name, fn in (("sum", rf.sum), ("max", rf.max), ("min", rf.min)) for op in (
        Op(f"{name}_len1", "reduce", lambda x1, x37, x300, x3, fn=fn: fn(x1, axis=-1), **_ACCUMULATED),
        Op(f"{name}_row", "reduce", lambda x1, x37, x300, x3, fn=fn: fn(x37, axis=-1), length=37,
           scale=_abs_sum(1, -1) if name == "sum" else None, **_ACCUMULATED),
        Op(f"{name}_all", "reduce", lambda x1, x37, x300, x3, fn=fn: fn(x37), length=259,
           scale=_abs_sum(1) if name == "sum" else None, **_ACCUMULATED),
        Op(f"{name}_keep", "reduce", lambda x1, x37, x300, x3, fn=fn: fn(x300, axis=1, keepdims=True),
           length=300, scale=_abs_sum(2, 1, True) if name == "sum" else None, **_ACCUMULATED),
        Op(f"{name}_axes", "reduce", lambda x1, x37, x300, x3, fn=fn: fn(x3, axis=(0, 2)), length=134,
           scale=_abs_sum(3, (0, 2)) if name == "sum" else None, **_ACCUMULATED),
    )),
    Op("prod_len1", "reduce", lambda x1, x37, x300, x3: rf.prod(x1, axis=-1), **_ACCUMULATED),
    Op("prod_row", "reduce", lambda x1, x37, x300, x3: rf.prod(x37, axis=-1), length=37, **_ACCUMULATED),
    Op("prod_axes", "reduce", lambda x1, x37, x300, x3: x3.prod(axis=(0, 2), keepdims=True), length=134,
       **_ACCUMULATED),
    Op("sum_method", "reduce", lambda x1, x37, x300, x3: x37.sum(axis=-1, keepdims=True), length=37,
       scale=_abs_sum(1, -1, True), **_ACCUMULATED),
    Op("mean_row", "reduce", lambda x1, x37, x300, x3: rf.mean(x37, axis=-1), length=37, **_ACCUMULATED),
    Op("mean_axes", "reduce", lambda x1, x37, x300, x3: x3.mean(axis=(0, 2), keepdims=True), length=134,
       **_ACCUMULATED),
    Op("var_row", "reduce", lambda x1, x37, x300, x3: rf.var(x300, axis=1), length=300, **_ACCUMULATED),
    Op("var_ddof", "reduce", lambda x1, x37, x300, x3: x37.var(axis=-1, ddof=1, keepdims=True), length=37,
       **_ACCUMULATED),
    Op("std_all", "reduce", lambda x1, x37, x300, x3: rf.std(x37), length=259, **_ACCUMULATED),
    Op("argmax_row", "reduce", lambda x1, x37, x300, x3: rf.argmax(x37, axis=-1)),
    Op("argmin_axis0", "reduce", lambda x1, x37, x300, x3: x3.argmin(axis=0, keepdims=True)),
    Op("any_row", "reduce", lambda x1, x37, x300, x3: rf.any(x37, axis=-1)),
    Op("all_axes", "reduce", lambda x1, x37, x300, x3: x3.all(axis=(0, 2), keepdims=True)),
    # -- matmul: a (2, 5, 37), b (37, 3), v (37,), w (2, 37, 3) ----------------------------------------
    Op("mm", "matmul", lambda a, b, v, w: a[0] @ b, length=37, scale=_abs_matmul(lambda i: i[0][0], lambda i: i[1]),
       **_ACCUMULATED),
    Op("mm_batched", "matmul", lambda a, b, v, w: a @ b, length=37,
       scale=_abs_matmul(lambda i: i[0], lambda i: i[1]), **_ACCUMULATED),
    Op("mm_bcast", "matmul", lambda a, b, v, w: a[0][None] @ w, length=37,
       scale=_abs_matmul(lambda i: i[0][0][None], lambda i: i[3]), **_ACCUMULATED),
    Op("mm_vec_mat", "matmul", lambda a, b, v, w: v @ b, length=37,
       scale=_abs_matmul(lambda i: i[2], lambda i: i[1]), **_ACCUMULATED),
    Op("mm_mat_vec", "matmul", lambda a, b, v, w: a @ v, length=37,
       scale=_abs_matmul(lambda i: i[0], lambda i: i[2]), **_ACCUMULATED),
    Op("mm_dot", "matmul", lambda a, b, v, w: v @ v, length=37,
       scale=_abs_matmul(lambda i: i[2], lambda i: i[2]), **_ACCUMULATED),
    Op("mm_transposed", "matmul", lambda a, b, v, w: b.mT @ a.mT, length=37,
       scale=_abs_matmul(lambda i: i[1].T, lambda i: np.swapaxes(i[0], -1, -2)), **_ACCUMULATED),
    # -- views of x (3, 5, 37) -------------------------------------------------------------------------
    Op("swapaxes", "views", lambda x: rf.swapaxes(x, 0, 2)),
    Op("transpose_axes", "views", lambda x: rf.transpose(x, (1, 0, 2))),
    Op("T", "views", lambda x: x.T),               # rf.transpose(x) with no axes
    Op("mT", "views", lambda x: x.mT),
    Op("index_none", "views", lambda x: x[None, ..., 1]),
    Op("index_int", "views", lambda x: x[:, 2]),
    Op("index_mixed", "views", lambda x: x[-1, :, None, ...]),
    Op("view_of_view", "views", lambda x: rf.swapaxes(x.mT, 0, 1)[1]),
    Op("slice_step", "views", lambda x: x[1:, ::2, 3:30:4]),
    Op("slice_reversed", "views", lambda x: x[::-1, -2::-2, ::-3]),
    Op("slice_of_slice", "views", lambda x: x[:, 1:][..., ::-1][:, ::2, 5:-5]),
    Op("concatenate", "views", lambda x: rf.concatenate((x[:, :2], x, x[..., ::-1][:, 1:4]), axis=1)),
    Op("concatenate_last", "views", lambda x: rf.concatenate((x[..., 30:], x[..., :7]), axis=-1)),
    Op("stack", "views", lambda x: rf.stack((x[0], x[2, ::-1], x[1]), axis=1)),
    Op("reshape_split", "views", lambda x: x.reshape(3, 5, 37, 1)[:, ::-1].reshape(15, 37)),
    Op("reshape_merge", "views", lambda x: rf.reshape(x, (-1, 111))),
    Op("reshape_mixed", "views", lambda x: x.mT.reshape(37, 3, 5)[::2].reshape(-1)[7::3]),
    # -- arange ----------------------------------------------------------------------------------------
    Op("arange", "arange", lambda x: rf.arange(37, dtype=x.dtype), NOT_BOOL, errors=("bool",), error_op=("arange",)),
    Op("arange_step", "arange", lambda x: rf.arange(2, 40, 3, dtype=x.dtype), NOT_BOOL, errors=("bool",),
       error_op=("arange",)),
    Op("arange_plus", "arange", lambda x: x + rf.arange(131)),
    Op("arange_float_plus", "arange", lambda x: x + rf.arange(0.5, 33.25, 0.25)),
    # -- top-k of x (4, 37): ties, NaN, -0.0 against 0.0, -inf; full sorts of s (5, 4) -----------------
    Op("topk_1", "topk", lambda x, s: rf.topk(x, 1, -1)),
    Op("topk_4", "topk", lambda x, s: rf.topk(x, 4, -1)),
    Op("topk_axis0", "topk", lambda x, s: rf.topk(x, 2, 0)),
    Op("topk_full", "topk", lambda x, s: rf.topk(s, 4, -1)),
    Op("take_along_axis", "topk", lambda x, s: rf.take_along_axis(x, rf.topk(x, 4, -1)[1][:, ::-1], -1)),
    Op("take_along_axis_0", "topk", lambda x, s: rf.take_along_axis(s, rf.argmax(s, axis=0, keepdims=True) - 5, 0)),
]
OPS_BY_NAME = {op.name: op for op in OPS}


# -- divergences ---------------------------------------------------------------------------------------

def _saturated(target: str) -> tuple[Callable, Callable]:
    """float -> int the way LLVM's fptosi.sat and PTX's cvt.rzi do it: NaN -> 0, out of range -> the bound."""
    info = np.iinfo(DTYPES[target])

    bound = 2.0 ** (info.bits - 1)   # exact in float64, unlike info.max

    def affected(op, inputs, expected):
        x = inputs[0].astype(np.float64)
        with np.errstate(invalid="ignore"):
            return ~np.isfinite(x) | (np.trunc(x) < -bound) | (np.trunc(x) >= bound)

    def gives(op, inputs, expected):
        x = inputs[0].astype(np.float64)
        inside = np.where(affected(op, inputs, expected), 0.0, x).astype(DTYPES[target])
        out = np.where(np.isnan(x), 0, np.where(x > 0, info.max, info.min)).astype(DTYPES[target])
        return np.where(affected(op, inputs, expected), out, inside)

    return affected, gives


def _in_f32(op: Op, inputs: tuple, expected: np.ndarray) -> np.ndarray:
    """`op`'s body with its inputs as f32 (a float64 result computed in f32, then widened)."""
    with np.errstate(all="ignore"):
        return np.asarray(op.body(*(a.astype(np.float32) for a in inputs))).astype(np.float64)


def _everywhere(op: Op, inputs: tuple, expected: np.ndarray) -> np.ndarray:
    return np.ones(expected.shape, bool)


_SAT_INT = ("float -> int of NaN, +-inf and out-of-range values saturates (NaN -> 0, else the nearest bound: "
            "LLVM's fptosi.sat on cpu, PTX's cvt.rzi on GPUs); numpy's result is undefined there (a C cast; "
            "INT_MIN on x86)")
_F64_IN_F32 = ("GPUs compute exp/exp2/log/log2 (and tanh, sin, cos, expm1, log1p, erf) of float64 values in f32 "
               "(docs/gpu-backend.md, \"Numerics\"): "
               "numpy's float64 result of exp(int array) has f32 precision and range there (exp(100) is inf)")

def _narrow_overflow(op: Op, inputs: tuple, expected: np.ndarray) -> np.ndarray:
    """Where numpy's result is not finite but the body on f32 inputs, rounded to the result's dtype, is."""
    wide = _in_f32(op, inputs, expected).astype(expected.dtype).astype(np.float64)
    return ~np.isfinite(expected.astype(np.float64)) & np.isfinite(wide)


_NARROW_SUM = ("numpy's var sums f16 in f16, which overflows to inf on rows of large values, where a kernel's "
               "16-bit running sums are f32 (docs/cpu-backend.md): on those rows the kernel gives the variance of "
               "the f32 sums (every f16 var and std: a row of 300 values near 1000 is one; the table's values "
               "reach it for var_ddof)")

_NARROW_PRODUCT = ("numpy multiplies f16 and e4m3 values in that type, so a partial product past its range is inf or "
                   "NaN (e4m3) even where later factors would bring it back, or where a 0 follows (inf * 0); a kernel's "
                   "16- and 8-bit running products are f32 (docs/cpu-backend.md): on those rows it gives the product "
                   "of the f32 steps, rounded once")


def _narrow_class(op: Op, inputs: tuple, expected: np.ndarray) -> np.ndarray:
    """Where numpy's result and the body on f32 inputs, rounded to the result's dtype, differ in class."""
    with np.errstate(all="ignore"):
        wide = _in_f32(op, inputs, expected).astype(expected.dtype).astype(np.float64)
    ref = expected.astype(np.float64)
    return (np.isnan(ref) != np.isnan(wide)) | (np.isinf(ref) != np.isinf(wide))


_ROUND_NARROW = ("numpy rounds x * 10**decimals to the 16- or 8-bit type before rint, a kernel keeps it in f32 "
                 "(storage types): near a tie they would differ by a unit of the last decimal, so the kernel "
                 "raises UnsupportedError and says how to write it in f32")

DIVERGENCES: list[Divergence] = [
    *(Divergence(f"astype_{t}", FLOATS, COMPILED, _SAT_INT, affected=_saturated(t)[0], gives=_saturated(t)[1],
                 numpy_defined=False) for t in INTS),
    *(Divergence(name, INTS, ("simulate",), _F64_IN_F32, affected=_everywhere, gives=_in_f32, within=np.float32)
      for name in ("exp", "exp2", "log", "log2", "tanh", "sin", "cos", "expm1", "log1p", "erf", "logaddexp")),
    Divergence("logaddexp_float", INTS + ("bool",), ("simulate",), _F64_IN_F32, affected=_everywhere, gives=_in_f32,
               within=np.float32),                   # integers and bools with a Python float: numpy gives f64
    Divergence("logaddexp_np_f32", INTS, ("simulate",), _F64_IN_F32, affected=_everywhere, gives=_in_f32,
               within=np.float32),                   # integers with an np.float32: f64
    *(Divergence(name, ("i64",), COMPILED, "top-k of int64 is not compiled (the ranking key is a float64, "
                 "which rounds int64): the kernel raises BackendError", raises=rf.BackendError)
      for name in ("topk_1", "topk_4", "topk_axis0", "topk_full", "argmax_row", "argmin_axis0", "take_along_axis",
                   "take_along_axis_0")),
    Divergence("prod_row", ("e4m3",), BACKENDS, _NARROW_PRODUCT, affected=_narrow_class, gives=_in_f32,
               within=DTYPES["e4m3"]),
    *(Divergence("prod_axes", (d,), COMPILED, _NARROW_PRODUCT, affected=_narrow_class, gives=_in_f32,
                 within=DTYPES[d]) for d in ("f16", "e4m3")),
    Divergence("var_ddof", ("f16",), BACKENDS, _NARROW_SUM, affected=_narrow_overflow, gives=_in_f32,
               within=DTYPES["f16"]),
    *(Divergence(name, ("e4m3",), BACKENDS, "numpy adds e4m3 values in e4m3, one at a time (64 ones sum to 16, NaN "
                 "past 448), a kernel in f32: sum, mean, var and std of e4m3 raise UnsupportedError, which says to "
                 "take them of f32 values", raises=rf.UnsupportedError)
      for name in ("sum_len1", "sum_row", "sum_all", "sum_keep", "sum_axes", "sum_method", "mean_row", "mean_axes",
                   "var_row", "var_ddof", "std_all")),
    *(Divergence(name, FLOATS, BACKENDS, "// and % are numpy's integer ops only (numpy's float rules, fmod "
                 "with its sign and rounding corrections, are not in the subset): the kernel raises "
                 "UnsupportedError", raises=rf.UnsupportedError) for name in ("floordiv", "mod")),
    Divergence("round_2", ("f16", "bf16", "e4m3"), BACKENDS, _ROUND_NARROW, raises=rf.UnsupportedError),
    Divergence("round_m1", ("f16", "bf16", "e4m3"), BACKENDS, _ROUND_NARROW, raises=rf.UnsupportedError),
    Divergence("round_m1", INTS, BACKENDS, "numpy rounds integers at a negative decimal place "
               "through float64 and back: not in the subset, the kernel raises UnsupportedError",
               raises=rf.UnsupportedError),
    *(Divergence(name, ("bool",), BACKENDS, "numpy gives int8 (bool // bool, bool % bool), a dtype RedFuser does "
                 "not have: the kernel raises DTypeError", raises=rf.DTypeError) for name in ("floordiv", "mod")),
    Divergence("pow2", ("bool",), BACKENDS, "numpy gives int8 (bool ** Python int), a dtype RedFuser does "
               "not have: the kernel raises DTypeError", raises=rf.DTypeError),
    *(Divergence(name, INTS, BACKENDS, "& | ~ are in the subset for bools only (numpy's bitwise ops on "
                 "integers are not): the kernel raises DTypeError", raises=rf.DTypeError)
      for name in ("and", "or", "invert")),
]


def divergence(op: Op, dtype: str, backend: str) -> Divergence | None:
    """The divergence listed for this cell, if any (at most one a cell)."""
    found = [d for d in DIVERGENCES if d.op == op.name and dtype in d.dtypes and backend in d.backends]
    assert len(found) <= 1, f"{op.name}-{dtype}-{backend} has {len(found)} divergences"
    return found[0] if found else None


def raises(op: Op, dtype: str, backend: str) -> type | None:
    """The error the kernel must raise for this cell: numpy refuses it, or a divergence says it raises."""
    if dtype in op.errors:
        return rf.DTypeError
    div = divergence(op, dtype, backend)
    return div.raises if div is not None else None


def _cells(op: Op, reasons: list[str]) -> tuple[str, ...]:
    cells = []
    for d in ALL:
        if d in op.errors:
            cells.append("error")
            continue
        marks = []
        for v in (v for v in DIVERGENCES if v.op == op.name and d in v.dtypes):
            if v.reason not in reasons:
                reasons.append(v.reason)
            where = "" if v.backends == BACKENDS else f" ({', '.join(v.backends)})"
            marks.append(f"{'raises' if v.raises else 'differs'} [{reasons.index(v.reason) + 1}]{where}")
        cells.append("; ".join(marks) if marks else "ok")
    return tuple(cells)


LEGEND = """\
ok: run on interpret, cpu and simulate and equal to numpy (dtype, NaN/inf positions, the sign of zero
where marked, finite values under the tolerance rule). error: numpy refuses, and so does the kernel with
a DTypeError naming the op. raises [n]: numpy gives a result, RedFuser refuses as note n says. differs [n]:
the kernel differs from numpy as note n says, on the listed backends; the test checks that it does
exactly that (and that it still does), and compares everything else with numpy."""


def markdown() -> str:
    """The table as markdown: ops x dtypes (ops with the same verdicts share a row), legend and notes."""
    reasons: list[str] = []
    rows: list[tuple[str, list[str], tuple[str, ...], bool]] = []
    for op in OPS:
        cells = _cells(op, reasons)
        if rows and rows[-1][0] == op.group and rows[-1][2] == cells and rows[-1][3] == op.signed_zeros:
            rows[-1][1].append(op.name)
        else:
            rows.append((op.group, [op.name], cells, op.signed_zeros))
    lines = ["| group | ops | -0.0 | " + " | ".join(ALL) + " |", "|---" * (len(ALL) + 3) + "|"]
    for group, names, cells, zeros in rows:
        lines.append(f"| {group} | {' '.join(f'`{n}`' for n in names)} | {'sign' if zeros else 'any'} | "
                     + " | ".join(cells) + " |")
    notes = [f"[{i + 1}] {r}" for i, r in enumerate(reasons)]
    zero_note = ("-0.0: `sign` means a zero result must have numpy's sign; `any`: " + SIGNED_ZERO_FREE + ".")
    return "\n".join(lines + ["", LEGEND, "", zero_note, ""] + notes)


if __name__ == "__main__":
    print(markdown())
