"""`KernelBuilder`: emits Tile IR ops into a kernel, names values, and scopes loop bodies.

Values get readable, unique names from hints (``x``, ``x_1``...). Loop bodies
are opened with `loop` (a context manager); a memo table per open scope lets
the expression lowering reuse a value computed earlier in the same or an
enclosing scope (common subexpressions such as ``exp(s - m)`` are built once).
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

from ..ir import BinaryOp, Buffer, DType, ReduceOp, UnaryOp
from ..ir.sizes import Size, SymbolicDecision
from ..ir.source import UNKNOWN, SourceLoc
from ..ir.tile import nodes as t
from ..ir.types import bool_


@dataclass
class LoopScope:
    """An open ``for``: its induction variable and carried values; call `yield_` once before it closes."""

    iv: t.Value
    args: tuple[t.Value, ...]
    results: tuple[t.Value, ...] = ()
    yields: tuple[t.Value, ...] | None = None

    def yield_(self, *values: t.Value) -> None:
        self.yields = tuple(values)


@dataclass
class KernelBuilder:
    """Builds one `TileKernel` (see the module docstring)."""

    name: str
    index_dtype: DType
    _taken: set[str] = field(default_factory=set)
    _blocks: list[list[t.Op]] = field(default_factory=lambda: [[]])
    _memo: list[dict] = field(default_factory=lambda: [{}])
    params: dict[str, Buffer] = field(default_factory=dict)

    # -- names and values -------------------------------------------------------------------------
    def fresh(self, hint: str) -> str:
        base = "".join(c if c.isalnum() or c == "_" else "_" for c in hint) or "v"
        name, n = base, 1
        while name in self._taken:
            name, n = f"{base}_{n}", n + 1
        self._taken.add(name)
        return name

    def value(self, hint: str, dtype: DType, shape: tuple[int, ...] = ()) -> t.Value:
        return t.Value(self.fresh(hint), t.TileType(dtype, tuple(shape)))

    def emit(self, op: t.Op) -> t.Op:
        self._blocks[-1].append(op)
        return op

    # -- the scoped memo --------------------------------------------------------------------------
    def recall(self, key: object) -> object | None:
        """What `remember` stored under `key` in this scope or an enclosing one."""
        for table in reversed(self._memo):
            if key in table:
                return table[key]
        return None

    def remember(self, key: object, item: object) -> object:
        self._memo[-1][key] = item
        return item

    # -- ops ----------------------------------------------------------------------------------------
    def program_id(self, axis: int, hint: str = "pid") -> t.Value:
        out = self.value(hint, self.index_dtype)
        self.emit(t.ProgramId(out, axis))
        return out

    def extent(self, size: Size, hint: str = "n") -> t.Value:
        """The run-time extent `size` as an index scalar (one `Extent` op per expression and scope)."""
        key = ("extent", size)
        found = self.recall(key)
        if found is None:
            found = self.value(hint, self.index_dtype)
            self.emit(t.Extent(found, size))
            self.remember(key, found)
        return found  # type: ignore[return-value]

    def const(self, value: float | int | bool | Size, dtype: DType, shape: tuple[int, ...] = (),
              hint: str = "c") -> t.Value:
        """A tile of `value`; a run-time extent (`Size`, an index) is read once and broadcast."""
        if isinstance(value, Size):
            if dtype != self.index_dtype:
                raise SymbolicDecision(f"the run-time extent {value} as {dtype}")
            return self.broadcast(self.extent(value), tuple(shape))
        key = ("const", value, dtype, tuple(shape), str(value))
        found = self.recall(key)
        if found is None:
            found = self.value(hint, dtype, shape)
            self.emit(t.Constant(found, value))
            self.remember(key, found)
        return found  # type: ignore[return-value]

    def arange(self, n: int, hint: str = "arange") -> t.Value:
        key = ("arange", n)
        found = self.recall(key)
        if found is None:
            found = self.value(hint, self.index_dtype, (n,))
            self.emit(t.Arange(found))
            self.remember(key, found)
        return found  # type: ignore[return-value]

    def unary(self, op: UnaryOp, x: t.Value, hint: str | None = None) -> t.Value:
        out = self.value(hint or op.name.lower(), x.dtype, x.shape)
        self.emit(t.Unary(out, op, x))
        return out

    def binary(self, op: BinaryOp, a: t.Value, b: t.Value, hint: str | None = None) -> t.Value:
        dtype = bool_ if op.is_comparison else a.dtype
        out = self.value(hint or op.name.lower(), dtype, a.shape)
        self.emit(t.Binary(out, op, a, b))
        return out

    def select(self, cond: t.Value, a: t.Value, b: t.Value, hint: str = "sel") -> t.Value:
        out = self.value(hint, a.dtype, a.shape)
        self.emit(t.Select(out, cond, a, b))
        return out

    def cast(self, x: t.Value, dtype: DType, hint: str | None = None) -> t.Value:
        if x.dtype == dtype:
            return x
        out = self.value(hint or f"{x.name}_{dtype}", dtype, x.shape)
        self.emit(t.Cast(out, x))
        return out

    def broadcast(self, x: t.Value, shape: tuple[int, ...], hint: str | None = None) -> t.Value:
        if x.shape == tuple(shape):
            return x
        out = self.value(hint or f"{x.name}_b", x.dtype, shape)
        self.emit(t.Broadcast(out, x))
        return out

    def expand_dims(self, x: t.Value, axis: int) -> t.Value:
        out = self.value(f"{x.name}_e", x.dtype, x.shape[:axis] + (1,) + x.shape[axis:])
        self.emit(t.ExpandDims(out, x, axis))
        return out

    def permute(self, x: t.Value, perm: tuple[int, ...]) -> t.Value:
        if tuple(perm) == tuple(range(len(perm))):
            return x
        out = self.value(f"{x.name}_t", x.dtype, tuple(x.shape[p] for p in perm))
        self.emit(t.Permute(out, x, tuple(perm)))
        return out

    def load(self, buffer: Buffer, offsets: t.Value, mask: t.Value | None, other: float | int | bool,
             hint: str | None = None) -> t.Value:
        self.params.setdefault(buffer.name, buffer)
        out = self.value(hint or buffer.name, buffer.dtype, offsets.shape)
        other = bool(other) if buffer.dtype.is_bool else int(other) if buffer.dtype.is_int else float(other)
        self.emit(t.Load(out, buffer, offsets, mask, other))
        return out

    def store(self, buffer: Buffer, offsets: t.Value, value: t.Value, mask: t.Value | None) -> None:
        self.params.setdefault(buffer.name, buffer)
        self.emit(t.Store(buffer, offsets, value, mask))

    def reduce(self, op: ReduceOp, x: t.Value, axis: int, hint: str | None = None) -> t.Value:
        out = self.value(hint or f"{op.value}", x.dtype, x.shape[:axis] + x.shape[axis + 1:])
        self.emit(t.Reduce(out, x, axis, op))
        return out

    def dot(self, a: t.Value, b: t.Value, acc: t.Value | None, dtype: DType, hint: str = "dot",
            held: tuple[DType | None, DType | None] = (None, None)) -> t.Value:
        """``acc + a @ b`` in `dtype`; `held`: the narrow types numpy holds f32-computed operands in (`t.Dot`)."""
        out = self.value(hint, dtype, (a.shape[0], b.shape[1]))
        self.emit(t.Dot(out, a, b, acc, held=held))
        return out

    def topk(self, x: t.Value, indices: t.Value, axis: int, k: int, acc: tuple[t.Value, t.Value] | None = None,
             hint: str = "top", loc: SourceLoc = UNKNOWN) -> tuple[t.Value, t.Value]:
        """The best `k` of (`x`, `indices`) along `axis`, merged into the k-list `acc` (values, indices); `loc`
        is the user's line (a GPU backend's refusal of a large k names it)."""
        shape = x.shape[:axis] + (k,) + x.shape[axis + 1:]
        out, out_i = self.value(hint, x.dtype, shape), self.value(f"{hint}_idx", indices.dtype, shape)
        self.emit(t.TopK(out, out_i, x, indices, axis, *(acc or (None, None)), loc=loc))
        return out, out_i

    @contextmanager
    def loop(self, start: int, stop: int | Size | t.Value, step: int, inits: tuple[t.Value, ...], hint: str = "k",
             arg_hints: tuple[str, ...] | None = None) -> Iterator[LoopScope]:
        """Open ``for iv = start to stop step step`` carrying `inits`; the body goes inside the ``with``."""
        if isinstance(stop, Size):
            stop = self.extent(stop)
        iv = self.value(hint, self.index_dtype)
        names = arg_hints or tuple(f"{v.name}_run" for v in inits)
        args = tuple(t.Value(self.fresh(n), v.type) for n, v in zip(names, inits))
        scope = LoopScope(iv, args)
        self._blocks.append([])
        self._memo.append({})
        try:
            yield scope
        finally:
            ops = self._blocks.pop()
            self._memo.pop()
        if scope.yields is None:
            raise AssertionError("loop body closed without yield_()")
        scope.results = tuple(t.Value(self.fresh(f"{a.name.removesuffix('_run')}_out"), a.type) for a in args)
        self.emit(t.For(scope.results, start, stop, step, inits, t.Region(iv, args, tuple(ops), scope.yields)))

    def finish(self, grid: tuple[int | Size, ...]) -> t.TileKernel:
        """The kernel built so far (params sorted by first use)."""
        assert len(self._blocks) == 1, "a loop is still open"
        return t.TileKernel(self.name, tuple(grid), tuple(self.params.values()), tuple(self._blocks[0]))
