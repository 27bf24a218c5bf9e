"""Thread coordinates, constants, elementwise arithmetic, casts and vector packing as LLVM IR.

A vector register's arithmetic is one LLVM vector instruction (``fadd <16 x float>``,
``llvm.maximum.v16f32``); the NVPTX backend splits it into the scalar or paired
(``f16x2``) instructions the target has. Only what has no vector form goes element by
element (`lanewise`): the NVVM approximations (``lg2``), ``pow`` and the e4m3
conversions. Packs and multi-element extracts are ``shufflevector``s. One vector
instruction instead of an extract, op and insert per element keeps the module about
half as long, and every LLVM stage's time with it.
"""
from __future__ import annotations

import functools
from typing import Callable

from llvmlite import ir

from ...ir.semantics import ROUNDING, WIDE_MATH, BinaryOp, UnaryOp
from ...ir.simt.nodes import (
    Binary, Bitcast, BlockIdx, Cast, Const, Extract, IntBinary, IntOp, LaneId, Pack, Reg, Select, ThreadIdx, Unary,
    WarpId,
)
from ...ir.types import DType, float8_e4m3fn
from .. import correctly_rounded, int_division, nvvm, wide_math
from ..llvm_dtypes import NVPTX, cast, intrinsic_suffix
from ..nvvm import I32, call_intrinsic, i32, lanewise, splat
from . import mathlib
from .emitter import Emitter, deferred
from .types import const, reg_type


# Unary float ops without a vector form on NVPTX: one call per element.
_SCALAR_ONLY_UNARY = frozenset({UnaryOp.EXP2, UnaryOp.EXP2_FTZ, UnaryOp.EXP_NONPOS, UnaryOp.LOG,
                                UnaryOp.LOG2}) | ROUNDING | WIDE_MATH


def _float_unary(op: UnaryOp, b: ir.IRBuilder, x: ir.Value, em: Emitter) -> ir.Value:
    suffix = intrinsic_suffix(x.type)
    if op is UnaryOp.NEG:
        return b.fneg(x)
    if op is UnaryOp.ABS:
        return call_intrinsic(b, f"llvm.fabs.{suffix}", x.type, [x])
    if op is UnaryOp.SQRT:
        return _sqrt(b, x, em)
    if op is UnaryOp.RSQRT:
        return _divide(b, splat(x.type, 1.0), _sqrt(b, x, em), em)
    if op in ROUNDING:      # cvt.rmi / rpi / rzi / rni: exact; rint is to nearest, ties to even (numpy's)
        return call_intrinsic(b, f"llvm.{op.value}.{suffix}", x.type, [x])
    # The verifier admits the transcendental ops on f32 only.
    # evaluated in f64, at most 1 ulp (codegen/wide_math.py; log too: lg2.approx is 3.6% off at log(1.00001))
    if op in WIDE_MATH or op.value in wide_math.GPU_FUNCTIONS:
        if em.without_calls:    # its f64 division without div.rn.f64's subroutine
            return wide_math.emit(b, op.value, x, table_space=1, divide=_quotient_f64)
        return wide_math.emit(b, op.value, x, table_space=1)
    return {UnaryOp.EXP: lambda: mathlib.exp(b, x, fast=em.options.fast_math), UnaryOp.EXP2: lambda: mathlib.exp2(b, x),
            UnaryOp.EXP2_FTZ: lambda: mathlib.ex2_approx_ftz(b, x),
            UnaryOp.EXP_NONPOS: lambda: mathlib.exp_nonpositive(b, x),
            UnaryOp.LOG2: lambda: mathlib.log2(b, x)}[op]()


