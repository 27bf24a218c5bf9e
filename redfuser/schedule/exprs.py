"""Lowering Loop IR expressions to Tile IR values over a kernel's tile dimensions.

One rule per Loop IR expression type. A result varies only over the dims its
expression reads (``m[i]`` is a 1-d tile even inside a 2-d nest); operands are
aligned by explicit expand/broadcast. Arithmetic in f16/bf16/f8 is done in f32:
a load of such a buffer is cast up, a cast *to* such a type rounds and comes back
to f32, and the store casts down (ARCHITECTURE.md: compute in f32, round on store).
Loads of buffers computed inside the kernel (fused-loop locals and states) return
their tiles instead of reading memory. Results are memoized per scope, so a shared
subexpression is built once.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Callable

import ml_dtypes
import numpy as np

from ..ir import (
    Axis,
    Strided,
    Computed,
    index_axes,
    Binary,
    BinaryOp,
    Cast,
    Const,
    DType,
    Expr,
    IndexValue,
    Length,
    InternalError,
    Load,
    Select,
    Unary,
    UnaryOp,
    compared_branch,
    decided,
    walk,
)
from ..ir.semantics import ROUNDING
from ..ir.tile import nodes as t
from ..ir.types import bool_, float32, from_numpy
from .builder import KernelBuilder
from ..ir.loop.index import flat_offset, in_index_type
from .space import Binding, Dim, ElementOffset, Fixed, Position, Shifted, Tiled, align, mask_tile, offsets, place

if TYPE_CHECKING:
    from .options import ScheduleOptions

def compute_dtype(d: DType) -> DType:
    """The dtype arithmetic on `d` values runs in (f32 for the storage-only float types)."""
    return float32 if d.storage_only else d


def round_to(value: float | int | bool, d: DType) -> float | int | bool:
    """`value` as `d` stores it, read back as a Python number."""
    if d.is_bool:
        return bool(value)
    if d.is_int:
        return int(value)
    return float(np.asarray(value, dtype=d.numpy).astype(np.float64))


@lru_cache(maxsize=4096)
def footprint(e: Expr) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The axis names `e` reads and the buffers it loads (sorted)."""
    axes: set[str] = set()
    bufs: set[str] = set()
    for n in walk(e):
        if isinstance(n, Load):
            bufs.add(n.buffer.name)
            axes.update(a.name for i in n.indices for a in index_axes(i))
        elif isinstance(n, IndexValue):
            axes.add(n.axis.name)
    return tuple(sorted(axes)), tuple(sorted(bufs))


@dataclass
class ExprLowering:
    """Lowers expressions of one kernel; `tiles` holds the in-kernel buffers' current tiles by name."""

    kb: KernelBuilder
    tiles: dict[str, Tiled] = field(default_factory=dict)
    fast_exp: bool = False          # f32 exponentials as exp2_ftz too (the ``fast_exp`` option; `_unary`)
    shifted: frozenset = frozenset()  # f32 exps of a value minus its maximum: EXP_NONPOS (`shifted_exp.py`)
    flushable: frozenset = frozenset()  # those of them no result can tell flushed: exp2_ftz (`shifted_exp.py`)
    unrounded: set[str] = field(default_factory=set)  # finished 16-bit results held in f32 (`_decided`)
    extrema: set[str] = field(default_factory=set)    # the maxima and minima among them

    @classmethod
    def of(cls, kb: KernelBuilder, opts: "ScheduleOptions") -> "ExprLowering":
        """A lowering for `kb` under the exp choices of `opts` (``fast_exp`` and the derived shifted and
        flushable exps)."""
        return cls(kb, fast_exp=opts.fast_exp, shifted=opts.shifted_exps, flushable=opts.flushable_exps)

    def lower(self, e: Expr, bindings: dict[str, Binding]) -> Tiled:
        """`e` with its axes bound by `bindings`, as a tile over the dims it reads."""
        axes, bufs = footprint(e)
        key = ("expr", e, tuple(bindings[a] for a in axes),
               tuple(self.tiles[b].value.name for b in bufs if b in self.tiles))
        found = self.kb.recall(key)
        if found is None:
            found = self.kb.remember(key, _RULES[type(e)](self, e, bindings))
        return found  # type: ignore[return-value]

    def lower_as(self, e: Expr, dtype: DType, bindings: dict[str, Binding]) -> Tiled:
        """`e` lowered and cast to `dtype`."""
        x = self.lower(e, bindings)
        return Tiled(self.kb.cast(x.value, dtype), x.dims)

    # -- helpers -----------------------------------------------------------------------------------
    def elementwise(self, items: list[Tiled], make: Callable[[list[t.Value]], t.Value]) -> Tiled:
        values, dims = align(self.kb, items)
        return Tiled(make(values), dims)


