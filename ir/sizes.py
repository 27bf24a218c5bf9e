"""Symbolic extents: the sizes of a shape-polymorphic kernel that are known only when it runs.

A polymorphic kernel (``rf.kernel(fn, dynamic=...)``, docs/shapes.md) is compiled once for every length of
its symbolic axes. Below the Loop IR such an axis's extent is a `Size`: a symbol (`Sym`, printed as its
name, e.g. ``L0``) or an expression of symbols and integers built with ``+``, ``-``, ``*``, `ceil_div`
and ``//`` by a positive integer. Every symbol stands for an integer >= 2: a kernel specializes on the
axes of length 0 and 1 (they change the code: an empty loop, a broadcast), so a symbol is never either.

What the compiler may do with a `Size` is what holds for every value of its symbols: arithmetic, and
equality between sizes (two different symbols are two different lengths: a call whose symbolic axes
meet equal lengths where the compiled kernel had different symbols is another specialization). Any
question whose answer depends on the value -- ``n < 128``, ``n % 64``, ``int(n)``, ``range(n)``,
``bool(n)`` -- raises `SymbolicDecision`: the caller either has a rule for a symbolic extent or the
kernel cannot be polymorphic there, and keeps that axis's exact length (the fallback is the caller's).
That is what makes the scheduler's hundred uses of extents safe to reuse: one that has no symbolic
rule cannot silently decide on a value it does not know.
"""
from __future__ import annotations

from typing import Mapping, Sequence, Union

SizeLike = Union[int, "Size"]


class SymbolicDecision(Exception):
    """A decision that depends on the value of a symbolic extent (see the module docstring). Not a user
    error: the kernel falls back to the exact lengths of the axes involved, `symbols` (empty: unknown,
    all of them)."""

    def __init__(self, message: str, symbols: frozenset[str] = frozenset()) -> None:
        super().__init__(message)
        self.symbols = symbols


class Size:
    """A symbolic extent (see the module docstring): `Sym` or `SizeOp`. Immutable and hashable."""

    __slots__ = ()

    # -- arithmetic: always allowed --------------------------------------------------------------
    def __add__(self, other: SizeLike) -> SizeLike:
        return size_op("+", self, other)

    def __radd__(self, other: SizeLike) -> SizeLike:
        return size_op("+", other, self)

    def __sub__(self, other: SizeLike) -> SizeLike:
        return size_op("-", self, other)

    def __rsub__(self, other: SizeLike) -> SizeLike:
        return size_op("-", other, self)

    def __mul__(self, other: SizeLike) -> SizeLike:
        return size_op("*", self, other)

    def __rmul__(self, other: SizeLike) -> SizeLike:
        return size_op("*", other, self)

    def __floordiv__(self, other: SizeLike) -> SizeLike:
        return size_op("//", self, other)

    def __neg__(self) -> SizeLike:
        return size_op("-", 0, self)

    # -- decisions on the value: never ----------------------------------------------------------
    def _decide(self, what: str, *_: object) -> bool:
        raise SymbolicDecision(f"{what} of the run-time extent {self}", self.symbols())

    def __lt__(self, other: object) -> bool:
        return self._decide(f"'< {other}'")

    def __le__(self, other: object) -> bool:
        return self._decide(f"'<= {other}'")

    def __gt__(self, other: object) -> bool:
        return self._decide(f"'> {other}'")

    def __ge__(self, other: object) -> bool:
        return self._decide(f"'>= {other}'")

    def __mod__(self, other: object) -> int:
        return self._decide(f"'% {other}'")

    def __rmod__(self, other: object) -> int:
        return self._decide(f"'{other} % ...'")

    def __rfloordiv__(self, other: object) -> int:
        return self._decide(f"'{other} // ...'")

    def __bool__(self) -> bool:
        return self._decide("the truth")

    def __index__(self) -> int:
        return self._decide("the integer value")

    __int__ = __index__

    def __float__(self) -> float:
        return self._decide("the float value")

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Size):
            return self._key() == other._key()
        if isinstance(other, int) and not isinstance(other, bool):
            if isinstance(self, Sym) and other <= 1:
                return False       # a symbol is >= 2
            return self._decide(f"'== {other}'")
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self) -> int:
        return hash(self._key())

    def _key(self) -> tuple:
        raise NotImplementedError

    def symbols(self) -> frozenset[str]:
        """The symbols this size depends on."""
        raise NotImplementedError

    def evaluate(self, values: Mapping[str, int]) -> int:
        """The size's value when each symbol has its value in `values`."""
        raise NotImplementedError


