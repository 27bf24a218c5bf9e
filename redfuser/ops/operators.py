"""`Tracer`'s Python operators and methods: each forwards to the op of the redfuser namespace that numpy's
operator means (``a + b`` is `ops.add`, ``a ** b`` `ops.power_operator`, ``~a`` `ops.invert`...), and the
operators outside the subset (``//``, ``%``, ``<<``, ``>>``, rounding) raise a `UnsupportedError` at the user's
line. `install_operators` runs once, when `redfuser.ops` is imported.
"""
from __future__ import annotations

import numpy as np

from ..ir import DTypeError, ShapeError, UnsupportedError
from ..source_info import user_loc
from ..tracer import Tracer
from .elementwise import positive


UNSUPPORTED_OPERATORS: dict[str, str] = {"divmod": "divmod()", "lshift": "<<", "rshift": ">>"}
"""Python operators with no RedFuser op yet."""


def _unsupported_operator(symbol: str):
    def refuse(self, *other):
        raise UnsupportedError(f"the {symbol} operator on traced values is not in RedFuser's op subset",
                               op=symbol, loc=user_loc())

    return refuse


def _no_rounding(name: str):
    def refuse(self, *args):
        what = f"{name}()" if name == "round" else f"math.{name}()"
        raise UnsupportedError(f"{what} of a traced value would make a Python number (numpy refuses it for "
                               f"arrays); use rf.{name}(x), numpy's elementwise {name}", op=what, loc=user_loc())

    return refuse


def _in_place(fn, symbol: str):
    """``x op= y`` as numpy computes it: in place, so every name bound to the same array sees the new value
    (``b = a; b += 1`` changes ``a``), in ``x``'s dtype and shape. A traced array is this Python object, so
    the object itself takes the new value; where other traced arrays view its buffer (``t = a.T``, ``r =
    a[0]``), numpy would change them too and the kernel could not: reading one of them afterwards is refused.
    A numpy scalar (not a 0-d array) is immutable, and ``s += 1`` makes a new one, as here. Inputs the kernel
    reads are never written: the caller's array keeps its values (numpy's body would change it)."""
    def update(self, other):
        from .. import ops

        result = fn(self, other)
        if self.ndim == 0 and not self.array0d:
            return result
        if tuple(result.shape) != tuple(self.shape):
            raise ShapeError(f"the result's shape {tuple(result.shape)} does not fit the updated array's "
                             f"{tuple(self.shape)} (numpy refuses to broadcast an in-place output)", op=symbol,
                             loc=user_loc())
        if result.dtype != self.dtype:
            if not np.can_cast(result.dtype, self.dtype, "same_kind"):
                raise DTypeError(f"numpy cannot cast the {result.dtype} result to the updated array's "
                                 f"{self.dtype} in place (casting rule 'same_kind'); write x = x {symbol[:-1]} y",
                                 op=symbol, loc=user_loc())
            result = ops.astype(result, self.dtype)
        if self.builder.other_views(self):
            # numpy changes every other view of the buffer too (the right-hand side among them: ``t = x[:]; t += x``
            # doubles ``x``); a kernel rebinds this one alone, so the others are stale: reading one is refused
            # (`TraceBuilder.check_current`), and a body that never reads them again is numpy's (``y = x.T; y +=
            # 1; return y``). (``y[0] += 1`` ends in item assignment, refused as such.)
            self.builder.note_changed(self, symbol, user_loc())
        self.builder.note_update(self, user_loc())
        self.rebind(result)
        return self

    return update


def _reshape_method(self, *shape, order="C"):
    """``x.reshape(2, 3)`` or ``x.reshape((2, 3))``, as numpy's method."""
    from .. import ops

    return ops.reshape(self, shape[0] if len(shape) == 1 else shape, order=order)