def _const(lw: ExprLowering, e: Const, b: dict[str, Binding]) -> Tiled:
    d = compute_dtype(e.dtype)
    return Tiled(lw.kb.const(round_to(e.value, e.dtype), d), ())


def _length(lw: ExprLowering, e: Length, b: dict[str, Binding]) -> Tiled:
    """A count of elements as a float: a constant, or the run-time lengths (index scalars, one `Extent` op
    each) multiplied and converted, rounding as numpy converts the count where it passes 2**24 in f32."""
    d, n = compute_dtype(e.dtype), e.count
    if isinstance(n, int):
        return Tiled(lw.kb.const(round_to(float(n), e.dtype), d), ())
    return Tiled(lw.kb.cast(lw.kb.extent(n), d, hint="count"), ())


def _index_value(lw: ExprLowering, e: IndexValue, b: dict[str, Binding]) -> Tiled:
    from .space import index_tile

    bound = b[e.axis.name]
    d = compute_dtype(e.dtype)
    if isinstance(bound, Fixed):
        return Tiled(lw.kb.cast(bound.index, d), ())
    idx = index_tile(lw.kb, bound)
    return Tiled(lw.kb.cast(idx.value, d, hint=f"{e.axis.name}_val"), idx.dims)


def _load(lw: ExprLowering, e: Load, b: dict[str, Binding]) -> Tiled:
    kb = lw.kb
    if e.buffer.name in lw.tiles:
        tile = lw.tiles[e.buffer.name]
        used = {b[i.name].key for i in e.indices if isinstance(i, Axis) and isinstance(b[i.name], Dim)}
        if used != {d.key for d in tile.dims} or any(isinstance(i, Strided | Computed) for i in e.indices):
            raise InternalError(f"fused read of {e.buffer.name} at {e.indices} does not line up with its tile",
                                pass_name="schedule")
        return tile
    flat = flat_offset(e.indices, e.buffer.type.shape, e.buffer.type.element_strides) \
        if any(isinstance(i, Computed) for i in e.indices) else None
    if flat is not None and all(isinstance(n, Const | IndexValue | Binary) and
                                not (isinstance(n, Binary) and n.op in (BinaryOp.FLOORDIV, BinaryOp.MOD))
                                for n in walk(flat)):
        # a reshape's positions that fold into one affine offset: contiguous reads stay contiguous (vectorized)
        at = ElementOffset(lw.lower_as(in_index_type(flat, kb.index_dtype), kb.index_dtype, b))
        positions: list[Position] = [at] + [0] * (len(e.indices) - 1)
        off = offsets(kb, e.buffer, positions)
        v = kb.load(e.buffer, off.value, mask_tile(kb, off.dims), 0)
        return Tiled(kb.cast(v, compute_dtype(e.buffer.dtype)), off.dims)
    positions = [
        i if isinstance(i, int) else b[i.name] if isinstance(i, Axis) else
        Shifted(b[i.axis.name], i.start, i.step, i.may_clamp(size)) if isinstance(i, Strided) else
        lw.lower_as(in_index_type(i.value, kb.index_dtype), kb.index_dtype, b)
        for i, size in zip(e.indices, e.buffer.shape)]
    off = offsets(kb, e.buffer, positions)
    mask = mask_tile(kb, off.dims)
    v = kb.load(e.buffer, off.value, mask, 0)
    return Tiled(kb.cast(v, compute_dtype(e.buffer.dtype)), off.dims)


LOG2E = float(np.log2(np.e))


def _decided(lw: ExprLowering, e: Expr) -> Expr:
    """The operand of a comparison, a rounding to an integral value or a cast, rounded as the reference
    rounds it where it computes in a storage-only type (f16, bf16, e4m3): `ir.loop.rewrite.decided`, with the
    finished results this kernel holds in f32 (`ExprLowering.unrounded`: a fused loop's 16-bit sum, max or min,
    an epilogue value; `ExprLowering.extrema` the maxima and minima among them). An f16 ``y = x * 0.3; y ==
    max(y)`` compared 58.8125 with the running 58.8096 and marked no element; an f16 softmax's ``p == max(p)``
    compares ``f16(f16(e) / l)`` with its epilogue ``max(e) / l``, which must be rounded as the elements are."""
    return decided(e, lw.unrounded, lw.extrema)


