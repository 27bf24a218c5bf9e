"""Cascade analysis: which reductions can share one pass over their axis.

A *cascade group* is a list of single-axis reductions over axes of one length,
in program order, each linked to the group by a dependency (it reads an earlier
member's result) or by reading one of the group's inputs along the reduced axis
(one pass reads the data once). A reduction may only join when nothing else it
reads depends on the group: that would need the group's final results first;
nor when it would make two groups need each other's results (it reads another
group's results, and that group reads the group's: a CLIP loss's row and column
softmaxes, each summed with the other's denominators, made two loops each needing
the other's results first, an internal error on every backend).

A lone reduction is a group of one where a later nest sweeps its row again
(`swept_later`: a row normalized by its own statistic), so both share a kernel.

The analysis only *proposes* groups; `redfuser.fusion.rewrite` decides, member
by member, whether each body factors (the fusion theorem) and builds the loop.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..ir import Axis, Compute, Load, Program, reads_axis, walk, written
from ..ir.loop.rewrite import reads
from .member import Member, as_member


@dataclass
class Candidate:
    """A proposed cascade: reductions over one axis length, in program order."""

    extent: int
    members: list[Member] = field(default_factory=list)
    signature: set[tuple[str, int]] = field(default_factory=set)  # (buffer, dim) read along the axis

    @property
    def outs(self) -> set[str]:
        return {b.name for m in self.members for b in written(m.stmt)}


def axis_signature(r: Member) -> set[tuple[str, int]]:
    """The (buffer, dimension) pairs `r` reads along its reduced axis."""
    axis = r.reduce_axis
    return {(n.buffer.name, d) for n in walk(r.value) if isinstance(n, Load)
            for d, i in enumerate(n.indices) if reads_axis(i, axis.name)}


def reads_own_rows(r: Member, outs: set[str]) -> bool:
    """Whether every read of a result in `outs` by `r` is at `r`'s own position: an axis at each dim, or 0 of
    a length-1 dim (``keepdims``). A result read at another fixed position (row 6 of a sum, for every row of
    `r`) belongs to another program of the loop and is final only after it, so `r` cannot join that pass."""
    return all(isinstance(i, Axis) or size == 1
               for n in walk(r.value) if isinstance(n, Load) and n.buffer.name in outs
               for i, size in zip(n.indices, n.buffer.shape))


def dependencies(p: Program) -> dict[str, set[str]]:
    """For each buffer, every buffer it is computed from (transitively)."""
    deps: dict[str, set[str]] = {b.name: set() for b in p.inputs}
    for s in p.body:
        direct = reads(s)
        closure = set(direct)
        for b in direct:
            closure |= deps.get(b, set())
        for out in written(s):
            deps[out.name] = closure
    return deps


def find_candidates(p: Program) -> list[Candidate]:
    """Group the program's single-axis reductions into proposed cascades (see the module docstring)."""
    deps = dependencies(p)
    groups: list[Candidate] = []
    for stmt in p.body:
        s = as_member(stmt)
        if s is None:
            continue
        extent = s.reduce_axis.extent
        sig = axis_signature(s)
        along = {b for b, _ in sig}   # read along the reduced axis: inputs of the pass, never its results
        direct = reads(stmt)
        chosen = None
        read = direct.union(*(deps.get(b, set()) for b in direct))
        for g in groups:
            if g.extent != extent:
                continue
            linked = bool((direct - along) & g.outs) or bool(sig & g.signature)
            # A member's result read along the axis is a producer over another axis of equal length, not
            # an earlier result; and everything else read must be computable before the loop, which
            # another group's result is not where that group needs this one's (module docstring).
            outs = g.outs | {b.name for b in written(stmt)}
            legal = not (along & g.outs) and all(not (deps.get(b, set()) & g.outs) for b in direct - g.outs) \
                and reads_own_rows(s, g.outs) \
                and not any(read & h.outs and _needs(h, deps) & outs for h in groups if h is not g)
            if linked and legal:
                chosen = g
                break
        if chosen is None:
            chosen = Candidate(extent)
            groups.append(chosen)
        chosen.members.append(s)
        chosen.signature |= sig
    return [g for g in groups if len(g.members) > 1 or swept_later(p, g.members[0])]


def _needs(g: Candidate, deps: dict[str, set[str]]) -> set[str]:
    """Every buffer the members of `g` are computed from (transitively)."""
    direct = set().union(*(reads(m.stmt) for m in g.members))
    return direct.union(*(deps.get(b, set()) for b in direct))


def swept_later(p: Program, member: Member) -> bool:
    """Whether a lone reduction is worth a loop of its own: a later nest reads its result and runs over an axis
    of the reduced length besides the result's (RMSNorm's ``x / sqrt(mean(x * x))``, a row normalized by its
    sum). As a fused loop the reduction and that nest are one kernel, the nest a *sweep* of the row the loop
    just read (`schedule.layout._sweep_key`); as a plain reduction they are two, the row read from memory
    twice and the statistic stored in between. Such a reduction is proposed as a cascade of one; a top-k keeps
    its own kernel (`schedule/topk.py`)."""
    if member.is_topk:
        return False
    name, extent = member.out.name, member.reduce_axis.extent
    later = False
    for s in p.body:
        if s is member.stmt:
            later = True
            continue
        if later and isinstance(s, Compute) and name in reads(s) \
                and len([a for a in s.axes if a.extent == extent]) > len([a for a in member.axes if a.extent == extent]):
            return True
    return False

