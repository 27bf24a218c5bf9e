"""`LoopBuilder`: the states, rescales and epilogue of one fused loop, as `fuse_cascade` adds members.

It owns the numerics of reading running values inside the loop (see `OnlineState`):
a running max read as 0 inside exponentials while it is still -inf (`safe`), as 1
inside a quantization while it is -inf or 0 (`safe_scale`), earlier results read
as their running values (`running`), and the conditions under which the
reference's own value is NaN (`unseen`, `nan_row`).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

from ..ir import (
    Axis,
    Binary,
    BinaryOp,
    Buffer,
    Compute,
    Const,
    Expr,
    Load,
    OnlineState,
    ReduceOp,
    Select,
    TopKState,
    Unary,
    UnaryOp,
    map_expr,
    rounded,
    walk,
)
from ..ir.types import bool_
from .member import Member
from .narrowing import rescale_dtype
from .nan_guard import read_logs_safely, read_safely, running_extrema, sums_of_exponentials
from .positivity import is_positive
from .product_law import product_carry
from .algebra import Linear
from .centred import Shift
from .own_centre import count_type, keep_infinite, resolve as resolve_own_centre
from .shift_law import carry_expr, centre_move, centre_unseen, loop_term, overflow_condition, overflows
from .separability import Accumulator, rescale_expr
from .substitute import inline_loads


class LoopBuilder:
    """Accumulates the states and epilogue of one fused loop."""

    def __init__(self, axis: Axis, taken: dict[str, Buffer] | None = None) -> None:
        self.axis = axis
        self.taken = dict(taken or {})   # the program's buffers: a new state's names must not be theirs
        self.states: list[OnlineState | TopKState] = []
        self.positive: set[str] = set()
        self.epilogue: list[Compute] = []
        self.epilogue_values: dict[str, tuple] = {}   # member -> (axes, value over state buffers)
        self.names: set[str] = set()
        self.online: list = []                         # each state's online exponent (for sharing)
        self.extreme_terms: dict[str, tuple[Expr, Expr]] = {}   # member -> (an u - c overflowed, its body there)

    def state_for(self, member: Member, acc, suggested: Buffer, indices: Buffer | None = None,
                  term: Expr | None = None, carry_of: Callable[[Buffer], Expr] | None = None) -> Buffer:
        """The state accumulating `acc` (shared with an equal one already in the loop); `term` and
        `carry_of` (a shift-stable sum's carry given the state's own prev-buffer, see `centred_state`)
        replace the term made from `acc` and its rescale."""
        term = self.safe_term(acc) if term is None else term
        for st, online in zip(self.states, self.online):
            carry = None if carry_of is None or not isinstance(st, OnlineState) else carry_of(st.prev)
            if (isinstance(st, OnlineState) and not member.is_topk
                    and (st.op, st.axes, st.term, online, st.carry) == (acc.op, member.state_axes, term,
                                                                         (acc.online, acc.powers), carry)):
                return st.acc
        name = suggested.name
        k = 1
        # (a state may be its member's own buffer, `suggested` itself; a made name must not be another
        # buffer's: a user's variable `s_acc_prev` beside the state `s_acc` and its `s_acc_prev`)
        while name in self.names or self.taken.get(name, suggested) != suggested or f"{name}_prev" in self.taken:
            name, k = f"{suggested.name}{k}", k + 1
        buf = Buffer(name, suggested.type)
        prev = Buffer(f"{name}_prev", suggested.type)
        self.names |= {name, prev.name}
        rescale = rescale_expr(acc.online, lambda e: self.to_prev(self.running(e)),
                               rescale_dtype(acc.online, acc.powers, suggested.dtype),
                               lambda e: self.safe(self.running(e)), acc.powers,
                               lambda e: self.safe_scale(self.running(e)))
        if member.is_topk:
            st = TopKState(buf, indices or member.indices, prev, member.state_axes, member.rank, term, rescale)
        elif carry_of is not None:
            st = OnlineState(buf, prev, member.state_axes, acc.op, term, None, carry_of(prev))
        else:
            st = OnlineState(buf, prev, member.state_axes, acc.op, term, rescale)
        self.states.append(st)
        self.online.append((acc.online, acc.powers))
        if not member.is_topk and is_positive(acc.term, frozenset(self.positive)):
            self.positive.add(name)
        return buf

    def centred_state(self, member: Member, acc, lower: list[Buffer], suggested: Buffer) -> Buffer:
        """The state of a shift-stable accumulator (`acc.shift`): its term read with the running centre, and
        for a power above 0 the carry that moves the family's previous sums to the new centre."""
        shift = acc.shift
        if shift.centre.own is not None:
            # the compiler's own running mean (fusion/own_centre.py): its sum and count become states here
            centre, count_load = resolve_own_centre(self, member, shift.centre)
            shift = replace(shift, centre=centre)
        else:
            count_load = self.count_for(member, shift.centre) if shift.centre.op is ReduceOp.SUM else None
        term = self.safe(self.running(loop_term(shift, count_load)))
        if shift.degree == 0:
            return self.state_for(member, acc, suggested, term=term)
        move = centre_move(shift.centre, count_load, self.to_prev)
        rest = rescale_expr(shift.online_rest, lambda e: self.to_prev(self.running(e)), suggested.dtype,
                            lambda e: self.safe(self.running(e)))
        by_name = {st.acc.name: st for st in self.states if isinstance(st, OnlineState)}
        prevs = [Load(by_name[b.name].prev, member.state_axes) for b in lower]

        # A sum about a running mean (the compiler's or the user's own ``sum / n``) keeps an infinite sum as it
        # is: the law's lower powers times a huge move gave inf - inf (a variance of values near 1e25: NaN for
        # numpy's inf); a running max/min centre has its own guards (`centred_nan_guard`)
        keeps = shift.centre.own is not None or shift.centre.op is ReduceOp.SUM

        def carry(own: Buffer) -> Expr:
            moved = carry_expr(shift, prevs + [Load(own, member.state_axes)], move, rest)
            return keep_infinite(moved, Load(own, member.state_axes), rest) if keeps else moved

        return self.state_for(member, acc, suggested, term=term, carry_of=carry)

    def product_state(self, member: Member, acc, suggested: Buffer) -> Buffer:
        """The state of a running product whose factors read a moving earlier result (`acc.online`): a count
        of the elements multiplied in, and the product carried by the product law (`product_law.py`)."""
        count_prev = self.to_prev(Load(self.count_state(member), member.state_axes))
        d = rescale_dtype(acc.online, acc.powers, suggested.dtype)

        def carry(own: Buffer) -> Expr:
            return product_carry(acc.online, Load(own, member.state_axes), count_prev,
                                 lambda e: self.to_prev(self.running(e)), lambda e: self.safe(self.running(e)), d)

        return self.state_for(member, acc, suggested, carry_of=carry)

    def centred_nan_guard(self, member: Member, acc, value: Expr, reduced: Callable[[Expr], bool]) -> Expr | None:
        """Where a shift-stable power's reference value is NaN though the loop's sums are not: the centre
        (a running max/min) never left its identity, so every ``u - c`` is ``-inf - -inf`` (the loop read
        the centre as 0); or some ``u - c`` overflows (`overflows`), told by a state keeping the reduced
        values' extreme farthest from the centre, or the body (`value`, as the decomposition read it) is NaN
        for that element (`only_reads`, `term_at`; `reduced`: whether an expression reads the reduced values)."""
        shift = acc.shift
        if shift is None or shift.degree == 0 or shift.centre.op is ReduceOp.SUM:
            return None
        # with an exponential of u - c the centre is in H's online part, which `unseen` already guards
        guard = centre_unseen(shift) if not shift.alpha else None
        u = shift.centre.u
        # The body can be ±inf or NaN at an element where the loop's sums are not: where some u - c overflows
        # (`overflows`), or where the algebra cancelled a log against an exponential that underflows in the
        # reference (log p = (u - m) - log l with p = exp(u - m) / l). Either first happens at the element
        # farthest from the centre, whose value a state keeps.
        readable = self.only_reads(value, u, reduced)
        if not overflows(shift) and not (readable and _cancels_a_log(value)):
            return guard
        extreme = self._farthest(member, shift)
        far = overflow_condition(shift, extreme) if overflows(shift) else None
        if readable:
            there = self.term_at(value, u, extreme)
            # The body as the reference evaluates it at that element: NaN there is NaN in the sum, and so is an
            # infinity there (a log of a probability that underflowed to 0: Σ log p, a focal loss
            # Σ (1 - p)^γ log p, whose algebra's log p = (u - m) - log l stays finite), with a finite centre
            # (an infinite centre's own element is inf - inf = NaN).
            c = shift.centre.source
            finite = Binary(BinaryOp.LT, Unary(UnaryOp.ABS, c, c.dtype), Const(float("inf"), c.dtype), bool_)
            self.extreme_terms[member.name] = (finite, there)
            nan_there = Binary(BinaryOp.NE, there, there, bool_)
            far = nan_there if far is None else Binary(BinaryOp.OR, far, nan_there, bool_)
        assert far is not None
        return far if guard is None else Binary(BinaryOp.OR, guard, far, bool_)

    def _farthest(self, member: Member, shift: Shift) -> Load:
        """A state keeping the reduced value farthest from a running max/min centre (the running min of ``u``
        for a max), where the reference's terms first overflow or underflow."""
        op = ReduceOp.MIN if shift.centre.op is ReduceOp.MAX else ReduceOp.MAX
        u = shift.centre.u
        # in u's own type: the member's can be wider (an int32 @ f32 product is f64) and a state's term
        # must have its accumulator's type (fuzz: seed 1, example 2080 at 17e4aa1)
        buf = self.state_for(member, Accumulator(op, u, Linear(), u, Const(1.0, u.dtype)),
                             Buffer(f"{member.name}_{op.value}", replace(member.out.type, dtype=u.dtype)))
        return Load(buf, member.state_axes)

    @staticmethod
    def term_at(value: Expr, u: Expr, extreme: Load) -> Expr:
        """The body `value` as the reference computes it for the element whose reduced value is `extreme`,
        where `u` is all it reads of the reduced values (the caller's `only_reads`). An entropy's ``q log q``
        with ``q = exp(x - m) / l`` is NaN where ``q`` underflows to 0, which the algebra's ``log q = (x - m) -
        log l`` never sees; such a ``q`` underflows first at the element farthest from the max. Rounded as
        the reference rounds it (`rounded`): an f16 ``q`` underflows where the kernel's f32 one would not."""
        return rounded(map_expr(value, lambda n: extreme if n == u else None))

    @staticmethod
    def only_reads(value: Expr, u: Expr, reduced: Callable[[Expr], bool]) -> bool:
        """Whether `u` is all `value` reads of the reduced values (`reduced`: whether an expression reads
        them), so that `term_at` can evaluate it for one element."""
        return not reduced(map_expr(value, lambda n: Const(0.0, u.dtype) if n == u else None))

    def count_state(self, member: Member) -> Buffer:
        """The exact running count of elements seen (a sum of 1), for a running mean: in f32 for a 16-bit
        result (f16 counts exactly only to 2048, bf16 to 256)."""
        t = count_type(member.out.type)
        one = Const(1.0, t.dtype)
        return self.state_for(member, Accumulator(ReduceOp.SUM, one, Linear(), one, one),
                              Buffer(f"{member.name}_count", t))

    def count_for(self, member: Member, centre) -> Load:
        """The running count of a running mean `centre` (``S / N``), read by `member`'s term: kept per the
        mean's own axes where its sum ``S`` is read at a subset of `member`'s (a count of elements seen
        is the same at every index; layer norm + GEMM: per row, not per output element, so that
        ``sum_j (x[i, j] - c[i]) w[j, n]`` stays a dot), else per `member`'s axes."""
        own = centre.source.indices
        if all(isinstance(a, Axis) for a in own) and set(own) <= set(member.state_axes) \
                and len(set(own)) == len(own):
            axes = tuple(a for a in member.state_axes if a in own)
            shape = tuple(a.extent for a in axes)
            narrowed = replace(member, out=Buffer(member.name, replace(member.out.type, shape=shape)),
                               axes=axes, state_axes=axes)
            return Load(self.count_state(narrowed), axes)
        return Load(self.count_state(member), member.state_axes)

    def running_extrema(self) -> dict[str, float]:
        """Max/min states and their identities (what they hold before any element is seen)."""
        return running_extrema(self.states)

    def safe(self, e: Expr) -> Expr:
        """`e` reading each running max/min as 0 while it still holds its identity (see OnlineState), and the
        log of a running sum of exponentials as 0 while the sum is 0 (`nan_guard.read_logs_safely`)."""
        return read_logs_safely(read_safely(e, self.running_extrema()), sums_of_exponentials(self.states))

    def safe_scale(self, e: Expr) -> Expr:
        """`e` reading each running max as 1 while it is still at its identity or 0 (nothing but zeros
        seen): a quantization scaled by ``1 / a`` then gives the exact 0 instead of ``0 * inf``."""
        ext = self.running_extrema()

        def fix(n: Expr) -> Expr | None:
            if isinstance(n, Load) and n.buffer.name in ext:
                return Select(self._unset_scale(n), Const(1.0, n.dtype), n, n.dtype)
            return None

        return map_expr(e, fix)

    def _unset_scale(self, n: Load) -> Expr:
        ident = Binary(BinaryOp.EQ, n, Const(self.running_extrema()[n.buffer.name], n.dtype), bool_)
        return Binary(BinaryOp.OR, ident, Binary(BinaryOp.EQ, n, Const(0.0, n.dtype), bool_), bool_)

    def safe_term(self, acc) -> Expr:
        """The accumulated term with running maxima read safely: as a scale inside quantizations, as an
        offset inside exponentials (see `safe_scale` and `safe`)."""
        term = self.safe(self.running(acc.term))
        # Inside a quantization the running max is a scale, not an offset: swap in its scale-safe form.
        scaled = {self.safe(self.running(q)): self.safe_scale(self.running(q)) for q in acc.quantized}
        return map_expr(term, lambda n: scaled.get(n)) if scaled else term

    def extrema_read(self, acc) -> list[Load]:
        """The running max/min loads in `acc`'s online exponent."""
        ext = self.running_extrema()
        return [n for mono, _ in acc.online.terms for atom, _ in mono.factors for n in walk(atom)
                if isinstance(n, Load) and n.buffer.name in ext]

    def nan_row(self, acc) -> Expr | None:
        """True where a running max the accumulator's exponent reads ended NaN: the reference's whole row
        of terms is NaN then (a top-k of it keeps positions 0..k-1)."""
        cond: Expr | None = None
        for n in self.extrema_read(acc):
            c = Binary(BinaryOp.NE, n, n, bool_)
            cond = c if cond is None else Binary(BinaryOp.OR, cond, c, bool_)
        return cond

    def unseen(self, acc) -> Expr | None:
        """True where the reference's own value is NaN because a running max the accumulator depends
        on ended at its identity (every element -inf) or, scaling a quantization, at 0."""
        ext = self.running_extrema()
        cond: Expr | None = None

        def add(c: Expr) -> None:
            nonlocal cond
            cond = c if cond is None else Binary(BinaryOp.OR, cond, c, bool_)

        for mono, _ in acc.online.terms:
            for atom, _ in mono.factors:
                for n in walk(atom):
                    # a float max at -inf saw only -inf (numpy: exp(-inf - -inf) = NaN); a bool or integer
                    # max at its identity (False, INT_MIN) is an ordinary value (fuzz: seed 1, example 4009
                    # at 17e4aa1, exp of a bool @ bool gave NaN for numpy's 1)
                    if isinstance(n, Load) and n.buffer.name in ext and n.dtype.is_float:
                        add(Binary(BinaryOp.EQ, n, Const(ext[n.buffer.name], n.dtype), bool_))
        for atom, _ in acc.powers.factors:
            add(self._unset_scale(atom))
        return cond

    def running(self, e: Expr) -> Expr:
        """`e` with each earlier result that is computed after the loop (``y = acc / l``...) replaced by
        its running value inside the loop: the same formula over the accumulators' current values."""
        return inline_loads(e, self.epilogue_values) if self.epilogue_values else e

    def to_prev(self, e: Expr) -> Expr:
        prev = {st.acc.name: st.prev for st in self.states if isinstance(st, OnlineState)}
        return map_expr(e, lambda n: Load(prev[n.buffer.name], n.indices)
                        if isinstance(n, Load) and n.buffer.name in prev else None)


_LOGS = frozenset({UnaryOp.LOG, UnaryOp.LOG2, UnaryOp.LOG1P})


def _cancels_a_log(value: Expr) -> bool:
    """Whether `value` takes a log or divides: where its argument underflows to 0 in the reference (a
    probability far below the max), the reference's term is infinite though the algebra's is finite."""
    return any((isinstance(n, Unary) and n.op in _LOGS) or (isinstance(n, Binary) and n.op is BinaryOp.DIV)
               for n in walk(value))
