"""Running a fuzzed program on one backend and judging every call against the oracle.

One kernel object per backend (``rf.kernel(body, backend=..., **options)``) is
called with each of the program's calls in order. Each call is judged against
`program_oracle.reference`:

- numpy refuses the program: the kernel must raise a `CompileError` (a user
  error: ``ShapeError``, ``DTypeError``...); returning is ``accepted``;
- a masked-array argument whose mask changes numpy's result (or that numpy's
  masked operations refuse): the kernel must refuse it (``mask dropped``
  otherwise); where the mask changes nothing, a refusal or the plain result
  both pass;
- numpy computes it: a user error is ``refused`` (the grammar draws only the
  subset; unless numpy's values pass through a dtype RedFuser lacks, such as the
  int8 of ``bool_array ** 2``, which a kernel must refuse), an `InternalError`/`VerifyError` is ``internal error``, a
  `SimulationError` ``simulation error``, a `BackendError` ``backend error``, any
  other exception ``exception`` (except the refusals by design of
  `KNOWN_LIMITS`); returned outputs must have numpy's count,
  shapes and dtypes (``wrong shape``, ``wrong dtype``); integers and bools equal
  exactly, floats in the same class (finite, NaN, +inf, -inf: ``wrong class``)
  and within ``C * err`` of the reference (``wrong value``), except where the
  oracle marks an element unsure (counted, never judged). The unsure elements
  of the fusion engine's documented limits (`LIMITS`: oracle rules (4) and (6))
  are also counted apart, with the calls they were in and how many of them the
  kernel computed otherwise than numpy (where the limit did bite).

After each call the input arrays must be unchanged, and so must the guard bytes
around contiguous ones (`program_data.guarded`): ``wrote memory``. A crash of
the process or a hang is seen by the worker pool (`fuzz_pool`): ``crash`` and
``timeout``.
"""
from __future__ import annotations

import traceback
import warnings
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

import redfuser as rf
from redfuser.ir import (
    BackendError,
    CompileError,
    InternalError,
    RedFuserError,
    SimulationError,
)

from .program import Program
from .program_data import guards_intact
from .program_oracle import Reference, Value, _class, is_float, reference
from .tolerance import C

KINDS = ("wrong value", "wrong class", "wrong dtype", "wrong shape", "accepted", "refused", "mask dropped",
         "wrote memory", "internal error", "simulation error", "backend error", "exception", "crash", "timeout",
         "cascade soundness", "cascade completeness", "cascade unexpected fusion", "cascade reason")
"""Failure kinds; the ``cascade`` ones are `cascade_check`'s properties of the fusion grammar's examples."""
LIMITS = ("precondition", "expansion")
"""The fusion engine's documented limits the oracle marks unsure (`Value.limit`: rule (6), the theorem's
precondition; `Value.expansion`: rule (4), sums of expanded terms that overflow), counted apart."""
KNOWN_LIMITS = ("ranking int64 values (rf.topk, rf.argmax, rf.argmin) is not compiled", "values per row is not compiled for the GPU backends")
"""Refusals by design: a `BackendError` whose message holds one of these passes (the grammar avoids them; a
run of static scalars can still lead there: ``True`` then ``2`` makes a bool an int64)."""


@dataclass(frozen=True)
class Failure:
    """One call judged wrong: what, where, and what the reproducer asserts."""

    kind: str
    backend: str
    call: int
    message: str
    error_type: str = ""
    output: int = 0
    index: tuple[int, ...] | None = None    # wrong value / class: the worst element
    allowed: float = 0.0

    def signature(self) -> tuple[str, str, str]:
        """Failures with one signature are likely one bug (and shrinking keeps it)."""
        return (self.backend, self.kind, self.error_type)


