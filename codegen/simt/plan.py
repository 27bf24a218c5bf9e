"""Layout assignment: which tile values are computed where, before any code is emitted.

Every Tile IR value is either *concrete* — computed once, in its planned
`Layout` — or *lazy*: constants, aranges, views and elementwise ops on lazy
operands only (index arithmetic, masks), recomputed in whatever layout a
consumer asks for (no data moves, it is all per-thread arithmetic).

Anchors give concrete layouts (ARCHITECTURE.md section 6):

- `Load`: a blocked layout whose fastest dim is the one the offsets step through
  by 1 (coalesced, 16-byte vectors per thread where the tile is big enough);
- `Dot`: the mma accumulator layout on tensor cores, else a blocked one (FMA);
- `Reduce`: its input's layout with the reduced dim sliced away;
- elementwise ops take the layout of their first concrete operand;
- a `For`'s carried values take the layout their yields have, found by
  re-planning the body until it is stable (so online states stay in registers
  in one layout across the loop).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ...ir.tile import nodes as t
from ...ir.errors import BackendError
from ...ir.simt.nodes import MmaShape
from ...ir.types import bfloat16, float8_e4m3fn, float16, float32
from .affine import AffineInfo
from .layouts import Layout, blocked, default_vec, mma_acc, scalar, sliced
from .options import GpuOptions
from .tma import TmaOperand, plan_tma
from .wgmma import WgmmaPlan, wgmma_plan

LAZY_OPS = (t.Constant, t.Arange, t.Broadcast, t.ExpandDims, t.Permute)
MMA_SHAPES = {float16: MmaShape.M16N8K16_F16, bfloat16: MmaShape.M16N8K16_BF16, float8_e4m3fn: MmaShape.M16N8K32_E4M3}


@dataclass(frozen=True, slots=True)
class DotPlan:
    """How one `Dot` runs: on warpgroup tensor cores (`wgmma`, sm_90a), on warp tensor cores (`mma` names
    the instruction) or as FMA (both None)."""

    mma: MmaShape | None
    layout: Layout
    wgmma: WgmmaPlan | None = None


@dataclass
class Plan:
    """The layout plan of one kernel (see the module docstring)."""

    warps: int
    defs: dict[str, t.Op] = field(default_factory=dict)
    depth: dict[str, int] = field(default_factory=dict)
    layouts: dict[str, Layout | None] = field(default_factory=dict)   # concrete values (None: not known yet)
    lazy: set[str] = field(default_factory=set)
    dots: dict[str, DotPlan] = field(default_factory=dict)
    reduce_in: dict[str, Layout] = field(default_factory=dict)
    affine: AffineInfo | None = None
    wgmma: bool = True                      # whether dots may run on wgmma (where `wgmma_plan` allows)
    tma: dict[str, TmaOperand] = field(default_factory=dict)   # wgmma operands the copy engine stages (`tma.py`)

    def is_lazy(self, v: t.Value) -> bool:
        return v.name in self.lazy

    def copied(self, op: t.Op) -> bool:
        """Whether `op` is a load the copy engine does instead of the threads (`tma.py`): not emitted where
        it stands (a dot whose staging point cannot use the copy loads it on request)."""
        return isinstance(op, t.Load) and any(o.load is op for o in self.tma.values())


def mma_shape(op: t.Dot, opts: GpuOptions) -> MmaShape | None:
    """The tensor-core instruction for `op` on `opts.sm`, or None (FMA)."""
    shape = MMA_SHAPES.get(op.a.dtype)
    if shape is None or op.b.dtype != op.a.dtype or op.out.dtype != float32:
        return None
    if shape is MmaShape.M16N8K32_E4M3 and opts.sm_number < 89:
        return None
    if opts.sm_number < 80:     # (m16n8k16 of f16/bf16 needs sm_80; sm_75 takes the FMA path, as e4m3 below 89)
        return None
    (m, k), n = op.a.shape, op.b.shape[1]
    if m % 16 or n % 8 or k % shape.k:
        return None
    return shape


def load_order(op: t.Load | t.Store, shape: tuple[int, ...], affine: AffineInfo) -> tuple[int, ...]:
    """Dims fastest first: the one the offsets step through by 1 leads (coalescing), then the others from the last."""
    rank = len(shape)
    form = affine.of(op.offsets)
    fast = next((d for d in reversed(range(rank)) if shape[d] > 1 and form is not None and form.strides[d] == 1),
                next((d for d in reversed(range(rank)) if shape[d] > 1), rank - 1))
    return (fast,) + tuple(d for d in reversed(range(rank)) if d != fast)


def memory_layout(op: t.Load | t.Store, shape: tuple[int, ...], itemsize: int, plan: Plan) -> Layout:
    """The blocked layout a load (or a store of a lazy value) uses."""
    if not shape:
        return scalar(plan.warps)
    return blocked(shape, plan.warps, load_order(op, shape, plan.affine), default_vec(shape, plan.warps, itemsize))


def default_layout(shape: tuple[int, ...], warps: int, itemsize: int = 4) -> Layout:
    """A blocked layout, last dim fastest."""
    return blocked(shape, warps, None, default_vec(shape, warps, itemsize)) if shape else scalar(warps)


class _Planner:
    def __init__(self, plan: Plan, opts: GpuOptions) -> None:
        self.plan, self.opts = plan, opts

    def known(self, v: t.Value) -> Layout | None:
        return self.plan.layouts.get(v.name)

    def concrete(self, v: t.Value, layout: Layout | None) -> None:
        self.plan.layouts[v.name] = layout
        self.plan.lazy.discard(v.name)

    def ops(self, ops: tuple[t.Op, ...], depth: int) -> None:
        for op in ops:
            for r in t.results(op):
                self.plan.defs[r.name] = op
                self.plan.depth[r.name] = depth
            rule = _RULES.get(type(op))
            if rule is None:
                raise BackendError(f"the GPU backends (cuda, simulate) cannot lower the Tile IR op "
                                   f"{type(op).__name__} yet; use backend='cpu' or 'interpret'")
            rule(self, op, depth)


def _scalar_or_lazy(p: _Planner, op: t.Op, depth: int) -> None:
    out = op.out
    if isinstance(op, LAZY_OPS) and out.shape:
        p.plan.lazy.add(out.name)
    elif not out.shape:
        p.concrete(out, scalar(p.plan.warps))
    else:
        p.plan.lazy.add(out.name)


def _elementwise(p: _Planner, op: t.Op, depth: int) -> None:
    out = op.out
    if not out.shape:
        p.concrete(out, scalar(p.plan.warps))
        return
    unknown = False
    for v in t.operands(op):
        if v.name in p.plan.lazy or v.shape != out.shape:
            continue
        layout = p.known(v)
        if layout is not None:
            p.concrete(out, layout)
            return
        unknown = True
    if unknown:
        p.concrete(out, None)
    else:
        p.plan.lazy.add(out.name)


def _load(p: _Planner, op: t.Load, depth: int) -> None:
    if op.offsets.name not in p.plan.lazy and op.out.shape and p.known(op.offsets) is not None \
            and p.plan.affine.of(op.offsets) is None:
        p.concrete(op.out, p.known(op.offsets))   # gathered offsets: load where they are
        return
    p.concrete(op.out, memory_layout(op, op.out.shape, op.out.dtype.itemsize, p.plan))


def _reduce(p: _Planner, op: t.Reduce, depth: int) -> None:
    layout = None if op.x.name in p.plan.lazy else p.known(op.x)
    if layout is None:
        layout = default_layout(op.x.shape, p.plan.warps)
    p.plan.reduce_in[op.out.name] = layout
    p.concrete(op.out, sliced(layout, op.axis))


def _dot(p: _Planner, op: t.Dot, depth: int) -> None:
    shape = mma_shape(op, p.opts)
    wgmma = wgmma_plan(op, p.opts.sm, p.plan.warps) if p.plan.wgmma else None
    m, n = op.out.shape
    tensor_cores = shape is not None or wgmma is not None    # (wgmma's accumulator is the mma one: `wgmma.py`)
    layout = mma_acc(m, n, p.plan.warps) if tensor_cores else default_layout(op.out.shape, p.plan.warps)
    p.plan.dots[op.out.name] = DotPlan(shape, layout, wgmma)
    p.concrete(op.out, layout)


def _for(p: _Planner, op: t.For, depth: int) -> None:
    body = op.body
    p.plan.defs[body.iv.name] = op
    p.plan.depth[body.iv.name] = depth + 1
    p.concrete(body.iv, scalar(p.plan.warps))
    layouts: list[Layout | None] = [None if v.name in p.plan.lazy else p.known(v) for v in op.inits]
    for _ in range(4):
        for a, layout in zip(body.args, layouts):
            p.plan.defs[a.name] = op
            p.plan.depth[a.name] = depth + 1
            p.concrete(a, layout)
        p.ops(body.ops, depth + 1)
        found = []
        for y, init, old in zip(body.yields, op.inits, layouts):
            got = None if y.name in p.plan.lazy else p.known(y)
            if got is None:
                got = old if old is not None else (None if init.name in p.plan.lazy else p.known(init))
            if got is None:
                got = default_layout(y.shape, p.plan.warps, y.dtype.itemsize)
            found.append(got)
        if found == layouts:
            break
        layouts = found
    for a, r, layout in zip(body.args, op.results, layouts):
        p.concrete(a, layout)
        p.concrete(r, layout)


def _store(p: _Planner, op: t.Store, depth: int) -> None:
    pass


_RULES = {
    t.ProgramId: _scalar_or_lazy,
    t.Extent: _scalar_or_lazy,
    t.Constant: _scalar_or_lazy,
    t.Arange: _scalar_or_lazy,
    t.Broadcast: _scalar_or_lazy,
    t.ExpandDims: _scalar_or_lazy,
    t.Permute: _scalar_or_lazy,
    t.Unary: _elementwise,
    t.Binary: _elementwise,
    t.Select: _elementwise,
    t.Cast: _elementwise,
    t.Load: _load,
    t.Store: _store,
    t.Reduce: _reduce,
    t.Dot: _dot,
    t.For: _for,
}


def plan_rule(*types: type):
    """Register a planning rule ``rule(planner, op, depth)`` for ops of `types` (rules in other modules)."""
    def register(fn):
        for typ in types:
            _RULES[typ] = fn
        return fn
    return register


DEFAULT_WARPS = 4
"""Warps a block when the kernel option leaves it open, unless `ELEMENTS_PER_THREAD` asks for more."""

ELEMENTS_PER_THREAD = 32
"""Without a ``num_warps`` option, a kernel that is one tile of work (no tensor-core product, no loop: a
whole-row softmax, an elementwise nest) gets enough warps (up to 16) that a thread holds at most this many
elements of its largest tile. Other kernels keep `DEFAULT_WARPS`: a ``dot``'s largest tiles are accumulators
spread over the mma layout, and a loop carries its tiles from one iteration to the next; both ran slower
at 8 warps (docs/gpu-backend.md, "Why these defaults")."""


WGMMA_TILE_ROWS = 128
"""Without a ``num_warps`` option, on ``sm_90a`` a kernel whose dots have output tiles of this many rows
(attention's 128-row query tiles at head 64, `schedule.options.WIDE_ROWS`) gets 8 warps: two warpgroups,
one m64 slice each, instead of one warpgroup holding both. On an H200 (benchmarks/device_notes.md, run 10)
that took f16 attention from 1.96 to 1.58 ms at [4,16,4096,64] (183 to 106 registers a thread, twice the
resident warps); the same rule on ``mma.sync`` was slower (run 2), so it is the wgmma plan's alone."""


def choose_warps(k: t.TileKernel, opts: GpuOptions, wgmma: bool = True) -> int:
    """`opts.num_warps` (None: see `ELEMENTS_PER_THREAD` and `WGMMA_TILE_ROWS`), fewer when the kernel's
    largest tile would leave threads idle."""
    biggest = max((r.type.size for op in t.walk_ops(k.body) for r in t.results(op)), default=1)
    warps = opts.num_warps
    if warps is None:
        warps = DEFAULT_WARPS
        if wgmma and any(isinstance(op, t.Dot) and op.a.shape[0] % WGMMA_TILE_ROWS == 0
                         and wgmma_plan(op, opts.sm, 2 * DEFAULT_WARPS) is not None for op in t.walk_ops(k.body)):
            warps = 2 * DEFAULT_WARPS
        if not any(isinstance(op, t.Dot | t.For) for op in t.walk_ops(k.body)):
            while warps < 16 and biggest > 32 * warps * ELEMENTS_PER_THREAD:
                warps *= 2
    while warps > 1 and biggest < 64 * warps:
        warps //= 2
    return warps


def plan_kernel(k: t.TileKernel, opts: GpuOptions, wgmma: bool = True) -> Plan:
    """The layout plan of `k` (see the module docstring); `BackendError` on an op with no GPU lowering.
    `wgmma` False keeps every dot off ``wgmma`` (its operand tiles did not fit in shared memory)."""
    plan = Plan(choose_warps(k, opts, wgmma), wgmma=wgmma)
    defs: dict[str, t.Op] = {}
    for op in t.walk_ops(k.body):
        for r in t.results(op):
            defs[r.name] = op
        if isinstance(op, t.For):
            for v in (op.body.iv,) + op.body.args:
                defs[v.name] = op
    plan.affine = AffineInfo(defs)
    for op in t.walk_ops(k.body):
        for v in t.results(op):
            if not all(s & (s - 1) == 0 and s > 0 for s in v.shape):
                raise BackendError(f"the GPU backends need power-of-two tile shapes, {v} is {v.type} "
                                   "(schedule with pow2=True, the GPU default)")
    _Planner(plan, opts).ops(k.body, 0)
    if opts.tma and wgmma:
        plan.tma = plan_tma(k, plan.dots, plan.defs, plan.affine)
    return plan
