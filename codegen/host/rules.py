"""One rule per inline Tile IR op: the LLVM IR computing the op's element at an index.

``rule(emitter, op, idx) -> llvm value``. Semantics follow numpy: ``maximum``
and ``minimum`` propagate NaN (``llvm.maximum``/``llvm.minimum``, not maxnum);
``!=`` is unordered (NaN != x); comparisons otherwise ordered. Float ``+ - *``
round separately like numpy's (no FMA contraction: ``c*s - max(c*s)`` must stay
<= 0, or ``exp`` of it overflows for large scores). ``exp``/``log`` in f32
are the vectorizable polynomials of `mathlib`, ``tanh sin cos erf expm1 log1p`` those of
`wide_math`; ``x ** c`` for the constants numpy
special-cases (2, 0.5, -1, 1, 0) is computed like numpy does.
"""
from __future__ import annotations

import llvmlite.ir as ir

from ...ir import BinaryOp, UnaryOp
from ...ir.tile import nodes as t
from ...ir.semantics import F32_TINY, ROUNDING, WIDE_MATH
from ..llvm_dtypes import constant, from_memory, intrinsic_suffix, memory_type
from ..llvm_utils import F32, F64, I1, I64, declare_intrinsic
from . import mathlib
from .. import int_division
from .emitter import Idx, InlineRule, KernelEmitter

_FCMP = {BinaryOp.LT: "<", BinaryOp.LE: "<=", BinaryOp.GT: ">", BinaryOp.GE: ">=", BinaryOp.EQ: "=="}


def intrinsic(em: KernelEmitter, name: str, ty: ir.Type, n: int = 1) -> ir.Function:
    """``llvm.<name>.<ty>`` taking `n` operands of type `ty` and returning one."""
    return declare_intrinsic(em.module, f"llvm.{name}.{intrinsic_suffix(ty)}", ty, [ty] * n)


def fenced_factor(em: KernelEmitter, x: ir.Value) -> ir.Value:
    """`x` behind ``llvm.arithmetic.fence``, for a product's ``reassoc`` multiply: the flag lets LLVM regroup
    the product's multiplies (vectorized, as a tree), and without the fence also hoist a constant factor out
    of `x`'s own computation across them. The nonpositive ``exp`` is ``(p * 2**(n + 64)) * 2**-64``: in a
    product of two such terms the two ``2**(n + 64)`` met first and overflowed (``prod(exp(x - max(x)))`` of
    ``[-3, -3]`` gave inf, of three terms NaN; fuzz seed 38, example 349)."""
    return em.b.call(intrinsic(em, "arithmetic.fence", x.type), [x])


def _constant_of(em: KernelEmitter, v: t.Value) -> float | None:
    """The value of `v` when it is a constant (through broadcasts and other views)."""
    op = em.plan.defs.get(v.name)
    while isinstance(op, t.Broadcast | t.ExpandDims | t.Permute):
        op = em.plan.defs.get(op.x.name)
    return op.value if isinstance(op, t.Constant) else None


def _unary(em: KernelEmitter, op: t.Unary, idx: Idx) -> ir.Value:
    b, d = em.b, op.x.dtype
    x = em.value(op.x, idx)
    if op.op is UnaryOp.NOT:
        return b.xor(x, ir.Constant(I1, 1))
    if d.is_int:
        if op.op is UnaryOp.NEG:
            return b.sub(ir.Constant(x.type, 0), x)
        if op.op is UnaryOp.ABS:
            fn = declare_intrinsic(em.module, f"llvm.abs.i{x.type.width}", x.type, [x.type, I1])
            return b.call(fn, [x, ir.Constant(I1, 0)])
        raise NotImplementedError(f"{op.op.value} on {d}")
    if op.op is UnaryOp.NEG:
        return b.fneg(x)
    if op.op is UnaryOp.ABS:
        return b.call(intrinsic(em, "fabs", x.type), [x])
    if op.op is UnaryOp.SQRT:
        return b.call(intrinsic(em, "sqrt", x.type), [x])
    if op.op is UnaryOp.RSQRT:
        return b.fdiv(ir.Constant(x.type, 1.0), b.call(intrinsic(em, "sqrt", x.type), [x]))
    if op.op in ROUNDING:   # llvm.rint rounds in the default mode, to nearest with ties to even: numpy's rint
        return b.call(intrinsic(em, op.op.value, x.type), [x])
    if op.op in WIDE_MATH:  # f32: evaluated in f64 (codegen/wide_math.py); f64: the C library's, as numpy's
        if x.type == F64:
            return b.call(mathlib.libm_f64(em.module, op.op.value), [x])
        return b.call(mathlib.wide_f32(em.module, op.op.value), [x])
    flush = op.op is UnaryOp.EXP2_FTZ       # exp2, then results below 2**-126 made 0
    name = "exp2" if flush else op.op.value  # exp, exp_nonpos, exp2, log, log2
    if x.type == F32:
        r = b.call(mathlib.F32_FUNCTIONS[name](em.module), [x])
    else:                                    # (f64: the C library's; an f64 exp_nonpos is its exp)
        r = b.call(intrinsic(em, "exp" if op.op is UnaryOp.EXP_NONPOS else name, x.type), [x])
    if flush:
        return b.select(b.fcmp_ordered("<", r, ir.Constant(x.type, F32_TINY)), ir.Constant(x.type, 0.0), r)
    return r


def _int_power(b: ir.IRBuilder, x: ir.Value, n: int) -> ir.Value:
    result: ir.Value = ir.Constant(x.type, 1)
    base = x
    while n > 0:
        if n & 1:
            result = b.mul(result, base)
        n >>= 1
        if n:
            base = b.mul(base, base)
    return result


