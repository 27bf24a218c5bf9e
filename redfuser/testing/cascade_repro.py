"""Turning a failing cascade into a small, self-contained Python reproducer.

`shrink` simplifies a failing `Cascade` greedily (shorter axis, fewer reductions
and outputs, no mask or special values, one row, float32, normal data, chunk 1,
...) while it still fails the same way. `reproducer` prints it as a script
that imports only numpy and redfuser, defines the kernel body as plain source,
builds the exact arrays from a numpy seed, runs the kernel and the reference,
and asserts the property that failed (the script exits non-zero while the bug
is there).
"""
from __future__ import annotations

import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

from .cascade_check import Failure, check, sequential_sums
from .cascade_nodes import leaves, rename
from .cascades import SIDES, Cascade, Gemm, Reduction


def same_failure(target: Failure) -> Callable[[Cascade], bool]:
    """A predicate: the cascade fails with `target`'s kind (on the same reduction, when it names one)."""

    def fails(c: Cascade) -> bool:
        verdict = check(c, soundness=target.kind in ("soundness", "crash"))
        return any(f.kind == target.kind and (not target.reduction or f.reduction == target.reduction)
                   for f in verdict.failures)

    return fails


def shrink(c: Cascade, fails: Callable[[Cascade], bool], budget: int = 150, seconds: float = 60.0) -> tuple[Cascade, int]:
    """The simplest variant of `c` found that still `fails`, and how many candidates were tried."""
    tried, deadline = 0, time.monotonic() + seconds
    improved = True
    while improved and tried < budget and time.monotonic() < deadline:
        improved = False
        for candidate in _candidates(c):
            tried += 1
            if fails(candidate):
                c, improved = candidate, True
                break
            if tried >= budget or time.monotonic() >= deadline:
                break
    return c, tried


def _dims(c: Cascade) -> tuple[tuple[int, ...], int]:
    """(leading dims + rows, value width) of `c`."""
    shapes = dict(c.data.shapes)
    return c.data.shapes[0][1][:-1], shapes["v"][-1] if "v" in shapes else 1


def reshape(c: Cascade, n: int | None = None, lead_rows: tuple[int, ...] | None = None, d: int | None = None,
            dv: int | None = None) -> Cascade:
    """`c` with other dimensions (special values that fall outside are dropped)."""
    old_lead, old_dv = _dims(c)
    n, lead_rows = n or c.n, lead_rows or old_lead
    dv = dv or old_dv
    gemm = replace(c.gemm, d=d or c.gemm.d, dv=dv) if c.gemm else None
    shapes = []
    for name, _ in c.data.shapes:
        shape = {"q": lead_rows + (gemm.d if gemm else 0,), "k": lead_rows[:-1] + (n, gemm.d if gemm else 0),
                 "v": lead_rows[:-1] + (n, dv)}.get(name, lead_rows + (n,))
        shapes.append((name, shape))
    sizes = {name: _size(s) for name, s in shapes}
    specials = tuple(s for s in c.data.specials if s[1] < sizes[s[0]])
    data = replace(c.data, shapes=tuple(shapes), specials=specials, first_chunk=min(c.data.first_chunk, n))
    return replace(c, n=n, gemm=gemm, data=data)


def _size(shape: tuple[int, ...]) -> int:
    out = 1
    for s in shape:
        out *= s
    return out


def _drop(c: Cascade, r: Reduction) -> Cascade:
    reductions = tuple(x for x in c.reductions if x is not r)
    returns = tuple(n for n in c.returns if n != r.name) or (reductions[-1].name,)
    used = set().union(*(leaves(x.body) for x in reductions)) | {"v"} if any(x.op == "matmul" for x in reductions) \
        else set().union(*(leaves(x.body) for x in reductions))
    shapes = tuple(s for s in c.data.shapes if s[0] not in ("w", "v") or s[0] in used)
    specials = tuple(s for s in c.data.specials if s[0] in dict(shapes))
    return replace(c, reductions=reductions, returns=returns, data=replace(c.data, shapes=shapes, specials=specials))


def _unmask(c: Cascade) -> Cascade:
    reductions = tuple(replace(r, body=rename(r.body, c.d_name, c.data_name),
                               terms=tuple(rename(t, c.d_name, c.data_name) for t in r.terms)) for r in c.reductions)
    shapes = tuple(s for s in c.data.shapes if s[0] != "mask")
    data = replace(c.data, shapes=shapes, keep=1.0, full_row=False, first_chunk=0)
    return replace(c, masked=False, reductions=reductions, data=data)


