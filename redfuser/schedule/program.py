"""`schedule_program`: the scheduling pass, Loop IR -> Tile IR.

Guarantees: the Tile IR it returns is verified and computes the same outputs as
the Loop IR program on every input (checked in tests by running both
interpreters). Kernels run in program order:

- each `FusedLoop` becomes one kernel, joined by the `Compute` nests right after
  it that read its states pointwise (the epilogue, e.g. ``out = acc / l``) and by
  a closing *sweep*, one more nest with an axis of the loop's length walked in
  chunks after it (softmax's ``exp(x - m) / l``); or, split (`split.py`, flash
  decoding), two: partial states per slice of the axis into scratch, then their
  merge by the cascade's merge rule and the epilogue (a sweep then runs as a
  kernel of its own, over the whole grid);
- a `TopK` nest becomes a kernel keeping a sorted k-list per row (`topk.py`);
- every other nest becomes its own kernel; nests whose result nobody reads are dropped;
- buffers passed between kernels become scratch buffers; values used only inside
  a kernel (locals, running states) never touch memory.

Offsets are i32 unless some buffer of a kernel (padded to whole tiles) reaches 2**31 elements.
"""
from __future__ import annotations

import math
from dataclasses import replace

from ..ir import BackendError, Buffer, Compute, FusedLoop, Program, Reduce, Stmt, TopK, loads, written
from ..ir.source import UNKNOWN
from ..ir.sizes import is_static
from ..ir.tile import nodes as t
from ..ir.tile.verifier import verify_tile_program
from ..ir.types import int32, int64
from .cleanup import cleanup_kernel
from .fused import fused_kernel, joins, layout_or_fail
from .nests import compute_kernel, reduce_kernel
from .options import ScheduleOptions
from .shifted_exp import flush_safe_exps, max_shifted_exps
from .split import plan_split, scratch_of, split_kernels
from .topk import topk_kernel

Group = list[Stmt]


def _reads(s: Stmt) -> set[str]:
    """Names of the buffers a statement reads from outside itself."""
    if isinstance(s, FusedLoop):
        inner = {l.out.name for l in s.locals} | {st.prev.name for st in s.states} | {st.acc.name for st in s.states}
        names = {b.buffer.name for l in s.locals for b in loads(l.value)}
        for st in s.states:
            names |= {b.buffer.name for b in loads(st.term)}
            for e in (st.rescale, getattr(st, "carry", None)):
                if e is not None:
                    names |= {b.buffer.name for b in loads(e)}
        return names - inner
    return {b.buffer.name for b in loads(s.value)}


def group_statements(p: Program) -> list[Group]:
    """Statements grouped into kernels (a fused loop takes its pointwise epilogue along)."""
    groups: list[Group] = []
    for s in p.body:
        last = groups[-1] if groups else None
        if (isinstance(s, Compute) and last is not None and isinstance(last[0], FusedLoop)
                and joins(last[0], list(last[1:]), s)):  # type: ignore[arg-type]
            last.append(s)
        else:
            groups.append([s])
    return groups


def _sweeps_of_split_loops_apart(groups: list[Group], opts: ScheduleOptions) -> list[Group]:
    """`groups` with the closing sweep of a fused loop that will be split made a group of its own: a split
    loop ends in a merge over few programs, and the sweep is better run over the whole grid."""
    out: list[Group] = []
    for group in groups:
        head = group[0]
        lay = layout_or_fail(head, group[1:]) if isinstance(head, FusedLoop) and len(group) > 1 else None  # type: ignore[arg-type]
        # (the split asked with the sweep: the cpu's row tile, which only a loop with a sweep takes, sets the
        # programs and chunks the split is planned from)
        if lay is not None and lay.sweep_key is not None and plan_split(lay, opts) is not None:
            out += [group[:-1], group[-1:]]
        else:
            out.append(group)
    return out


def _needs_i64(buffers: list[Buffer], opts: ScheduleOptions, row_tiled: bool = False,
               extents: tuple[int, ...] = ()) -> bool:
    # with power-of-two tiles a chunk overhangs its axis by less than the chunk: 2 x 64 covers a 128 chunk;
    # the cpu's fused-contraction tiles may be larger than the blocks
    pad = max(opts.rows(), opts.block_n, opts.k_block(), *(opts.dot_tile or ()), *(opts.gemm_tile or ()))
    pad *= 2 if opts.pow2 else 1
    # a row tile (`layout.row_tile`, `row_tiled`) is no longer than its axes (no power-of-two tiles where it
    # applies), so it pads each of the two axes it tiles to less than twice their length: 4x the offsets
    grow = 4 if row_tiled else 1
    def padded(s: int) -> int:
        """An axis of `s` and the most a tile overhangs it: less than the tile, which is never longer than the
        axis (`ScheduleOptions.tile`; rounded up to a power of two with `pow2`)."""
        return s + min(pad, 1 << (s - 1).bit_length() if opts.pow2 and s > 0 else s)

    for b in buffers:
        if not all(is_static(n) for n in b.shape):
            return True    # a run-time extent may be long: offsets in i64
        if b.type.strides is None:
            n = 1
            for s in b.shape:
                n *= padded(s)
        else:   # a view: its offsets run from its lowest element with its own strides (ir.types.BufferType)
            n = b.type.base_offset + 1 + sum((padded(s) - 1) * abs(st) for s, st in zip(b.shape, b.type.strides))
        if n * grow >= 2**31:
            return True
    # a loop index, a position (`arange`, an argmax's index) or a count runs to its iteration's extent, which
    # a small buffer does not bound: a sum of a zero-stride broadcast view of 2^31 + 7 elements gave 7
    return any(not is_static(e) or padded(e) >= 2**31 for e in extents)


