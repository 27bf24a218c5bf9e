"""`k_major_fp8_operands`: an e4m3 matrix a fused loop contracts along its rows is read transposed, from a copy.

Hopper's e4m3 ``wgmma`` reads both operands K-major (K contiguous in shared memory); 16-bit B may be N-major
(the instruction's transpose bit), 8-bit may not. A weight ``w[k, n]`` stored row-major, contracted along
``k`` (``x @ w`` in the FP8 per-token GEMM), is N-major, so the threads of every block transposed each tile
of it into shared memory byte by byte (`codegen/simt/wgmma.py`), once per tile row of the output, and the
copy engine could not take it (`codegen/simt/tma.py`: a box lands as it is stored). This pass, for targets
with TMA (``sm_90a`` with the ``tma`` option), transposes such an input once per call into a scratch buffer
``w_k_major[n, k]`` (a kernel of its own, one read and one write of ``w``) and has the fused loop read that:
its tiles are then K-major rows the copy engine copies. The values are the same bytes, so every result is
bit for bit what it was.

Applies to a 2-d e4m3 *input* read in a fused loop's states or locals as ``w[j, c]``, ``j`` the loop's axis
and ``c`` another axis, where the loop's states have at least `MIN_ROWS` rows besides ``c`` (each tile of
them read all of ``w``: with fewer, the copy's extra pass over ``w`` and its launch cost about what the
threads' staging did); other reads of ``w`` (not in that form) keep reading ``w``.
"""
from __future__ import annotations

from dataclasses import replace

from ..ir import Axis, Buffer, Compute, Expr, FusedLoop, Load, Program, map_expr
from ..ir.loop.expr import loads
from ..ir.loop.nodes import Stmt, written
from ..ir.loop.rewrite import map_state_exprs, state_exprs
from ..ir.types import BufferType, float8_e4m3fn


MIN_ROWS = 256
"""The fewest rows (the states' other axes, together) for which the K-major copy pays: 4 tiles of 64 rows,
each of which read and transposed all of ``w`` before."""


def k_major_fp8_operands(p: Program) -> Program:
    """`p` with every e4m3 input a fused loop reads as ``w[loop axis, c]`` transposed once into a K-major scratch
    buffer, read by that loop instead (the module docstring)."""
    inputs = {b.name: b for b in p.inputs if b.dtype == float8_e4m3fn and len(b.shape) == 2}
    if not inputs:
        return p
    wanted: dict[str, Buffer] = {}
    for s in p.body:
        if isinstance(s, FusedLoop):
            for e, axes in _exprs(s):
                for n in loads(e):
                    if n.buffer.name in inputs and _k_rows(n, s.axis) and _rows(axes, n.indices[1]) >= MIN_ROWS:
                        b = n.buffer
                        wanted.setdefault(b.name, Buffer(_fresh(p, f"{b.name}_k_major"),
                                                         BufferType(b.dtype, (b.shape[1], b.shape[0]))))
    if not wanted:
        return p
    body: list[Stmt] = []
    for name, t in wanted.items():
        n_axis, k_axis = Axis(f"{t.name}_n", t.shape[0]), Axis(f"{t.name}_k", t.shape[1])
        body.append(Compute(t, (n_axis, k_axis), Load(inputs[name], (k_axis, n_axis))))
    for s in p.body:
        body.append(_read_transposed(s, wanted) if isinstance(s, FusedLoop) else s)
    return replace(p, body=tuple(body))


def _k_rows(load: Load, axis: Axis) -> bool:
    """Whether `load` reads ``w[axis, c]``: rows along the loop's axis, columns along another axis."""
    rows, cols = load.indices
    return isinstance(rows, Axis) and rows.name == axis.name and isinstance(cols, Axis) and cols.name != axis.name


def _read_transposed(loop: FusedLoop, wanted: dict[str, Buffer]) -> FusedLoop:
    def fix(e: Expr) -> Expr | None:
        if isinstance(e, Load) and e.buffer.name in wanted and _k_rows(e, loop.axis):
            return Load(wanted[e.buffer.name], (e.indices[1], e.indices[0]))
        return None

    return replace(loop, locals=tuple(replace(l, value=map_expr(l.value, fix)) for l in loop.locals),
                   states=tuple(map_state_exprs(st, fix) for st in loop.states))


def _rows(axes: tuple[Axis, ...], column: Axis) -> int:
    """How many rows a state over `axes` has besides `column` (a run-time extent: many)."""
    rows = 1
    for a in axes:
        if a.name != column.name:
            if not isinstance(a.extent, int):
                return MIN_ROWS
            rows *= a.extent
    return rows


def _exprs(loop: FusedLoop) -> list[tuple[Expr, tuple[Axis, ...]]]:
    """Each expression of `loop`'s locals and states, with the axes of the nest or state it belongs to."""
    out: list[tuple[Expr, tuple[Axis, ...]]] = [(l.value, l.axes) for l in loop.locals]
    for st in loop.states:
        out += [(e, st.axes) for e in state_exprs(st)]
    return out


def _fresh(p: Program, name: str) -> str:
    """`name`, or `name` with a number after it, that no buffer of `p` has."""
    taken = {b.name for b in p.inputs + p.outputs} | {b.name for s in p.body for b in written(s)}
    out, k = name, 1
    while out in taken:
        out, k = f"{name}{k}", k + 1
    return out


__all__ = ["k_major_fp8_operands"]
