"""Dot operands in a narrow float type: the Tile IR rewrite the GPU's tensor cores and the host's AMX share.

The scheduler computes in f32, so a ``dot`` of half-precision data reads
``permute(cast_f32(load_f16))``. `narrow_operands` rewrites such an operand to
``permute(load_f16)`` — the same values, exactly (`Dot` multiplies in the
accumulator's dtype) — where the caller's `fits` says a narrow instruction can run
the dot (`codegen.simt.narrow`: an mma shape on the target; `codegen.host.amx`: an
AMX tile shape). When only one operand is exactly low precision, the other (an f32
computation, like ``P`` in ``P @ V``) is rounded to that type where numpy holds it
in that very type (`Dot.held`: the schedule records the program's type of each
computed operand), so the rounding is numpy's own. (Rounding wherever every store
of the result rounds as coarsely, as before, is not below what the store rounds
away where the terms cancel or the operand is below the narrow type's normal range:
an f32 ``exp(-17)`` rounded to f16 is 45% off.) Otherwise, when the exact operand is bf16, the f32
operand is *split*: three bf16 values that sum to it exactly, each multiplied by
the exact operand in its own dot, the three chained through the accumulator (numpy
computes ``bf16 @ bf16`` in f32, so an f32 ``P @ V`` is what a bf16 attention
written in numpy asks for). Otherwise the dot stays f32.
Guarantees: verified Tile IR in and out; exact operands give the same result.

Why the split is exact. bf16 has f32's exponent range and 8 of its 24 significant
bits. ``a1 = bf16(a)`` (round to nearest) leaves ``a - a1`` exactly representable in
f32 with at most 16 significant bits; ``a2 = bf16(a - a1)`` leaves at most 8, which
``a3`` holds exactly. So ``a1 + a2 + a3 == a``, and every product with a bf16 value is
exact in f32: the three dots add the very products the f32 dot adds, in another
order (the smallest part first, so ``a3 + a2 == a - a1`` exactly and no partial sum
overflows where ``a`` does not). The edges: what ``a1`` is cast from is clamped to
bf16's largest finite value, so an f32 beyond it (up to f32's largest) does not round
to inf (its rest, below 2**120, needs no clamp); an infinity is ``a1`` alone
(``a2 = a3 = 0``); and since ``a2`` and ``a3`` are 0 where ``a`` has no bits left for
them (``1.0`` splits into ``1, 0, 0``) and may have the other sign than ``a1``, they
multiply a copy of the exact operand whose infinities are 0: against an infinity they
would add ``0 · inf = NaN`` or ``inf - inf`` where ``a · inf`` is an infinity, while
``a1`` carries ``a``'s sign and meets the infinity alone. Bits of ``a`` below bf16's
smallest subnormal (2**-133, only when ``|a| < 2**-110``) are lost (an ``|a|`` below
2**-134 is 0, and times an infinity NaN). NaN stays NaN. The cost is three narrow dots
where one would do, and on the exact operand a select for the infinities.
"""
from __future__ import annotations

from dataclasses import replace

import ml_dtypes
import numpy as np

from ..ir.tile import nodes as t
from ..ir.semantics import BinaryOp, UnaryOp
from ..ir.source import SourceLoc
from ..ir.tile.verifier import verify_kernel
from ..ir.types import DType, bfloat16, bool_, float8_e4m3fn, float32
from typing import Callable

BF16_MAX = float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
SPLIT_PARTS = 3   # bf16 parts of an f32 operand: 3 x 8 significant bits hold f32's 24
_VIEWS = (t.Permute, t.Broadcast, t.ExpandDims)


