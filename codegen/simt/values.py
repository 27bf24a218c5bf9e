"""A tile value as SIMT registers, and the builder the lowering emits through.

A tile of layout ``L`` is ``L.num_regs`` registers per thread, held in *chunks*:
SIMT vector registers of ``min(num_regs, 16)`` elements (one statement of SIMT
works on a whole chunk, which keeps the program short and the simulator fast).
Register ``r`` is element ``r % V`` of chunk ``r // V``.

`LoweringBuilder` is a `SimtBuilder` that can emit into an enclosing block
(``at(depth)``): a value defined outside a loop but first needed inside it is
computed in front of the loop, where the Tile IR defined it.
"""
from __future__ import annotations

import struct
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Sequence

from ...ir.errors import InternalError
from ...ir.simt.nodes import MAX_VECTOR, Reg, Stmt
from ...ir.simt.builder import SimtBuilder
from ...ir.types import DType, int32, int64
from .layouts import Layout


@dataclass(frozen=True, slots=True)
class Regs:
    """A tile value in `layout`: `chunks` hold its registers in order (see the module docstring)."""

    layout: Layout
    dtype: DType
    chunks: tuple[Reg, ...]

    @property
    def chunk_len(self) -> int:
        return chunk_len(self.layout.num_regs)


def chunk_len(num_regs: int) -> int:
    """Registers per chunk for a tile of `num_regs` registers per thread."""
    return min(num_regs, MAX_VECTOR)


