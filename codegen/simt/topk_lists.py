"""Sorted k-lists in SIMT registers, and the networks that insert into, sort and merge them (the top-k monoid).

A k-list is k `Entry`s, best first; an entry is a value register and an index
register, each a vector over some rows a thread holds (every statement works on
all of them at once). The order is `redfuser.ir.topk`'s, as the comparison
``c beats e``:

    c.ok and (not e.ok                                  an empty slot (index < 0) loses to anything
              or (c.num and not e.num)                  numbers beat NaN
              or (c.num == e.num                        same class: larger value, then lower index
                  and (c.v > e.v or ((c.v == e.v or not c.num) and c.i < e.i))))

(``ok``: index >= 0; ``num``: value == value; -0.0 ties with 0.0 and two NaNs
tie, both going by index, like numpy's sort). Indices are compared in their own
dtype (i64 exactly). The networks rely on that order being total on the entries
they see (distinct indices; empties are interchangeable):

- `insert` (one candidate into a sorted list): slot j keeps its entry, takes the
  candidate or takes slot j-1's, from ``beats(c, slot)`` -- k comparisons;
- `merge` (two sorted lists, k a power of two): ``better(a_i, b_{k-1-i})`` is the
  top k as a bitonic sequence, then ``log2 k`` half-cleaner stages sort it;
- `sort` (any list, k a power of two): Batcher's bitonic sorting network;
- `shuffle_list`: a lane's whole list from its ``shfl.bfly`` partner; 64-bit
  values and indices cross as two i32 words (`Bitcast`, shifts, casts).

What is known at compile time is not computed at run time. An `Entry` carries
`ok` when known: an empty slot (`Ranker.empty`) is not ok, and a candidate
whose index tile is proven non-negative (`affine.py`) is, as is any pick
between two entries that agree. A comparison with an empty slot, or between
entries known ok, then drops those terms; and where `c` is known to come after
`e` in index order (`insert` of a thread's own candidates, which arrive by
increasing position), ``c.i < e.i`` is false, so the comparison shrinks to
``c.ok and (not e.ok or (c.num and not e.num) or c.v > e.v)``. A comparison
the facts decide is a Python bool, and a pick on it emits nothing (MoE routing's
kernel: a quarter fewer PTX instructions, docs/gpu-backend.md).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ...ir.semantics import BinaryOp, UnaryOp
from ...ir.simt.nodes import IntOp, Reg, ShuffleKind
from ...ir.types import DType, float32, int32, int64
from .values import LoweringBuilder


@dataclass(frozen=True, slots=True)
class Entry:
    """One slot of a k-list: `value` (f32/f64) and `index` (i32/i64) registers of one length; `ok` what is known
    of the index at compile time (True: a real position, >= 0; False: an empty slot; None: either)."""

    value: Reg
    index: Reg
    ok: bool | None = field(default=None, compare=False)


KList = tuple[Entry, ...]


class Ranker:
    """Emits the comparisons and networks of top-k order through one builder (predicates made once per entry)."""

    def __init__(self, b: LoweringBuilder) -> None:
        self.b = b
        self._not: dict[str, Reg] = {}
        self._nums: dict[str, Reg] = {}

    def _const(self, value, like: Reg) -> Reg:
        return self.b.const_of(value, like.dtype, like.length)

    def empty(self, like: Entry) -> Entry:
        """An empty slot shaped like `like`: (NaN, -1)."""
        return Entry(self._const(float("nan"), like.value), self._const(-1, like.index), ok=False)

    def _negate(self, x: Reg) -> Reg:
        found = self._not.get(x.name)
        if found is None:
            found = self._not[x.name] = self.b.unary(UnaryOp.NOT, x)
        return found

    def _ok(self, e: Entry) -> Reg:
        return self.b.arith(BinaryOp.GE, e.index, self._const(0, e.index))

    def _num(self, e: Entry) -> Reg:
        found = self._nums.get(e.value.name)
        if found is None:
            found = self._nums[e.value.name] = self.b.arith(BinaryOp.EQ, e.value, e.value)
        return found

    def beats(self, c: Entry, e: Entry, later: bool = False) -> Reg | bool:
        """Whether `c` comes before `e` in top-k order: a bool register, or a Python bool where the entries'
        facts decide it (see the module docstring). `later`: `c`'s index is known to be above `e`'s."""
        if c.ok is False:
            return False
        if e.ok is False:
            return True if c.ok else self._ok(c)
        a = self.b.arith
        c_num, e_num = self._num(c), self._num(e)
        greater = a(BinaryOp.GT, c.value, e.value)
        better_class = a(BinaryOp.AND, c_num, self._negate(e_num))
        if later:    # the same class then needs a larger value: a tie, of numbers or of NaNs, keeps e
            wins = a(BinaryOp.OR, better_class, greater)
        else:
            level = a(BinaryOp.OR, a(BinaryOp.EQ, c.value, e.value), self._negate(c_num))
            lower = a(BinaryOp.LT, c.index, e.index)
            same_class = a(BinaryOp.AND, a(BinaryOp.EQ, c_num, e_num),
                           a(BinaryOp.OR, greater, a(BinaryOp.AND, level, lower)))
            wins = a(BinaryOp.OR, better_class, same_class)
        if e.ok is None:
            wins = a(BinaryOp.OR, self._negate(self._ok(e)), wins)
        return wins if c.ok else a(BinaryOp.AND, self._ok(c), wins)

    def pick(self, cond: Reg | bool, x: Entry, y: Entry) -> Entry:
        """`x` where `cond`, else `y` (nothing emitted when `cond` is a Python bool or both are one entry)."""
        if cond is True or x == y:
            return x
        if cond is False:
            return y
        return Entry(self.b.select(cond, x.value, y.value), self.b.select(cond, x.index, y.index),
                     ok=x.ok if x.ok == y.ok else None)

    def exchange(self, x: Entry, y: Entry) -> tuple[Entry, Entry]:
        """(the better, the worse) of `x` and `y` (`y` first when neither beats the other)."""
        w = self.beats(x, y)
        return self.pick(w, x, y), self.pick(w, y, x)

    def single(self, c: Entry, k: int) -> KList:
        """The k-list holding only `c`."""
        return (c,) + (self.empty(c),) * (k - 1)

    def insert(self, lst: KList, c: Entry, later: bool = False) -> KList:
        """Sorted `lst` with candidate `c` taken in (the worst entry drops out); `later`: `c`'s index is known to
        be above every index in `lst`."""
        wins = [self.beats(c, e, later) for e in lst]
        out = [self.pick(wins[0], c, lst[0])]
        for j in range(1, len(lst)):
            out.append(self.pick(wins[j], self.pick(wins[j - 1], lst[j - 1], c), lst[j]))
        return tuple(out)

    def _clean(self, lst: list[Entry]) -> KList:
        """Half-cleaner stages sorting a bitonic list of a power-of-two length, best first."""
        k = len(lst)
        stride = k // 2
        while stride:
            for i in range(k):
                if not i & stride:
                    lst[i], lst[i + stride] = self.exchange(lst[i], lst[i + stride])
            stride //= 2
        return tuple(lst)

    def merge(self, a: KList, b: KList) -> KList:
        """The best k of two sorted k-lists, sorted (k a power of two)."""
        k = len(a)
        firsts = []
        for i in range(k):
            w = self.beats(a[i], b[k - 1 - i])
            firsts.append(self.pick(w, a[i], b[k - 1 - i]))
        return self._clean(firsts)

    def sort(self, lst: KList) -> KList:
        """`lst` sorted best first (k a power of two): Batcher's bitonic network."""
        out = list(lst)
        k = len(out)
        size = 2
        while size <= k:
            stride = size // 2
            while stride:
                for i in range(k):
                    j = i ^ stride
                    if j > i:
                        first, second = self.exchange(out[i], out[j])
                        out[i], out[j] = (first, second) if not i & size else (second, first)
                stride //= 2
            size *= 2
        return tuple(out)

    def widen(self, lst: KList, dtype: DType) -> KList:
        """`lst` with its indices in `dtype` (a sign extension, which keeps their order)."""
        if all(e.index.dtype == dtype for e in lst):
            return lst
        return tuple(Entry(e.value, self.b.const_of(-1, dtype, e.index.length), ok=False) if e.ok is False
                     else Entry(e.value, self.b.cast(e.index, dtype), e.ok) for e in lst)

    def normalize(self, lst: KList) -> KList:
        """Empty slots written as (NaN, -1) whatever they carried."""
        out = []
        for e in lst:
            if e.ok is not None:                  # known: a real entry stays, an empty one is (NaN, -1) already
                out.append(e if e.ok else self.empty(e))
                continue
            empty = self.b.arith(BinaryOp.LT, e.index, self._const(0, e.index))
            out.append(Entry(self.b.select(empty, self._const(float("nan"), e.value), e.value),
                             self.b.select(empty, self._const(-1, e.index), e.index)))
        return tuple(out)


