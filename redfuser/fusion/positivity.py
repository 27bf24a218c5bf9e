"""Sign facts about expressions: what the algebra may assume (``l > 0`` for ``l = sum exp(...)``)."""
from __future__ import annotations

from ..ir import Binary, BinaryOp, Cast, Const, Expr, Length, Load, Select, Unary, UnaryOp


def is_positive(e: Expr, positive_buffers: frozenset[str]) -> bool:
    """True when `e` > 0 wherever it is defined (a sound, incomplete check)."""
    if isinstance(e, Const):
        return not isinstance(e.value, bool) and e.value > 0
    if isinstance(e, Length):
        return True     # (a symbolic length is at least 2; a traced one is a probe)
    if isinstance(e, Load):
        return e.buffer.name in positive_buffers
    if isinstance(e, Cast):
        return e.dtype.is_float and is_positive(e.x, positive_buffers)
    if isinstance(e, Unary):
        if e.op in (UnaryOp.EXP, UnaryOp.EXP2):
            return True
        if e.op in (UnaryOp.SQRT, UnaryOp.RSQRT):
            return is_positive(e.x, positive_buffers)
        return False
    if isinstance(e, Binary):
        a, b = is_positive(e.a, positive_buffers), is_positive(e.b, positive_buffers)
        if e.op in (BinaryOp.MUL, BinaryOp.DIV, BinaryOp.ADD, BinaryOp.MIN):
            return a and b
        if e.op is BinaryOp.MAX:
            return a or b
        if e.op is BinaryOp.POW:
            return a
        return False
    if isinstance(e, Select):
        return is_positive(e.a, positive_buffers) and is_positive(e.b, positive_buffers)
    return False


def is_nonnegative(e: Expr, positive_buffers: frozenset[str]) -> bool:
    """True when `e` >= 0 wherever it is defined."""
    if is_positive(e, positive_buffers):
        return True
    if isinstance(e, Const):
        return not isinstance(e.value, bool) and e.value >= 0
    if isinstance(e, Unary) and e.op in (UnaryOp.ABS, UnaryOp.SQRT):
        return True
    if isinstance(e, Binary):
        a, b = is_nonnegative(e.a, positive_buffers), is_nonnegative(e.b, positive_buffers)
        if e.op in (BinaryOp.MUL, BinaryOp.DIV, BinaryOp.ADD):
            return a and b
        if e.op is BinaryOp.MAX:
            return a or b
        if e.op is BinaryOp.POW and isinstance(e.b, Const):
            k = float(e.b.value)
            return a or (k.is_integer() and int(k) % 2 == 0)
    if isinstance(e, Cast):
        return e.dtype.is_float and is_nonnegative(e.x, positive_buffers)
    if isinstance(e, Select):
        return is_nonnegative(e.a, positive_buffers) and is_nonnegative(e.b, positive_buffers)
    return False