def _unary(lw: ExprLowering, e: Unary, b: dict[str, Binding]) -> Tiled:
    x = lw.lower_as(_decided(lw, e.x) if e.op in ROUNDING else e.x, compute_dtype(e.dtype), b)
    if e.op is UnaryOp.EXP and e.dtype.storage_only:
        return _exp_as_exp2(lw, x, flush=flushes_exp(e.dtype))
    if e.op is UnaryOp.EXP and e.dtype == float32:
        if lw.fast_exp or e in lw.flushable:
            # the ``fast_exp`` option (FlashAttention's exponential, not numpy's: docs/gpu-backend.md, "Numerics"),
            # or an argument at most 0 whose flushed results no result shows (shifted_exp.flush_safe_exps)
            return _exp_as_exp2(lw, x, flush=True)
        if e in lw.shifted:
            # an argument at most 0 (a value minus its maximum): each backend's cheaper exp (shifted_exp.py)
            return Tiled(lw.kb.unary(UnaryOp.EXP_NONPOS, x.value), x.dims)
    if e.dtype.storage_only and e.op in NARROW_FAST:
        return Tiled(NARROW_FAST[e.op](lw.kb, x.value), x.dims)
    return Tiled(lw.kb.unary(e.op, x.value), x.dims)


SERIES_BELOW = 0.125
"""The narrow fast paths' series serve ``|x|`` below this; above it, the exponential or logarithmic form."""


def _horner(kb: KernelBuilder, x: t.Value, coefficients: tuple[float, ...]) -> t.Value:
    """``c0 + x (c1 + x (c2 + ...))`` on a tile."""
    out = kb.const(coefficients[-1], x.dtype, x.shape)
    for c in reversed(coefficients[:-1]):
        out = kb.binary(BinaryOp.ADD, kb.binary(BinaryOp.MUL, out, x), kb.const(c, x.dtype, x.shape))
    return out


def _narrow_expm1(kb: KernelBuilder, x: t.Value) -> t.Value:
    """``expm1`` of an f32 value whose result the program rounds to a 16- or 8-bit float (issue 24's narrow
    fast path, as `_narrow_tanh`): ``x (1 + x (1/2 + x (1/6 + x (1/24 + x (1/120 + x/720)))))`` below |x| = 1/8
    (truncation below 2**-30 relative; ``-0.0`` stays ``-0.0``), else ``exp2(x log2 e) - 1``: the exponential's
    2**-22 (and ``|x| 2**-24`` from rounding the product) grown at most 8.5 times by the subtraction at
    ``x = 1/8`` (7.5 times at ``x = -1/8``), within 2**-18 relative; ``expm1(inf) = inf``, ``expm1(-inf) =
    -1``, NaN stays NaN (it is not below 1/8)."""
    c = lambda v: kb.const(v, x.dtype, x.shape)  # noqa: E731
    e = kb.unary(UnaryOp.EXP2_FTZ, kb.binary(BinaryOp.MUL, x, c(LOG2E)))
    wide = kb.binary(BinaryOp.SUB, e, c(1.0))
    small = kb.binary(BinaryOp.LT, kb.unary(UnaryOp.ABS, x), c(SERIES_BELOW))
    series = kb.binary(BinaryOp.MUL, x, _horner(kb, x, (1.0, 1 / 2, 1 / 6, 1 / 24, 1 / 120, 1 / 720)))
    return kb.select(small, series, wide, hint="expm1")