class _Narrower:
    def __init__(self, k: t.TileKernel, fits: Callable[[t.Dot], bool], mixed: bool) -> None:
        self.fits, self.mixed = fits, mixed
        self.defs: dict[str, t.Op] = {r.name: op for op in t.walk_ops(k.body) for r in t.results(op)}
        self.fresh = t.FreshValues(k)

    def exact(self, v: t.Value) -> tuple[t.Value, list[t.Op]] | None:
        """``(x, views)`` when `v` is `views` applied to ``cast_f32(x)`` with a narrow ``x``, looking through
        selects that change nothing (`_zero_where_false`)."""
        op = self.defs.get(v.name)
        views: list[t.Op] = []
        while True:
            if isinstance(op, _VIEWS):
                views.append(op)
                op = self.defs.get(op.x.name)
            elif isinstance(op, t.Select) and self._zero_where_false(op):
                op = self.defs.get(op.a.name)
            else:
                break
        if isinstance(op, t.Cast) and op.x.dtype.storage_only and op.out.dtype == float32:
            return op.x, views[::-1]
        return None

    def _zero_where_false(self, op: t.Select) -> bool:
        """Whether ``where(c, x, 0)`` is ``x`` itself: ``x`` is a cast of a load whose mask holds `c` as a
        conjunct and whose other value is 0. The scheduler writes such a select on a contraction's operands
        (padded lanes of a ragged K must add nothing); where the load already gives 0 there it changes
        nothing, and seeing through it keeps a ragged-K ``dot`` of f16 data on the tensor cores."""
        zero = self.defs.get(op.b.name)
        if not (isinstance(zero, t.Constant) and zero.value == 0 and not np.signbit(zero.value)):
            return False
        cast = self.defs.get(op.a.name)
        load = self.defs.get(cast.x.name) if isinstance(cast, t.Cast) else None
        if not (isinstance(load, t.Load) and load.other == 0 and not np.signbit(load.other)):
            return False
        return self._conjunct(op.cond, load.mask)

    def _conjunct(self, c: t.Value, mask: t.Value | None) -> bool:
        """Whether `mask` is `c`, or an AND with `c` among its (nested) operands: false wherever `c` is."""
        if mask is None:
            return False
        if mask.name == c.name:
            return True
        op = self.defs.get(mask.name)
        return isinstance(op, t.Binary) and op.op is BinaryOp.AND and (
            self._conjunct(c, op.a) or self._conjunct(c, op.b))

    def rebuild(self, x: t.Value, views: list[t.Op], out: list[t.Op]) -> t.Value:
        for view in views:
            new = self.fresh(f"{view.out.name}_{x.dtype}", t.TileType(x.dtype, view.out.shape))
            out.append(replace(view, out=new, x=x))
            x = new
        return x

    def dot(self, op: t.Dot, out: list[t.Op]) -> t.Dot:
        if op.out.dtype != float32:
            return op
        a, b = self.exact(op.a), self.exact(op.b)
        kinds = {s[0].dtype for s in (a, b) if s is not None}
        if len(kinds) != 1:
            return op
        (narrow,) = kinds
        one_exact = a is None or b is None
        # rounded where numpy holds the operand in that very type: its rounding, then
        rounds = one_exact and narrow != float8_e4m3fn and (op.held[0] if a is None else op.held[1]) == narrow
        if one_exact and not rounds and narrow != bfloat16:
            return op
        mixed = one_exact and not rounds and self.mixed
        probe = t.Dot(op.out, t.Value("a", op.a.type.with_dtype(float32 if mixed and a is None else narrow)),
                      t.Value("b", op.b.type.with_dtype(float32 if mixed and b is None else narrow)), op.acc)
        if not self.fits(probe):
            return op
        operands: list[list[t.Value]] = []
        split_side: int | None = None
        for value, exact in ((op.a, a), (op.b, b)):
            if exact is not None:
                operands.append([self.rebuild(exact[0], exact[1], out)])
            elif mixed:     # (split where the dot is computed: the code generator's own parts)
                operands.append([value])
            elif rounds:
                rounded = self.fresh(f"{value.name}_{narrow}", value.type.with_dtype(narrow))
                out.append(t.Cast(rounded, value, op.loc))
                operands.append([rounded])
            else:   # the smallest part first: each partial sum stays below |a| (no overflow on the way)
                operands.append(self.split(value, out, op.loc)[::-1])
                split_side = len(operands) - 1
        pairs = [(x, y) for x in operands[0] for y in operands[1]]
        if split_side is not None:     # the parts after the first meet the exact operand without infinities
            exact_side = 1 - split_side
            narrow_value, views = (a, b)[exact_side]
            finite = self.rebuild(self.without_infinities(narrow_value, out, op.loc), views, out)
            pairs = [tuple(finite if side == exact_side else v for side, v in enumerate(pair))
                     for pair in pairs[:-1]] + pairs[-1:]
        acc = op.acc
        for i, (x, y) in enumerate(pairs[:-1]):
            part = self.fresh(f"{op.out.name}_part{i}", op.out.type)
            out.append(replace(op, out=part, a=x, b=y, acc=acc))
            acc = part
        return replace(op, a=pairs[-1][0], b=pairs[-1][1], acc=acc)

    def split(self, value: t.Value, out: list[t.Op], loc: SourceLoc) -> list[t.Value]:
        """`SPLIT_PARTS` bf16 values summing exactly to the f32 `value`, the largest first (see the module
        docstring): an infinity is the first part alone, the others 0."""
        new, emit = self._makers(value, out)
        infinite = _is_infinite(value, new, emit, loc)
        # clamped, so that a finite f32 beyond bf16's range gives a finite first part (not one rounded to inf)
        clamped = emit(t.Binary(new("clamp"), BinaryOp.MIN, emit(t.Binary(
            new("floor"), BinaryOp.MAX, value, emit(t.Constant(new("bf16_lowest"), -BF16_MAX, loc)), loc)),
            emit(t.Constant(new("bf16_max"), BF16_MAX, loc)), loc))
        parts = [emit(t.Cast(new("part0", bfloat16), emit(t.Select(new("first"), infinite, value, clamped, loc)), loc))]
        rest = emit(t.Binary(new("rest0"), BinaryOp.SUB, value, emit(t.Cast(new("part0_f32"), parts[0], loc)), loc))
        rest = emit(t.Select(new("rest0_finite"), infinite, emit(t.Constant(new("zero"), 0.0, loc)), rest, loc))
        for i in range(1, SPLIT_PARTS):     # the rest is finite and below bf16's largest: no clamp
            parts.append(emit(t.Cast(new(f"part{i}", bfloat16), rest, loc)))
            if i + 1 < SPLIT_PARTS:
                rest = emit(t.Binary(new(f"rest{i}"), BinaryOp.SUB, rest,
                                     emit(t.Cast(new(f"part{i}_f32"), parts[-1], loc)), loc))
        return parts

    def without_infinities(self, value: t.Value, out: list[t.Op], loc: SourceLoc) -> t.Value:
        """The bf16 `value` with its infinities 0: what the split's smaller parts
        multiply. Those parts are 0 where the f32 operand has no bits left for them (``1.0`` splits into
        ``1, 0, 0``) and may have the other sign than the first (rounding to nearest), so against an infinity
        they would add ``0 · inf = NaN`` or ``inf - inf`` where the f32 product is an infinity. The first part
        carries the operand's sign and is 0 only where the operand is (below 2**-133), so it meets the
        infinity alone; NaN stays, for the first part to meet too."""
        new, emit = self._makers(value, out)
        wide = emit(t.Cast(new("f32"), value, loc))
        infinite = _is_infinite(wide, new, emit, loc)
        finite = emit(t.Select(new("finite_f32"), infinite, emit(t.Constant(new("zero"), 0.0, loc)), wide, loc))
        return emit(t.Cast(new("finite", value.dtype), finite, loc))

    def _makers(self, value: t.Value, out: list[t.Op]):
        """Fresh values named after `value`, of its shape, and an `emit` that appends an op to `out`."""
        def new(suffix: str, dtype: DType = float32) -> t.Value:
            return self.fresh(f"{value.name}_{suffix}", value.type.with_dtype(dtype))

        def emit(op: t.Op) -> t.Value:
            out.append(op)
            return op.out
        return new, emit

    def block(self, ops: tuple[t.Op, ...]) -> tuple[t.Op, ...]:
        out: list[t.Op] = []
        for op in ops:
            if isinstance(op, t.Dot):
                op = self.dot(op, out)
            elif isinstance(op, t.For):
                op = replace(op, body=replace(op.body, ops=self.block(op.body.ops)))
            out.append(op)
        return tuple(out)


def _is_infinite(value: t.Value, new, emit, loc: SourceLoc) -> t.Value:
    """``abs(value) == inf``, emitted."""
    magnitude = emit(t.Unary(new("abs"), UnaryOp.ABS, value, loc))
    return emit(t.Binary(new("is_inf", bool_), BinaryOp.EQ, magnitude, emit(t.Constant(new("inf"), np.inf, loc)), loc))


def narrow_operands(k: t.TileKernel, fits: Callable[[t.Dot], bool], pass_name: str,
                    mixed: bool = False) -> t.TileKernel:
    """`k` (verified) with narrow dot operands where `fits` takes the narrowed dot (see the module docstring);
    verified. With `mixed`, a dot with one exact bf16 operand keeps its other operand in f32 (not split
    here: the code generator splits it as it packs it, `codegen.host.amx`). A kernel without a dot is
    returned as it is: the analyses are not run and there is nothing new to verify."""
    if not any(isinstance(op, t.Dot) for op in t.walk_ops(k.body)):
        return k
    narrower = _Narrower(k, fits, mixed)
    return verify_kernel(replace(k, body=narrower.block(k.body)), pass_name=pass_name)


__all__ = ["narrow_operands", "BF16_MAX", "SPLIT_PARTS"]
