"""Probe lengths: the lengths a shape class is traced at (`redfuser.shapes`), and how the tracer notices the
user's code reading one as a number.

A shape class is traced and fused at `PROBES` and again at `CHECK_PROBES` (one pair per symbol: large primes
no body computes by accident), and the two programs must be equal up to the probes. What that cannot see is
a decision on a length both probes take the same way (``if x.shape[0] > 8``): so while a class is traced,
the tracer keeps each probe length of a shape as a `ProbeLength`, an int that notes when the user's code
uses it as a number (compares, computes with, converts or formats it: any method of `int`, and any function
of the `math` module, which reads an int's digits in C and is wrapped while a trace notes reads; RedFuser's
own code, which builds the program from lengths, is not noted). A symbol whose probe was read so is kept
static. C code that reads an int's value calling none of its methods (numpy's, ``0.5 * n``, ``hex(n)``) is
not seen (docs/shapes.md).
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import math
import os
import sys
import threading
import types
from typing import Iterator

from .ir.source import SourceLoc, is_internal, user_loc

PROBES = (10007, 10009, 10037, 10039, 10061, 10067, 10069, 10079, 10091, 10093, 10099, 10103, 10111, 10133,
          10139, 10141)
"""The lengths a shape class is traced at, one per symbol (so at most this many symbols a class)."""
CHECK_PROBES = (20011, 20021, 20023, 20029, 20047, 20051, 20063, 20071, 20089, 20101, 20107, 20113, 20117,
                20123, 20129, 20143)
"""The second tracing's lengths (`PROBES`' partners)."""


@functools.lru_cache(maxsize=4096)
def _users(filename: str) -> bool:
    """Whether code of `filename` is the user's: not RedFuser's own, not numpy's or ml_dtypes'."""
    import ml_dtypes
    import numpy

    libraries = tuple(os.path.join(os.path.dirname(m.__file__), "") for m in (numpy, ml_dtypes))
    return not is_internal(filename) and not os.path.abspath(filename).startswith(libraries)


PROBE_LENGTHS = frozenset(PROBES) | frozenset(CHECK_PROBES)
"""Every probe length (a static length equal to one cannot be told from a symbol's probe)."""
class ProbeReads(set):
    """The probe lengths the user's code read as numbers (a set of ints), with `where` each was first read
    (the user's line: what `Kernel.polymorphism` names)."""

    def __init__(self) -> None:
        super().__init__()
        self.where: dict[int, SourceLoc] = {}

    def note(self, probes: frozenset[int]) -> None:
        """Add `probes`, noting the user's line for those read for the first time."""
        new = probes - self
        if new:
            loc = user_loc()
            for p in new:
                self.where.setdefault(p, loc)
        self.update(probes)


_reads: contextvars.ContextVar[ProbeReads | None] = contextvars.ContextVar("redfuser_probe_reads", default=None)
_stop: contextvars.ContextVar[bool] = contextvars.ContextVar("redfuser_probe_reads_stop", default=False)
_lengths: contextvars.ContextVar[dict[int, int]] = contextvars.ContextVar("redfuser_probe_lengths", default={})


class ProbeRead(BaseException):
    """The user's code read a probe length as a number while a trace that asked to stop there
    (`noting_probe_reads` with ``stop``) ran: its symbols stay static, so the rest of the trace is not
    needed, and a body that loops over a symbolic length (``for i in range(x.shape[1])``) would otherwise
    be traced ten thousand times over (minutes) before its read is seen. A BaseException, so that the
    body's own ``except Exception`` does not take it for its error."""

    def __init__(self, probes: frozenset[int]) -> None:
        super().__init__(sorted(probes))
        self.probes = probes
        reads = _reads.get()
        self.where = {p: reads.where[p] for p in probes if p in reads.where} if reads is not None else {}


class CallTooShort(ProbeRead):
    """The trace needs more elements along a symbolic axis than the call being compiled has
    (`needed_past_the_call`). Unlike another read this may be a fact about the call, not the class: a call
    of 3 columns below a body's ``x[:, 7]`` (numpy's IndexError), whose class serves every longer call.
    `needs`: each probe -> the least length the trace needed (`Kernel._polymorphic` tells the two apart)."""

    def __init__(self, probes: frozenset[int], needs: dict[int, int]) -> None:
        super().__init__(probes)
        self.needs = needs


class ProbeLength(int):
    """A length as the body sees it (``x.shape[d]``, ``x.size``) while a shape class is traced, when it is a
    probe or a product with probes (`probes`): an int that notes when the user's code (not RedFuser's)
    uses it as a number -- compares, computes with, converts or formats it. Two traces at different probes
    cannot see a decision such as ``if x.shape[0] > 8`` (both probes are larger); a noted read makes the
    symbols static instead (`noting_probe_reads`)."""

    probes: frozenset[int]

    def __new__(cls, value: int, probes: frozenset[int]) -> "ProbeLength":
        made = super().__new__(cls, value)
        made.probes = probes
        return made

    @property
    def is_one_symbol(self) -> bool:
        """Whether this is one symbolic length as it is (one probe, nothing computed from it): an op handed it
        can read it when the kernel runs (`Length`) instead of compiling its value in."""
        return len(self.probes) == 1 and int(self) in self.probes

    def note_read(self) -> None:
        """Note this length as read whoever reads it (RedFuser's own code deciding on its value, e.g. the
        length of a partial slice ``x[1:]`` of it)."""
        reads = _reads.get()
        if reads is not None:
            reads.note(self.probes)

    def note_if_user(self, frame) -> None:
        """Note this length as read when `frame` (the one using it) is the user's code (not RedFuser's, and
        not numpy's or ml_dtypes', which RedFuser calls on shapes, e.g. to broadcast them)."""
        if _reads.get() is not None and _users(frame.f_code.co_filename):
            _read(self.probes)


def _read(probes: frozenset[int]) -> None:
    """Note `probes` as read by the body, and stop the trace there where it asked to (`ProbeRead`)."""
    _reads.get().note(probes)
    if _stop.get():
        raise ProbeRead(probes)


_TRACED: tuple[type, ...] = ()
"""The traced-array type (`redfuser.tracer.Tracer`, registered by `defers_to`): an int operator given one only
returns NotImplemented, and Python then asks the array's reflected operator, which makes the length an
operand of the program (``n * x`` as ``x * n``: `redfuser.ops.common.operand`), so that is no read."""


def defers_to(cls: type) -> type:
    """Register `cls` as the traced-array type (`_TRACED`); returns it (a class decorator)."""
    global _TRACED
    _TRACED += (cls,)
    return cls


def _noting(name: str):
    """`int`'s method `name`, noting the length as read when the user's code calls it (`note_if_user`), except
    an operator given a traced array (`_TRACED`)."""
    method = getattr(int, name)

    def noted(self, *args, **kwargs):
        if not (len(args) == 1 and isinstance(args[0], _TRACED)):
            self.note_if_user(sys._getframe(1))
        return method(self, *args, **kwargs)

    noted.__name__ = name
    noted.__doc__ = method.__doc__
    return noted


def _noting_attribute(name: str) -> property:
    """`int`'s attribute `name` (``n.real``, ``n.numerator``: the value as a plain int, which no later read of
    would see), noting the length as read when the user's code takes it."""
    descriptor = getattr(int, name)

    def noted(self):
        self.note_if_user(sys._getframe(1))
        return descriptor.__get__(self, int)

    return property(noted, doc=descriptor.__doc__)


_NOT_READS = frozenset({
    # the object machinery: making, pickling, copying, introspecting an int is no read of its value
    "__new__", "__init__", "__init_subclass__", "__subclasshook__", "__class__", "__getattribute__", "__setattr__",
    "__delattr__", "__dir__", "__reduce__", "__reduce_ex__", "__sizeof__", "__getnewargs__", "__getstate__",
    "__doc__", "from_bytes",
    # constants of every int
    "denominator", "imag"})
"""The attributes of `int` that are not a read of the value; every other one is wrapped (`_wrap_int`)."""


def _wrap_int(cls: type) -> None:
    """Make every method and value attribute of `int` on `cls` note a read: wrapped one by one, the reflected
    operators (``c & n`` calls ``n.__rand__``, ``divmod(c, n)`` ``n.__rdivmod__``), ``round(n, -1)``,
    ``n.bit_length()`` and ``math.floor(n)`` went unseen, and a decision both probes took alike was compiled
    into every length. (``__hash__``: a dict or set lookup, ``TABLE.get(x.shape[-1])`` or ``n in {1, 2, 3}``,
    decides on the value without calling ``__eq__``; ``__str__``/``__repr__``: a decision on its digits.)"""
    for name in sorted(set(dir(int)) - _NOT_READS):
        attribute = int.__dict__.get(name, getattr(int, name))
        if isinstance(attribute, types.GetSetDescriptorType | types.MemberDescriptorType):
            setattr(cls, name, _noting_attribute(name))
        elif callable(attribute):
            setattr(cls, name, _noting(name))


_wrap_int(ProbeLength)


# --- math's functions: they read an int argument's value in C, calling none of its methods ---------------

_MATH_FUNCTIONS = {name: f for name, f in vars(math).items() if isinstance(f, types.BuiltinFunctionType)}
"""`math`'s own functions (``math.log2``, ``math.gcd``, ``math.isqrt``, ``math.comb``... take an int's value
straight from its digits, no method of a `ProbeLength` is called), as the module has them."""
_math_lock = threading.Lock()
_math_tracers = 0        # traces noting reads now (the module's functions are wrapped while there is one)


def _noting_math(function):
    """`function` of `math`, noting each `ProbeLength` argument as read when the user's code calls it."""
    @functools.wraps(function)
    def noted(*args, **kwargs):
        if _reads.get() is not None:
            probes = [a for a in (*args, *kwargs.values()) if isinstance(a, ProbeLength)]
            if probes and _users(sys._getframe(1).f_code.co_filename):
                _read(frozenset().union(*(a.probes for a in probes)))
        return function(*args, **kwargs)

    return noted


_MATH_NOTED = {name: _noting_math(f) for name, f in _MATH_FUNCTIONS.items()}


@contextlib.contextmanager
def _math_noted() -> Iterator[None]:
    """`math`'s functions wrapped (`_noting_math`) while a trace notes reads: ``math.log2(x.shape[-1])`` is a
    read. The wrapper is transparent elsewhere (another thread, no trace: its contextvar holds no reads);
    a function imported by name before (``from math import gcd``) is the module's own and not seen."""
    global _math_tracers
    with _math_lock:
        _math_tracers += 1
        if _math_tracers == 1:
            for name, noted in _MATH_NOTED.items():
                setattr(math, name, noted)
    try:
        yield
    finally:
        with _math_lock:
            _math_tracers -= 1
            if _math_tracers == 0:
                for name, function in _MATH_FUNCTIONS.items():
                    setattr(math, name, function)


def _math_after_fork() -> None:
    """In a child of ``os.fork()`` taken while another thread traced: that trace never ends there, so `math`'s
    own functions are back and the lock is free (the child's first shape-class trace waited for it forever;
    found by a helper, hunt_conc/02)."""
    global _math_lock, _math_tracers
    _math_lock = threading.Lock()
    if _math_tracers:
        _math_tracers = 0
        for name, function in _MATH_FUNCTIONS.items():
            setattr(math, name, function)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_math_after_fork)


