"""Oracle rule (6): fused reductions whose earlier results break the fusion theorem's precondition.

The programs the fuzzer found (docs/fusion.md, "Limits") pass the judge on
the real backends and are counted as known limits, on the rows where the earlier
result is infinite, NaN or a zero divisor only: a planted wrong result on another
row of the same programs still fails. The rule marks nothing where the engine is
exact (softmax rows with infinities, NaN earlier results of a sum, another axis
length, an earlier result read along the axis, a zero that is not a divisor).
"""
from __future__ import annotations

import numpy as np
import pytest

import redfuser as rf
from redfuser.testing import fuzz, program_judge
from redfuser.testing.fuzz_tasks import Config, Result
from redfuser.testing.program import Arg, Node, Program
from redfuser.testing.program_data import ArrayData
from redfuser.testing.program_judge import run
from redfuser.testing.program_oracle import reference

BACKENDS = ("interpret", "cpu")
REAL_KERNEL = rf.kernel


def _array(values, dtype: str = "float32") -> Arg:
    values = np.asarray(values)
    return Arg(ArrayData(dtype, values.shape, values=tuple(values.reshape(-1).tolist())))


def _program(nodes: list[tuple], outputs: tuple[str, ...], *args: Arg) -> Program:
    """``nodes``: (outs, op, args, params) with outs as "a" or "v,i"."""
    return Program(tuple(f"x{k}" for k in range(len(args))),
                   tuple(Node(tuple(o.split(",")), op, tuple(a), tuple(p)) for o, op, a, p in nodes),
                   outputs, (tuple(args),))


def _limit(p: Program) -> list:
    return np.asarray(reference(p, 0).outputs[0].limit).tolist()


def _planted(monkeypatch, change) -> None:
    """Every backend's kernel returns the real kernel's result with `change(result)` applied."""
    def kernel(fn, backend=None, **options):
        real = REAL_KERNEL(fn, backend=backend, **options)
        return lambda *args: change(np.array(real(*args)))

    monkeypatch.setattr(program_judge.rf, "kernel", kernel)


# ---------------------------------------------------------------------------------------------
# the fuzzer's two programs
# ---------------------------------------------------------------------------------------------
X_INF = np.arange(126, dtype=np.float32).reshape(2, 63) % 7
X_INF[1, 39] = np.inf
TOPK = [("m", "max", ["x0"], [-1, True]), ("d", "sub", ["x0", "m"], []), ("v,i", "topk", ["d"], [3])]


def test_topk_of_x_minus_its_max_with_an_inf_row_is_judged():
    """``topk(x - max(x))`` with +inf in row 1, once a known limit of the fused top-k (it ranked x, while
    numpy's row is all NaN: positions 0..k-1). Issue 20: a top-k reading an earlier result ranks after
    the loop with the final max, so the row is judged and matches."""
    p = _program(TOPK, ("i",), _array(X_INF))
    assert not np.any(_limit(p))
    for backend in BACKENDS:
        out = run(p, backend)
        assert out.failures == [] and out.unsure == 0


def test_a_wrong_top_k_fails_on_every_row(monkeypatch):
    p = _program(TOPK, ("i",), _array(X_INF))

    def swap(row: int):
        def change(i):
            i[row, [0, 1]] = i[row, [1, 0]]
            return i
        return change

    for row in (0, 1):
        _planted(monkeypatch, swap(row))
        assert [f.kind for f in run(p, "cpu").failures] == ["wrong value"]


def test_a_sum_over_a_zero_max_is_a_known_limit():
    """The fuzzer's ``sum(x / max(x > s))`` with the max 0: the kernel's (sum x) * inf, numpy's NaN."""
    x = np.array([True] * 6 + [False])
    p = _program([("g", "gt", ["x0", "x1"], []), ("m", "max", ["g"], [0, True]), ("q", "div", ["x0", "m"], []),
                  ("s", "sum", ["q"], [-1, False])], ("s",), _array(x, "bool"), Arg(scalar=np.inf))
    assert _limit(p) is True
    for backend in BACKENDS:
        out = run(p, backend)
        assert out.failures == [] and (out.limit_elements["precondition"], out.limit_calls["precondition"]) == (1, 1)


SUM_ROWS = [("g", "gt", ["x0", "x1"], []), ("m", "max", ["g"], [-1, True]), ("q", "div", ["x0", "m"], []),
            ("s", "sum", ["q"], [-1, False])]
