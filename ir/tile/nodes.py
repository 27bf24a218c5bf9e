"""The Tile IR: kernels as grids of program instances computing on tiles.

A `TileProgram` is a list of `TileKernel`s launched in order over global
buffers (its inputs, outputs and scratch temporaries). A kernel runs one
program instance per point of its `grid`; inside, each op defines SSA values
(`Value`) of static `TileType` (a dtype and a shape; shape ``()`` is a scalar).

Semantics every backend implements (the numpy interpreter in
`interpreter.py` is the executable definition):

- Elementwise ops (`Unary`, `Binary`, `Select`, `Cast`) need operands of one
  shape: broadcasting is explicit (`Broadcast`, `ExpandDims`). Arithmetic runs
  in f32/f64/integers/bool only; f16, bf16 and f8 appear in `Load`, `Store`,
  `Cast` and as `Dot` operands (compute in f32, round on store).
- ``maximum``/``minimum`` and `Reduce` max/min propagate NaN like numpy.
- `Load` reads ``buffer.flat[offsets]`` where `mask` is true, else `other`;
  masked-off offsets are never dereferenced. `Store` writes where `mask` is true.
  Offsets count elements (not bytes) and are i32, or i64 where they can pass 2**31.
- `Reduce` folds one axis away; `Dot` is ``acc + a @ b`` with products and sums
  in the accumulator dtype.
- `For` runs its `Region` for ``iv = start, start+step, ... < stop``; the
  region's `args` take `inits` on the first trip and the previous `yields`
  after; the op's `results` are the last yields (the inits when it runs 0 times).
- `TopK` is the top-k monoid of `redfuser.ir.topk` as one op with two results.
  Its candidates are (value, index) pairs along dimension `axis` of `x` (f32/f64)
  and `indices` (i32/i64); a candidate whose index is < 0 is empty (a masked
  lane) and is never kept. `out` and `out_indices` have `x`'s shape with that
  dimension replaced by k (k = ``out.shape[axis]``): the best k of the candidates
  together with the k-list `acc`/`acc_indices` when given, best first in top-k
  order -- numbers before NaN, larger values first, equal values to the lower
  index -- and slots nothing fills are empty (value NaN, index -1). With `acc`
  one op is both the chunk update of a running top-k (candidates: the chunk;
  acc: the list so far, already rescaled) and the merge of two k-lists
  (candidates: one list; acc: the other), so a split reduction's combine step and
  a fused loop use the same op. Indices are compared exactly (64-bit); values
  are compared as floats, so the scheduler casts i32/bool values to f64 (exact)
  and rounds f16/bf16 values to their type before ranking them.

Split reductions need no op of their own: a kernel runs a fused loop over one
slice of the axis (a grid dimension picks the slice) and stores its partial
states into scratch; a second kernel loops over the slices and merges them.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Union

from ..semantics import BinaryOp, ReduceOp, UnaryOp
from ..buffer import Buffer
from ..source import UNKNOWN, SourceLoc
from ..sizes import Size, SizeLike
from ..types import DType


@dataclass(frozen=True, slots=True)
class TileType:
    """A tile's element type and static shape; prints like ``f32[64,128]`` (``i32`` for a scalar)."""

    dtype: DType
    shape: tuple[int, ...] = ()

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    def with_shape(self, shape: tuple[int, ...]) -> "TileType":
        return TileType(self.dtype, tuple(shape))

    def with_dtype(self, dtype: DType) -> "TileType":
        return TileType(dtype, self.shape)

    def __str__(self) -> str:
        if not self.shape:
            return str(self.dtype)
        return f"{self.dtype}[{','.join(str(s) for s in self.shape)}]"


@dataclass(frozen=True, slots=True)
class Value:
    """An SSA value of a kernel; `name` is unique in its kernel and printed as ``%name``."""

    name: str
    type: TileType

    @property
    def dtype(self) -> DType:
        return self.type.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.shape

    def __str__(self) -> str:
        return f"%{self.name}"


Scalar = Union[float, int, bool]


@dataclass(frozen=True, slots=True)
class ProgramId:
    """This program instance's index along grid dimension `axis` (a scalar)."""

    out: Value
    axis: int
    loc: SourceLoc = field(default=UNKNOWN, compare=False)


@dataclass(frozen=True, slots=True)
class Extent:
    """A run-time extent of a shape-polymorphic kernel (`redfuser.ir.sizes`): the value of `size`, an
    expression of the symbolic lengths of the program's arrays, as a scalar of `out`'s integer type. The
    runtime evaluates every `size` a kernel reads from its arguments' shapes before the launch."""

    out: Value
    size: Size
    loc: SourceLoc = field(default=UNKNOWN, compare=False)


@dataclass(frozen=True, slots=True)
class Constant:
    """A tile of `out`'s type filled with `value`."""

    out: Value
    value: Scalar
    loc: SourceLoc = field(default=UNKNOWN, compare=False)


@dataclass(frozen=True, slots=True)
class Arange:
    """``[0, 1, ..., n-1]`` for a 1-d integer `out` of length n."""

    out: Value
    loc: SourceLoc = field(default=UNKNOWN, compare=False)