@dataclass
class Outcome:
    """Everything one program did on one backend."""

    failures: list[Failure] = field(default_factory=list)
    calls: int = 0
    judged: int = 0        # elements compared
    unsure: int = 0        # elements the oracle could not judge
    refusals: int = 0      # calls numpy and the kernel both refused (as they should)
    limit_elements: Counter = field(default_factory=Counter)   # LIMITS -> unsure elements of the outputs
    limit_calls: Counter = field(default_factory=Counter)      # LIMITS -> calls with any
    limit_differ: Counter = field(default_factory=Counter)     # LIMITS -> ... the kernel computed otherwise


def _error_kind(err: BaseException) -> str:
    if isinstance(err, SimulationError):
        return "simulation error"
    if isinstance(err, InternalError):
        return "internal error"
    if isinstance(err, BackendError):
        return "backend error"
    return "exception"


def _describe(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    where = ""
    if not isinstance(err, RedFuserError):
        frames = traceback.extract_tb(err.__traceback__)
        where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"{type(err).__name__}: {text[0][:300] if text else ''}{where}"


def run(program: Program, backend: str, references: list[Reference] | None = None) -> Outcome:
    """Call `program` on `backend` (one kernel object, every call in order) and judge each call."""
    out = Outcome()
    refs = references or [reference(program, i, backend) for i in range(len(program.calls))]
    try:
        kernel = rf.kernel(program.body, backend=backend, **dict(program.options))
    except Exception as err:
        out.failures.append(Failure(_error_kind(err) if not isinstance(err, CompileError) else "refused", backend, 0,
                                    f"rf.kernel(...) raised {_describe(err)}", type(err).__name__))
        return out
    for i, ref in enumerate(refs):
        out.calls += 1
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            args = program.arguments(i)
            before = [np.ma.getdata(a).tobytes() for a in args if isinstance(a, np.ndarray)]
            try:
                got = kernel(*args)
            except CompileError as err:
                if ref.error is not None or ref.masked or ref.unsupported:
                    out.refusals += 1
                else:
                    out.failures.append(Failure("refused", backend, i, f"the kernel refused a program numpy runs: "
                                                f"{_describe(err)}", type(err).__name__))
                continue
            except Exception as err:
                if any(limit in str(err) for limit in KNOWN_LIMITS):
                    out.refusals += 1
                else:
                    out.failures.append(Failure(_error_kind(err), backend, i, _describe(err), type(err).__name__))
                continue
            finally:
                written = _writes(args, before)
                if written:
                    out.failures.append(Failure("wrote memory", backend, i, written))
        if ref.masked and (ref.mask_matters or ref.error is not None):
            out.failures.append(Failure("mask dropped", backend, i, "a masked array whose mask changes numpy's "
                                        "result was accepted (the mask is lost)"))
            continue
        if ref.error is not None:
            out.failures.append(Failure("accepted", backend, i, f"numpy refuses this call ({_describe(ref.error)}) "
                                        "but the kernel returned a result", type(ref.error).__name__))
            continue
        failure = compare(got, ref, backend, i, out)
        if failure is not None:
            out.failures.append(failure)
        _count_limits(got, ref, out)
    return out


def _count_limits(got: object, ref: Reference, out: Outcome) -> None:
    """Add the call's outputs' elements that a documented fusion limit made unsure (`LIMITS`), and those of
    them the kernel computed otherwise than numpy."""
    outputs = got if isinstance(got, tuple) else (got,)
    for name in LIMITS:
        n = differ = 0
        for g, v in zip(outputs, ref.outputs):
            mask = np.asarray(v.limit if name == "precondition" else v.expansion)
            n += int(mask.sum())
            if mask.any():
                differ += int((mask & _differs(np.asarray(g), v)).sum())
        if n:
            out.limit_elements[name] += n
            out.limit_calls[name] += 1
            out.limit_differ[name] += differ


def _differs(g: np.ndarray, v: Value) -> np.ndarray | bool:
    """Elements of `g` that would fail against `v` if they were judged (False where shapes or dtypes differ)."""
    r = np.asarray(v.ref)
    if g.shape != r.shape or g.dtype != r.dtype:
        return False
    if not is_float(r.dtype):
        return g != r
    a, e = g.astype(np.float64), r.astype(np.float64)
    with np.errstate(all="ignore"):
        off = np.abs(a - e) > C * np.asarray(v.err, np.float64)
    return (_class(g) != _class(r)) | ((_class(r) == 0) & off)


def _writes(args: list[object], before: list[bytes]) -> str:
    """What the kernel wrote that it must not: its inputs, or the guard bytes around them ("" when nothing)."""
    arrays = [a for a in args if isinstance(a, np.ndarray)]
    for n, (a, old) in enumerate(zip(arrays, before)):
        if np.ma.getdata(a).tobytes() != old:
            return f"the kernel changed input array {n}"
        if not guards_intact(a):
            return f"the kernel wrote past the end (or before the start) of input array {n}"
    return ""


def compare(got: object, ref: Reference, backend: str, call: int, out: Outcome | None = None) -> Failure | None:
    """The first way the kernel's outputs `got` differ from the judged reference, or None."""
    outputs = got if isinstance(got, tuple) else (got,)
    if len(outputs) != len(ref.outputs):
        return Failure("wrong shape", backend, call, f"{len(outputs)} outputs, numpy gives {len(ref.outputs)}")
    for j, (g, v) in enumerate(zip(outputs, ref.outputs)):
        f = judge_output(np.asarray(g), v, backend, call, j, out)
        if f is not None:
            return f
    return None


def judge_output(g: np.ndarray, v: Value, backend: str, call: int, j: int, out: Outcome | None) -> Failure | None:
    """One output against its reference value (the rules of the module docstring)."""
    r = np.asarray(v.ref)
    if g.shape != r.shape:
        return Failure("wrong shape", backend, call, f"output {j}: shape {g.shape}, numpy {r.shape}", output=j)
    if g.dtype != r.dtype:
        return Failure("wrong dtype", backend, call, f"output {j}: dtype {g.dtype}, numpy {r.dtype}",
                       f"{g.dtype} for {r.dtype}", output=j)
    unsure = np.asarray(v.unsure)
    if out is not None:
        out.judged += int(unsure.size - unsure.sum())
        out.unsure += int(unsure.sum())
    if not is_float(r.dtype):
        bad = (g != r) & ~unsure
        if bad.any():
            idx = tuple(int(i) for i in np.argwhere(bad)[0])
            return Failure("wrong value", backend, call, f"output {j}: {int(bad.sum())} of {bad.size} values differ; "
                           f"first at {idx}: kernel {g[idx]!r}, numpy {r[idx]!r}", output=j, index=idx)
        return None
    cg, cr = _class(g), _class(r)
    bad = (cg != cr) & ~unsure
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        return Failure("wrong class", backend, call, f"output {j}: NaN/inf differ at {int(bad.sum())} of {bad.size}; "
                       f"first at {idx}: kernel {float(g[idx])!r}, numpy {float(r[idx])!r}", output=j, index=idx)
    a, e = g.astype(np.float64), r.astype(np.float64)
    allowed = C * np.asarray(v.err, np.float64)
    with np.errstate(all="ignore"):
        over = np.where((cr == 0) & ~unsure & np.isfinite(allowed), np.abs(a - e) - allowed, -np.inf)
    if over.size and float(over.max()) > 0:
        idx = tuple(int(i) for i in np.unravel_index(int(np.argmax(over)), over.shape))
        n = int((over > 0).sum())
        what = "exact" if v.exact else f"allowed {float(allowed[idx]):.3g}"
        return Failure("wrong value", backend, call, f"output {j}: {n} of {over.size} values off; worst at {idx}: "
                       f"kernel {float(a[idx])!r}, numpy {float(e[idx])!r} ({what})", output=j, index=idx,
                       allowed=float(allowed[idx]))
    return None