X_BOOL = np.array([[1, 0, 1, 1, 0, 1, 1], [1, 1, 0, 1, 1, 1, 1]], bool)
S_ROWS = np.array([[0.5], [np.inf]], np.float32)   # row 0's max is True, row 1's False (0)


def test_a_sum_off_by_one_percent_on_a_finite_row_still_fails(monkeypatch):
    p = _program(SUM_ROWS, ("s",), _array(X_BOOL, "bool"), _array(S_ROWS))
    assert _limit(p) == [False, True]
    assert run(p, "cpu").failures == []
    _planted(monkeypatch, lambda s: s * np.array([1.01, 1.0]))
    assert [f.kind for f in run(p, "cpu").failures] == ["wrong value"]
    _planted(monkeypatch, lambda s: np.array([s[0], -np.inf]))
    assert run(p, "cpu").failures == []


def test_a_matmul_over_a_zero_max_marks_its_column_only(monkeypatch):
    """``a @ (v / max(v, axis=0))``: column 1's max is 0, so 1/max = inf is factored out of that column."""
    v = np.array([[1.0, 0.0], [2.0, -1.0], [3.0, -2.0]], np.float32)
    a = np.array([[1.0, 2.0, 0.0], [0.5, 1.0, 2.0]], np.float32)
    p = _program([("m", "max", ["x1"], [0, True]), ("q", "div", ["x1", "m"], []), ("o", "matmul", ["x0", "q"], [])],
                 ("o",), _array(a), _array(v))
    assert _limit(p) == [[False, True], [False, True]]
    for backend in BACKENDS:
        assert run(p, backend).failures == []
    _planted(monkeypatch, lambda o: o * np.float32(1.01))
    assert [f.kind for f in run(p, "cpu").failures] == ["wrong value"]


# ---------------------------------------------------------------------------------------------
# where the rule marks nothing (and the judge still judges)
# ---------------------------------------------------------------------------------------------
INF, NAN = np.inf, np.nan
SOFTMAX = [("m", "max", ["x0"], [-1, True]), ("d", "sub", ["x0", "m"], []), ("e", "exp", ["d"], []),
           ("s", "sum", ["e"], [-1, True]), ("p", "div", ["e", "s"], [])]


def test_softmax_rows_with_infinities_and_nan_are_judged():
    """exp(x - max x) is exact whatever the max (docs/fusion.md); a NaN sum makes numpy's p @ v NaN too."""
    x = np.array([[1, 2, 3, 4], [1, INF, 3, 4], [-INF] * 4, [1, NAN, 2, 3]], np.float32)
    v = np.arange(8, dtype=np.float32).reshape(4, 2)
    p = _program(SOFTMAX + [("o", "matmul", ["p", "x1"], [])], ("o",), _array(x), _array(v))
    assert not np.any(_limit(p))
    for backend in BACKENDS:
        out = run(p, backend)
        assert out.failures == [] and out.unsure == 0