@dataclass(frozen=True, slots=True)
class Unary:
    out: Value
    op: UnaryOp
    x: Value
    loc: SourceLoc = field(default=UNKNOWN, compare=False)


@dataclass(frozen=True, slots=True)
class Binary:
    """``a op b`` elementwise; comparisons give bool."""

    out: Value
    op: BinaryOp
    a: Value
    b: Value
    loc: SourceLoc = field(default=UNKNOWN, compare=False)


@dataclass(frozen=True, slots=True)
class Select:
    """``where(cond, a, b)`` elementwise."""

    out: Value
    cond: Value
    a: Value
    b: Value
    loc: SourceLoc = field(default=UNKNOWN, compare=False)


@dataclass(frozen=True, slots=True)
class Cast:
    """`x` converted to `out`'s dtype (numpy ``astype``: round to nearest even, wrap ints)."""

    out: Value
    x: Value
    loc: SourceLoc = field(default=UNKNOWN, compare=False)


@dataclass(frozen=True, slots=True)
class Broadcast:
    """`x` repeated to `out`'s shape: `x` is a scalar, or has its rank with 1 where `out` is larger."""

    out: Value
    x: Value
    loc: SourceLoc = field(default=UNKNOWN, compare=False)


@dataclass(frozen=True, slots=True)
class ExpandDims:
    """`x` with a new dimension of size 1 inserted at `axis`."""

    out: Value
    x: Value
    axis: int
    loc: SourceLoc = field(default=UNKNOWN, compare=False)


@dataclass(frozen=True, slots=True)
class Permute:
    """`x` with dimensions reordered: ``out`` dim n is ``x`` dim ``perm[n]``."""

    out: Value
    x: Value
    perm: tuple[int, ...]
    loc: SourceLoc = field(default=UNKNOWN, compare=False)


@dataclass(frozen=True, slots=True)
class Load:
    """``buffer.flat[offsets]`` where `mask` (None: everywhere), `other` elsewhere."""

    out: Value
    buffer: Buffer
    offsets: Value
    mask: Value | None
    other: Scalar
    loc: SourceLoc = field(default=UNKNOWN, compare=False)


@dataclass(frozen=True, slots=True)
class Store:
    """``buffer.flat[offsets] = value`` where `mask` (None: everywhere)."""

    buffer: Buffer
    offsets: Value
    value: Value
    mask: Value | None
    loc: SourceLoc = field(default=UNKNOWN, compare=False)


@dataclass(frozen=True, slots=True)
class Reduce:
    """`op` over dimension `axis` of `x` (the dimension is removed)."""

    out: Value
    x: Value
    axis: int
    op: ReduceOp
    loc: SourceLoc = field(default=UNKNOWN, compare=False)


@dataclass(frozen=True, slots=True)
class Dot:
    """``acc + a @ b`` for ``a: [M,K]``, ``b: [K,N]``; computed in `out`'s dtype (f32 for low precision).
    `held`: for each operand the kernel computes in f32, the 16-bit or narrower float type numpy holds it in
    (the program's type of that operand: a softmax's ``p`` of f16 scores), else None; a code generator may
    round such an operand to that type for a narrow instruction, as numpy rounds it (`codegen.narrow_operands`)."""

    out: Value
    a: Value
    b: Value
    acc: Value | None
    loc: SourceLoc = field(default=UNKNOWN, compare=False)
    held: tuple[DType | None, DType | None] = (None, None)


@dataclass(frozen=True, slots=True)
class Region:
    """The body of a `For`: induction variable, loop-carried arguments, ops and the values yielded."""

    iv: Value
    args: tuple[Value, ...]
    ops: tuple["Op", ...]
    yields: tuple[Value, ...]


@dataclass(frozen=True, slots=True)
class For:
    """``for iv in range(start, stop, step)`` carrying `inits` -> `results` through `body`; `stop` is a
    constant or a scalar of the iv's dtype computed before the loop (a bound that depends on the program,
    such as the last key block a causal row tile can see)."""

    results: tuple[Value, ...]
    start: int
    stop: int | Value
    step: int
    inits: tuple[Value, ...]
    body: Region
    loc: SourceLoc = field(default=UNKNOWN, compare=False)


@dataclass(frozen=True, slots=True)
class TopK:
    """The best k of the candidates (`x`, `indices`) along `axis` and of the k-list `acc` (see the module docstring).

    k is ``out.shape[axis]``; `acc`/`acc_indices` are both None or both k-lists of
    `out`'s/`out_indices`' types.
    """

    out: Value
    out_indices: Value
    x: Value
    indices: Value
    axis: int
    acc: Value | None = None
    acc_indices: Value | None = None
    loc: SourceLoc = field(default=UNKNOWN, compare=False)

    @property
    def k(self) -> int:
        return self.out.shape[self.axis]


Op = Union[ProgramId, Extent, Constant, Arange, Unary, Binary, Select, Cast, Broadcast, ExpandDims, Permute,
           Load, Store, Reduce, Dot, TopK, For]