class LoweringBuilder(SimtBuilder):
    """A `SimtBuilder` that can emit into an enclosing block, with memoized extracts and constants.

    `chain` lists the blocks (indices into the builder's block stack) from the
    kernel body to where statements go now; ``at(depth)`` cuts it back to an
    enclosing block, and a loop opened there nests under that block. Memo tables
    are per block and looked up along the chain, so a register is reused only
    where it is visible.
    """

    def __init__(self, name: str, *, warps: int, grid: tuple[int, ...]) -> None:
        super().__init__(name, warps=warps, grid=grid)
        self.chain: list[int] = [0]
        self._pieces: dict[int, dict[tuple, Reg]] = {0: {}}
        self.constants: dict[str, object] = {}   # register name -> value, for registers made by `const_of`

    @property
    def depth(self) -> int:
        """The nesting depth statements go to now (0: the kernel body)."""
        return len(self.chain) - 1

    def emit(self, s: Stmt) -> Stmt:
        self._blocks[self.chain[-1]].append(s)
        return s

    @contextmanager
    def at(self, depth: int) -> Iterator[None]:
        """Emit into the enclosing block at `depth` inside the ``with``."""
        if depth > self.depth:
            raise InternalError(f"emit at depth {depth} inside depth {self.depth}", pass_name="lower_to_simt")
        saved, self.chain = self.chain, self.chain[:depth + 1]
        try:
            yield
        finally:
            self.chain = saved

    def _region(self, body):
        self._blocks.append([])
        index = len(self._blocks) - 1
        saved, self.chain = self.chain, self.chain + [index]
        self._pieces[index] = {}
        try:
            yields = tuple(body() or ())
        finally:
            self.chain = saved
            del self._pieces[index]
        return tuple(self._blocks.pop()), yields

    def _recall(self, key: tuple) -> Reg | None:
        for index in reversed(self.chain):
            found = self._pieces[index].get(key)
            if found is not None:
                return found
        return None

    def _keep(self, key: tuple, reg: Reg) -> Reg:
        self._pieces[self.chain[-1]][key] = reg
        return reg

    def const_of(self, value, dtype: DType, length: int = 1) -> Reg:
        """A constant register, made once per scope."""
        key = ("const", repr(value), struct.pack("<d", value) if isinstance(value, float) else None,
               type(value).__name__, dtype.name, length)   # (bytes: -nan and nan print alike)
        found = self._recall(key)
        if found is None:
            with self.at(0):   # constants go to the top of the kernel, out of every loop
                found = self._keep(key, self.const(value, dtype, length))
            self.constants[found.name] = value
        return found

    def arith(self, op, a: Reg, b: Reg) -> Reg:
        """``a op b``, folded when both are integer constants, skipped for ``+ 0`` / ``* 1``, made once per scope."""
        from ...ir.semantics import BinaryOp

        ca, cb = self.constants.get(a.name), self.constants.get(b.name)
        if a.dtype.is_int and not a.dtype.is_bool:
            fold = {BinaryOp.ADD: lambda x, y: x + y, BinaryOp.SUB: lambda x, y: x - y,
                    BinaryOp.MUL: lambda x, y: x * y}.get(op)
            if fold is not None and ca is not None and cb is not None:
                value = fold(int(ca), int(cb))
                bits = 8 * a.dtype.itemsize - 1
                if -(1 << bits) <= value < (1 << bits):
                    return self.const_of(value, a.dtype, a.length)
            if op is BinaryOp.ADD and cb == 0 or op is BinaryOp.MUL and cb == 1 or op is BinaryOp.SUB and cb == 0:
                return a
            if op is BinaryOp.ADD and ca == 0 or op is BinaryOp.MUL and ca == 1:
                return b
            if op is BinaryOp.MUL and (ca == 0 or cb == 0):
                return self.const_of(0, a.dtype, a.length)
        key = ("arith", op, a.name, b.name)
        return self._recall(key) or self._keep(key, self.binary(op, a, b))

    def int_arith(self, op, a: Reg, b: Reg) -> Reg:
        """An `IntBinary`, made once per scope."""
        key = ("int", op, a.name, b.name)
        return self._recall(key) or self._keep(key, self.int_op(op, a, b))

    def thread_field(self, tid: Reg, coefs: Sequence[int], dtype: DType = int32) -> Reg:
        """`thread_linear` made once per scope."""
        key = ("thread", tid.name, tuple(coefs), dtype.name)
        found = self._recall(key)
        if found is None:
            with self.at(0):   # a function of the thread index only: computed once, at the top
                found = self._keep(key, thread_linear(self, tid, coefs, dtype))
        return found

    def const_vector(self, values: Sequence, dtype: DType) -> Reg:
        """A register whose element ``i`` is ``values[i]`` (one constant when they are all equal)."""
        if len(set(values)) == 1:
            return self.const_of(values[0], dtype, len(values))
        key = ("cvec", tuple(values), dtype.name)
        return self._recall(key) or self._keep(key, self.pack([self.const_of(v, dtype) for v in values]))

    def splat(self, reg: Reg, length: int) -> Reg:
        """A vector of `length` copies of the scalar `reg`."""
        if length == 1:
            return reg
        if reg.name in self.constants:
            return self.const_of(self.constants[reg.name], reg.dtype, length)
        key = ("splat", reg.name, length)
        return self._recall(key) or self._keep(key, self.pack([reg] * length))

    def piece(self, vec: Reg, index: int, length: int = 1) -> Reg:
        """Elements ``index .. index+length-1`` of `vec` (the register itself when that is all of it)."""
        if index == 0 and length == vec.length:
            return vec
        key = ("piece", vec.name, index, length)
        return self._recall(key) or self._keep(key, self.extract(vec, index, length))


def pieces(b: LoweringBuilder, regs: Regs, index: int, length: int) -> Reg:
    """Registers ``index .. index+length-1`` of `regs` as one SIMT register (`length` within one chunk)."""
    v = regs.chunk_len
    c, at = divmod(index, v)
    if at + length > v:
        raise InternalError(f"registers {index}..{index + length - 1} cross a chunk of {v}", pass_name="lower_to_simt")
    return b.piece(regs.chunks[c], at, length)


def _runs(sources: Sequence[int]) -> list[tuple[int, int]]:
    """`sources` cut into runs ``(first, length)`` of consecutive indices, each a power of two long."""
    out: list[tuple[int, int]] = []
    i = 0
    while i < len(sources):
        n = 1
        while i + n < len(sources) and sources[i + n] == sources[i] + n:
            n += 1
        while n:
            p = 1 << (n.bit_length() - 1)
            out.append((sources[i], p))
            i, n = i + p, n - p
    return out