def _unary(s: Unary, em: Emitter) -> None:
    b, dtype = em.builder, s.x.dtype

    def one(x: ir.Value) -> ir.Value:
        if s.op is UnaryOp.NOT:
            return b.xor(x, splat(x.type, 1))
        if dtype.is_float:
            return _float_unary(s.op, b, x, em)
        zero = splat(x.type, 0)
        if s.op is UnaryOp.NEG:
            return b.sub(zero, x)
        return b.select(b.icmp_signed("<", x, zero), b.sub(zero, x), x)   # ABS

    if dtype.is_float and s.op in _SCALAR_ONLY_UNARY:
        em.set(s.out, lanewise(b, reg_type(s.out.type), one, em[s.x]))
    else:
        em.set(s.out, one(em[s.x]))


_FLOAT = {BinaryOp.ADD: "fadd", BinaryOp.SUB: "fsub", BinaryOp.MUL: "fmul"}
_INT = {BinaryOp.ADD: "add", BinaryOp.SUB: "sub", BinaryOp.MUL: "mul", BinaryOp.AND: "and_", BinaryOp.OR: "or_"}


def _without_calls(x: ir.Value, em: Emitter) -> bool:
    """Whether ``x``'s division and square root must be free of subroutines: f32 in a kernel that issues wgmma
    (a call would serialize them). 16-bit arithmetic is f32 in the SIMT IR; f64 keeps ``div.rn.f64``."""
    element = x.type.element if isinstance(x.type, ir.VectorType) else x.type
    return em.without_calls and isinstance(element, ir.FloatType)


def _divide(b: ir.IRBuilder, x: ir.Value, y: ir.Value, em: Emitter) -> ir.Value:
    """``x / y``, IEEE's correctly rounded quotient: ``fdiv`` (``div.rn``, which has a subroutine), or the same
    quotient in straight-line code (`correctly_rounded.divide`) where `_without_calls`."""
    if not _without_calls(x, em):
        return b.fdiv(x, y)
    return correctly_rounded.divide(b, x, y, correctly_rounded.nvptx_reciprocal)