@pytest.mark.parametrize("nodes, x, y, marked", [
    # a NaN earlier result: numpy's sum is NaN, and so is (sum x) * NaN
    ([("m", "max", ["x1"], [-1, True]), ("q", "div", ["x0", "m"], []), ("s", "sum", ["q"], [-1, False])],
     [[1.0, 2.0], [3.0, 4.0]], [[NAN, 1.0], [1.0, 2.0]], [False, False]),
    # ... and a top-k of x - NaN, which ranks after the loop as numpy does (its first positions)
    ([("m", "max", ["x1"], [-1, True]), ("q", "sub", ["x0", "m"], []), ("t", "topk_indices", ["q"], [1])],
     [[1.0, 2.0], [3.0, 4.0]], [[NAN, 1.0], [1.0, 2.0]], [[False], [False]]),
    # an earlier result over an axis of another length (3, not 2) is not fused with this sum
    ([("m", "max", ["x1"], [-1, True]), ("q", "div", ["x0", "m"], []), ("s", "sum", ["q"], [-1, False])],
     [[1.0, 0.0], [3.0, 4.0]], [[INF, 0.0, 0.0], [1.0, 2.0, 3.0]], [False, False]),
    # an earlier result read along the axis (a max over axis 0, read per column) is not an earlier result
    ([("m", "max", ["x1"], [0, False]), ("q", "div", ["x0", "m"], []), ("s", "sum", ["q"], [-1, False])],
     [[1.0, 0.0], [3.0, 4.0]], [[INF, 1.0], [0.5, 2.0]], [False, False]),
    # a zero earlier result that is a factor, not a divisor
    ([("m", "max", ["x1"], [-1, True]), ("q", "mul", ["x0", "m"], []), ("s", "sum", ["q"], [-1, False])],
     [[1.0, 0.0], [3.0, 4.0]], [[0.0, 0.0], [1.0, 2.0]], [False, False]),
    # ... a divisor: marked, as is a divisor that is zero where the earlier result is 1
    ([("m", "max", ["x1"], [-1, True]), ("q", "div", ["x0", "m"], []), ("s", "sum", ["q"], [-1, False])],
     [[1.0, 0.0], [3.0, 4.0]], [[0.0, 0.0], [1.0, 2.0]], [True, False]),
    ([("m", "max", ["x1"], [-1, True]), ("c", "add_c", ["m"], [-1.0]), ("q", "div", ["x0", "c"], []),
      ("s", "sum", ["q"], [-1, False])], [[1.0, 0.0], [3.0, 4.0]], [[1.0, 0.0], [1.0, 2.0]], [True, False]),
    # ... and a comparison of it that is False (0) as a divisor
    ([("m", "max", ["x1"], [-1, True]), ("g", "gt_c", ["m"], [0.0]), ("q", "div", ["x0", "g"], []),
      ("s", "sum", ["q"], [-1, False])], [[1.0, 0.0], [3.0, 4.0]], [[-1.0, -2.0], [1.0, 2.0]], [True, False]),
    # ... through a view: the max over axis 0 of a (3, 4) array, transposed, divides the rows of a (4, 3) one
    ([("m", "max", ["x1"], [0, True]), ("t", "T", ["m"], []), ("q", "div", ["x0", "t"], []),
      ("s", "sum", ["q"], [-1, False])], np.arange(12.0).reshape(4, 3),
     [[1.0, 0.0, 2.0, 3.0], [1.0, -1.0, 2.0, 3.0], [1.0, -2.0, 2.0, 3.0]], [False, True, False, False]),
    # -inf data with a finite earlier result: the x part, not the y part
    ([("m", "max", ["x1"], [-1, True]), ("q", "sub", ["x0", "m"], []), ("e", "exp", ["q"], []),
      ("s", "sum", ["e"], [-1, False])], [[-INF, 0.0], [3.0, 4.0]], [[1.0, 0.0], [1.0, 2.0]], [False, False]),
    # exp(t - max s) with s all -inf: the documented limit of online exponents (NaN for numpy's inf)
    ([("m", "max", ["x1"], [-1, True]), ("q", "sub", ["x0", "m"], []), ("e", "exp", ["q"], []),
      ("s", "sum", ["e"], [-1, False])], [[0.0, 0.0], [3.0, 4.0]], [[-INF, -INF], [1.0, 2.0]], [True, False]),
    # (max, +) needs a finite H too: max(x - min y) with min y = -inf
    ([("m", "min", ["x1"], [-1, True]), ("q", "sub", ["x0", "m"], []), ("s", "max", ["q"], [-1, False])],
     [[-INF, 2.0], [3.0, 4.0]], [[-INF, 0.0], [1.0, 2.0]], [True, False]),
])
def test_the_rule_marks_only_a_broken_precondition(nodes, x, y, marked):
    p = _program(nodes, (nodes[-1][0],), _array(x), _array(y))
    assert _limit(p) == marked
    out = run(p, "cpu")
    assert out.failures == [] and out.unsure == out.limit_elements["precondition"] == int(np.sum(marked))


def test_the_summary_counts_the_known_limits():
    campaign = fuzz.Campaign(Config(0, ("cpu",)))
    campaign.record(Result(5, "program", limits={"precondition": (3, 1, 2)}))
    campaign.record(Result(9, "program", limits={"precondition": (4, 2, 0), "expansion": (1, 1, 0)}))
    lines = campaign.summary().splitlines()
    assert ("known fusion limits: 7 elements in 3 calls (docs/fusion.md, 'Limits'): an earlier result of a fused "
            "cascade infinite, NaN or a zero divisor (oracle rule 6); 2 of them computed otherwise than numpy; "
            "examples 5, 9") in lines
    assert any(line.startswith("known fusion limits: 1 element in 1 call ") and "rule 4" in line for line in lines)