def gather(b: LoweringBuilder, regs: Regs, sources: Sequence[int], layout: Layout) -> Regs:
    """A tile in `layout` whose register ``j`` is register ``sources[j]`` of `regs` (moves no data)."""
    v_in = regs.chunk_len
    out_len = chunk_len(len(sources))
    if list(sources) == list(range(regs.layout.num_regs)) and out_len == v_in:
        return Regs(layout, regs.dtype, regs.chunks)
    chunks = []
    for start in range(0, len(sources), out_len):
        part = list(sources[start:start + out_len])
        parts: list[Reg] = []
        for first, n in _runs(part):
            while n:   # a run may cross source chunks: split it there
                c, at = divmod(first, v_in)
                take = min(n, v_in - at)
                take = 1 << (take.bit_length() - 1)
                parts.append(b.piece(regs.chunks[c], at, take))
                first, n = first + take, n - take
        chunks.append(parts[0] if len(parts) == 1 else b.pack(parts))
    return Regs(layout, regs.dtype, tuple(chunks))


def from_registers(b: LoweringBuilder, layout: Layout, dtype: DType, parts: Sequence[Reg]) -> Regs:
    """A tile from registers in order (scalars or vectors), packed into chunks."""
    v = chunk_len(layout.num_regs)
    chunks: list[Reg] = []
    group: list[Reg] = []
    size = 0
    for p in parts:
        if p.length > v:
            raise InternalError(f"register of {p.length} elements for chunks of {v}", pass_name="lower_to_simt")
        group.append(p)
        size += p.length
        if size == v:
            chunks.append(group[0] if len(group) == 1 else b.pack(group))
            group, size = [], 0
    if group or len(chunks) * v != layout.num_regs:
        raise InternalError(f"{sum(p.length for p in parts)} registers for a layout of {layout.num_regs}",
                            pass_name="lower_to_simt")
    return Regs(layout, dtype, tuple(chunks))


def splat(b: LoweringBuilder, layout: Layout, dtype: DType, value) -> Regs:
    """A constant tile in `layout`."""
    v = chunk_len(layout.num_regs)
    c = b.const_of(value, dtype, v)
    return Regs(layout, dtype, (c,) * (layout.num_regs // v))


def map_chunks(regs: Sequence[Regs], fn) -> tuple[Reg, ...]:
    """``fn(*chunk_i)`` for each chunk index (all operands share one layout)."""
    return tuple(fn(*parts) for parts in zip(*(r.chunks for r in regs)))


def thread_linear(b: LoweringBuilder, tid: Reg, coefs: Sequence[int], dtype: DType = int32) -> Reg:
    """``sum_i bit_i(tid) * coefs[i]`` as SIMT integer code (runs of geometric coefficients as one bit field),
    in `dtype`: computed in i32 where every value fits (each field then widened), else each field is widened
    before it is scaled (a warp's row 2^31 elements into ``x``: ``warp * stride`` in i32 wrapped, and the warp
    read 4 GiB before ``x``; a stride past 2^31 was no i32 constant; found by a helper, hunt_huge/01-02)."""
    from ...ir.semantics import BinaryOp
    from ...ir.simt.nodes import IntOp

    fields: list[tuple[int, int, int]] = []        # (lowest bit, bits, coefficient)
    i = 0
    while i < len(coefs):
        if coefs[i] == 0:
            i += 1
            continue
        n = 1
        while i + n < len(coefs) and coefs[i + n] == coefs[i] << n:
            n += 1
        fields.append((i, n, coefs[i]))
        i += n
    wide = dtype != int32 and sum(((1 << n) - 1) * abs(c) for _, n, c in fields) > 2**31 - 1
    work = dtype if wide else int32
    terms: list[Reg] = []
    for i, n, coef in fields:
        field = tid
        if i:
            field = b.int_arith(IntOp.SHR, field, b.const_of(i, int32))
        if i + n < b.warps.bit_length() + 4:   # bits above the thread count are zero anyway
            field = b.int_arith(IntOp.AND, field, b.const_of((1 << n) - 1, int32))
        if wide:
            field = b.cast(field, work)
        if coef & (coef - 1) == 0 and coef > 1:
            field = b.int_arith(IntOp.SHL, field, b.const_of(coef.bit_length() - 1, work))
        elif coef != 1:
            field = b.arith(BinaryOp.MUL, field, b.const_of(coef, work))
        terms.append(field)
    if not terms:
        out = b.const_of(0, work)
    else:
        out = terms[0]
        for t in terms[1:]:
            out = b.arith(BinaryOp.ADD, out, t)
    return b.cast(out, dtype) if dtype != work else out


def index_dtype(dtype: DType) -> DType:
    """i64 for i64 indices, else i32."""
    return int64 if dtype == int64 else int32
