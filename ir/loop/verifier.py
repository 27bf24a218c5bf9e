"""The Loop IR verifier: the invariants every pass keeps.

- every buffer is written exactly once, before it is read; inputs are never written;
- a statement's axes match its output's shape, axis names are unique in a nest;
- every load has one index per buffer dimension, each an axis in scope whose
  extent equals that dimension (or a fixed in-bounds position, 0 for a size-1 dim);
- dtypes agree: a statement's value has its output's dtype, comparisons give
  bool, ``where`` conditions are bool; every output is written.
"""
from __future__ import annotations

from typing import NamedTuple

from ..errors import VerifyError
from .expr import Axis, Binary, Cast, Computed, Expr, IndexValue, Length, Load, Select, Strided, Unary, walk
from .index import is_index_expression
from ..semantics import BinaryOp, ReduceOp, UnaryOp
from ..buffer import Buffer
from .nodes import Compute, FusedLoop, OnlineState, Program, Reduce, Stmt, TopK, TopKState, written
from ..excerpt import excerpt_around
from .printer import program_lines
from ..types import bool_, int64
from ..sizes import is_static


_ARITHMETIC = frozenset({BinaryOp.ADD, BinaryOp.SUB, BinaryOp.MUL, BinaryOp.DIV, BinaryOp.POW, BinaryOp.MAX,
                         BinaryOp.MIN, BinaryOp.FLOORDIV, BinaryOp.MOD})
"""Binary ops whose meaning on bools would depend on the backend (LLVM's 1-bit add is xor): bool values
use only comparisons and the logical ops."""


class _Where(NamedTuple):
    """What a failure names: the program being checked (printed around the bad statement) and the pass."""

    program: Program
    pass_name: str




def _below(i: int, extent: object) -> bool:
    """``i < extent``; true for a run-time extent (its kernel guards the lengths its indices need)."""
    return not is_static(extent) or i < extent

def _fail(msg: str, node: Stmt | OnlineState | TopKState | None, where: _Where) -> None:
    """Raise `VerifyError`: `msg`, then the printed program around `node`, marked (none without a node)."""
    context = excerpt_around(node, lambda index: program_lines(where.program, index)) if node is not None else ""
    raise VerifyError(msg, pass_name=where.pass_name, context=context)


def verify_expr(e: Expr, scope: dict[str, Axis], defined: dict[str, Buffer], stmt: Stmt | OnlineState | TopKState,
                where: _Where) -> None:
    """Check one expression against the axes in scope and the buffers defined so far (`stmt` holds it)."""
    for node in walk(e):
        if isinstance(node, Load):
            buf = node.buffer
            if defined.get(buf.name) != buf:
                _fail(f"load of {buf.name} before it is defined (or with a different type)", stmt, where)
            if len(node.indices) != len(buf.shape):
                _fail(f"load of {buf.name} has {len(node.indices)} indices for {len(buf.shape)} dims", stmt, where)
            for dim, (idx, size) in enumerate(zip(node.indices, buf.shape)):
                if isinstance(idx, Axis):
                    if scope.get(idx.name) != idx:
                        _fail(f"load of {buf.name} uses axis {idx.name} not in scope", stmt, where)
                    if idx.extent != size:
                        _fail(f"{buf.name} dim {dim} has size {size} but axis {idx.name} runs to {idx.extent}", stmt, where)
                elif isinstance(idx, Computed):
                    if not is_index_expression(idx.value):
                        _fail(f"{buf.name} dim {dim} indexed by {idx}: a computed position is an int64 value",
                              stmt, where)   # (its loads and loop indices are children: checked by this walk)
                elif isinstance(idx, Strided):
                    if scope.get(idx.axis.name) != idx.axis:
                        _fail(f"load of {buf.name} uses axis {idx.axis.name} not in scope", stmt, where)
                    if idx.step == 0:
                        _fail(f"{buf.name} dim {dim} indexed by {idx!r}: a step of 0", stmt, where)
                elif not (isinstance(idx, int) and 0 <= idx and _below(idx, size)):
                    _fail(f"{buf.name} dim {dim} indexed by {idx!r}, outside [0, {size})", stmt, where)
        elif isinstance(node, IndexValue):
            if scope.get(node.axis.name) != node.axis:
                _fail(f"value of axis {node.axis.name} used outside its loop", stmt, where)
        elif isinstance(node, Length):
            if node.dtype.is_bool or node.dtype.storage_only:
                _fail(f"a length as {node.dtype}: a length is an integer, f32 or f64 (16-bit ones are casts)",
                      stmt, where)
            if not node.sizes or any(isinstance(n, int) and n < 0 for n in node.sizes):
                _fail(f"a length of sizes {node.sizes}", stmt, where)
        elif isinstance(node, Binary) and node.op.is_comparison and node.dtype != bool_:
            _fail(f"comparison {node.op.value} must give bool, not {node.dtype}", stmt, where)
        elif isinstance(node, Select) and node.cond.dtype != bool_:
            _fail(f"where() condition must be bool, not {node.cond.dtype}", stmt, where)
        elif isinstance(node, Unary) and node.op is UnaryOp.NOT and node.dtype != bool_:
            _fail("logical not must be on bool", stmt, where)
        elif isinstance(node, Unary) and node.dtype == bool_ and node.op is not UnaryOp.NOT:
            _fail(f"{node.op.value} of bool: bools have only logical ops", stmt, where)
        elif isinstance(node, Binary) and node.dtype == bool_ and node.op in _ARITHMETIC:
            _fail(f"arithmetic {node.op.value} on bool: numpy's bool + * maximum minimum are | & | & "
                  "(the tracer writes them so: ops/elementwise.py, BOOL_FORMS)", stmt, where)
        elif isinstance(node, Cast | Unary | Binary | Select) and node.dtype is None:
            _fail("expression without a dtype", stmt, where)
        elif isinstance(node, Binary) and node.op in _ARITHMETIC and node.dtype.is_float and any(
                o.dtype.is_float and o.dtype.itemsize > node.dtype.itemsize for o in (node.a, node.b)):
            _fail(f"{node.op.value} typed {node.dtype} narrows an operand of {node.a.dtype} and {node.b.dtype} "
                  "(a narrowing is an explicit cast)", stmt, where)


