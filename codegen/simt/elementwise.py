"""Rules for constants, aranges, program ids, views and elementwise ops: per-thread work on register chunks.

Every operand is read in the result's layout, so an elementwise op is one SIMT
statement per chunk. Semantics are the Tile IR's (numpy's): ``maximum``/
``minimum`` propagate NaN (the SIMT ops do), ``x ** c`` for the constants numpy
special-cases is computed like numpy does (``x * x`` rather than ``exp2(2 log2 x)``),
integer ``/`` truncates, casts to float8_e4m3fn give NaN past the range (`fp8.py`; in software on sm_80/86, `fp8_bits.py`),
and f64 or integers cast to f16, bf16 or e4m3 round once, as numpy's do (through f32 rounded to odd).
"""
from __future__ import annotations

from ...ir import BinaryOp, UnaryOp
from ...ir.tile import nodes as t
from ...ir.errors import BackendError
from ...ir.semantics import TRANSCENDENTAL
from ...ir.simt.nodes import IntOp, Reg
from ...ir.types import DType, float8_e4m3fn, float32, float64, int32
from . import fp8, fp8_bits
from .context import Lowering, value_rule
from .layouts import Layout
from .values import Regs, chunk_len, splat
from .views import source_layout


def coerce(value, dtype: DType):
    """A Tile IR constant as the SIMT IR wants it for `dtype`."""
    if dtype.is_bool:
        return bool(value)
    if dtype.is_int:
        return int(value)
    return float(value)


@value_rule(t.Constant)
def _constant(lw: Lowering, op: t.Constant, layout: Layout) -> Regs:
    return splat(lw.b, layout, op.out.dtype, coerce(op.value, op.out.dtype))


@value_rule(t.Extent)
def _extent(lw: Lowering, op: t.Extent, layout: Layout) -> Regs:
    return Regs(layout, op.out.dtype, (lw.size_param(op.size, op.out.dtype),))


@value_rule(t.ProgramId)
def _program_id(lw: Lowering, op: t.ProgramId, layout: Layout) -> Regs:
    return Regs(layout, op.out.dtype, (lw.b.cast(lw.pids[op.axis], op.out.dtype) if op.out.dtype != lw.pids[op.axis].dtype
                                        else lw.pids[op.axis],))


@value_rule(t.Arange)
def _arange(lw: Lowering, op: t.Arange, layout: Layout) -> Regs:
    b, dtype = lw.b, op.out.dtype
    thread = b.thread_field(lw.tid, [x[0] for x in layout.thread_bases], dtype)
    v = chunk_len(layout.num_regs)
    chunks = []
    for start in range(0, layout.num_regs, v):
        offsets = [layout.reg_coord(r)[0] for r in range(start, start + v)]
        spread = b.splat(thread, v)
        chunks.append(spread if not any(offsets) else b.add(spread, b.const_vector(offsets, dtype)))
    return Regs(layout, dtype, tuple(chunks))