class Sym(Size):
    """A run-time extent named `name` (>= 2)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "name", name)

    def __setattr__(self, key: str, value: object) -> None:
        raise AttributeError("a Sym is immutable")

    def _key(self) -> tuple:
        return ("sym", self.name)

    def symbols(self) -> frozenset[str]:
        return frozenset((self.name,))

    def evaluate(self, values: Mapping[str, int]) -> int:
        return int(values[self.name])

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"Sym({self.name!r})"

    def __reduce__(self):
        return (Sym, (self.name,))


class SizeOp(Size):
    """``a op b`` with op one of ``+ - * // cdiv max`` (`cdiv`: division rounded up; the divisor of ``//``
    and `cdiv` a positive int)."""

    __slots__ = ("op", "a", "b")

    def __init__(self, op: str, a: SizeLike, b: SizeLike) -> None:
        object.__setattr__(self, "op", op)
        object.__setattr__(self, "a", a)
        object.__setattr__(self, "b", b)

    def __setattr__(self, key: str, value: object) -> None:
        raise AttributeError("a SizeOp is immutable")

    def _key(self) -> tuple:
        return ("op", self.op, _key(self.a), _key(self.b))

    def symbols(self) -> frozenset[str]:
        return symbols_of(self.a) | symbols_of(self.b)

    def evaluate(self, values: Mapping[str, int]) -> int:
        a, b = evaluate(self.a, values), evaluate(self.b, values)
        return _APPLY[self.op](a, b)

    def __str__(self) -> str:
        if self.op in ("cdiv", "max"):
            return f"{self.op}({self.a}, {self.b})"
        return f"({self.a} {self.op} {self.b})"

    def __repr__(self) -> str:
        return f"SizeOp({self.op!r}, {self.a!r}, {self.b!r})"

    def __reduce__(self):
        return (SizeOp, (self.op, self.a, self.b))


_APPLY = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
          "//": lambda a, b: a // b, "cdiv": lambda a, b: -(-a // b), "max": max}


def _key(x: SizeLike) -> tuple:
    return x._key() if isinstance(x, Size) else ("int", x)


def size_op(op: str, a: SizeLike, b: SizeLike) -> SizeLike:
    """``a op b``, folded: ints give an int, ``x + 0``, ``x * 1``, ``x * 0`` and ``x // 1`` simplify."""
    for x in (a, b):
        if not isinstance(x, (int, Size)) or isinstance(x, bool):
            return NotImplemented
    if not isinstance(a, Size) and not isinstance(b, Size):
        return _APPLY[op](a, b)
    if op in ("//", "cdiv"):
        if isinstance(b, Size) or b < 1:
            raise SymbolicDecision(f"division of the run-time extent {a} by {b}", symbols_of(a) | symbols_of(b))
        if b == 1:
            return a
    if op in ("+", "-") and not isinstance(b, Size) and b == 0:
        return a
    if op == "+" and not isinstance(a, Size) and a == 0:
        return b
    if op == "*":
        for x, y in ((a, b), (b, a)):
            if not isinstance(x, Size) and x == 1:
                return y
            if not isinstance(x, Size) and x == 0:
                return 0
    return SizeOp(op, a, b)


def size_max(a: SizeLike, b: SizeLike) -> SizeLike:
    """``max(a, b)`` (an int for two ints; evaluated at run time otherwise)."""
    if isinstance(a, Size) or isinstance(b, Size):
        return SizeOp("max", a, b)
    return max(a, b)


