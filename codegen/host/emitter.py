"""`KernelEmitter`: the state of one kernel's host code generation.

The kernel becomes ``void name(ptr buf0, ..., ptr bufN, ptr sizes, i64 begin, i64 end)``
running program instances ``begin <= pid < end`` of its (flattened, row-major)
grid; the runtime splits the grid over threads. ``sizes`` points to the i64
values of the kernel's run-time extents (`size_params`: the `Extent` ops' sizes
and the grid's, evaluated by the runtime per call; a shape-polymorphic kernel's
only), null for a kernel without any.

Values are produced on demand by `elem(value, idx)`: the element of a tile at an
index (a tuple of i64 loop counters). Materialized tiles (see `plan.py`) are read
from their stack array; scalars are registers; inline tiles are recomputed by
their op's rule (one of the `inline_rules` the emitter is given: `rules.py`),
memoized per loop level so a value is emitted once per loop body; ops that run
loops of their own go to the `statement_rules` it is given (`stmts.py`). The
emitter imports neither: `module.py` hands both tables in, so imports point
one way (module -> stmts -> rules -> emitter). Integer index arithmetic
(aranges, program ids, offsets) is computed in i64 ("wide") and truncated only
where an i32 result is observed, which is exact for +, -, * and lets LLVM see
consecutive addresses.
"""
from __future__ import annotations

import math

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

import llvmlite.ir as ir

from ...ir import DType
from ...ir.sizes import Size
from ...ir.tile import nodes as t
from ...ir.types import bfloat16, row_major_strides
from ..llvm_dtypes import HOST, cast, from_memory, memory_type, register_type, to_memory
from ..llvm_utils import I64, PTR, VOID, counted_loop, entry_alloca
from ..simt.affine import Affine, AffineInfo
from .blocking import panel_columns
from .plan import plan_kernel

Idx = tuple[ir.Value, ...]
InlineRule = Callable[["KernelEmitter", t.Op, Idx], ir.Value]
StatementRule = Callable[["KernelEmitter", t.Op], None]


@dataclass(frozen=True)
class Slot:
    """A tile in memory: a row-major stack array, or (`strides` set) a load's elements read in place in its
    buffer (`KernelEmitter.global_view`), or (`panel` set) a 2-D stack array in panels of `panel` columns,
    each panel's rows one after another (a GEMM's right operand: `blocking.py`)."""

    ptr: ir.Value
    shape: tuple[int, ...]
    dtype: DType
    strides: tuple[int, ...] | None = None   # elements between neighbours along each dim (None: row-major)
    panel: int | None = None                 # columns per panel (a power of two), 2-D stack arrays only


L1_WAYS = 8
"""Associativity of the host's L1 data cache (8 on the x86-64 and aarch64 cores of this decade)."""

L1_BYTES = 32 << 10
"""Size of the host's L1 data cache (32 KiB or more on current x86-64 and aarch64 cores)."""

CONFLICT_STRIDE = 1024
"""Bytes between rows that put every row of a tile in the same few L1 sets: rows this far apart (or any
multiple) share a set once 4 KiB / 1 KiB = 4 of them are in a 4 KiB way."""


