"""`drop_redundant_barriers`: remove each barrier that separates no conflicting memory accesses.

A barrier orders the block's memory accesses: what any thread did before it is seen by every thread
after it. It is needed only where an access before it and one after it touch the same shared array (or
global buffer) and one of the two writes: a store then another thread's load (read after write), or a
load then another thread's store (write after read). The layout conversions (`convert.py`) put a
barrier in front of every use of a scratch array, because an earlier conversion may still be reading
it. In a loop that converts two tiles into two scratch arrays of their own (attention's ``k`` and ``v``,
`Lowering.arena`'s alternation), the barrier in front of each is already covered: the array's last
read, an iteration earlier, and its next write have another barrier between them. Attention's key loop
keeps 2 of its 4 barriers.

The analysis, per barrier: the accesses that can run after the barrier before it (back to the barriers
that precede it on every path: around a loop's back edge to the end of its body, and in front of the
loop for the first iteration) and those that can run after it (up to the next barriers: on to the start
of the body for the next iteration, and past the loop for the last). A loop or branch on the way counts
with everything it contains, unless the scan can stop at a barrier inside a loop known to run at least
once. Arrays are compared by name, not by address, so the answer errs towards keeping a barrier. Barriers
inside an ``if`` stay. A `Wgmma` reads shared memory through
descriptors: it counts as a read of every shared array. Barriers are decided one at a time in program order, each on the kernel without
the ones removed before it (removing one only joins two intervals, so a barrier kept stays needed).

Guarantees: the same kernel but for barriers between accesses that cannot conflict; the simulator's race
trackers (`codegen.simulator`) check every kernel the tests run.
"""
from __future__ import annotations

from dataclasses import replace

from ...ir.simt.nodes import (
    Barrier,
    For,
    If,
    LdMatrix,
    LoadGlobal,
    LoadShared,
    MbarrierArrive,
    MbarrierInit,
    MbarrierWait,
    SimtKernel,
    Stmt,
    StoreGlobal,
    StoreShared,
    TmaLoad,
    Wgmma,
    walk_stmts,
)

Access = tuple[str, str, bool]   # (memory space, array name, writes)


_KINDS: dict[type, tuple[str, str, bool]] = {
    LoadShared: ("shared", "alloc", False), LdMatrix: ("shared", "alloc", False),
    StoreShared: ("shared", "alloc", True),
    LoadGlobal: ("global", "buffer", False), StoreGlobal: ("global", "buffer", True),
    TmaLoad: ("shared", "dst", True), MbarrierInit: ("shared", "alloc", True),
    MbarrierArrive: ("shared", "alloc", True), MbarrierWait: ("shared", "alloc", False)}
"""Statement kinds that touch memory: (space, the field naming the array, writes)."""


ANY_SHARED = "*"
"""The array a `Wgmma` reads: it reads shared memory through descriptors (registers), so which tile is not
known here; it conflicts with a store to any shared array."""


def _access(s: Stmt) -> Access | None:
    """The memory access of a plain statement, None for one that touches no memory."""
    if isinstance(s, Wgmma):
        return ("shared", ANY_SHARED, False)
    kind = _KINDS.get(type(s))
    if kind is None:
        return None
    space, field, writes = kind
    return (space, getattr(s, field).name, writes)


def _accesses(s: For | If) -> set[Access]:
    """Every memory access of a loop or a branch, nested ones included."""
    return {a for x in walk_stmts((s,)) if (a := _access(x)) is not None}


def _conflict(before: set[Access], after: set[Access]) -> bool:
    writes = {(space, name) for space, name, w in before | after if w}
    touched_before = _touched(before, writes)
    touched_after = _touched(after, writes)
    return bool(writes & touched_before & touched_after)


def _touched(accesses: set[Access], writes: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """The arrays `accesses` touch, a read of any shared array standing for every shared array written."""
    out = {(space, name) for space, name, _ in accesses}
    if ("shared", ANY_SHARED) in out:
        out |= {w for w in writes if w[0] == "shared"}
    return out


def _runs(loop: For) -> bool:
    """Whether `loop` surely runs its body at least once."""
    return isinstance(loop.start, int) and isinstance(loop.stop, int) and loop.start < loop.stop


Frame = tuple[tuple[Stmt, ...], int]
"""One step of a position: a block of statements and an index into it. A position is the chain of frames
from the kernel body down through loop bodies to a statement."""


def _scan(stmts: tuple[Stmt, ...], order: range, seen: set[Access]) -> bool:
    """Add the accesses of ``stmts[i]`` for `i` in `order` to `seen` until a barrier; True if one stopped it."""
    for i in order:
        s = stmts[i]
        if isinstance(s, Barrier):
            return True
        if isinstance(s, For) and _runs(s):
            body = s.body.stmts
            forward = order.step > 0
            inner = range(0, len(body)) if forward else range(len(body) - 1, -1, -1)
            if _scan(body, inner, seen):
                return True
        elif isinstance(s, For | If):
            seen |= _accesses(s)
        else:
            access = _access(s)
            if access is not None:
                seen.add(access)
    return False


def _reach(path: list[Frame], forward: bool) -> set[Access]:
    """The accesses that can run after (`forward`) or before the statement at `path` with no barrier
    between."""
    seen: set[Access] = set()
    for depth in range(len(path) - 1, -1, -1):
        stmts, at = path[depth]
        order = range(at + 1, len(stmts)) if forward else range(at - 1, -1, -1)
        if _scan(stmts, order, seen):
            return seen
        if depth == 0:
            return seen                   # the kernel's start or end
        # `stmts` is a loop's body (`_barrier_paths` enters no branch). Around the back edge: the rest of
        # the body in the next (or previous) iteration
        wrap = range(0, at) if forward else range(len(stmts) - 1, at, -1)
        _scan(stmts, wrap, seen)
        # and out of the loop: what follows it (the last iteration) or precedes it (the first)
    return seen


def _barrier_paths(stmts: tuple[Stmt, ...], prefix: list[Frame]):
    """Paths to every barrier outside an ``if``, in program order."""
    for i, s in enumerate(stmts):
        here = prefix + [(stmts, i)]
        if isinstance(s, Barrier):
            yield here
        elif isinstance(s, For):
            yield from _barrier_paths(s.body.stmts, here)


def _without(stmts: tuple[Stmt, ...], target: Stmt) -> tuple[Stmt, ...]:
    out = []
    for s in stmts:
        if s is target:
            continue
        if isinstance(s, For):
            s = replace(s, body=replace(s.body, stmts=_without(s.body.stmts, target)))
        out.append(s)
    return tuple(out)


def drop_redundant_barriers(kernel: SimtKernel) -> SimtKernel:
    """`kernel` without the barriers that separate no conflicting accesses (see the module docstring)."""
    body = kernel.body
    kept = 0       # removing a barrier only joins intervals: a barrier kept stays needed, so one sweep
    while True:
        paths = list(_barrier_paths(body, []))
        if kept == len(paths):
            break
        path = paths[kept]
        if _conflict(_reach(path, forward=False), _reach(path, forward=True)):
            kept += 1
        else:
            stmts, at = path[-1]
            body = _without(body, stmts[at])
    return kernel if body is kernel.body else replace(kernel, body=body)
