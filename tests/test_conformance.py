"""Every op of the subset x every dtype x every host backend, against numpy (generated from conformance_table).

A case ``exp-f16-cpu`` runs the table's body for ``exp`` on the f16 inputs of its group on the ``cpu``
backend and compares the result with the same body run on the numpy arrays:

- the result dtype and shape must be numpy's; integers and bools must be equal;
- floats: NaN exactly where numpy has NaN, infinities exactly with their sign, the sign of zero where the
  op's is exactly defined (`Op.signed_zeros`), and finite values under `redfuser.testing.assert_close`
  (f16/bf16/e4m3 results with the roundings `Op.roundings` counts: one for an elementwise op, where numpy
  and the kernel both round once), applied to the whole result (the documented rule) and again to the elements of each binade of the
  reference's magnitude (a dtype's largest value in the same array would otherwise widen every other
  element's absolute tolerance to uselessness). The magnitude of an accumulated value is that of its
  terms (`Op.scale`); values below the smallest normal share one group at the smallest normal's scale;
- a listed divergence is checked, not skipped: on the elements it affects the kernel must give what the
  table says (exactly, or under the tolerance the entry names), it must affect some element of the
  inputs, and where numpy's value is defined the kernel must still differ from it (a stale entry fails).

Cases numpy refuses (``sub-bool-cpu``) must raise a `redfuser.DTypeError` naming the op, and cases the
table says RedFuser refuses must raise the error it names: a `RedFuserError`, never an internal one or a
raw Python exception. To keep compile
time down, the ops of one group that run on one (dtype, backend) are compiled into one kernel returning
all their results; when that kernel fails to build, each op is compiled alone, so a failure is reported
by the case that causes it.
"""
from __future__ import annotations

import functools
import inspect
import warnings

import ml_dtypes
import numpy as np
import pytest

import redfuser as rf
from conformance_table import BACKENDS, DIVERGENCES, OPS, OPS_BY_NAME, Op, divergence, raises
from conformance_values import ALL, inputs
from redfuser.testing import assert_close

CASES = [(op, d, be) for op in OPS for d in op.dtypes if d not in op.errors for be in BACKENDS]
VALUE_CASES = [c for c in CASES if raises(*c) is None]
_VALUE_SET = set(VALUE_CASES)
ERROR_CASES = [(op, d, be) for op in OPS for d in ALL for be in BACKENDS if raises(op, d, be) is not None]


def _id(case: tuple[Op, str, str]) -> str:
    op, d, be = case
    return f"{op.name}-{d}-{be}"