def _narrow_log1p(kb: KernelBuilder, x: t.Value) -> t.Value:
    """``log1p`` of an f32 value whose result the program rounds to a 16- or 8-bit float (issue 24's narrow
    fast path): its Taylor series to ``x^8 / 8`` below |x| = 1/8 (truncation below 2**-27 relative), else ``log(1 + x)`` in f32 (each backend's ``log``, within an ulp): rounding ``1 + x`` moves the
    result by at most ``2**-24 / log(1 + x)`` relative, 2**-21 at ``x = 1/8`` (and at ``x = -1/8``); within
    2**-20 in all. ``log1p(-1) = -inf``, below -1 NaN, ``log1p(inf) = inf``, NaN stays NaN."""
    c = lambda v: kb.const(v, x.dtype, x.shape)  # noqa: E731
    wide = kb.unary(UnaryOp.LOG, kb.binary(BinaryOp.ADD, x, c(1.0)))
    small = kb.binary(BinaryOp.LT, kb.unary(UnaryOp.ABS, x), c(SERIES_BELOW))
    series = kb.binary(BinaryOp.MUL, x, _horner(kb, x, (1.0, -1 / 2, 1 / 3, -1 / 4, 1 / 5, -1 / 6, 1 / 7, -1 / 8)))
    return kb.select(small, series, wide, hint="log1p")


def _narrow_tanh(kb: KernelBuilder, x: t.Value) -> t.Value:
    """``tanh`` of an f32 value whose result the program rounds to a 16- or 8-bit float, in f32 with one
    ``exp2`` instead of the f64 series of `codegen/wide_math.py` (issue 24's narrow fast path):

        |x| < 1/8:   x (1 - x²/3 + 2x⁴/15 - 17x⁶/315)          truncation below 0.022 x⁸ < 2**-29 relative
        otherwise:   ±(1 - 2 / (1 + exp2(2 |x| log2 e)))         2**-19 relative at worst (below)

    The exponent's rounding is ``2|x| 2**-24`` relative in ``E = e^(2|x|)``, which moves ``1 - 2/(1 + E)`` by
    ``2E/(E² - 1)`` times that: at most about 2**-21 where the result is not already 1 in the narrow type
    (``|x| < 9``); the division's and subtraction's roundings (the subtraction exact, the quotient's error
    grown by at most 7 at ``|x| = 1/8``) add 2**-21; ``exp2`` (``ex2.approx.ftz`` on a GPU, 2**-22; its
    argument is >= 0, so nothing flushes). Against the narrow type's half ulp (2**-12 for f16, 2**-9 for
    bf16) the rounded result is numpy's, or its neighbour within 2**-19 of a rounding midpoint.
    ``tanh(±inf) = ±1`` (``exp2(inf) = inf``), NaN stays NaN, ``-0.0`` stays ``-0.0`` (the series)."""
    f = x.dtype
    shape = x.shape

    def c(value: float) -> t.Value:
        return kb.const(value, f, shape)

    # (in this order, each tile consumed as soon as it is made: a thread holds whole tiles of them)
    a = kb.unary(UnaryOp.ABS, x)
    big_e = kb.unary(UnaryOp.EXP2_FTZ, kb.binary(BinaryOp.MUL, a, c(2.0 * LOG2E)))
    ratio = kb.binary(BinaryOp.DIV, c(2.0), kb.binary(BinaryOp.ADD, big_e, c(1.0)))
    magnitude = kb.binary(BinaryOp.SUB, c(1.0), ratio)
    signed = kb.select(kb.binary(BinaryOp.LT, x, c(0.0)), kb.unary(UnaryOp.NEG, magnitude), magnitude)
    # NaN is not below 1/8: it takes the exponential form, whose exp2(NaN) keeps it NaN
    small = kb.binary(BinaryOp.LT, a, c(SERIES_BELOW))
    x2 = kb.binary(BinaryOp.MUL, x, x)
    series = kb.binary(BinaryOp.MUL, x, _horner(kb, x2, (1.0, -1.0 / 3.0, 2.0 / 15.0, -17.0 / 315.0)),
                       hint="tanh_series")
    return kb.select(small, series, signed, hint="tanh")


ERF_SERIES_BELOW = 0.5
"""`_narrow_erf`'s Taylor series serves ``|x|`` below this; above it, the rational-exponential form."""

ERF_TAIL = (0.3275911, (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429))
"""Abramowitz and Stegun's 7.1.26: ``erf x = 1 - t (a1 + t (a2 + ...)) e^(-x²)``, ``t = 1 / (1 + p x)`` for
``x >= 0``, within 1.5e-7 of erf: (p, (a1..a5))."""


