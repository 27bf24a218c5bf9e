"""`max_shifted_exps`: the f32 exponentials of a program whose argument is a value minus the maximum it is part of.

A softmax (and every online softmax the fusion engine makes: attention, cross-entropy, MoE routing) takes
``exp(x - m)`` with ``m`` the maximum of the ``x`` along the reduced axis, and rescales its running sums by
``exp(m_prev - m)``. Such an argument is at most 0, so the exponential is at most 1 and what reads it adds
it into sums (``l``, ``P·V``) or divides it by one. Such exponentials become `UnaryOp.EXP_NONPOS`, which each
backend computes more cheaply than a general ``exp``: on a GPU ``exp2(x * log2 e)``, one ``ex2.approx.f32`` and
a multiply, where an f32 ``exp`` otherwise takes the range-reduced path (about seventeen instructions with a
quarter-rate ``cvt.rni``): f16 attention's kernel on sm_90a went from 1 485 to 1 145 SASS instructions
(`benchmarks/static_counts.py`); on the cpu `expf`'s polynomial with one lower limit instead of two and one
scale factor instead of two (`codegen/host/mathlib.expf_nonpositive`, the same results as `expf` where
measured: within 2 ulp of numpy, subnormals included).

Why the GPU's form keeps the tolerance rule (`redfuser.testing.tolerance`): ``exp2`` of the rounded product is
within ``2**-22 + |x| 2**-24`` relative of ``e**x``. The first part is the accurate path's own bound (about 2
ulp); the second is the rounding of ``x * log2 e``, the same size as the rounding the reference itself makes
when it forms ``x = s - m`` in f32 (half an ulp of ``|x|``: ``|x| 2**-24``), which the rule's ``C`` already
absorbs ("``exp`` turning an absolute error in its argument into a relative one"). The non-flushing ``exp2``
keeps results below ``2**-126`` (subnormals) as numpy does; the ``fast_exp`` option's ``exp2_ftz`` flushes
them and applies to every f32 ``exp``.

What is recognized (structurally, over the Loop IR; anything else keeps the accurate path): ``exp(a - M)``
or ``exp(a - where(M == -inf, 0, M))`` (the fusion engine's guard of a running max), ``M`` a load of a
maximum -- a fused loop's max state, or a max `Reduce` -- at some position ``p`` of its axes, and ``a``

- that maximum's term with its axes at ``p`` and its reduced axis at an axis running over the same extent
  (the loop's own axis inside the loop: the running max covers the current chunk; any axis of that extent
  after it: the final one covers every position), products and sums matched in either order; or
- the state's value before the chunk (``m_prev``) at ``p``: the running max only grows.

The shifted path is the ``shifted_exp`` option (on by default; False keeps every ``exp`` accurate). On GPU
schedules (`ScheduleOptions.flush_shifted_exp`) the ones no result can tell flushed below ``2**-126``
(`flush_safe_exps`: a running sum's terms, values rounded to f16 at once) are ``exp2_ftz``, one
``ex2.approx.ftz`` where the non-flushing ``ex2.approx.f32`` is that instruction behind a range check and two
multiplies: f16 attention 1 145 -> 1 049 SASS instructions.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ir import Axis, Binary, BinaryOp, Const, Expr, FusedLoop, Load, OnlineState, Program, Reduce, Select, Unary
from ..ir.loop.expr import Cast, Computed, IndexValue, Strided, children, walk
from ..ir.loop.nodes import Compute
from ..ir.loop.rewrite import state_exprs
from ..ir.semantics import ReduceOp, UnaryOp
from ..ir.types import float8_e4m3fn, float16, float32

_COMMUTATIVE = (BinaryOp.ADD, BinaryOp.MUL)


@dataclass(frozen=True)
class _Maximum:
    """A buffer holding a maximum: ``out[axes] = max over reduced of term``; `prev` the buffer of its value
    before each chunk (a fused loop's state; None for a `Reduce`)."""

    axes: tuple[Axis, ...]
    reduced: tuple[Axis, ...]
    term: Expr
    prev: str | None
    loop: int | None = None       # the position of its fused loop in the program's body (a state)


def max_shifted_exps(p: Program) -> frozenset[Expr]:
    """The f32 ``exp`` nodes of `p` whose argument is a value minus a maximum it is part of (module
    docstring)."""
    maxima = _maxima(p)
    if not maxima:
        return frozenset()
    found: set[Expr] = set()
    refused: set[Expr] = set()      # (the same expression in two places is taken only where both are proven)
    for e, where, _ in _expressions(p):
        for node in walk(e):
            if isinstance(node, Unary) and node.op is UnaryOp.EXP and node.dtype == float32:
                (found if _at_most_zero(node.x, maxima, where) else refused).add(node)
    return frozenset(found - refused)


FLUSHING_CASTS = (float16, float8_e4m3fn)
"""Types whose rounding makes 0 of every value below 2**-126 (their smallest subnormals are 2**-24 and 2**-9;
bfloat16's, 2**-133, is not among them)."""


def flush_safe_exps(p: Program, shifted: frozenset[Expr]) -> frozenset[Expr]:
    """Of the `shifted` exps, those no result of `p` can tell from ``exp2_ftz`` (results below 2**-126 made 0):
    each occurrence is either

    - rounded to f16 or e4m3 at once (`FLUSHING_CASTS`: the rounding makes those values 0 anyway; P in f16
      attention as users write it), or
    - the whole term of a running sum over the loop of its own maximum, ``l = sum over j of exp(s - m)``: the
      term at the maximum is ``exp(0) = 1`` and rescales keep it 1 while ``m`` holds, so ``l >= 1`` after every
      chunk (or every term is exactly 0) and a flushed term changes ``l`` by less than 2**-120, far below
      half its ulp; the result may round the other way only where the exact sum lies that close to a
      rounding boundary (then by one ulp of ``l``, within the tolerance rule by a factor of thousands).

    A rescale ``exp(m_prev - m)`` is never among them: it multiplies ``P·V``'s accumulator too, where a
    flushed factor would show."""
    if not shifted:
        return frozenset()
    maxima = _maxima(p)
    safe: set[Expr] = set()
    unsafe: set[Expr] = set()
    for root, loop, summed in _expressions(p):
        for node, parent in _with_parents(root):
            if node not in shifted:
                continue
            ok = (isinstance(parent, Cast) and parent.dtype in FLUSHING_CASTS) or \
                (parent is None and summed and _sums_its_maximum(node, maxima, loop))
            (safe if ok else unsafe).add(node)
    return frozenset(safe - unsafe)


def _with_parents(e: Expr):
    """Every node of `e` with its parent (None for `e` itself)."""
    stack: list[tuple[Expr, Expr | None]] = [(e, None)]
    while stack:
        node, parent = stack.pop()
        yield node, parent
        stack.extend((child, node) for child in children(node))


def _sums_its_maximum(e: Expr, maxima: dict[str, _Maximum], loop: int | None) -> bool:
    """Whether exp node `e` is ``exp(term - m)`` with ``m`` a running max of the fused loop at `loop` and the
    argument that max's own term (not the rescale's ``m_prev``)."""
    x = e.x  # type: ignore[attr-defined]
    m = _guarded(x.b)
    maximum = maxima.get(m.buffer.name) if isinstance(m, Load) else None
    if maximum is None or maximum.loop != loop:
        return False
    return not (isinstance(x.a, Load) and x.a.buffer.name == maximum.prev)


def _maxima(p: Program) -> dict[str, _Maximum]:
    out: dict[str, _Maximum] = {}
    for position, s in enumerate(p.body):
        if isinstance(s, Reduce) and s.op is ReduceOp.MAX:
            out[s.out.name] = _Maximum(s.axes, s.reduce_axes, s.value, None)
        elif isinstance(s, FusedLoop):
            for st in s.states:
                if isinstance(st, OnlineState) and st.op is ReduceOp.MAX and st.carry is None:
                    out[st.acc.name] = _Maximum(st.axes, (s.axis,), st.term, st.prev.name, position)
    return out


def _expressions(p: Program) -> list[tuple[Expr, int | None, bool]]:
    """Every expression of `p`, with the position of the fused loop it is in (None: a nest of its own) and
    whether it is the whole term of a running sum (an `OnlineState` adding its terms, without a carry)."""
    out: list[tuple[Expr, int | None, bool]] = []
    for position, s in enumerate(p.body):
        if isinstance(s, (Compute, Reduce)):
            out.append((s.value, None, False))
        elif isinstance(s, FusedLoop):
            out += [(local.value, position, False) for local in s.locals]
            for st in s.states:
                summed = isinstance(st, OnlineState) and st.op is ReduceOp.SUM and st.carry is None
                out += [(e, position, summed and e is st.term) for e in state_exprs(st)]
    return out


def _at_most_zero(x: Expr, maxima: dict[str, _Maximum], loop: int | None) -> bool:
    """Whether `x` is ``a - M`` (or ``a - where(M == -inf, 0, M)``) with ``a`` at most the maximum ``M``, `x`
    being in the fused loop at position `loop` of the program (None: in a nest of its own)."""
    if not (isinstance(x, Binary) and x.op is BinaryOp.SUB):
        return False
    m = _guarded(x.b)
    if not (isinstance(m, Load) and m.buffer.name in maxima):
        return False
    maximum = maxima[m.buffer.name]
    a = x.a
    while isinstance(a, Cast) and a.dtype == a.x.dtype and not a.dtype.storage_only:
        a = a.x     # (an f32 or f64 rounding point of a computed value: the max rounded its terms alike)
    if maximum.prev is not None and isinstance(a, Load) and a.buffer.name == maximum.prev \
            and a.indices == m.indices:
        return True
    if len(m.indices) != len(maximum.axes):
        return False
    at = {axis.name: index for axis, index in zip(maximum.axes, m.indices)}
    bound: dict[str, Axis] = {}
    if maximum.loop is not None and maximum.loop == loop:
        # inside its own loop a running max covers the chunks seen so far: the term at the loop's own axis
        bound = {r.name: r for r in maximum.reduced}
    return _matches(maximum.term, a, at, {r.name: r for r in maximum.reduced}, bound)


def _guarded(b: Expr) -> Expr:
    """``M`` from ``where(M == -inf, 0, M)``; `b` itself otherwise."""
    if isinstance(b, Select) and isinstance(b.cond, Binary) and b.cond.op is BinaryOp.EQ \
            and isinstance(b.a, Const) and b.a.value == 0 and b.cond.a == b.b \
            and isinstance(b.cond.b, Const) and b.cond.b.value == float("-inf"):
        return b.b
    return b


def _matches(t: Expr, e: Expr, at: dict[str, object], reduced: dict[str, Axis], bound: dict[str, Axis]) -> bool:
    """Whether `e` is the term `t` with its state axes at `at`, each reduced axis at one axis of its extent
    (`bound` records which, the same everywhere)."""
    if isinstance(t, Load):
        return isinstance(e, Load) and e.buffer.name == t.buffer.name and len(e.indices) == len(t.indices) \
            and all(_index_matches(i, j, at, reduced, bound) for i, j in zip(t.indices, e.indices))
    if isinstance(t, IndexValue) or isinstance(e, IndexValue):      # (a mask's ``j <= i``)
        return isinstance(t, IndexValue) and isinstance(e, IndexValue) and t.dtype == e.dtype \
            and _index_matches(t.axis, e.axis, at, reduced, bound)
    if type(t) is not type(e) or getattr(t, "dtype", None) != getattr(e, "dtype", None):
        return False
    if isinstance(t, Const):
        return t == e
    if isinstance(t, Binary):
        assert isinstance(e, Binary)
        if t.op is not e.op:
            return False
        orders = [(e.a, e.b), (e.b, e.a)] if t.op in _COMMUTATIVE else [(e.a, e.b)]
        for first, second in orders:
            trial = dict(bound)
            if _matches(t.a, first, at, reduced, trial) and _matches(t.b, second, at, reduced, trial):
                bound.update(trial)
                return True
        return False
    if isinstance(t, (Unary, Select, Cast)):
        if isinstance(t, Unary) and t.op is not e.op:   # type: ignore[attr-defined]
            return False
        return all(_matches(x, y, at, reduced, bound) for x, y in zip(children(t), children(e)))
    return False


def _index_matches(i: object, j: object, at: dict[str, object], reduced: dict[str, Axis],
                   bound: dict[str, Axis]) -> bool:
    if isinstance(i, Axis) and i.name in at:
        return at[i.name] == j
    if isinstance(i, Axis) and i.name in reduced:
        if not (isinstance(j, Axis) and j.extent == reduced[i.name].extent):
            return False
        return bound.setdefault(i.name, j) == j
    if isinstance(i, (Strided, Computed)):
        return False                 # (positions computed from the axes: not matched)
    return i == j