def reference(op: Op, args: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    """`op`'s body on the numpy arrays, as a tuple of arrays (numpy's warnings about NaN/inf are noise)."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = op.body(*args)
    return tuple(np.asarray(o) for o in out) if isinstance(out, tuple) else (np.asarray(out),)


def _kernel(fns: list, arity: int, name: str, backend: str) -> rf.Kernel:
    """A kernel over `arity` arrays returning every output of `fns`, flattened into one tuple."""

    def body(*args):
        outs = []
        for fn in fns:
            out = fn(*args)
            outs.extend(out if isinstance(out, tuple) else (out,))
        return tuple(outs)

    body.__name__ = body.__qualname__ = name
    body.__signature__ = inspect.Signature(
        [inspect.Parameter(f"a{i}", inspect.Parameter.POSITIONAL_OR_KEYWORD) for i in range(arity)])
    return rf.kernel(body, backend=backend)


@functools.cache
def _group_results(group: str, dtype: str, backend: str) -> dict[str, tuple | Exception]:
    """The kernel's outputs for every op of `group` run on (`dtype`, `backend`): one kernel for all of them,
    or one kernel each (with its exception) when the batch fails."""
    ops = [op for op in OPS if op.group == group and (op, dtype, backend) in _VALUE_SET]
    args = inputs(group, dtype)
    counts = [len(reference(op, args)) for op in ops]
    try:
        flat = _kernel([op.body for op in ops], len(args), f"{group}_{dtype}", backend)(*args)
    except Exception:   # split it up, so each failure belongs to its op
        results: dict[str, tuple | Exception] = {}
        for op in ops:
            try:
                out = _kernel([op.body], len(args), op.name, backend)(*args)
                results[op.name] = out if isinstance(out, tuple) else (out,)
            except Exception as exc:
                results[op.name] = exc
        return results
    flat = flat if isinstance(flat, tuple) else (flat,)
    results, start = {}, 0
    for op, n in zip(ops, counts):
        results[op.name], start = tuple(flat[start:start + n]), start + n
    return results


def _binade_check(actual: np.ndarray, expected: np.ndarray, op: Op, scale: np.ndarray, tol: np.dtype,
                  label: str) -> None:
    """`assert_close` (tolerance of dtype `tol`) on the finite elements of each binade of magnitude separately."""
    a, e = actual.astype(np.float64), expected.astype(np.float64)
    finite = np.isfinite(e) & np.isfinite(a)
    tiny = float(ml_dtypes.finfo(expected.dtype).smallest_normal)
    mag = np.maximum(np.maximum(np.abs(np.where(finite, e, 0.0)), np.broadcast_to(scale, e.shape)), tiny)
    binade = np.floor(np.log2(mag))
    for b in np.unique(binade[finite]):
        sel = finite & (binade == b)
        assert_close(actual[sel], expected[sel], tol, op.length, f"{label}: values of magnitude ~2^{int(b)}",
                     scale=float(2.0 ** (b + 1)), roundings=op.roundings)


def compare(actual: object, expected: np.ndarray, op: Op, scale: np.ndarray, label: str,
            tol: np.dtype | None = None) -> None:
    """`actual` equals numpy's `expected` under the rules of the module docstring (the tolerance of dtype
    `tol`, by default the result's)."""
    actual = np.asarray(actual)
    tol = expected.dtype if tol is None else np.dtype(tol)
    assert actual.shape == expected.shape, f"{label}: shape {actual.shape}, numpy's {expected.shape}"
    assert actual.dtype == expected.dtype, f"{label}: dtype {actual.dtype}, numpy's {expected.dtype}"
    if expected.dtype.kind in "biu":
        assert_close(actual, expected, expected.dtype, op.length, label)
        return
    assert_close(actual, expected, tol, op.length, label, scale=float(np.max(scale, initial=0.0)),
                 roundings=op.roundings)
    _binade_check(actual, expected, op, scale, tol, label)
    if op.signed_zeros:
        a, e = actual.astype(np.float64), expected.astype(np.float64)
        zeros = (a == 0) & (e == 0)
        wrong = zeros & (np.signbit(a) != np.signbit(e))
        assert not wrong.any(), (f"{label}: zero of the wrong sign at {np.argwhere(wrong)[:5].tolist()} "
                                 f"(numpy: {e[wrong][:5]})")


def _same_values(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind in "biu":
        return a == b
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return (a64 == b64) & (np.signbit(a64) == np.signbit(b64)) | (np.isnan(a64) & np.isnan(b64))


@pytest.mark.parametrize("case", VALUE_CASES, ids=_id)
def test_values(case: tuple[Op, str, str]) -> None:
    op, dtype, backend = case
    got = _group_results(op.group, dtype, backend)[op.name]
    if isinstance(got, Exception):
        raise AssertionError(f"{_id(case)} raised {type(got).__name__}: {got}") from got
    args = inputs(op.group, dtype)
    expected = reference(op, args)
    assert len(got) == len(expected), f"{len(got)} outputs, numpy's body gives {len(expected)}"
    scale = np.asarray(op.scale(args), np.float64) if op.scale else np.zeros(())
    div = divergence(op, dtype, backend)
    for k, (actual, want) in enumerate(zip(got, expected)):
        label = _id(case) + (f" output {k}" if len(expected) > 1 else "")
        actual = np.asarray(actual)
        if div is not None:
            actual = _check_divergence(div, op, args, actual, want, label)
        compare(actual, want, op, scale, label)
        if dtype in op.exact:
            wrong = ~_same_values(actual, want)
            assert not wrong.any(), (f"{label}: not numpy's value exactly at {np.argwhere(wrong)[:5].tolist()}: "
                                     f"{actual[wrong][:5]} for numpy's {want[wrong][:5]} (inputs {args[0][wrong][:5]})")


def _check_divergence(div, op: Op, args: tuple, actual: np.ndarray, expected: np.ndarray, label: str) -> np.ndarray:
    """Check the divergence on the elements it affects; return `actual` with those elements set to numpy's."""
    affected = np.broadcast_to(div.affected(op, args, expected), expected.shape)
    gives = np.broadcast_to(np.asarray(div.gives(op, args, expected)), expected.shape).astype(expected.dtype)
    assert affected.any(), f"{label}: stale divergence: no input exercises it ({div.reason})"
    assert actual.shape == expected.shape and actual.dtype == expected.dtype, \
        f"{label}: {actual.dtype}{list(actual.shape)}, numpy's {expected.dtype}{list(expected.shape)}"
    if div.within is None:
        wrong = affected & ~_same_values(actual, gives)
        assert not wrong.any(), (f"{label}: the table says the kernel gives {gives[wrong][:5]} at "
                                 f"{np.argwhere(wrong)[:5].tolist()}, it gave {actual[wrong][:5]} ({div.reason})")
    else:
        compare(actual[affected], gives[affected], op, np.zeros(()), f"{label} (as the table says: {div.reason})",
                tol=div.within)
    if div.numpy_defined:
        assert not _passes(compare, actual[affected], expected[affected], op, np.zeros(()), label), \
            f"{label}: stale divergence: the kernel now gives numpy's values ({div.reason})"
    return np.where(affected, expected, actual).astype(expected.dtype)


def _passes(check, *args) -> bool:
    try:
        check(*args)
    except AssertionError:
        return False
    return True


@pytest.mark.parametrize("case", ERROR_CASES, ids=_id)
def test_errors(case: tuple[Op, str, str]) -> None:
    """Numpy refuses (or the table documents a refusal): a RedFuser user error naming the op, not a crash."""
    op, dtype, backend = case
    expected = raises(*case)
    args = inputs(op.group, dtype)
    try:
        out = _kernel([op.body], len(args), op.name, backend)(*args)
    except rf.InternalError as err:
        raise AssertionError(f"{_id(case)}: an internal error instead of {expected.__name__}: {err}") from err
    except Exception as err:
        assert isinstance(err, expected), f"{_id(case)}: {type(err).__name__} instead of {expected.__name__}: {err}"
        assert not isinstance(err, rf.CompileError) or err.op, f"{_id(case)}: the error names no op: {err}"
        if dtype in op.errors:
            assert err.op in op.error_op, f"{_id(case)}: the error names {err.op!r}, not {op.error_op[0]!r}: {err}"
        return
    raise AssertionError(f"{_id(case)}: no error; the kernel returned {out!r:.200}")


# -- the table itself ----------------------------------------------------------------------------------

@pytest.mark.parametrize("op", OPS, ids=lambda op: op.name)
def test_table_matches_numpy(op: Op) -> None:
    """Every dtype has a verdict; numpy accepts the dtypes listed as run and refuses those listed as errors."""
    assert set(op.dtypes) | set(op.errors) == set(ALL), f"{op.name}: no verdict for {set(ALL) - set(op.dtypes)}"
    for d in ALL:
        try:
            reference(op, inputs(op.group, d))
        except Exception as exc:
            assert d in op.errors, f"{op.name}-{d}: numpy raises {type(exc).__name__}: {exc}"
        else:
            assert d not in op.errors, f"{op.name}-{d}: listed as an error, but numpy gives a result"


def test_divergences_name_cells_of_the_table() -> None:
    """A divergence for an op, dtype or backend the table does not run would never be checked."""
    for div in DIVERGENCES:
        op = OPS_BY_NAME.get(div.op)
        assert op is not None, f"divergence for unknown op {div.op!r}"
        assert set(div.dtypes) <= set(op.dtypes) - set(op.errors), f"{div.op}: {div.dtypes}"
        assert set(div.backends) <= set(BACKENDS), f"{div.op}: {div.backends}"
        assert (div.raises is None) == (div.affected is not None), f"{div.op}: raises xor affected/gives"


def test_case_ids_are_unique() -> None:
    ids = [_id(c) for c in CASES]
    assert len(ids) == len(set(ids))


def test_fused_max_over_e4m3_on_the_interpreter() -> None:
    """Found by the table: float8 e4m3fn has no -inf, so a max's identity cast to it was NaN and the
    interpreter's max/min over e4m3 (unfused, and the online state of a fused cascade) gave NaN."""
    x = inputs("reduce", "e4m3")[2]

    def softmax_sum(x):     # (summed in f32: numpy adds e4m3 values in e4m3, which RedFuser refuses)
        m = rf.max(x, axis=-1, keepdims=True)
        return m, rf.sum(rf.exp(x.astype(rf.float32) - m), axis=-1)

    expected = softmax_sum(x)
    got = rf.kernel(softmax_sum, backend="interpret")(x)
    for a, e in zip(got, expected):
        assert_close(a, e, e.dtype, x.shape[-1])