def _narrow_erf(kb: KernelBuilder, x: t.Value) -> t.Value:
    """``erf`` of an f32 value whose result the program rounds to a 16- or 8-bit float (issue 24's narrow fast
    path): its Taylor series to ``x^13`` below |x| = 1/2 (truncation below 2**-25 relative), else
    Abramowitz-Stegun 7.1.26 (`ERF_TAIL`) with ``e^(-x²)`` as ``exp2(-x² log2 e)``, within 1.5e-7 of
    erf plus a few f32 roundings where erf is at least 0.52: below 2**-20 relative, against the narrow
    type's half ulp of 2**-12 (f16) or 2**-9 (bf16). ``erf(±inf) = ±1``, NaN stays NaN, ``-0.0`` stays
    ``-0.0`` (the series)."""
    c = lambda v: kb.const(v, x.dtype, x.shape)  # noqa: E731
    a = kb.unary(UnaryOp.ABS, x)
    p, coefficients = ERF_TAIL
    q = kb.binary(BinaryOp.DIV, c(1.0), kb.binary(BinaryOp.ADD, kb.binary(BinaryOp.MUL, a, c(p)), c(1.0)))
    poly = kb.binary(BinaryOp.MUL, q, _horner(kb, q, coefficients))
    gauss = kb.unary(UnaryOp.EXP2_FTZ, kb.binary(BinaryOp.MUL, kb.binary(BinaryOp.MUL, a, a), c(-LOG2E)))
    tail = kb.binary(BinaryOp.SUB, c(1.0), kb.binary(BinaryOp.MUL, poly, gauss))
    signed = kb.select(kb.binary(BinaryOp.LT, x, c(0.0)), kb.unary(UnaryOp.NEG, tail), tail)
    small = kb.binary(BinaryOp.LT, a, c(ERF_SERIES_BELOW))
    x2 = kb.binary(BinaryOp.MUL, x, x)
    two_over_root_pi = 2.0 / math.sqrt(math.pi)
    series_c = tuple(two_over_root_pi * (-1) ** n / (math.factorial(n) * (2 * n + 1)) for n in range(7))
    series = kb.binary(BinaryOp.MUL, x, _horner(kb, x2, series_c))
    return kb.select(small, series, signed, hint="erf")


NARROW_FAST: dict[UnaryOp, Callable[[KernelBuilder, t.Value], t.Value]] = {
    UnaryOp.TANH: _narrow_tanh, UnaryOp.EXPM1: _narrow_expm1, UnaryOp.LOG1P: _narrow_log1p, UnaryOp.ERF: _narrow_erf}
"""The functions whose result the program rounds to a 16- or 8-bit float that are computed in f32 instead of
`codegen/wide_math.py`'s f64 series (`sin` and `cos` keep the series: their range reduction is the cost)."""


def flushes_exp(d: DType) -> bool:
    """Whether an exponential rounded to `d` loses nothing when f32 subnormal results flush to 0: `d`'s
    smallest subnormal is far above f32's smallest normal (f16 2**-24 and e4m3 2**-9 against 2**-126;
    not bf16, whose subnormals go down to 2**-133)."""
    return bool(ml_dtypes.finfo(d.numpy).smallest_subnormal > 2.0 ** -126)


def _exp_as_exp2(lw: ExprLowering, x: Tiled, flush: bool) -> Tiled:
    """``exp`` of a 16- or 8-bit float computed as ``exp2(x * log2 e)`` in f32.

    The program rounds this exponential to its narrow type, so its error budget is half an ulp of
    that type (2**-9 for bf16, 2**-12 for f16). Rounding ``x * log2 e`` to f32 moves the result by at
    most ``|x| log2(e) ln(2) 2**-24 = |x| 2**-24`` relative, and ``exp2`` (one ``ex2.approx`` on a GPU,
    2**-22) adds its own: below 2**-17 wherever the narrow type's exponential is neither 0 nor inf
    (|x| < 104), 2**8 under the budget. The range-reduced ``exp`` that f32 programs get costs about
    fifteen more instructions per element, the bulk of a softmax's or an attention's inner loop
    (docs/gpu-backend.md, "Numerics").

    With `flush` (f16, e4m3: `flushes_exp`) it is ``exp2_ftz``: results below 2**-126 become 0, which
    rounding to the narrow type does to them anyway (its half-smallest subnormal is 2**-25 or more). On a
    GPU that is one ``ex2.approx.ftz``: the non-flushing ``ex2.approx.f32`` is the same instruction
    behind a range check and two multiplies, about a sixth of f16 attention's key loop. bf16 reaches
    down to 2**-133 and keeps ``exp2``."""
    scale = Tiled(lw.kb.const(LOG2E, float32), ())
    scaled = lw.elementwise([x, scale], lambda v: lw.kb.binary(BinaryOp.MUL, v[0], v[1]))
    return Tiled(lw.kb.unary(UnaryOp.EXP2_FTZ if flush else UnaryOp.EXP2, scaled.value), scaled.dims)