@value_rule(t.Broadcast, t.ExpandDims, t.Permute)
def _view(lw: Lowering, op: t.Broadcast | t.ExpandDims | t.Permute, layout: Layout) -> Regs:
    if not op.x.shape:   # a scalar: the same register in every position
        const = lw.plan.defs.get(op.x.name)
        if isinstance(const, t.Constant):
            return splat(lw.b, layout, op.out.dtype, coerce(const.value, op.out.dtype))
        x = lw.get(op.x)
        v = chunk_len(layout.num_regs)
        spread = lw.b.splat(x.chunks[0], v)
        return Regs(layout, op.out.dtype, (spread,) * (layout.num_regs // v))
    x = lw.get(op.x, source_layout(op, layout))
    return Regs(layout, op.out.dtype, x.chunks)


def _chunks(lw: Lowering, values: tuple[t.Value, ...], layout: Layout) -> list[tuple[Reg, ...]]:
    regs = [lw.get(v, layout) for v in values]
    return list(zip(*(r.chunks for r in regs)))


def _in_f32(b, x: Reg, fn) -> Reg:
    """`fn` of f64 `x` evaluated in f32 (the GPU's exp/log/pow are f32 only; f64 tiles come from numpy
    promoting low-precision data with Python floats, whose results are rounded to that data's precision)."""
    return b.cast(fn(b.cast(x, float32)), x.dtype) if x.dtype == float64 else fn(x)


@value_rule(t.Unary)
def _unary(lw: Lowering, op: t.Unary, layout: Layout) -> Regs:
    b, dtype = lw.b, op.x.dtype
    if op.op in TRANSCENDENTAL and dtype not in (float32, float64):
        raise BackendError(f"{op.op.value} of {dtype} tiles: the GPU computes it in f32 only")
    if op.op in TRANSCENDENTAL:
        return Regs(layout, op.out.dtype, tuple(_in_f32(b, x, lambda y: b.unary(op.op, y))
                                                for (x,) in _chunks(lw, (op.x,), layout)))
    return Regs(layout, op.out.dtype, tuple(b.unary(op.op, x) for (x,) in _chunks(lw, (op.x,), layout)))


def _power(b, x: Reg, exponent: float | None, y: Reg) -> Reg:
    """``x ** y``, strength-reduced for the constants numpy special-cases."""
    n = x.length
    if exponent == 2:
        return b.mul(x, x)
    if exponent == 1:
        return x
    if exponent == 0:
        return b.const_of(1.0 if x.dtype.is_float else 1, x.dtype, n)
    if exponent == 0.5 and x.dtype.is_float:
        return b.unary(UnaryOp.SQRT, x)
    if exponent == -1 and x.dtype.is_float:
        return b.binary(BinaryOp.DIV, b.const_of(1.0, x.dtype, n), x)
    if x.dtype.is_int and exponent is not None and exponent >= 0 and exponent == int(exponent):
        result, base, e = None, x, int(exponent)
        while e:
            if e & 1:
                result = base if result is None else b.mul(result, base)
            e >>= 1
            if e:
                base = b.mul(base, base)
        return result
    if x.dtype == float64:
        return b.cast(b.binary(BinaryOp.POW, b.cast(x, float32), b.cast(y, float32)), x.dtype)
    if x.dtype != float32:
        raise BackendError(f"** of {x.dtype} tiles with a non-constant exponent: the GPU computes it in f32 only")
    return b.binary(BinaryOp.POW, x, y)


def defined_through_views(lw: Lowering, v: t.Value) -> t.Op | None:
    """The op that makes `v`'s elements: its definition, seen through broadcasts, expand_dims and permutes."""
    op = lw.plan.defs.get(v.name)
    while isinstance(op, t.Broadcast | t.ExpandDims | t.Permute):
        op = lw.plan.defs.get(op.x.name)
    return op


def constant_value(lw: Lowering, v: t.Value) -> float | int | bool | None:
    """`v`'s value when it is a constant (through views)."""
    op = defined_through_views(lw, v)
    return op.value if isinstance(op, t.Constant) else None


_BOOL_ORDER = {   # False < True: each ordered comparison of bools as (negate a, negate b, and/or)
    BinaryOp.LT: (True, False, BinaryOp.AND), BinaryOp.LE: (True, False, BinaryOp.OR),
    BinaryOp.GT: (False, True, BinaryOp.AND), BinaryOp.GE: (False, True, BinaryOp.OR),
}


def _bool_order(b, o: BinaryOp, x: Reg, y: Reg) -> Reg:
    """``x < y`` and the like on bools with logical ops (SIMT IR compares bools only for (in)equality)."""
    not_x, not_y, logic = _BOOL_ORDER[o]
    return b.binary(logic, b.unary(UnaryOp.NOT, x) if not_x else x, b.unary(UnaryOp.NOT, y) if not_y else y)


@value_rule(t.Binary)
def _binary(lw: Lowering, op: t.Binary, layout: Layout) -> Regs:
    b, dtype, o = lw.b, op.a.dtype, op.op
    pairs = _chunks(lw, (op.a, op.b), layout)
    if o is BinaryOp.POW:
        c = constant_value(lw, op.b)
        out = tuple(_power(b, x, c, y) for x, y in pairs)
    elif dtype.is_int and o is BinaryOp.DIV:
        out = tuple(b.int_op(IntOp.DIV, x, y) for x, y in pairs)
    elif dtype.is_bool and o in (BinaryOp.MAX, BinaryOp.MIN):
        o = BinaryOp.OR if o is BinaryOp.MAX else BinaryOp.AND
        out = tuple(b.binary(o, x, y) for x, y in pairs)
    elif dtype.is_bool and o in _BOOL_ORDER:
        out = tuple(_bool_order(b, o, x, y) for x, y in pairs)
    else:
        out = tuple(b.arith(o, x, y) for x, y in pairs)
    return Regs(layout, op.out.dtype, out)


@value_rule(t.Select)
def _select(lw: Lowering, op: t.Select, layout: Layout) -> Regs:
    triples = _chunks(lw, (op.cond, op.a, op.b), layout)
    return Regs(layout, op.out.dtype, tuple(lw.b.select(c, x, y) for c, x, y in triples))


def _round_trip_source(lw: Lowering, op: t.Cast) -> t.Value | None:
    """``y`` when `op` is ``f32(e4m3(y))`` with f32 ``y``: a quantize-dequantize."""
    if op.out.dtype != float32 or op.x.dtype != float8_e4m3fn:
        return None
    inner = lw.plan.defs.get(op.x.name)
    if isinstance(inner, t.Cast) and inner.x.dtype == float32:
        return inner.x
    return None


def _f32_rounded_to_odd(b, x: Reg) -> Reg:
    """`x` (f64, i32 or i64) as f32 rounded to odd: toward zero, the last bit set when inexact. Rounding that
    to f16, bf16 or e4m3 (at most 22 bits) rounds `x` once, as numpy does; through f32 by nearest it would
    round twice (1 + 2**-8 + 2**-30 -> bf16 is 1.0078125, not 1.0)."""
    wide = x if x.dtype == float64 else b.cast(x, float64)   # exact from i32
    t = b.cast(wide, float32)
    back = b.cast(t, float64)
    one = b.const(1, int32, x.type.length)
    bits = b.bitcast(t, int32)
    away = b.binary(BinaryOp.GT, b.unary(UnaryOp.ABS, back), b.unary(UnaryOp.ABS, wide))  # rounded up: step back
    bits = b.select(away, b.sub(bits, one), bits)
    inexact = b.binary(BinaryOp.NE, back, wide)   # NaN too: a NaN with its last bit set is still NaN
    return b.bitcast(b.select(inexact, b.int_op(IntOp.OR, bits, one), bits), float32)


@value_rule(t.Cast)
def _cast(lw: Lowering, op: t.Cast, layout: Layout) -> Regs:
    b, dst = lw.b, op.out.dtype
    if lw.opts.sm_number < 89:
        source = _round_trip_source(lw, op)
        if source is not None:
            return Regs(layout, dst, tuple(fp8.quantize(b, x) for (x,) in _chunks(lw, (source,), layout)))
    source = op.x
    inner = lw.plan.defs.get(op.x.name)
    if dst == float8_e4m3fn and lw.opts.sm_number < 89 and isinstance(inner, t.Cast):
        source = _round_trip_source(lw, inner) or source   # e4m3(f32(e4m3(y))) is e4m3(y), NaN signs included
    xs = tuple(x for (x,) in _chunks(lw, (source,), layout))
    if dst.storage_only and (source.dtype == float64 or source.dtype.is_int):
        xs = tuple(_f32_rounded_to_odd(b, x) for x in xs)   # then one more rounding: numpy's one
    if dst == float8_e4m3fn:
        if xs[0].dtype != float32:
            xs = tuple(b.cast(x, float32) for x in xs)
        convert = fp8.to_e4m3 if lw.opts.sm_number >= 89 else fp8_bits.f32_to_e4m3   # sm_80/86: no cvt to e4m3
        return Regs(layout, dst, tuple(convert(b, x) for x in xs))
    return Regs(layout, dst, tuple(b.cast(x, dst) for x in xs))