# --- lists across lanes ---------------------------------------------------------------------------

def _words(b: LoweringBuilder, x: Reg) -> list[Reg]:
    """`x` as the i32/f32 registers a shuffle moves (64-bit types as low and high i32 words)."""
    if x.dtype in (float32, int32):
        return [x]
    bits = b.bitcast(x, int64) if x.dtype.is_float else x
    high = b.cast(b.int_op(IntOp.SHR, bits, b.const_of(32, int64, x.length)), int32)
    return [b.cast(bits, int32), high]


def _join(b: LoweringBuilder, words: list[Reg], dtype: DType) -> Reg:
    """The inverse of `_words`."""
    if len(words) == 1:
        return words[0]
    low, high = words
    n = low.length
    low64 = b.int_op(IntOp.AND, b.cast(low, int64), b.const_of(0xFFFFFFFF, int64, n))
    high64 = b.int_op(IntOp.SHL, b.cast(high, int64), b.const_of(32, int64, n))
    bits = b.int_op(IntOp.OR, high64, low64)
    return b.bitcast(bits, dtype) if dtype.is_float else bits


def shuffle_reg(b: LoweringBuilder, x: Reg, mask: int) -> Reg:
    """Register `x` of the lane ``lane ^ mask`` (``shfl.sync.bfly``), any 32/64-bit dtype, scalar or vector."""
    moved = []
    for word in _words(b, x):
        elems = [b.shuffle(ShuffleKind.BFLY, b.piece(word, e), mask) for e in range(word.length)]
        moved.append(elems[0] if len(elems) == 1 else b.pack(elems))
    return _join(b, moved, x.dtype)


def shuffle_list(b: LoweringBuilder, lst: KList, mask: int) -> KList:
    """The k-list of the lane ``lane ^ mask`` (slot facts are the same in every lane; an empty slot stays)."""
    return tuple(e if e.ok is False else Entry(shuffle_reg(b, e.value, mask), shuffle_reg(b, e.index, mask), e.ok)
                 for e in lst)


__all__ = ["Entry", "KList", "Ranker", "shuffle_list", "shuffle_reg"]