def _candidates(c: Cascade) -> Iterator[Cascade]:
    for side in SIDES:
        if side >= c.n:
            break
        yield reshape(c, n=side)
    read = {j for r in c.reductions for j in r.reads}
    for r in reversed(c.reductions):
        if r.name not in read and len(c.reductions) > 1:
            yield _drop(c, r)
    for name in c.returns:
        if len(c.returns) > 1:
            yield replace(c, returns=tuple(n for n in c.returns if n != name))
    data = c.data
    if data.specials:
        yield replace(c, data=replace(data, specials=()))
    if c.masked:
        yield _unmask(c)
        if data.full_row:
            yield replace(c, data=replace(data, full_row=False))
        if data.first_chunk:
            yield replace(c, data=replace(data, first_chunk=0))
    lead_rows, dv = _dims(c)
    if len(lead_rows) > 1:
        yield reshape(c, lead_rows=lead_rows[1:])
    if lead_rows[-1] > 1:
        yield reshape(c, lead_rows=lead_rows[:-1] + (1,))
    if c.gemm and (c.gemm.d > 1 or dv > 1 or c.gemm.scale != 1.0):
        yield reshape(replace(c, gemm=Gemm(c.gemm.d, c.gemm.dv, 1.0)), d=1, dv=1)
    elif dv > 1:
        yield reshape(c, dv=1)
    if data.dtype != "float32":
        yield replace(c, data=replace(data, dtype="float32"))
    if data.profile != "normal":
        scale = tuple((n, 1.0 / ((c.gemm.d ** 0.5) * c.gemm.scale) if c.gemm else 1.0, 0.0) for n, _, _ in data.data_scale)
        yield replace(c, data=replace(data, profile="normal", data_scale=scale))
    for chunk in (1, 2, 3):
        if chunk < c.chunk:
            yield replace(c, chunk=chunk)
    if data.seed:
        yield replace(c, data=replace(data, seed=0))


# --------------------------------------------------------------------------------------------
# the script
# --------------------------------------------------------------------------------------------
def reproducer(c: Cascade, failure: Failure, origin: str = "") -> str:
    """A self-contained Python script that fails while `failure` is there (see the module docstring)."""
    args = ", ".join(c.inputs)
    name = failure.reduction
    summary = "\n".join(textwrap.wrap(failure.message, 100, break_long_words=False)[:12])
    where = f" in `{name}`" if name else ""
    lines = [f'"""RedFuser fusion fuzzer: {failure.kind} failure{where}{origin}.', "", summary, '"""',
             "import numpy as np", "", "import redfuser as rf"]
    tools = (["wide_reference"] if sequential_sums(c) else []) + (["assert_close"] if failure.scale is not None else [])
    if tools:  # (wide_reference: the checker's reference for bf16, cascade_check.reference)
        lines.append(f"from redfuser.testing.tolerance import {', '.join(sorted(tools))}")
    lines += ["", "", c.source(), "", ""]
    lines += c.data.source()
    lines += [f"kernel = rf.kernel(cascade, backend=\"interpret\", interpret_chunk={c.chunk})",
              f"lowered = kernel.lower({args})",
              'print(lowered.stages["fused"])',
              "for group in lowered.groups:",
              "    print(group.reductions, 'fused:', group.fused_members, 'reason:', group.reason)",
              "fused = {n for g in lowered.groups for n in g.fused_members}",
              "with np.errstate(all=\"ignore\"):",
              f"    got = kernel({args})",
              f"    want = wide_reference(cascade, {args})" if sequential_sums(c) else f"    want = cascade({args})"]
    lines += _assertions(c, failure)
    return "\n".join(lines) + "\n"


def _assertions(c: Cascade, failure: Failure) -> list[str]:
    name = failure.reduction
    r = next((x for x in c.reductions if x.name == name), None)
    what = f"{r.op} of {r.family}" if r else ""
    if failure.kind == "soundness":
        out = []
        if len(c.returns) > 1:
            k = c.returns.index(name)
            out.append(f"got, want = got[{k}], want[{k}]  # `{name}`")
        out += ["print('kernel   ', got.ravel()[:8])", "print('reference', want.ravel()[:8])",
                "assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)",
                "assert np.array_equal(np.isnan(got), np.isnan(want)), 'NaN positions differ'",
                "inf = np.isinf(got) | np.isinf(want)",
                "assert np.array_equal(got[inf], want[inf]), 'infinities differ'"]
        if failure.scale is not None:   # the whole result, as the campaign compared it
            out.append(f"assert_close(got, want, rf.{c.data.dtype}, {c.n}, scale={failure.scale!r})")
        if failure.worst is not None:
            idx, allowed = failure.worst
            out += [f"error = abs(float(got[{idx}]) - float(want[{idx}]))",
                    f"assert error <= {allowed!r}, f'|kernel - reference| = {{error:.3g}} at {idx}, allowed {allowed:.3g}'"]
        return out
    if failure.kind == "completeness":
        return [f"assert {name!r} in fused, '`{name}` ({what}) is separable by construction but was not fused'"]
    if failure.kind == "unexpected fusion":
        return [f"assert {name!r} not in fused, '`{name}` ({what}) is not separable by construction but was fused'"]
    if failure.kind == "reason":
        return ["for g in lowered.groups:",
                f"    d = g.decompositions.get({name!r})",
                "    if d is not None and not hasattr(d, 'accumulators'):  # a Refusal",
                f"        assert d.reason.strip() and '`{name}`' in d.reason, d.reason",
                f"    if {name!r} in g.reductions and not g.fused:",
                "        assert (g.reason or '').strip(), 'an unfused group without a reason'"]
    return []  # crash: lowering or running raises