def _common(a: DType, b: DType) -> DType:
    return compute_dtype(from_numpy(np.result_type(a.numpy, b.numpy)) or a)


def _binary(lw: ExprLowering, e: Binary, b: dict[str, Binding]) -> Tiled:
    if e.op.is_comparison:
        operand = _common(e.a.dtype, e.b.dtype)
        x, y = lw.lower_as(_decided(lw, e.a), operand, b), lw.lower_as(_decided(lw, e.b), operand, b)
        return lw.elementwise([x, y], lambda v: lw.kb.binary(e.op, v[0], v[1]))
    elif e.op in (BinaryOp.AND, BinaryOp.OR):
        operand = bool_
    else:
        operand = compute_dtype(e.dtype)
    x, y = lw.lower_as(e.a, operand, b), lw.lower_as(e.b, operand, b)
    if e.op is BinaryOp.DIV and e.dtype.storage_only and _invariant_in(y, x):
        return _times_reciprocal(lw, x, y)
    return lw.elementwise([x, y], lambda v: lw.kb.binary(e.op, v[0], v[1]))


def _invariant_in(y: Tiled, x: Tiled) -> bool:
    """True when `y` varies over fewer of the tile's dims than `x` (a row's normalizer beside the row)."""
    keys = {d.key for d in x.dims}
    return {d.key for d in y.dims} < keys


def _times_reciprocal(lw: ExprLowering, x: Tiled, y: Tiled) -> Tiled:
    """``x / y`` rounded to a 16- or 8-bit float, computed as ``x * (1 / y)`` with ``1 / y`` divided once
    over `y`'s smaller tile (a softmax's ``e / l``: one division a row instead of one an element).

    The f32 product is within 1.5 f32 ulps (2**-23 relative) of the exact quotient, against the narrow
    type's half-ulp budget of 2**-12 (f16), 2**-9 (bf16) or 2**-4 (e4m3): the rounded result is
    numpy's, or its neighbour where the quotient lies within 2**-23 of a rounding midpoint. Zero,
    infinite and NaN divisors give what division gives (``1 / 0 = inf``, ``x * inf = x / 0``;
    ``1 / inf = 0``). A correctly rounded f32 division is a reciprocal, four FMAs and a range check on a
    GPU, and was a third of a one-pass softmax's instructions. An f32 quotient keeps its division.

    A divisor below 2**-126 (a bf16 or f32 subnormal: the absmax of a row of tiny bf16 values) has a
    reciprocal past f32's range: ``1 / y`` was inf and every quotient inf or NaN (``0 * inf``) where numpy's
    are finite. Such a divisor is scaled by 2**32 first and the product scaled back, ``(x * (1 / (y s))) s``:
    powers of two, exact, so the result is the unscaled one's wherever that one was finite."""
    d = y.value.dtype
    one, least, big = (Tiled(lw.kb.const(c, d), ()) for c in (1.0, SUBNORMAL_BELOW, RECIPROCAL_SCALE))
    tiny = lw.elementwise([y, least], lambda v: lw.kb.binary(BinaryOp.LT, lw.kb.unary(UnaryOp.ABS, v[0]), v[1],
                                                             hint="tiny"))
    scale = lw.elementwise([tiny, big, one], lambda v: lw.kb.select(v[0], v[1], v[2], hint="scale"))
    scaled = lw.elementwise([y, scale], lambda v: lw.kb.binary(BinaryOp.MUL, v[0], v[1]))
    inverse = lw.elementwise([one, scaled], lambda v: lw.kb.binary(BinaryOp.DIV, v[0], v[1], hint="inv"))
    product = lw.elementwise([x, inverse], lambda v: lw.kb.binary(BinaryOp.MUL, v[0], v[1]))
    return lw.elementwise([product, scale], lambda v: lw.kb.binary(BinaryOp.MUL, v[0], v[1]))


