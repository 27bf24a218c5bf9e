"""The fusion fuzzer: its three properties over the cascade grammar, its reproducers and its command line.

The properties run under the hypothesis profile (tests/conftest.py; ``ci``: 25
examples each, ``HYPOTHESIS_PROFILE=fuzz``: 2500). They are derandomized, so a
run of the suite is reproducible; a long random campaign is
``python -m redfuser fuzz --examples 5000 --seed N``.
"""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
from hypothesis import given, note, settings

from redfuser.testing.cascade_check import (
    Failure,
    check,
    compare,
    error_bounds,
    expected_fused,
)
from redfuser.testing.cascade_nodes import Leaf, Num, call, source
from redfuser.testing.cascade_repro import reproducer, same_failure, shrink
from redfuser.testing.cascade_templates import INDEPENDENT, NON_SEPARABLE
from redfuser.testing.cascades import (
    Cascade,
    DataSpec,
    RandomDraw,
    Reduction,
    cascades,
    draw_cascade,
)
from redfuser.testing.fuzz import example, main

REPO = Path(__file__).resolve().parents[1]
PROPERTY = settings(derandomize=True)


def failures_of(c: Cascade, kinds: tuple[str, ...], soundness: bool = True) -> list[Failure]:
    return [f for f in check(c, soundness=soundness).failures if f.kind in kinds]


# ---------------------------------------------------------------------------------------------
# the three properties
# ---------------------------------------------------------------------------------------------
@PROPERTY
@given(cascades(max_axis=1024))
def test_soundness_every_kernel_equals_its_reference(c):
    note(c.source())
    note("\n".join(c.data.source()))
    assert failures_of(c, ("soundness", "crash")) == []


@PROPERTY
@given(cascades(max_axis=1024))
def test_completeness_every_separable_body_is_fused(c):
    note(c.source())
    assert failures_of(c, ("completeness", "unexpected fusion", "crash"), soundness=False) == []


@PROPERTY
@given(cascades(max_axis=1024))
def test_every_refusal_names_its_reduction(c):
    note(c.source())
    assert failures_of(c, ("reason",), soundness=False) == []


# ---------------------------------------------------------------------------------------------
# the grammar
# ---------------------------------------------------------------------------------------------
def test_examples_are_reproducible_from_seed_and_index():
    a, b = example(3, 17), example(3, 17)
    assert a.source() == b.source() and a.data == b.data
    assert all(np.array_equal(x, y, equal_nan=True) for x, y in zip(a.data.build().values(), b.data.build().values()))
    assert example(3, 18).source() != a.source() or example(3, 18).data != a.data


def test_grammar_covers_both_labels_every_op_masks_gemms_and_specials():
    drawn = [draw_cascade(RandomDraw(f"coverage:{i}")) for i in range(300)]
    reductions = [r for c in drawn for r in c.reductions]
    assert {r.op for r in reductions} == {"sum", "max", "min", "matmul"}
    assert sum(r.separable for r in reductions) > 100 and sum(not r.separable for r in reductions) > 50
    assert any(r.template.expands for r in reductions)
    assert any(c.masked and c.data.full_row for c in drawn) and any(c.masked and c.data.first_chunk for c in drawn)
    assert any(c.gemm for c in drawn) and any(c.data.specials for c in drawn)
    assert {c.data.profile for c in drawn} == {"normal", "wide", "offset", "large"}
    assert {c.n for c in drawn} >= {1, 2, 3, 4096}
    assert all(2 <= len(c.reductions) <= 6 for c in drawn)


def test_printed_source_keeps_the_tree_association():
    x, y = Leaf("x"), Leaf("y")
    assert source((x - y) - (x - y)) == "x - y - (x - y)"
    assert source(-(x * y)) == "-(x * y)"
    assert source(call("square", x - y) * Num(-2.0)) == "(x - y) ** 2 * -2.0"
    assert source(call("square", Num(-2.0))) == "(-2.0) ** 2"
    assert source(call("where", call("gt", x, y), x, Num(-np.inf))) == "rf.where(x > y, x, -rf.inf)"


