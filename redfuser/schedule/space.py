"""How Loop IR axes map onto a kernel: tile dimensions, fixed indices, and tiles placed on dimensions.

A Loop IR axis is bound either to a `Dim` (a tile dimension: lanes
``base + [0, size)`` of an axis of length `extent`, masked where they run past
it) or to a `Fixed` scalar index (a grid coordinate or a loop's induction
variable). A `Tiled` value is a Tile IR value together with the dims it varies
over, in the kernel's canonical order; size-1 broadcasting between tiled values
is made explicit here (`align`).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ir import BinaryOp, Buffer
from ..ir.sizes import Size, SizeLike
from ..ir.tile import nodes as t
from .builder import KernelBuilder


@dataclass(frozen=True, slots=True)
class Dim:
    """A tile dimension (see the module docstring); `order` is its canonical position in the kernel."""

    key: str
    order: int
    size: int
    extent: SizeLike
    base: t.Value | None
    masked: bool

    @staticmethod
    def make(key: str, order: int, size: int, extent: SizeLike, base: t.Value | None, covered: SizeLike) -> "Dim":
        """A dim whose lanes, over all programs or chunks, reach index `covered` (masked if > extent; always
        for a run-time extent)."""
        return Dim(key, order, size, extent, base, overhangs(covered, extent))


@dataclass(frozen=True, slots=True)
class Fixed:
    """An axis pinned to one index per program instance or loop trip (a scalar value)."""

    index: t.Value
    extent: SizeLike


Binding = Dim | Fixed


@dataclass(frozen=True, slots=True)
class Shifted:
    """A buffer dim read at ``start + step * index`` of a binding (a Loop IR `Strided` index), clamped into
    the dim where `clamp` (a piece of a concatenation: those lanes' values are discarded)."""

    of: Binding
    start: int
    step: int
    clamp: bool





def overhangs(covered: SizeLike, extent: SizeLike) -> bool:
    """Whether lanes reaching index `covered` run past an axis of `extent` (true whenever either is a
    run-time extent: the mask is then kept)."""
    if isinstance(covered, Size) or isinstance(extent, Size):
        return True
    return covered > extent


@dataclass(frozen=True, slots=True)
class Tiled:
    """`value` varies over `dims` (canonical order); its shape is the dims' sizes."""

    value: t.Value
    dims: tuple[Dim, ...]


@dataclass(frozen=True, slots=True)
class ElementOffset:
    """A load's whole element offset, computed (`ir.loop.index.flat_offset`: a reshape's positions folded into
    one affine offset); it stands in one dim's place, the other dims' positions being 0."""

    at: Tiled


Position = Binding | Shifted | int | Tiled | ElementOffset
"""How one buffer dim is addressed: a binding, a binding shifted and scaled, a fixed index, or computed
indices (an index tile over some dims, or a scalar: a reshape's positions)."""


def ordered(dims) -> tuple[Dim, ...]:
    """Distinct dims in canonical order."""
    unique = {d.key: d for d in dims}
    return tuple(sorted(unique.values(), key=lambda d: d.order))


def place(kb: KernelBuilder, x: Tiled, dims: tuple[Dim, ...]) -> t.Value:
    """`x` expanded and broadcast onto `dims` (a superset of its own, canonical order)."""
    if x.dims == dims:
        return x.value
    key = ("place", x.value.name, tuple(d.key for d in dims), tuple(d.base.name if d.base else "" for d in dims))
    found = kb.recall(key)
    if found is not None:
        return found  # type: ignore[return-value]
    shape = tuple(d.size for d in dims)
    v = x.value
    if x.dims:
        have = [d.key for d in x.dims]
        for pos, d in enumerate(dims):
            if d.key not in have:
                v = kb.expand_dims(v, pos)
                have.insert(pos, d.key)
    out = kb.broadcast(v, shape)
    return kb.remember(key, out)  # type: ignore[return-value]


def align(kb: KernelBuilder, items: list[Tiled]) -> tuple[list[t.Value], tuple[Dim, ...]]:
    """The values of `items` placed on the union of their dims."""
    dims = ordered(d for x in items for d in x.dims)
    return [place(kb, x, dims) for x in items], dims


def index_tile(kb: KernelBuilder, dim: Dim) -> Tiled:
    """The indices ``base + [0, size)`` of `dim` as a 1-d tile."""
    key = ("index", dim)
    found = kb.recall(key)
    if found is None:
        idx = kb.arange(dim.size, hint=f"ar{dim.size}")
        if dim.base is not None:
            idx = kb.binary(BinaryOp.ADD, kb.broadcast(dim.base, (dim.size,)), idx, hint=f"{dim.key}_idx")
        found = kb.remember(key, Tiled(idx, (dim,)))
    return found  # type: ignore[return-value]


def mask_tile(kb: KernelBuilder, dims: tuple[Dim, ...]) -> t.Value | None:
    """True on the lanes of `dims` (placed on `dims`) inside every axis; None when no dim is masked."""
    masked = [d for d in dims if d.masked]
    if not masked:
        return None
    key = ("mask", tuple(d.key for d in dims), tuple(masked))
    found = kb.recall(key)
    if found is not None:
        return found  # type: ignore[return-value]
    parts = []
    for d in masked:
        one = kb.recall(("mask1", d))
        if one is None:
            idx = index_tile(kb, d)
            limit = kb.const(d.extent, kb.index_dtype, (d.size,))
            one = kb.remember(("mask1", d), kb.binary(BinaryOp.LT, idx.value, limit, hint=f"{d.key}_in"))
        parts.append(place(kb, Tiled(one, (d,)), dims))  # type: ignore[arg-type]
    mask = parts[0]
    for p in parts[1:]:
        mask = kb.binary(BinaryOp.AND, mask, p, hint="mask")
    return kb.remember(key, mask)  # type: ignore[return-value]


def _is_one(stride: SizeLike) -> bool:
    return not isinstance(stride, Size) and stride == 1


def _shifted(kb: KernelBuilder, index: t.Value, pos: Shifted, size: SizeLike, hint: str) -> t.Value:
    """``start + step * index`` (a scalar or a tile of indices), clamped into ``[0, size)`` where asked."""
    idx, shape = kb.index_dtype, index.shape
    if pos.step != 1:
        index = kb.binary(BinaryOp.MUL, index, kb.const(pos.step, idx, shape), hint=hint)
    if pos.start:
        index = kb.binary(BinaryOp.ADD, index, kb.const(pos.start, idx, shape), hint=hint)
    return _clamp(kb, index, size, hint) if pos.clamp else index


def _clamp(kb: KernelBuilder, index: t.Value, size: SizeLike, hint: str = "at") -> t.Value:
    """`index` clamped into ``[0, size)`` (a computed or strided read a select discards stays in memory)."""
    idx, shape = kb.index_dtype, index.shape
    index = kb.binary(BinaryOp.MAX, index, kb.const(0, idx, shape), hint=hint)
    last = kb.binary(BinaryOp.SUB, kb.const(size, idx), kb.const(1, idx))
    return kb.binary(BinaryOp.MIN, index, kb.broadcast(last, shape), hint=hint)


def offsets(kb: KernelBuilder, buffer: Buffer, positions: list[Position]) -> Tiled:
    """Element offsets of `buffer` at `positions` (one per buffer dim)."""
    idx = kb.index_dtype
    const_part = buffer.type.base_offset   # > 0 for a view with negative strides (ir.types.BufferType)
    scalar: t.Value | None = None
    tiles: list[Tiled] = []
    for pos, stride, size in zip(positions, buffer.type.element_strides, buffer.type.shape):
        if isinstance(pos, ElementOffset):
            if pos.at.dims:
                tiles.append(pos.at)
            else:
                scalar = pos.at.value if scalar is None else kb.binary(BinaryOp.ADD, scalar, pos.at.value, hint="off")
            continue
        if buffer.type.strides is not None and stride == 0:
            continue   # a broadcast view's repeated dim (only inputs are views, so only loads get here)
        shift = pos if isinstance(pos, Shifted) else None
        bound = shift.of if shift is not None else pos
        if isinstance(bound, Tiled):
            bound = Tiled(_clamp(kb, bound.value, size), bound.dims)
            term = bound.value if _is_one(stride) else kb.binary(
                BinaryOp.MUL, bound.value, kb.const(stride, idx, bound.value.shape), hint="at_off")
            if bound.dims:
                tiles.append(Tiled(term, bound.dims))
            else:
                scalar = term if scalar is None else kb.binary(BinaryOp.ADD, scalar, term, hint="off")
        elif isinstance(bound, int):
            const_part += bound * stride
        elif isinstance(bound, Fixed):
            index = bound.index if shift is None else _shifted(kb, bound.index, shift, size, "at")
            term = index if _is_one(stride) else kb.binary(BinaryOp.MUL, index, kb.const(stride, idx))
            scalar = term if scalar is None else kb.binary(BinaryOp.ADD, scalar, term, hint="off")
        else:
            index = index_tile(kb, bound).value
            if shift is not None:
                index = _shifted(kb, index, shift, size, f"{bound.key}_at")
            term = index if _is_one(stride) else kb.binary(
                BinaryOp.MUL, index, kb.const(stride, idx, (bound.size,)), hint=f"{bound.key}_off")
            tiles.append(Tiled(term, (bound,)))
    if isinstance(const_part, Size) or const_part:
        c = kb.const(const_part, idx)
        scalar = c if scalar is None else kb.binary(BinaryOp.ADD, scalar, c, hint="off")
    if scalar is None and not tiles:
        scalar = kb.const(0, idx)
    if not tiles:
        return Tiled(scalar, ())  # type: ignore[arg-type]
    key = ("offsets", buffer.name, tuple(_position_key(p) for p in positions))
    found = kb.recall(key)
    if found is not None:
        return found  # type: ignore[return-value]
    values, dims = align(kb, tiles)
    total = values[0]
    for v in values[1:]:
        total = kb.binary(BinaryOp.ADD, total, v, hint=f"{buffer.name}_off")
    if scalar is not None:
        total = kb.binary(BinaryOp.ADD, kb.broadcast(scalar, total.shape), total, hint=f"{buffer.name}_off")
    return kb.remember(key, Tiled(total, dims))  # type: ignore[return-value]


def _position_key(p: Position) -> object:
    """What identifies a position in the offsets memo (a scalar index by its value's name)."""
    if isinstance(p, Shifted):
        return (_position_key(p.of), p.start, p.step, p.clamp)
    if isinstance(p, Tiled):
        return ("at", p.value.name)
    if isinstance(p, ElementOffset):
        return ("offset", p.at.value.name)
    return p.index.name if isinstance(p, Fixed) else p