SUBNORMAL_BELOW = 2.0 ** -126
"""f32's smallest normal value: a divisor below it has a reciprocal past 2**126, past f32's range below 2**-128."""

RECIPROCAL_SCALE = 2.0 ** 32
"""The power of two a subnormal divisor is scaled by in `_times_reciprocal` (its reciprocal then at most 2**117)."""


def _select(lw: ExprLowering, e: Select, b: dict[str, Binding]) -> Tiled:
    d = compute_dtype(e.dtype)
    c = lw.lower_as(e.cond, bool_, b)
    # A branch that returns the very value the condition compares returns it as the comparison saw it
    # (`_decided`): bf16 ``sign(y - max(y))`` takes its ±0 branch where the rounded ``y`` is the max, and
    # returned the f32 difference there (-0.047 for numpy's 0); ``where(y > 0, y, 0)`` keeps ``y`` that
    # the reference kept.
    # A fused loop's max or min is no such value: the loop's terms used its f32 value, and the guard
    # ``where(m == -inf, 0.0, m)`` after the loop must give them the same shift.
    x, y = (lw.lower_as(_decided(lw, v) if compared_branch(e, v, lw.extrema) else v, d, b) for v in (e.a, e.b))
    return lw.elementwise([c, x, y], lambda v: lw.kb.select(v[0], v[1], v[2], hint="where"))


def _cast(lw: ExprLowering, e: Cast, b: dict[str, Binding]) -> Tiled:
    # (a cast of a value computed in a storage-only type starts from that value as the reference has it:
    # rounded, ``(x * 0.3).astype(f16)`` of bf16 ``x`` rounds to bf16, then to f16)
    x = lw.lower(_decided(lw, e.x) if e.x.dtype != e.dtype else e.x, b)    # (a rounding cast is the rounding)
    if e.dtype.storage_only and e.x.dtype == e.dtype and isinstance(e.x, Load):   # a finished result (`_decided`)
        return Tiled(as_stored(lw.kb, x.value, e.dtype), x.dims)
    if e.dtype.storage_only:  # round to the narrow type, keep computing in f32
        narrow = lw.kb.cast(x.value, e.dtype)
        return Tiled(lw.kb.cast(narrow, float32), x.dims)
    return Tiled(lw.kb.cast(x.value, e.dtype), x.dims)


_RULES: dict[type, Callable[..., Tiled]] = {
    Const: _const,
    IndexValue: _index_value,
    Length: _length,
    Load: _load,
    Unary: _unary,
    Binary: _binary,
    Select: _select,
    Cast: _cast,
}


def as_stored(kb: KernelBuilder, value: t.Value, d: DType) -> t.Value:
    """`value`, the f32 tile of a result the program holds in dtype `d`, read as its buffer holds it: rounded
    to `d` and back where `d` is storage-only (f16, bf16, e4m3), once (a value already read so is itself).

    A fused loop's finished 16-bit sum, max or min and an epilogue value are read so where a decision reads them
    (`_decided`): the reference holds them rounded, and an f32 value compared with an operand rounded as numpy
    rounds it decided otherwise (f16 ``y == max(y)`` with ``y = x * 0.3`` compared 58.8125 with the running
    58.8096 and marked no element). Arithmetic reads the f32 value the loop computed with, which is nearer the
    exact one (`test_low_precision_inputs_compute_in_f32`) and is the one the loop's terms used."""
    if not d.storage_only or kb.recall(("as_stored", value.name, d)) is not None:
        return value
    read = kb.cast(kb.cast(value, d, hint=f"{value.name}_{d}"), value.dtype, hint=f"{value.name}_read")
    kb.remember(("as_stored", read.name, d), read)
    return read


def store_tile(kb: KernelBuilder, buffer, x: Tiled, positions: list[Binding | int]) -> None:
    """Store `x` into `buffer` at `positions` (one binding per buffer dim), masked to the valid lanes."""
    off = offsets(kb, buffer, positions)
    value = place(kb, x, off.dims) if set(d.key for d in x.dims) <= {d.key for d in off.dims} else None
    if value is None:
        raise InternalError(f"store to {buffer.name}: value varies over dims the store does not cover",
                            pass_name="schedule")
    value = kb.cast(value, buffer.dtype)
    kb.store(buffer, off.value, value, mask_tile(kb, off.dims))