def install_operators() -> None:
    """Operators and methods of `Tracer` forward to the op namespace (one definition per op)."""
    from .. import ops   # redfuser.ops, being initialized: its ops are bound by now

    def binary(fn, reflected=False):
        if reflected:
            return lambda self, other: fn(other, self)
        return lambda self, other: fn(self, other)

    table = {
        "add": ops.add, "sub": ops.subtract, "mul": ops.multiply, "truediv": ops.divide,
        "pow": ops.power_operator, "matmul": ops.matmul, "and": ops.bitwise_and, "or": ops.bitwise_or,
    }
    symbols = {"add": "+=", "sub": "-=", "mul": "*=", "truediv": "/=", "pow": "**=", "matmul": "@=", "and": "&=",
               "or": "|=", "floordiv": "//=", "mod": "%=", "xor": "^="}
    for name, fn in table.items():
        setattr(Tracer, f"__{name}__", binary(fn))
        setattr(Tracer, f"__r{name}__", binary(fn, reflected=True))
    for name, fn in (table | {"floordiv": ops.floor_divide, "mod": ops.remainder, "xor": ops.bitwise_xor}).items():
        setattr(Tracer, f"__i{name}__", _in_place(fn, symbols[name]))
    for name, fn in {"lt": ops.less, "le": ops.less_equal, "gt": ops.greater, "ge": ops.greater_equal,
                     "eq": ops.equal, "ne": ops.not_equal}.items():
        setattr(Tracer, f"__{name}__", binary(fn))
    Tracer.__hash__ = object.__hash__  # type: ignore[assignment]  (== is traced, identity hashes)
    Tracer.__neg__ = lambda self: ops.negative(self)  # type: ignore[attr-defined]
    Tracer.__pos__ = lambda self: positive(self)  # type: ignore[attr-defined]
    Tracer.__abs__ = lambda self: ops.abs(self)  # type: ignore[attr-defined]
    Tracer.__invert__ = lambda self: ops.invert(self)  # type: ignore[attr-defined]
    Tracer.__floordiv__ = binary(ops.floor_divide)  # type: ignore[attr-defined]
    Tracer.__rfloordiv__ = binary(ops.floor_divide, reflected=True)  # type: ignore[attr-defined]
    Tracer.__mod__ = binary(ops.remainder)  # type: ignore[attr-defined]
    Tracer.__rmod__ = binary(ops.remainder, reflected=True)  # type: ignore[attr-defined]
    Tracer.__xor__ = binary(ops.bitwise_xor)  # type: ignore[attr-defined]
    Tracer.__rxor__ = binary(ops.bitwise_xor, reflected=True)  # type: ignore[attr-defined]
    for name, symbol in UNSUPPORTED_OPERATORS.items():
        setattr(Tracer, f"__{name}__", _unsupported_operator(symbol))
        setattr(Tracer, f"__r{name}__", _unsupported_operator(symbol))
    for name in ("round", "trunc", "floor", "ceil"):
        setattr(Tracer, f"__{name}__", _no_rounding(name))
    Tracer.__getitem__ = lambda self, key: ops.getitem(self, key)  # type: ignore[attr-defined]
    # methods forward to the op of the same name, looked up when called (ops checks its own arguments)
    for name in ("astype", "swapaxes", "transpose", "sum", "max", "min", "prod", "mean", "var", "std", "any", "all",
                 "argmax", "argmin"):
        setattr(Tracer, name, lambda self, *args, _op=name, **kwargs: getattr(ops, _op)(self, *args, **kwargs))
    Tracer.reshape = _reshape_method  # type: ignore[attr-defined]
    Tracer.T = property(lambda self: ops.transpose(self))  # type: ignore[attr-defined]
    Tracer.mT = property(_matrix_transpose)  # type: ignore[attr-defined]


def _matrix_transpose(x: Tracer) -> Tracer:
    """``x.mT``: the last two axes swapped; numpy refuses it below two dims, and so does this, by its name."""
    from .. import ops
    from .common import describe

    if x.ndim < 2:
        raise ShapeError(f"matrix transpose (.mT) of {describe(x)}: it needs at least 2 dims (numpy refuses it "
                         "too)", op="mT", loc=user_loc())
    return ops.swapaxes(x, -1, -2)