def verify_stmt(s: Stmt, defined: dict[str, Buffer], where: _Where) -> None:
    """Check one loop nest (see the module docstring for the rules)."""
    axes = list(s.axes) + (list(s.reduce_axes) if isinstance(s, Reduce) else [])
    names = [a.name for a in axes]
    if len(set(names)) != len(names):
        _fail(f"axis names repeat in one loop nest: {names}", s, where)
    if tuple(a.extent for a in s.axes) != s.out.shape:
        _fail(f"loops {[a.extent for a in s.axes]} do not cover {s.out.name}'s shape {list(s.out.shape)}", s, where)
    if s.value.dtype != s.out.dtype:
        _fail(f"value has dtype {s.value.dtype} but {s.out.name} is {s.out.dtype}", s, where)
    if isinstance(s, Reduce) and s.op is ReduceOp.SUM and s.out.dtype == bool_:
        _fail("a sum of bools (numpy counts them in an integer; or over bools is a max)", s, where)
    verify_expr(s.value, {a.name: a for a in axes}, defined, s, where)


def verify_topk(s: TopK, defined: dict[str, Buffer], where: _Where) -> None:
    """Check a top-k nest: buffer shapes follow its axes, indices are i64, the value has the values' dtype."""
    shape = tuple(a.extent for a in s.axes)
    if s.values.shape != shape or s.indices.shape != shape or s.indices.dtype != int64:
        _fail(f"top-k buffers {s.values.type}, {s.indices.type} do not match loops {list(shape)} (indices i64)",
              s, where)
    if not 0 <= s.rank < len(s.axes) or not _below(s.k - 1, s.reduce_axis.extent):
        _fail(f"top-k rank {s.rank} / k {s.k} out of range for {s.reduce_axis.extent} elements", s, where)
    if s.value.dtype != s.values.dtype:
        _fail(f"top-k value has dtype {s.value.dtype} but {s.values.name} is {s.values.dtype}", s, where)
    verify_expr(s.value, {a.name: a for a in s.parallel + (s.reduce_axis,)}, defined, s, where)


def verify_fused_loop(s: FusedLoop, defined: dict[str, Buffer], where: _Where) -> None:
    """Check a fused loop: locals run along its axis; each state reads only what is known at its turn."""
    inner = dict(defined)
    for local in s.locals:
        if s.axis not in local.axes:
            _fail(f"local {local.out.name} of a fused loop over {s.axis.name} does not run along it", local, where)
        verify_stmt(local, inner, where)
        inner[local.out.name] = local.out
    for st in s.states:
        shape = tuple(a.extent for a in st.axes)
        if isinstance(st, TopKState):
            shape = shape[: st.rank] + (st.k,) + shape[st.rank:]
            if st.indices.shape != shape or st.indices.dtype != int64 or not _below(st.k - 1, s.axis.extent):
                _fail(f"top-k state {st.acc.name}: indices {st.indices.type} or k {st.k} wrong", st, where)
        if st.prev.type != st.acc.type or shape != st.acc.shape:
            _fail(f"state {st.acc.name}: prev/acc types or axes disagree", st, where)
        inner[st.prev.name] = st.prev
    for st in s.states:
        if st.term.dtype != st.acc.dtype:
            _fail(f"state {st.acc.name}: term has dtype {st.term.dtype}, accumulator {st.acc.dtype}", st, where)
        verify_expr(st.term, {a.name: a for a in st.axes + (s.axis,)}, inner, st, where)
        if st.rescale is not None:
            verify_expr(st.rescale, {a.name: a for a in st.axes}, inner, st, where)
        if isinstance(st, OnlineState) and st.carry is not None:
            if st.op not in (ReduceOp.SUM, ReduceOp.PROD) or st.rescale is not None:
                _fail(f"state {st.acc.name}: a carry needs a sum or product state without a rescale", st, where)
            verify_expr(st.carry, {a.name: a for a in st.axes}, inner, st, where)
        if isinstance(st, OnlineState):   # a running top-k is not readable inside the loop
            inner[st.acc.name] = st.acc


def verify_program(p: Program, pass_name: str = "") -> Program:
    """Check every invariant of `p`; return it unchanged or raise `VerifyError`."""
    where = _Where(p, pass_name)
    defined: dict[str, Buffer] = {}
    for b in p.inputs:
        if b.name in defined:
            _fail(f"input {b.name} declared twice", None, where)
        defined[b.name] = b
    for s in p.body:
        if isinstance(s, FusedLoop):
            verify_fused_loop(s, defined, where)
        elif isinstance(s, TopK):
            verify_topk(s, defined, where)
        elif isinstance(s, Compute | Reduce):
            verify_stmt(s, defined, where)
        else:
            _fail(f"unknown statement kind {type(s).__name__}", None, where)
        for out in written(s):
            if out.name in defined:
                _fail(f"{out.name} is written twice (or is an input)", s, where)
            defined[out.name] = out
    for b in p.outputs:
        if defined.get(b.name) != b or b in p.inputs:
            _fail(f"output {b.name} is never computed", None, where)
    return p