def test_data_source_builds_the_same_arrays(tmp_path):
    c = next(c for c in (example(0, i) for i in range(200)) if c.masked and c.data.specials)
    out = tmp_path / "arrays.npz"
    script = "\n".join(["import numpy as np", "import redfuser as rf", *c.data.source(),
                        f"np.savez({str(out)!r}, " + ", ".join(f"{n}={n}" for n in c.inputs) + ")"])
    subprocess.run([sys.executable, "-c", script], check=True, cwd=REPO)
    saved = np.load(out)
    for name, array in c.data.build().items():
        assert np.array_equal(saved[name].view(np.uint8), array.view(np.uint8)), name


def test_ground_truth_needs_two_live_separable_members():
    c = example(0, 1)
    mislabelled = replace(c, reductions=tuple(replace(r, separable=False) for r in c.reductions))
    assert not any(expected_fused(mislabelled).values())


# ---------------------------------------------------------------------------------------------
# the tolerance rule catches real bugs
# ---------------------------------------------------------------------------------------------
POSITIVE_SUMS = ("exp(d - M)", "exp(d - M) / L", "exp(2(d - M))", "exp2(d - M)", "exp(Mn - x)")


def test_tolerance_catches_one_term_too_many_in_a_long_sum_of_positive_terms():
    """Without cancellation (and scores computed exactly: no GEMM) the bound stays near eps * depth * |result|,
    far below one average term in n."""
    cases = [(c, r) for c in (example(1, i) for i in range(300)) for r in c.reductions
             if r.op == "sum" and r.family in POSITIVE_SUMS and c.n >= 64 and c.data.dtype == "float32"
             and r.name in c.returns and not c.data.specials and not c.gemm]
    assert len(cases) >= 5
    for c, r in cases:
        arrays = c.data.build()
        with np.errstate(all="ignore"):
            outputs = c.function(*[arrays[n] for n in c.inputs])
        want = outputs[c.returns.index(r.name)] if isinstance(outputs, tuple) else outputs
        bound = error_bounds(c, arrays)[r.name]
        assert compare(want, want, bound, c) is None
        wrong = (want.astype(np.float64) * (1 + 1.0 / c.n)).astype(want.dtype)
        finite = np.isfinite(want) & (want != 0)
        if finite.any():
            assert compare(wrong, want, bound, c) is not None, c.source()


# ---------------------------------------------------------------------------------------------
# reproducers
# ---------------------------------------------------------------------------------------------
def _run_script(text: str, tmp_path: Path) -> subprocess.CompletedProcess:
    path = tmp_path / "repro.py"
    path.write_text(text)
    env = {**os.environ, "REDFUSER_CACHE": "0"}
    return subprocess.run([sys.executable, str(path)], capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=120, check=False)


def _wrongly_labelled() -> tuple[Cascade, Failure]:
    """``sum(x)`` then ``sum(abs(x - mean))`` with the ground truth told the second is separable: a deliberate
    completeness failure (the engine rightly refuses it)."""
    independent = next(t for t in INDEPENDENT if t.family == "x")
    template = next(t for t in NON_SEPARABLE if t.family == "abs(x - G)")
    x, n = Leaf("x"), 37
    first = Reduction("r0", "sum", independent, x, (x,), (), "x", True, bounded=True)
    body = template.build(x, x, Leaf("w"), (Leaf("r0") / Num(float(n)),))[0]
    wrong = Reduction("r9", "sum", template, body, (body,), ("r0",), template.family, separable=True)
    data = DataSpec(5, "float32", "normal", (("x", (3, n)),))
    c = Cascade(data, n, 4, None, False, (first, wrong), ("r9",))
    failure = next(f for f in check(c).failures if f.kind == "completeness" and f.reduction == "r9")
    return c, failure


