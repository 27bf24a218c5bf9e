"""Probe lengths: the lengths a shape class is traced at (`redfuser.shapes`), and how the tracer notices the
user's code reading one as a number.

A shape class is traced and fused at `PROBES` and again at `CHECK_PROBES` (one pair per symbol: large primes
no body computes by accident), and the two programs must be equal up to the probes. What that cannot see is
a decision on a length both probes take the same way (``if x.shape[0] > 8``): so while a class is traced,
the tracer keeps each probe length of a shape as a `ProbeLength`, an int that notes when the user's code
uses it as a number (compares, computes with, converts or formats it; RedFuser's own code, which builds the
program from lengths, is not noted). A symbol whose probe was read so is kept static.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import sys
from typing import Iterator

from .ir.source import is_internal

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
_reads: contextvars.ContextVar[set[int] | None] = contextvars.ContextVar("redfuser_probe_reads", default=None)
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

    def note_read(self) -> None:
        """Note this length as read whoever reads it (RedFuser's own code deciding on its value, e.g. the
        length of a partial slice ``x[1:]`` of it)."""
        reads = _reads.get()
        if reads is not None:
            reads.update(self.probes)

    def note_if_user(self, frame) -> None:
        """Note this length as read when `frame` (the one using it) is the user's code (not RedFuser's, and
        not numpy's or ml_dtypes', which RedFuser calls on shapes, e.g. to broadcast them)."""
        if _reads.get() is not None and _users(frame.f_code.co_filename):
            _read(self.probes)


def _read(probes: frozenset[int]) -> None:
    """Note `probes` as read by the body, and stop the trace there where it asked to (`ProbeRead`)."""
    _reads.get().update(probes)
    if _stop.get():
        raise ProbeRead(probes)


def _noting(name: str):
    method = getattr(int, name)

    def noted(self, *args):
        self.note_if_user(sys._getframe(1))
        return method(self, *args)

    noted.__name__ = name
    return noted


for _name in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__", "__rtruediv__",
              "__floordiv__", "__rfloordiv__", "__mod__", "__rmod__", "__pow__", "__rpow__", "__neg__", "__abs__",
              "__lt__", "__le__", "__gt__", "__ge__", "__eq__", "__ne__", "__bool__", "__index__", "__int__",
              "__float__", "__format__", "__and__", "__or__", "__xor__", "__lshift__", "__rshift__", "__divmod__",
              "__str__", "__repr__", "__hash__"):
    # (__hash__: a dict or set lookup, ``TABLE.get(x.shape[-1])`` or ``n in {1, 2, 3}``, decides on the value
    # without calling __eq__; __str__/__repr__: a decision on its digits)
    setattr(ProbeLength, _name, _noting(_name))


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
    read as a number (`ProbeRead` where the trace stops at reads)."""
    if not isinstance(length, ProbeLength) or _reads.get() is None:
        return
    if any(least > _lengths.get().get(p, least) for p in length.probes):
        _read(length.probes)


@contextlib.contextmanager
def noting_probe_reads(stop: bool = False, lengths: dict[int, int] | None = None) -> Iterator[set[int]]:
    """Collect, in the set it yields, the probe lengths the user's code reads as numbers inside the ``with``;
    with `stop`, raise `ProbeRead` at the first such read (the caller keeps those symbols static).
    `lengths`: the call's own length of each probe (`needed_past_the_call`)."""
    reads: set[int] = set()
    token, stopping, known = _reads.set(reads), _stop.set(stop), _lengths.set(dict(lengths or {}))
    try:
        yield reads
    finally:
        _lengths.reset(known)
        _stop.reset(stopping)
        _reads.reset(token)


__all__ = ["PROBES", "CHECK_PROBES", "PROBE_LENGTHS", "ProbeLength", "ProbeRead", "probe_length", "product_length",
           "noting_probe_reads", "needed_past_the_call"]