def _extents(group: Group) -> tuple[int, ...]:
    """The lengths the group's loops run to: each axis, and all of a reduction's axes together (reduced as
    one run of elements)."""
    out: list[int] = []
    for s in group:
        subs = list(s.locals) if isinstance(s, FusedLoop) else [s]
        if isinstance(s, FusedLoop):
            out.append(s.axis.extent)
        for x in subs + [s]:
            out += [a.extent for a in getattr(x, "axes", ())]
            if isinstance(x, TopK):
                out.append(x.reduce_axis.extent)
            if isinstance(x, Reduce):
                out.append(math.prod((a.extent for a in x.reduce_axes), start=1))
    return tuple(out)


def _buffers(group: Group) -> list[Buffer]:
    out: list[Buffer] = []
    for s in group:
        subs = list(s.locals) if isinstance(s, FusedLoop) else [s]
        for x in subs:
            out += list(written(x)) + [ld.buffer for ld in loads(x.value)]
        if isinstance(s, FusedLoop):
            for st in s.states:
                out += [st.acc] + [ld.buffer for ld in loads(st.term)]
    return out


def schedule_program(p: Program, opts: ScheduleOptions | None = None) -> t.TileProgram:
    """Tile `p` (see the module docstring); the result is verified."""
    opts = opts or ScheduleOptions()
    if opts.shifted_exp:
        shifted = max_shifted_exps(p)
        flushable = flush_safe_exps(p, shifted) if opts.flush_shifted_exp else frozenset()
        opts = replace(opts, shifted_exps=shifted, flushable_exps=flushable)
    groups = _sweeps_of_split_loops_apart(group_statements(p), opts)
    outputs = {b.name for b in p.outputs}
    kernels: list[t.TileKernel] = []
    scratch: dict[str, Buffer] = {}
    for g, group in enumerate(groups):
        later = set().union(*(_reads(s) for other in groups[g + 1:] for s in other))
        made = [b for s in group for b in written(s)]
        needed = {b.name for b in made if b.name in outputs or b.name in later}
        if not needed:
            continue  # nothing it computes is used
        for b in made:
            if b.name in needed and b.name not in outputs:
                scratch[b.name] = b
        head = group[0]
        lay = layout_or_fail(head, group[1:]) if isinstance(head, FusedLoop) else None  # type: ignore[arg-type]
        plan = plan_split(lay, opts) if lay is not None else None
        parts = scratch_of(head, plan) if plan is not None else []  # type: ignore[arg-type]
        row_tiled = lay is not None and lay.row_tile(opts) is not None
        index = int64 if _needs_i64(_buffers(group) + parts, opts, row_tiled, _extents(group)) else int32
        name = f"{p.name}_{len(kernels)}"
        made_here: tuple[t.TileKernel, ...]
        try:
            if isinstance(head, FusedLoop) and plan is not None:
                made_here = split_kernels(head, list(group[1:]), needed, plan, name, opts, index,  # type: ignore[arg-type]
                                          later)
                scratch.update({b.name: b for b in parts})
            elif isinstance(head, FusedLoop):
                made_here = (fused_kernel(head, list(group[1:]), needed, name, opts, index,  # type: ignore[arg-type]
                                          later),)
            elif isinstance(head, TopK):
                made_here = (topk_kernel(head, name, opts, index, needed,
                                         frozenset(b.name for st in p.body for b in written(st))),)
            elif isinstance(head, Reduce):
                made_here = (reduce_kernel(head, name, opts, index),)
            else:
                made_here = (compute_kernel(head, name, opts, index),)
        except BackendError as err:    # a limit met deep in the schedule: shown at the statement's line
            if err.loc is not None or getattr(head, "loc", None) in (None, UNKNOWN):
                raise
            raise BackendError(err.message, op=err.op, loc=head.loc) from None
        kernels += [cleanup_kernel(k) for k in made_here]
    tiled = t.TileProgram(p.name, p.inputs, p.outputs, tuple(scratch.values()), tuple(kernels))
    return verify_tile_program(tiled, pass_name="schedule")