def test_reproducer_of_a_deliberate_failure_runs_and_fails(tmp_path):
    c, failure = _wrongly_labelled()
    text = reproducer(c, failure, " (a test)")
    compile(text, "repro.py", "exec")
    done = _run_script(text, tmp_path)
    assert done.returncode != 0 and "AssertionError" in done.stderr and "`r9`" in done.stderr, done.stderr


def test_reproducer_of_an_impossible_tolerance_fails_on_its_value_assertion(tmp_path):
    c = example(0, 2)
    name = c.returns[-1]
    failure = Failure("soundness", name, f"`{name}`: injected", ((0,) * (len(c.data.shapes[0][1])), -1.0))
    done = _run_script(reproducer(c, failure), tmp_path)
    assert done.returncode != 0 and "allowed -1" in done.stderr, done.stderr


def test_reproducer_of_a_healthy_cascade_passes(tmp_path):
    """Its arrays, outputs and reduction names are the fuzzer's: the checks that hold in the fuzzer hold there."""
    verdicts = (check(example(0, i)) for i in range(60))
    v = next(v for v in verdicts if not v.failures and "fused" in v.status.values() and len(v.cascade.returns) > 1)
    fused = next(n for n, s in v.status.items() if s == "fused")
    for failure in (Failure("soundness", v.cascade.returns[0], "none"), Failure("completeness", fused, "none")):
        done = _run_script(reproducer(v.cascade, failure), tmp_path)
        assert done.returncode == 0, done.stderr


def test_shrinking_keeps_the_failure_and_simplifies():
    c, failure = _wrongly_labelled()
    small, tried = shrink(c, same_failure(failure), budget=60)
    assert tried > 0 and small.n <= c.n and same_failure(failure)(small)
    assert small.n < c.n or len(small.reductions) < len(c.reductions) or small.data != c.data


# ---------------------------------------------------------------------------------------------
# the command line (the cascades are every eighth example of the whole-compiler fuzzer's campaign)
# ---------------------------------------------------------------------------------------------
def test_main_runs_a_few_examples_and_prints_a_summary(capsys):
    assert main(["--backend", "interpret", "--examples", "8", "--seed", "0", "--max-axis", "256", "--jobs", "0"]) == 0
    out = capsys.readouterr().out
    assert "8 examples (7 programs, 1 cascades), seed 0" in out and "failures: 0" in out
    assert "cascade reductions:" in out and "separable" in out


def test_main_exits_1_and_prints_a_reproducer_when_something_fails(capsys, monkeypatch):
    c, _ = _wrongly_labelled()
    for module in ("redfuser.testing.fuzz", "redfuser.testing.fuzz_tasks"):
        monkeypatch.setattr(f"{module}.cascade_example", lambda seed, index, max_axis=4096: c)
    argv = ["--backend", "interpret", "--first", "7", "--examples", "1", "--seed", "0", "--shrink-budget", "5",
            "--jobs", "0"]
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert "failures: 1 (1 signatures)" in out and "interpret / cascade completeness / cascade" in out
    assert "---- reproducer: cascade completeness on interpret" in out
    assert "def cascade(" in out and "rng = np.random.default_rng(" in out


def test_one_result_in_both_slots_of_a_product_of_sums_is_not_expected_to_fuse():
    """(Fuzz, seed 95, example 111.) ``(x - r1) * (x + r1)`` is ``x^2 - r1^2``: the cross terms cancel in exact
    arithmetic, which the engine refuses to fuse (exact only for finite ``r1``), and the grammar called the body
    separable, a completeness failure. The slots now take two results where there are, and a body with one
    result in both is labelled not separable."""
    from redfuser.testing.fuzz_tasks import cascade_example

    import re

    seen = {True: 0, False: 0}
    for index in range(400):
        for r in cascade_example(95, index).reductions:
            if r.family == "(x - Y) * (x + L)" and r.op == "sum":
                y, l = re.search(r"\((\w+) - (.+?)\) \* \(\1 \+ (.+?)\)", r.source()).group(2, 3)
                assert r.separable == (y != l), r.source()
                seen[y != l] += 1
    assert seen[True] > 0, seen