def _quotient_f64(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    return correctly_rounded.quotient_f64(b, x, y, correctly_rounded.nvptx_reciprocal)


def _sqrt(b: ir.IRBuilder, x: ir.Value, em: Emitter) -> ir.Value:
    """``sqrt(x)`` correctly rounded: ``llvm.sqrt`` (``sqrt.rn``, which has a subroutine), or straight-line code
    (`correctly_rounded.sqrt`) where `_without_calls`."""
    if not _without_calls(x, em):
        return call_intrinsic(b, f"llvm.sqrt.{intrinsic_suffix(x.type)}", x.type, [x])
    return correctly_rounded.sqrt(b, x, correctly_rounded.nvptx_reciprocal_sqrt)


def _binary_scalar(op: BinaryOp, dtype: DType, b: ir.IRBuilder, x: ir.Value, y: ir.Value, em: Emitter) -> ir.Value:
    if op.is_comparison:
        if dtype.is_float:   # ordered, except != which numpy makes true on NaN
            return b.fcmp_unordered("!=", x, y) if op is BinaryOp.NE else b.fcmp_ordered(op.value, x, y)
        return b.icmp_signed(op.value, x, y)
    if dtype.is_float:
        if op is BinaryOp.DIV:
            return _divide(b, x, y, em)
        if op in _FLOAT:
            return getattr(b, _FLOAT[op])(x, y)
        if op is BinaryOp.POW:
            return mathlib.pow_(b, x, y)
        name = f"llvm.{'maximum' if op is BinaryOp.MAX else 'minimum'}.{intrinsic_suffix(x.type)}"
        return call_intrinsic(b, name, x.type, [x, y])   # NaN-propagating, like numpy
    if op in _INT:
        return getattr(b, _INT[op])(x, y)
    if op is BinaryOp.FLOORDIV:
        return int_division.floor_divide(b, x, y)
    if op is BinaryOp.MOD:
        return int_division.remainder(b, x, y)
    return b.select(b.icmp_signed(">" if op is BinaryOp.MAX else "<", x, y), x, y)


def _binary(s: Binary, em: Emitter) -> None:
    b = em.builder
    fn = lambda x, y: _binary_scalar(s.op, s.a.dtype, b, x, y, em)  # noqa: E731
    if s.op is BinaryOp.POW:   # mathlib.pow_ calls lg2.approx, which has no vector form
        em.set(s.out, lanewise(b, reg_type(s.out.type), fn, em[s.a], em[s.b]))
    else:
        em.set(s.out, fn(em[s.a], em[s.b]))


_INT_OPS = {IntOp.DIV: "sdiv", IntOp.REM: "srem", IntOp.SHL: "shl", IntOp.SHR: "ashr", IntOp.AND: "and_",
            IntOp.OR: "or_", IntOp.XOR: "xor"}


def _int_binary(s: IntBinary, em: Emitter) -> None:
    # Integer ops work on whole LLVM vectors directly.
    em.set(s.out, getattr(em.builder, _INT_OPS[s.op])(em[s.a], em[s.b]))


def _cast(s: Cast, em: Emitter) -> None:
    b = em.builder
    fn = lambda x: cast(b, x, s.x.dtype, s.out.dtype, NVPTX)  # noqa: E731
    if float8_e4m3fn in (s.x.dtype, s.out.dtype):   # bit-level decoding and a 2-element cvt
        em.set(s.out, lanewise(b, reg_type(s.out.type), fn, em[s.x]))
    else:
        em.set(s.out, fn(em[s.x]))


def _bitcast(s: Bitcast, em: Emitter) -> None:
    """Float registers are bitcast to the integer of their width (bf16 and e4m3 registers are i16/i8 already),
    then zero-extended; the other way the integer is truncated to the float's width first."""
    b, x = em.builder, em[s.x]
    out_type = reg_type(s.out.type)
    if s.x.dtype.is_float:
        width = ir.IntType(8 * s.x.dtype.itemsize)
        bits = x if x.type == _vector_of(width, s.x.length) else b.bitcast(x, _vector_of(width, s.x.length))
        em.set(s.out, bits if bits.type == out_type else b.zext(bits, out_type))
        return
    width = ir.IntType(8 * s.out.dtype.itemsize)
    bits = x if x.type == _vector_of(width, s.x.length) else b.trunc(x, _vector_of(width, s.x.length))
    em.set(s.out, bits if bits.type == out_type else b.bitcast(bits, out_type))


def _vector_of(elem: ir.Type, length: int) -> ir.Type:
    return elem if length == 1 else ir.VectorType(elem, length)


def _pack(s: Pack, em: Emitter) -> None:
    """One ``shufflevector`` when the parts are elements of at most two same-typed vectors (whole, or
    `Extract`s of them: layout changes and broadcasts pack like that); equal vector parts joined
    pairwise. Otherwise scalar parts and the elements of mma results are inserted, and a vector part is
    widened to the output's length and blended in, one shuffle each."""
    b = em.builder
    out_type = reg_type(s.out.type)
    mma_parts = any(p.name in em.lanes for p in s.parts)
    gathered = None if mma_parts else _gather(s, em)
    if gathered is not None:
        first, second, mask = gathered
        em.set(s.out, b.shuffle_vector(first, second, _indices(mask)))
        return
    lengths = {p.length for p in s.parts}
    if len(lengths) == 1 and min(lengths) > 1 and not mma_parts:
        em.set(s.out, _concatenate(b, [em[p] for p in s.parts]))   # equal vector parts: halving shuffles
        return
    vec: ir.Value = ir.Constant(out_type, ir.Undefined)
    at = 0
    for part in s.parts:
        scalars = em.lanes.get(part.name)
        if scalars is not None:   # an mma result: its elements go straight in
            for i, elem in enumerate(scalars):
                vec = b.insert_element(vec, elem, i32(at + i))
            at += part.length
            continue
        value = em[part]
        if part.length == 1:
            vec = b.insert_element(vec, value, i32(at))
        elif at == 0:
            vec = b.shuffle_vector(value, ir.Constant(value.type, ir.Undefined),
                                   _indices([i if i < part.length else -1 for i in range(s.out.length)]))
        else:
            wide = b.shuffle_vector(value, ir.Constant(value.type, ir.Undefined),
                                    _indices([i - at if at <= i < at + part.length else -1
                                              for i in range(s.out.length)]))
            # lanes below `at + length` from `wide` where they are the part's, else from what was packed so far
            vec = b.shuffle_vector(vec, wide, _indices([s.out.length + i if at <= i < at + part.length else i
                                                        for i in range(s.out.length)]))
        at += part.length
    em.set(s.out, vec)


def _concatenate(b: ir.IRBuilder, parts: list[ir.Value]) -> ir.Value:
    """Equal-length vectors end to end (a power-of-two count of them, as packs have), pairwise: n - 1 shuffles."""
    while len(parts) > 1:
        n = parts[0].type.count
        parts = [b.shuffle_vector(x, y, _indices(range(2 * n))) for x, y in zip(parts[::2], parts[1::2])]
    return parts[0]


def _gather(s: Pack, em: Emitter) -> tuple[ir.Value, ir.Value, list[int]] | None:
    """``(first, second, mask)`` of one shuffle building `s` from at most two source vectors, or None."""
    sources: list[Reg] = []
    lanes: list[tuple[int, int]] = []               # (which source, element) per output element
    for part in s.parts:
        made = em.defs.get(part.name)
        src, start = (made.vec, made.index) if isinstance(made, Extract) else (part, 0)
        if src.length == 1:
            return None
        if src not in sources:
            if len(sources) == 2 or (sources and sources[0].type != src.type):
                return None
            sources.append(src)
        which = sources.index(src)
        lanes += [(which, start + i) for i in range(part.length)]
    length = sources[0].length
    mask = [which * length + i for which, i in lanes]
    first = em[sources[0]]
    second = em[sources[1]] if len(sources) == 2 else ir.Constant(first.type, ir.Undefined)
    return first, second, mask


def _indices(mask) -> ir.Constant:
    """A ``shufflevector`` mask; -1 marks a lane nobody reads (element 0 goes there: llvmlite takes no undef)."""
    return _mask_constant(tuple(max(i, 0) for i in mask))


@functools.lru_cache(maxsize=4096)
def _mask_constant(mask: tuple[int, ...]) -> ir.Constant:
    # one object per mask: llvmlite caches a constant's text, and packs reuse a few masks many times
    return ir.Constant(ir.VectorType(I32, len(mask)), [i32(i) for i in mask])


def _extract(s: Extract, em: Emitter) -> None:
    b, vec = em.builder, em[s.vec]
    if s.out.length == 1:
        em.set(s.out, b.extract_element(vec, i32(s.index)))
        return
    em.set(s.out, b.shuffle_vector(vec, ir.Constant(vec.type, ir.Undefined),
                                   _indices(range(s.index, s.index + s.out.length))))


def _thread_idx(em: Emitter) -> ir.Value:
    return nvvm.thread_idx(em.builder)


RULES: dict[type, Callable[..., None]] = {
    ThreadIdx: lambda s, em: em.set(s.out, _thread_idx(em)),
    LaneId: lambda s, em: em.set(s.out, em.builder.and_(_thread_idx(em), i32(31), name=s.out.name)),
    WarpId: lambda s, em: em.set(s.out, em.builder.lshr(_thread_idx(em), i32(5), name=s.out.name)),
    BlockIdx: lambda s, em: em.set(s.out, nvvm.block_idx(em.builder, "xyz"[s.axis])),
    Const: lambda s, em: em.set(s.out, const(s.value, s.out.type)),
    Unary: _unary,
    Binary: _binary,
    IntBinary: _int_binary,
    Select: lambda s, em: em.set(s.out, em.builder.select(em[s.cond], em[s.a], em[s.b], name=s.out.name)),
    Cast: _cast,
    Bitcast: _bitcast,
    Pack: deferred(_pack),         # the mma path reads fragments' words around packs and slices of them
    Extract: deferred(_extract),
}
