"""The environment of one kernel's lowering: tile values as registers, by (value, layout).

`Lowering.get(value, layout)` is the one way a rule reads an operand: a
concrete value is computed once in its planned layout (where its Tile IR op
stands, or for elementwise ops where it is first needed, in the block that
defines it) and converted on request (`convert.py`); a lazy value is computed
in the requested layout. Results are memoized per scope (a loop body's
registers are not visible after the loop). Rules live in tables keyed by Tile
IR op type: `VALUE_RULES` compute an op's result in a layout, `EFFECT_RULES`
emit stores and loops in program order.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

from ...ir.sizes import Size
from ...ir.tile import nodes as t
from ...ir.errors import BackendError, InternalError
from ...ir.simt.nodes import Reg, SharedAlloc
from ...ir.types import BufferType, DType
from .convert import convert
from .layouts import Layout, scalar
from .options import GpuOptions
from .plan import Plan
from .values import LoweringBuilder, Regs

ValueRule = Callable[["Lowering", t.Op, Layout], Regs]
EffectRule = Callable[["Lowering", t.Op], None]
VALUE_RULES: dict[type, ValueRule] = {}
EFFECT_RULES: dict[type, EffectRule] = {}
EAGER = (t.Load, t.Reduce, t.Dot)   # concrete anchors, computed where they stand


def value_rule(*types: type) -> Callable[[ValueRule], ValueRule]:
    """Register a rule computing the result of ops of `types` in a given layout."""
    def register(fn: ValueRule) -> ValueRule:
        for typ in types:
            VALUE_RULES[typ] = fn
        return fn
    return register


def effect_rule(*types: type) -> Callable[[EffectRule], EffectRule]:
    """Register a rule for ops emitted for their effect (stores, loops)."""
    def register(fn: EffectRule) -> EffectRule:
        for typ in types:
            EFFECT_RULES[typ] = fn
        return fn
    return register


@dataclass(frozen=True, slots=True)
class LoopFrame:
    """A SIMT loop whose body is being emitted: ``for iv in range(start, stop, step)`` with `trips` iterations
    when static (None: a run-time stop), its body at builder depth `depth`, the Tile IR loop's counter named
    `tile_iv`. A statement at depth ``d`` runs inside the frames of depth ``<= d``; `tma.py` derives an
    mbarrier's phase from them, and where a copy's next iteration starts."""

    iv: Reg
    start: int
    stop: Reg | int
    step: int
    trips: int | None
    depth: int
    tile_iv: str


class Lowering:
    """One kernel being lowered: the plan, the builder, the register environment and the shared arenas."""

    def __init__(self, kernel: t.TileKernel, plan: Plan, opts: GpuOptions, builder: LoweringBuilder,
                 alternate: bool = True) -> None:
        self.kernel, self.plan, self.opts, self.b = kernel, plan, opts, builder
        self.memo: dict[int, dict[tuple[str, Layout], Regs]] = {0: {}}   # per block of the builder
        self.arenas: dict[str, SharedAlloc] = {}
        self.arena_size: dict[str, int] = {}
        self.alternate = alternate                     # conversions alternate between two arrays a dtype
        self._turn: dict[str, int] = {}
        self.tid: Reg = builder.thread_idx()
        self.scalar = scalar(plan.warps)
        self.size_regs: dict[tuple[Size, DType], Reg] = {}   # run-time extents: kernel parameters
        self.loops: list[LoopFrame] = []                   # the SIMT loops being emitted, outermost first
        self.tma_stages = opts.tma_stages                   # a TMA ring's stages (`tma.ring_stages`)
        self.ring_bytes = 0                                # the shared bytes the rings' extra stages take
        self.ring_budget: int | None = None                # at most this many (None: no limit but the target's)

    def size_param(self, size: Size, dtype: DType) -> Reg:
        """The run-time extent `size` as a scalar kernel parameter of `dtype` (one per extent and dtype; the
        runtime evaluates it per launch from the arguments' shapes: `SimtKernel.sizes`)."""
        key = (size, dtype)
        reg = self.size_regs.get(key)
        if reg is None:
            reg = self.size_regs[key] = self.b.scalar_param(f"n{len(self.size_regs)}", dtype)
        return reg

    # --- the environment -------------------------------------------------------------------------

    def _lookup(self, key: tuple[str, Layout]) -> Regs | None:
        for index in reversed(self.b.chain):
            found = self.memo[index].get(key)
            if found is not None:
                return found
        return None

    def _remember(self, key: tuple[str, Layout], regs: Regs) -> Regs:
        self.memo[self.b.chain[-1]][key] = regs
        return regs

    def bind(self, v: t.Value, regs: Regs) -> Regs:
        """Record `v`'s registers (in `regs.layout`) in the current scope."""
        return self._remember((v.name, regs.layout), regs)

    def planned(self, v: t.Value) -> Layout:
        layout = self.plan.layouts.get(v.name)
        if layout is None:
            raise InternalError(f"no layout planned for {v}", pass_name="lower_to_simt")
        return layout

    def get(self, v: t.Value, layout: Layout | None = None) -> Regs:
        """`v`'s registers in `layout` (None: its planned layout), computed or converted on first request."""
        if not v.shape:
            layout = self.scalar
        lazy = self.plan.is_lazy(v)
        if layout is None:
            layout = self.planned(v)
        found = self._lookup((v.name, layout))
        if found is not None:
            return found
        depth = self.plan.depth.get(v.name, 0)
        with self.b.at(min(depth, self.b.depth)):
            if lazy:
                regs = self._compute(v, layout)
            else:
                home = self.planned(v)
                base = self._lookup((v.name, home))
                if base is None:
                    base = self._remember((v.name, home), self._compute(v, home))
                regs = convert(self, base, layout)
            self._remember((v.name, layout), regs)
        return regs

    def _compute(self, v: t.Value, layout: Layout) -> Regs:
        op = self.plan.defs.get(v.name)
        rule = VALUE_RULES.get(type(op))
        if rule is None or isinstance(op, t.For):
            raise InternalError(f"{v} has no registers yet (defined by {type(op).__name__})", pass_name="lower_to_simt")
        regs = rule(self, op, layout)
        if regs.layout != layout or regs.dtype != v.dtype:
            raise InternalError(f"rule for {type(op).__name__} gave {regs.dtype} in {regs.layout.kind}, "
                                f"wanted {v.dtype} in {layout.kind}", pass_name="lower_to_simt")
        return regs

    @contextmanager
    def region(self) -> Iterator[None]:
        """A loop body's scope of tile registers (enter it inside the builder's region)."""
        index = self.b.chain[-1]
        self.memo[index] = {}
        try:
            yield
        finally:
            del self.memo[index]

    def emit_ops(self, ops: tuple[t.Op, ...]) -> None:
        """Emit a block: anchors and effects in program order; other values wait until someone reads them."""
        for op in ops:
            if isinstance(op, EAGER):
                if not self.plan.copied(op):
                    self.get(op.out)
            elif type(op) in EFFECT_RULES:
                EFFECT_RULES[type(op)](self, op)
            elif type(op) not in VALUE_RULES:
                raise BackendError(f"the GPU backends (cuda, simulate) cannot lower the Tile IR op "
                                   f"{type(op).__name__} yet; use backend='cpu' or 'interpret'")

    # --- shared memory -----------------------------------------------------------------------------

    def arena(self, dtype: DType, elements: int, alternate: bool = False) -> SharedAlloc:
        """The block's shared scratch array for `dtype`, sized at the end to its largest use.

        Every use starts with a barrier (an earlier use may still be reading it). With `alternate` (layout
        conversions, while `self.alternate`), successive uses take two arrays in turn, so that a loop
        converting two tiles gives each its own and `barriers.drop_redundant_barriers` can see that the
        barrier in front of each is covered by the other's."""
        name = f"smem_{dtype.name}"
        if alternate and self.alternate:
            turn = self._turn.get(name, 0)
            self._turn[name] = 1 - turn
            name = f"{name}_{'ab'[turn]}"
        self.arena_size[name] = max(self.arena_size.get(name, 0), elements)
        if name not in self.arenas:
            self.arenas[name] = SharedAlloc(name, BufferType(dtype, (1,)))
        return self.arenas[name]