def conflicting_rows(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> bool:
    """Whether a tile that fits L1 when contiguous would thrash it read in place: more rows than `L1_WAYS` at a row stride
    that is a multiple of `CONFLICT_STRIDE` bytes (a GEMM's ``w[j, n]`` chunk of a 1024-wide f32 matrix,
    4 KiB apart, all in one set: read by every row block of the micro-kernel, it was refetched from L2
    each time; copied to the stack it stays in L1. Layer norm + GEMM 1024x1024@1024: 64 -> 102 GF/s,
    4096x1024@1024: 50 -> 99 GF/s, interleaved in one process on an AVX2 host)."""
    if len(shape) < 2 or shape[-2] <= L1_WAYS or math.prod(shape) * itemsize > L1_BYTES:
        return False     # (a tile larger than L1 is streamed from L2 wherever it lies: copying it only costs)
    return (strides[-2] * itemsize) % CONFLICT_STRIDE == 0


class KernelEmitter:
    """Emits one `TileKernel` as an LLVM function (see the module docstring)."""

    def __init__(self, module: ir.Module, kernel: t.TileKernel, fn_name: str, inline_rules: dict[type, InlineRule],
                 statement_rules: dict[type, StatementRule]) -> None:
        self.module, self.kernel = module, kernel
        self.inline_rules, self.statement_rules = inline_rules, statement_rules
        self.plan = plan_kernel(kernel)
        fnty = ir.FunctionType(VOID, [PTR] * (len(kernel.params) + 1) + [I64, I64])
        self.fn = ir.Function(module, fnty, name=fn_name)
        self.fn.attributes.add("nounwind")
        self.b = ir.IRBuilder(self.fn.append_basic_block("entry"))
        self.buffers: dict[str, ir.Value] = {}
        for buf, arg in zip(kernel.params, self.fn.args):
            arg.name = buf.name
            arg.add_attribute("noalias")
            self.buffers[buf.name] = arg
        self.size_params = size_params(kernel)
        self.sizes_arg = self.fn.args[len(kernel.params)]
        self.sizes_arg.name = "sizes"
        self.slots: dict[str, Slot] = {}
        self.stored = frozenset(op.buffer.name for op in _walk(kernel.body) if isinstance(op, t.Store))
        self.dot_rhs = frozenset(op.b.name for op in _walk(kernel.body) if isinstance(op, t.Dot))
        self.readers, self.block_of = _readers_and_blocks(kernel.body)
        # the bf16 operands of dots on AMX tiles (`amx.py`: read where they are; a bf16 ``a``'s exponents scanned
        # where it is made, ``b``'s as the dot packs it), and those that are a transpose read by their dot
        # alone (packed from the source)
        from .amx import fits    # (amx.py imports this module)
        amx_dots = [op for op in _walk(kernel.body) if isinstance(op, t.Dot) and fits(op)]
        self.amx_operands = frozenset(v.name for op in amx_dots for v in (op.a, op.b) if v.dtype == bfloat16)
        self.amx_scanned = frozenset(op.a.name for op in amx_dots if op.a.dtype == bfloat16)
        self.amx_transposed = frozenset(
            op.b.name for op in amx_dots if isinstance(self.plan.defs.get(op.b.name), t.Permute)
            and self.plan.defs[op.b.name].perm == (1, 0) and self.readers.get(op.b.name) == [op])
        self.amx_ranges: dict[str, tuple] = {}  # an AMX dot's ``a``'s `amx._Range` and its tiles (`amx.scan_a`)
        self.amx_sources: dict[str, Slot] = {}   # a transposed AMX operand packed from its source: the source
        # right operands the micro-kernel reads in panels (one width for every dot that reads them; none on AMX)
        widths: dict[str, set[int | None]] = {}
        for op in _walk(kernel.body):
            if isinstance(op, t.Dot):
                widths.setdefault(op.b.name, set()).add(None if op.b.name in self.amx_operands else panel_columns(op))
        self.panels = {name: w.pop() for name, w in widths.items() if len(w) == 1 and None not in w}
        self.scalars: dict[str, ir.Value] = {}
        self.filled: set[str] = set()   # materialized values a statement already computed (`epilogue.py`)
        self.in_place: dict[str, tuple[Slot, bool]] = {}   # dots accumulating into a loop's carried slot, and
        # whether they write their accumulator's initial value there first (stmts._in_place_dots)
        self.coords: list[ir.Value] = []
        self.trips: list = []   # the `For`s whose bodies are being emitted, innermost last (`stream_prefetch.Trip`)
        self._cache: list[dict] = [{}]
        self.zero = ir.Constant(I64, 0)

    # -- the function -----------------------------------------------------------------------------
    def build(self) -> ir.Function:
        begin, end = self.fn.args[-2], self.fn.args[-1]
        begin.name, end.name = "begin", "end"
        with counted_loop(self.b, begin, end, name="pid") as pid:
            rest: ir.Value = pid
            coords = []
            for g in reversed(self.kernel.grid):
                n = self.size(g) if isinstance(g, Size) else ir.Constant(I64, g)
                coords.append(self.b.urem(rest, n))
                rest = self.b.udiv(rest, n)
            self.coords = coords[::-1]
            self.emit_block(self.kernel.body)
        self.b.ret_void()
        return self.fn

    def size(self, size: Size) -> ir.Value:
        """The run-time extent `size` (an i64 read from the ``sizes`` argument)."""
        slot = self.b.gep(self.sizes_arg, [ir.Constant(I64, self.size_params.index(size))], inbounds=True,
                          source_etype=I64)
        return self.b.load(slot, typ=I64, name=f"n{self.size_params.index(size)}")

    def emit_block(self, ops: tuple[t.Op, ...]) -> None:
        """Emit a block of ops in order: loop-owning ops by their statement rule, scalars and materialized
        tiles computed here; other inline values are emitted later, where they are read."""
        for op in ops:
            rule = self.statement_rules.get(type(op))
            if isinstance(op, t.Permute) and op.out.name in self.amx_transposed and self._amx_source(op):
                continue
            if rule is not None:
                rule(self, op)
            elif op.out.shape == ():
                self.scalars[op.out.name] = self.inline(op.out, ())
            elif op.out.name in self.filled:
                continue
            elif op.out.name in self.plan.materialized:
                view = self.global_view(op.out)
                if view is not None:
                    self.slots[op.out.name] = view
                else:
                    self.materialize(op.out)
            for r in t.results(op):
                if r.name in self.amx_scanned and r.name in self.slots:
                    from .amx import scan_a    # (amx.py imports this module)
                    self.amx_ranges[r.name] = scan_a(self, self.slots[r.name], r.name)

    def _amx_source(self, op: t.Permute) -> bool:
        """Record the source of a transposed AMX operand (`amx_transposed`) instead of copying it, where the
        source's rows are contiguous and a whole number of 16 x 16 blocks of bf16 pairs; False: copy it."""
        columns = self._transposed_load_view(op)
        if columns is not None:      # the transpose of a load read column-wise: a view with contiguous rows
            self.slots[op.out.name] = columns
            return True
        src = self.slots.get(op.x.name) or self.global_view(op.x)
        if src is None or src.panel is not None or (src.strides is not None and (
                src.strides[-1] != 1 or src.strides[0] % 2)) or src.shape[1] % 32 or src.shape[0] % 16:
            return False
        self.amx_sources[op.out.name] = src
        return True

    def _transposed_load_view(self, op: t.Permute) -> Slot | None:
        """``x^T`` read in place where ``x`` is an unmasked affine load one element apart along its *first* dim
        (a GEMM's ``B`` block, loaded as ``[n, k]`` and transposed back: `global_view`'s conditions otherwise),
        so that ``x^T``'s rows are contiguous in the buffer."""
        found = self._in_place_load(op.x)
        if found is None or len(op.x.shape) != 2 or found[1].strides[0] != 1:
            return None
        load, form = found
        return Slot(self._first_element(load), op.out.shape, op.out.dtype, (form.strides[1], 1))

    def materialize(self, v: t.Value) -> None:
        """`v` written, element by element, to a new stack array (its slot)."""
        slot = self.new_slot(v)
        if slot.panel is not None:   # row by row, each panel's part of the row contiguous (innermost)
            # (rows outer: panels outer made LLVM's loop-load elimination take 0.5 s on the FP8 GEMM's
            # e4m3 -> f32 tile, 0.1 s this way; the copies run alike)
            rows, cols = v.shape
            with self.loop(rows, f"{v.name}.r") as r, self.loop(cols // slot.panel, f"{v.name}.p") as p:
                base = self.b.mul(p, ir.Constant(I64, slot.panel), flags=("nsw", "nuw"))
                with self.loop(slot.panel, f"{v.name}.c") as c:
                    col = self.b.add(base, c, flags=("nsw", "nuw"))
                    value = to_memory(self.b, self._exact(v, self.inline(v, (r, col))), v.dtype)
                    self.b.store(value, self.panel_address(slot, p, r, c))
            return
        with self.nest(v.shape, name=f"{v.name}.") as idx:
            self.write(slot, idx, self._exact(v, self.inline(v, idx)))

    def _in_place_load(self, v: t.Value) -> tuple[t.Load, Affine] | None:
        """``(load, affine form)`` where `v` is an unmasked load of its buffer's own dtype, from a buffer this
        kernel never stores to, at affine offsets (`codegen.simt.affine`) with one non-negative stride per dim:
        its elements can be read where they are (`global_view`, `_transposed_load_view`). None otherwise."""
        op = self.plan.defs.get(v.name)
        if (not isinstance(op, t.Load) or op.mask is not None or not v.shape or op.buffer.dtype != v.dtype
                or memory_type(v.dtype) != register_type(v.dtype) or op.buffer.name in self.stored):
            return None
        form = AffineInfo(self.plan.defs).of(op.offsets)
        if form is None or len(form.strides) != len(v.shape) or min(form.strides) < 0:
            return None
        return op, form

    def global_view(self, v: t.Value) -> Slot | None:
        """`v`'s elements where they are, when copying them to a stack array would only move them: `v` is an
        unmasked load of its buffer's own dtype whose offsets are affine (`codegen.simt.affine`) with
        non-negative strides and one element apart along the last dim, from a buffer this kernel never
        stores to. Then a dot's operand or a transpose's source is read in place (rows contiguous), as a
        stack array would be. None otherwise."""
        found = self._in_place_load(v)
        if found is None:
            return None
        op, form = found
        if form.strides[-1] != 1:
            return None
        if v.name in self.panels:
            return None    # (copied into panels: read by every row block, in order)
        if v.name in self.dot_rhs and conflicting_rows(v.shape, form.strides, v.dtype.itemsize):
            return None    # (a dot's right operand: its rows are read again by every row block)
        return Slot(self._first_element(op), v.shape, v.dtype, form.strides)

    def _first_element(self, load: t.Load) -> ir.Value:
        """The address of `load`'s element at index 0 of every dim, in its buffer."""
        base = self.wide(load.offsets, (self.zero,) * len(load.out.shape))
        return self.b.gep(self.buffers[load.buffer.name], [base], source_etype=memory_type(load.out.dtype))

    # -- elements ---------------------------------------------------------------------------------
    def elem(self, v: t.Value, idx: tuple[ir.Value, ...]) -> ir.Value:
        """`v`'s element at `idx`, in its register type (wide i64 for index arithmetic)."""
        slot = self.slots.get(v.name)
        if slot is not None and slot.panel is not None and self._in_place_load(v) is not None:
            # a load copied into panels for a dot's micro-kernel, read by something else (layer norm + GEMM's
            # column sums of `w`): from its buffer, where its rows are contiguous; the panels' addresses made
            # LLVM gather every element (6.5% of the kernel on one thread)
            return self.inline(v, idx)
        if slot is not None:
            return self.read(slot, idx if slot.shape else ())
        if v.shape == ():
            return self.scalars[v.name]
        key = (v.name, tuple(id(i) for i in idx))
        for layer in reversed(self._cache):
            if key in layer:
                return layer[key][1]
        value = self.inline(v, idx)
        self._cache[-1][key] = (idx, value)
        return value

    def inline(self, v: t.Value, idx: tuple[ir.Value, ...]) -> ir.Value:
        """`v`'s element computed by its defining op's rule (ignoring any slot of `v`)."""
        op = self.plan.defs[v.name]
        return self.inline_rules[type(op)](self, op, idx)

    def value(self, v: t.Value, idx: tuple[ir.Value, ...]) -> ir.Value:
        """`v`'s element in exactly its register type (wide values truncated)."""
        return self._exact(v, self.elem(v, idx))

    def _exact(self, v: t.Value, x: ir.Value) -> ir.Value:
        want = register_type(v.dtype)
        if isinstance(x.type, ir.VectorType):   # (a dot's epilogue evaluated on vectors: `epilogue.py`)
            return x
        return self.b.trunc(x, want) if x.type != want else x

    def memo(self) -> dict:
        """The innermost memo layer (`elem`): ``(name, ids of an index) -> (index, value)``."""
        return self._cache[-1]

    def cast(self, x: ir.Value, src: DType, dst: DType) -> ir.Value:
        """`x` (a register of `src`) converted to `dst` like numpy's ``astype`` (`codegen.llvm_dtypes.cast`)."""
        return cast(self.b, x, src, dst, HOST)

    def wide(self, v: t.Value, idx: tuple[ir.Value, ...]) -> ir.Value:
        """An integer `v`'s element as i64 (sign-extended, exact)."""
        x = self.elem(v, idx)
        return self.b.sext(x, I64) if x.type != I64 else x

    # -- stack arrays -----------------------------------------------------------------------------
    def new_slot(self, v: t.Value) -> Slot:
        n = max(1, v.type.size)
        ptr = entry_alloca(self.b, memory_type(v.dtype), name=f"{v.name}.tile", count=n, align=64)
        slot = Slot(ptr, v.shape, v.dtype, panel=self.panels.get(v.name))
        self.slots[v.name] = slot
        return slot

    def address(self, slot: Slot, idx: tuple[ir.Value, ...]) -> ir.Value:
        if slot.panel is not None:
            row, col = idx
            shift = ir.Constant(I64, slot.panel.bit_length() - 1)
            panel = self.b.lshr(col, shift)
            within = self.b.and_(col, ir.Constant(I64, slot.panel - 1))
            return self.panel_address(slot, panel, row, within)
        linear: ir.Value = self.zero
        for i, s in zip(idx, slot.strides or row_major_strides(slot.shape)):
            if s == 0:
                continue
            term = i if s == 1 else self.b.mul(i, ir.Constant(I64, s), flags=("nsw", "nuw"))
            linear = term if linear is self.zero else self.b.add(linear, term, flags=("nsw", "nuw"))
        return self.b.gep(slot.ptr, [linear], inbounds=True, source_etype=memory_type(slot.dtype))

    def panel_address(self, slot: Slot, panel: ir.Value, row: ir.Value, within: ir.Value | int) -> ir.Value:
        """The address of column `within` of `panel` in `row` of a panel-laid slot."""
        b = self.b
        rows_p = ir.Constant(I64, slot.shape[0] * slot.panel)
        linear = b.add(b.mul(panel, rows_p, flags=("nsw", "nuw")),
                       b.mul(row, ir.Constant(I64, slot.panel), flags=("nsw", "nuw")), flags=("nsw", "nuw"))
        if not (isinstance(within, int) and within == 0):
            within = ir.Constant(I64, within) if isinstance(within, int) else within
            linear = b.add(linear, within, flags=("nsw", "nuw"))
        return b.gep(slot.ptr, [linear], inbounds=True, source_etype=memory_type(slot.dtype))

    def read(self, slot: Slot, idx: tuple[ir.Value, ...]) -> ir.Value:
        raw = self.b.load(self.address(slot, idx), typ=memory_type(slot.dtype))
        return from_memory(self.b, raw, slot.dtype)

    def write(self, slot: Slot, idx: tuple[ir.Value, ...], value: ir.Value) -> None:
        self.b.store(to_memory(self.b, value, slot.dtype), self.address(slot, idx))

    # -- loops ------------------------------------------------------------------------------------
    @contextmanager
    def level(self) -> Iterator[None]:
        """A new memo layer: values emitted inside do not outlive the enclosing loop body."""
        self._cache.append({})
        try:
            yield
        finally:
            self._cache.pop()

    @contextmanager
    def loop(self, n: int, name: str, unroll: bool = True) -> Iterator[ir.Value]:
        """``for i in range(n)`` (i64), with its own memo layer; size 1 needs no loop. ``unroll=False``: LLVM
        may vectorize it but not unroll it (`llvm_utils.counted_loop`)."""
        if n == 1:
            yield self.zero
            return
        with counted_loop(self.b, self.zero, ir.Constant(I64, n), name=name, unroll=unroll) as i:
            with self.level():
                yield i

    @contextmanager
    def nest(self, shape: tuple[int, ...], name: str = "i",
             on_row: Callable[[ir.Value], None] | None = None) -> Iterator[tuple[ir.Value, ...]]:
        """Loops over every index of `shape` (last dimension innermost); `on_row(i)` is emitted at the top of
        the outermost loop's body (`stream_prefetch.py`)."""
        with self.level():
            idx: list[ir.Value] = []
            with _nested(self, shape, name, idx, on_row):
                yield tuple(idx)


@contextmanager
def _nested(em: KernelEmitter, shape: tuple[int, ...], name: str, idx: list,
            on_row: Callable[[ir.Value], None] | None) -> Iterator[None]:
    if not shape:
        yield
        return
    with em.loop(shape[0], f"{name}{len(idx)}") as i:
        idx.append(i)
        if on_row is not None and len(idx) == 1:
            on_row(i)
        with _nested(em, shape[1:], name, idx, on_row):
            yield


def _readers_and_blocks(body: tuple[t.Op, ...]) -> tuple[dict[str, list[object]], dict[int, int]]:
    """Who reads each value of a kernel (its ops, loop bodies included, a view counted as a reader of its
    source; a loop body for the values it yields), and the block (a number per op sequence) each op is in."""
    readers: dict[str, list[object]] = {}
    block_of: dict[int, int] = {}
    blocks = [0]

    def visit(ops: tuple[t.Op, ...], block: int) -> None:
        for op in ops:
            block_of[id(op)] = block
            for v in t.operands(op):
                readers.setdefault(v.name, []).append(op)
            if isinstance(op, t.For):
                for y in op.body.yields:
                    readers.setdefault(y.name, []).append(op.body)
                blocks[0] += 1
                visit(op.body.ops, blocks[0])
    visit(body, 0)
    return readers, block_of


def _walk(ops: tuple[t.Op, ...]) -> Iterator[t.Op]:
    """Every op of a block, loop bodies included."""
    for op in ops:
        yield op
        if isinstance(op, t.For):
            yield from _walk(op.body.ops)


def size_params(kernel: t.TileKernel) -> tuple[Size, ...]:
    """The run-time extents a kernel's code reads, in the order of its ``sizes`` argument: the grid's,
    then its `Extent` ops' (`TileKernel.sizes`), each once."""
    seen: dict[Size, None] = {g: None for g in kernel.grid if isinstance(g, Size)}
    seen.update((s, None) for s in kernel.sizes())
    return tuple(seen)
