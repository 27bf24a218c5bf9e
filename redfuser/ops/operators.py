"""`Tracer`'s Python operators and methods: each forwards to the op of the redfuser namespace that numpy's
operator means (``a + b`` is `ops.add`, ``a ** b`` `ops.power_operator`, ``~a`` `ops.invert`...), and the
operators outside the subset (``//``, ``%``, ``<<``, ``>>``, rounding) raise a `UnsupportedError` at the user's
line. `install_operators` runs once, when `redfuser.ops` is imported.
"""
from __future__ import annotations

from ..ir import UnsupportedError
from ..source_info import user_loc
from ..tracer import Tracer


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
        "pow": ops.power_operator, "matmul": ops.matmul, "and": ops.logical_and, "or": ops.logical_or,
    }
    for name, fn in table.items():
        setattr(Tracer, f"__{name}__", binary(fn))
        setattr(Tracer, f"__r{name}__", binary(fn, reflected=True))
    for name, fn in {"lt": ops.less, "le": ops.less_equal, "gt": ops.greater, "ge": ops.greater_equal,
                     "eq": ops.equal, "ne": ops.not_equal}.items():
        setattr(Tracer, f"__{name}__", binary(fn))
    Tracer.__hash__ = object.__hash__  # type: ignore[assignment]  (== is traced, identity hashes)
    Tracer.__neg__ = lambda self: ops.negative(self)  # type: ignore[attr-defined]
    Tracer.__pos__ = lambda self: self  # type: ignore[attr-defined]
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
    Tracer.mT = property(lambda self: ops.swapaxes(self, -1, -2))  # type: ignore[attr-defined]