def probe_length(n: int) -> int:
    """`n` as the tracer keeps a length: a `ProbeLength` while a class is traced and `n` is a probe."""
    return ProbeLength(n, frozenset((n,))) if n in PROBE_LENGTHS and _reads.get() is not None else n


def product_length(n: int, factors: tuple[int, ...]) -> int:
    """`n`, the product of `factors`, as a `ProbeLength` when some factor is one (an array's size)."""
    probes = frozenset(f for f in factors if isinstance(f, ProbeLength))
    return ProbeLength(n, frozenset().union(*(f.probes for f in probes))) if probes else n


def needed_past_the_call(length: int, least: int) -> None:
    """The trace needs `least` elements along a dim of `length` (an int index, a top-k's k): where the call
    being compiled has fewer, the trace has left the path the call takes (``for i in range(1, x.shape[1]):
    x[:, i]``, a loop ``range`` reads without any hook an int subclass can see), and the length counts as
    read as a number (`CallTooShort` where the trace stops at reads: the call may just be below what the
    class needs, ``x[:, 7]`` on 3 columns, which says nothing of longer calls)."""
    if not isinstance(length, ProbeLength) or _reads.get() is None:
        return
    needs = {p: least for p in length.probes if least > _lengths.get().get(p, least)}
    if needs:
        _reads.get().note(length.probes)
        if _stop.get():
            raise CallTooShort(length.probes, needs)


@contextlib.contextmanager
def noting_probe_reads(stop: bool = False, lengths: dict[int, int] | None = None) -> Iterator[ProbeReads]:
    """Collect, in the set it yields, the probe lengths the user's code reads as numbers inside the ``with``;
    with `stop`, raise `ProbeRead` at the first such read (the caller keeps those symbols static).
    `lengths`: the call's own length of each probe (`needed_past_the_call`)."""
    reads = ProbeReads()
    token, stopping, known = _reads.set(reads), _stop.set(stop), _lengths.set(dict(lengths or {}))
    try:
        with _math_noted():
            yield reads
    finally:
        _lengths.reset(known)
        _stop.reset(stopping)
        _reads.reset(token)


__all__ = ["PROBES", "CHECK_PROBES", "PROBE_LENGTHS", "ProbeLength", "ProbeRead", "ProbeReads", "CallTooShort", "probe_length", "product_length",
           "noting_probe_reads", "needed_past_the_call"]