def ceil_div(a: SizeLike, b: int) -> SizeLike:
    """``a / b`` rounded up (``b`` a positive int)."""
    if isinstance(a, Size):
        return size_op("cdiv", a, b)
    return -(-a // b)


def is_static(x: object) -> bool:
    """Whether `x` is a plain int (not a run-time extent)."""
    return not isinstance(x, Size)


def symbols_of(x: SizeLike) -> frozenset[str]:
    """The symbols `x` depends on (none for an int)."""
    return x.symbols() if isinstance(x, Size) else frozenset()


def evaluate(x: SizeLike, values: Mapping[str, int]) -> int:
    """`x`'s value when each symbol has its value in `values` (an int is itself)."""
    return x.evaluate(values) if isinstance(x, Size) else int(x)


def same_length(a: SizeLike, b: SizeLike) -> bool:
    """Whether two extents are the same length for every value of their symbols (a run-time extent and
    an int: never, though a call may give them one value; the code made for different lengths is right
    for equal ones too)."""
    if isinstance(a, Size) or isinstance(b, Size):
        return isinstance(a, Size) and isinstance(b, Size) and a == b
    return a == b


def assumed_at_least(x: SizeLike, n: int) -> bool:
    """``x >= n``, taking a run-time extent to be large: for choices that change speed only (how many rows a
    tile holds while the grid fills the machine), never what a kernel computes."""
    return isinstance(x, Size) or x >= n


def divides(size: int, extent: SizeLike) -> bool:
    """Whether chunks of `size` tile `extent` exactly (never known of a run-time extent: false)."""
    return not isinstance(extent, Size) and extent % size == 0


def size_min(x: SizeLike, bound: int) -> int:
    """``min(x, bound)`` where that is static: `bound` for a run-time extent that may exceed it (a tile of
    `bound` lanes, masked past the extent, covers any length), else the int minimum."""
    return bound if isinstance(x, Size) else min(x, bound)


def bind_shapes(shapes: "list[tuple[SizeLike, ...]]", actual: "list[tuple[int, ...]]") -> dict[str, int]:
    """Each symbol's value where buffers of `shapes` (a symbolic dim being a `Sym`) hold arrays of the
    `actual` shapes; `ValueError` when an array's rank, a static length or a symbol's two values disagree."""
    values: dict[str, int] = {}
    for shape, got in zip(shapes, actual):
        if len(shape) != len(got):
            raise ValueError(f"rank {len(got)} for a buffer of shape {shape_str(shape)}")
        for want, n in zip(shape, got):
            if isinstance(want, Sym):
                if values.setdefault(want.name, int(n)) != n:
                    raise ValueError(f"{want} is {values[want.name]} and {n}")
            elif isinstance(want, Size):
                raise ValueError(f"a buffer dim {want} is not a symbol")
            elif want != n:
                raise ValueError(f"length {n} where the kernel has {want}")
    return values


def bind_buffers(buffers: "Sequence[object]", arrays: "Sequence[object]") -> dict[str, int]:
    """`bind_shapes` of buffers (anything with a ``shape``: IR buffers) holding `arrays` (anything with a
    ``shape``, or a shape tuple itself)."""
    return bind_shapes([b.shape for b in buffers], [_shape_of(a) for a in arrays])


def _shape_of(a: object) -> tuple[int, ...]:
    if isinstance(a, tuple):
        return a
    shape = getattr(a, "shape", None)       # numpy, torch (CPU or CUDA), cupy...
    return tuple(shape) if shape is not None else ()   # a Python scalar


def concrete(shape: "tuple[SizeLike, ...]", values: Mapping[str, int]) -> tuple[int, ...]:
    """`shape` with its run-time extents evaluated."""
    return tuple(evaluate(n, values) for n in shape)


def shape_str(shape: "tuple[SizeLike, ...]") -> str:
    return "[" + ", ".join(str(n) for n in shape) + "]"


__all__ = ["bind_shapes", "concrete", "shape_str", "Size", "Sym", "SizeOp", "SizeLike", "SymbolicDecision", "size_op", "ceil_div", "is_static",
           "symbols_of", "evaluate", "size_min", "size_max", "divides", "same_length", "assumed_at_least"]