ELEMENTWISE = (Unary, Binary, Select, Cast)


def results(op: Op) -> tuple[Value, ...]:
    """The values `op` defines."""
    if isinstance(op, For):
        return op.results
    if isinstance(op, TopK):
        return (op.out, op.out_indices)
    if isinstance(op, Store):
        return ()
    return (op.out,)


def operands(op: Op) -> tuple[Value, ...]:
    """The values `op` reads directly (for `For`: its inits and a computed stop; the region reads more)."""
    if isinstance(op, Unary | Cast | Broadcast | ExpandDims | Permute):
        return (op.x,)
    if isinstance(op, Binary):
        return (op.a, op.b)
    if isinstance(op, Select):
        return (op.cond, op.a, op.b)
    if isinstance(op, Load):
        return (op.offsets,) + ((op.mask,) if op.mask is not None else ())
    if isinstance(op, Store):
        return (op.offsets, op.value) + ((op.mask,) if op.mask is not None else ())
    if isinstance(op, Reduce):
        return (op.x,)
    if isinstance(op, Dot):
        return (op.a, op.b) + ((op.acc,) if op.acc is not None else ())
    if isinstance(op, TopK):
        return tuple(v for v in (op.x, op.indices, op.acc, op.acc_indices) if v is not None)
    if isinstance(op, For):
        return op.inits + ((op.stop,) if isinstance(op.stop, Value) else ())
    return ()


def walk_ops(ops: tuple[Op, ...]):
    """Every op in `ops`, loop bodies included (pre-order)."""
    for op in ops:
        yield op
        if isinstance(op, For):
            yield from walk_ops(op.body.ops)


def drop_dead(ops: tuple[Op, ...], live: set[str]) -> tuple[Op, ...]:
    """`ops` without the pure ops whose results neither `live` nor a later op reads (stores and the loops
    holding them stay)."""
    kept: list[Op] = []
    for op in reversed(ops):
        if isinstance(op, For):
            needed = any(r.name in live for r in op.results) or any(
                isinstance(x, Store) for x in walk_ops(op.body.ops))
            if not needed:
                continue
            inner_live = set(live) | {y.name for y in op.body.yields}
            body = drop_dead(op.body.ops, inner_live)
            live |= inner_live | {v.name for v in operands(op)}
            for x in walk_ops(body):
                live |= {v.name for v in operands(x)}
            kept.append(replace(op, body=replace(op.body, ops=body)))
        elif isinstance(op, Store) or any(r.name in live for r in results(op)):
            live |= {v.name for v in operands(op)}
            kept.append(op)
    return tuple(reversed(kept))


class FreshValues:
    """New values for a rewrite of one kernel, each named after a `base` and never after a name the kernel
    takes (params, results, loop variables) or an earlier call gave: ``base``, else ``base_1``, ``base_2``..."""

    def __init__(self, k: "TileKernel") -> None:
        self.taken = {p.name for p in k.params}
        for op in walk_ops(k.body):
            self.taken.update(v.name for v in results(op))
            if isinstance(op, For):
                self.taken.update(v.name for v in (op.body.iv,) + op.body.args)

    def __call__(self, base: str, type_: TileType) -> Value:
        name, n = base, 1
        while name in self.taken:
            name, n = f"{base}_{n}", n + 1
        self.taken.add(name)
        return Value(name, type_)


@dataclass(frozen=True, slots=True)
class TileKernel:
    """One launch: `grid` program instances running `body`, over the global buffers in `params`. A grid
    dimension of a shape-polymorphic kernel may be a run-time extent (`Size`)."""

    name: str
    grid: tuple[SizeLike, ...]
    params: tuple[Buffer, ...]
    body: tuple[Op, ...]
    loc: SourceLoc = field(default=UNKNOWN, compare=False)

    @property
    def num_programs(self) -> SizeLike:
        n: SizeLike = 1
        for g in self.grid:
            n *= g
        return n

    def sizes(self) -> tuple[Size, ...]:
        """The run-time extents the body reads (`Extent` ops), each once, in order of first use: the
        kernel's size parameters."""
        seen: dict[Size, None] = {}
        for op in walk_ops(self.body):
            if isinstance(op, Extent):
                seen.setdefault(op.size, None)
        return tuple(seen)

    def stored(self) -> tuple[Buffer, ...]:
        """The buffers this kernel writes."""
        seen: dict[str, Buffer] = {}
        for op in walk_ops(self.body):
            if isinstance(op, Store):
                seen.setdefault(op.buffer.name, op.buffer)
        return tuple(seen.values())


@dataclass(frozen=True, slots=True)
class TileProgram:
    """Kernels launched in order; `scratch` buffers are temporaries the runtime allocates."""

    name: str
    inputs: tuple[Buffer, ...]
    outputs: tuple[Buffer, ...]
    scratch: tuple[Buffer, ...]
    kernels: tuple[TileKernel, ...]

    def __str__(self) -> str:
        from .printer import format_tile_program

        return format_tile_program(self)