def _power(em: KernelEmitter, op: t.Binary, x: ir.Value, y: ir.Value) -> ir.Value:
    b = em.b
    c = _constant_of(em, op.b)
    if op.a.dtype.is_int:
        return _int_power(b, x, int(c)) if c is not None and c >= 0 else ir.Constant(x.type, 0)
    one = ir.Constant(x.type, 1.0)
    if c == 2:
        return b.fmul(x, x)
    if c == 1:
        return x
    if c == 0:
        return one
    if c == 0.5:
        return b.call(intrinsic(em, "sqrt", x.type), [x])
    if c == -1:
        return b.fdiv(one, x)
    return b.call(intrinsic(em, "pow", x.type, 2), [x, y])


def _binary(em: KernelEmitter, op: t.Binary, idx: Idx) -> ir.Value:
    b, d, o = em.b, op.a.dtype, op.op
    if d.is_int and o in (BinaryOp.ADD, BinaryOp.SUB, BinaryOp.MUL):  # wide: exact in i64, truncated when read
        x, y = em.wide(op.a, idx), em.wide(op.b, idx)
        return {BinaryOp.ADD: b.add, BinaryOp.SUB: b.sub, BinaryOp.MUL: b.mul}[o](x, y)
    x, y = em.value(op.a, idx), em.value(op.b, idx)
    if o is BinaryOp.POW:
        return _power(em, op, x, y)
    if d.is_bool:
        table = {BinaryOp.AND: b.and_, BinaryOp.OR: b.or_, BinaryOp.MAX: b.or_, BinaryOp.MIN: b.and_}
        if o in table:
            return table[o](x, y)
        return b.icmp_unsigned(_FCMP.get(o, "!="), x, y)
    if d.is_int:
        if o in (BinaryOp.MAX, BinaryOp.MIN):
            return b.call(intrinsic(em, "smax" if o is BinaryOp.MAX else "smin", x.type, 2), [x, y])
        if o is BinaryOp.NE:
            return b.icmp_signed("!=", x, y)
        if o in _FCMP:
            return b.icmp_signed(_FCMP[o], x, y)
        if o is BinaryOp.DIV:
            return b.sdiv(x, y)
        if o is BinaryOp.FLOORDIV:
            return int_division.floor_divide(b, x, y)
        if o is BinaryOp.MOD:
            return int_division.remainder(b, x, y)
        raise NotImplementedError(f"{o.value} on {d}")
    if o is BinaryOp.ADD:
        return b.fadd(x, y)
    if o is BinaryOp.SUB:
        return b.fsub(x, y)
    if o is BinaryOp.MUL:
        return b.fmul(x, y)
    if o is BinaryOp.DIV:
        return b.fdiv(x, y)
    if o in (BinaryOp.MAX, BinaryOp.MIN):
        return b.call(intrinsic(em, "maximum" if o is BinaryOp.MAX else "minimum", x.type, 2), [x, y])
    if o is BinaryOp.NE:
        return b.fcmp_unordered("!=", x, y)
    if o in _FCMP:
        return b.fcmp_ordered(_FCMP[o], x, y)
    raise NotImplementedError(f"{o.value} on {d}")


def _load(em: KernelEmitter, op: t.Load, idx: Idx) -> ir.Value:
    b = em.b
    mty = memory_type(op.buffer.dtype)
    ptr = b.gep(em.buffers[op.buffer.name], [em.wide(op.offsets, idx)], source_etype=mty)
    if op.mask is None:
        return from_memory(b, b.load(ptr, typ=mty), op.buffer.dtype)
    mask = em.value(op.mask, idx)
    other = constant(op.out.dtype, op.other)
    before = b.block
    with b.if_then(mask):
        loaded = from_memory(b, b.load(ptr, typ=mty), op.buffer.dtype)
        then = b.block
    phi = b.phi(other.type, name=f"{op.out.name}.v")
    phi.add_incoming(loaded, then)
    phi.add_incoming(other, before)
    return phi


def _broadcast(em: KernelEmitter, op: t.Broadcast, idx: Idx) -> ir.Value:
    if not op.x.shape:
        return em.elem(op.x, ())
    mapped = tuple(i if s != 1 else em.zero for i, s in zip(idx, op.x.shape))
    return em.elem(op.x, mapped)


def _constant(em: KernelEmitter, op: t.Constant, idx: Idx) -> ir.Value:
    if op.out.dtype.is_int:
        return ir.Constant(I64, int(op.value))  # wide
    return constant(op.out.dtype, op.value)


RULES: dict[type, InlineRule] = {
    t.ProgramId: lambda em, op, idx: em.coords[op.axis],
    t.Constant: _constant,
    t.Extent: lambda em, op, idx: em.size(op.size),   # wide
    t.Arange: lambda em, op, idx: idx[0],
    t.Unary: _unary,
    t.Binary: _binary,
    t.Select: lambda em, op, idx: em.b.select(em.value(op.cond, idx), em.value(op.a, idx), em.value(op.b, idx)),
    t.Cast: lambda em, op, idx: em.cast(em.value(op.x, idx), op.x.dtype, op.out.dtype),
    t.Broadcast: _broadcast,
    t.ExpandDims: lambda em, op, idx: em.elem(op.x, idx[:op.axis] + idx[op.axis + 1:]),
    t.Permute: lambda em, op, idx: em.elem(op.x, tuple(idx[op.perm.index(d)] for d in range(len(idx)))),
    t.Load: _load,
}
