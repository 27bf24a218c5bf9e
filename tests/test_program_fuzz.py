"""The whole-compiler fuzzer: its grammar, oracle, judge, shrinker, reproducers, worker pool, and a CI campaign.

The CI campaign runs a fixed seed's programs on ``cpu`` and ``simulate`` and
must find nothing. The planted-bug test shows the other direction: with a
codegen rule broken on purpose (in a subprocess), the fuzzer finds the bug,
shrinks it, and prints a script that fails with the bug and passes without it.
"""
from __future__ import annotations

import inspect
import os
import pickle
import signal
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import redfuser as rf
from redfuser.testing import fuzz, program_judge
from redfuser.testing.fuzz_pool import Pool
from redfuser.testing.fuzz_tasks import Config, Result, is_cascade, program_example, run_example
from redfuser.testing.program import Arg, Node, Program
from redfuser.testing.program_data import LAYOUTS, ArrayData
from redfuser.testing.program_judge import Failure, run
from redfuser.testing.program_oracle import evaluate, reference
from redfuser.testing.program_repro import reproducer
from redfuser.testing.program_shrink import same_failure, shrink
from redfuser.testing.tolerance import C

REPO = Path(__file__).resolve().parents[1]
CI_SEED, CI_EXAMPLES = 2026, 40


def _program(nodes: list[Node], outputs: tuple[str, ...], *calls: tuple[Arg, ...], options=()) -> Program:
    params = tuple(f"x{k}" for k in range(len(calls[0])))
    return Program(params, tuple(nodes), outputs, tuple(calls), tuple(options))


def _array(values, dtype: str = "float32") -> Arg:
    values = np.asarray(values)
    return Arg(ArrayData(dtype, values.shape, values=tuple(values.reshape(-1).tolist())))


# ---------------------------------------------------------------------------------------------
# the CI campaign
# ---------------------------------------------------------------------------------------------
def test_ci_campaign_on_cpu_and_simulate_finds_nothing():
    campaign = fuzz.run(Config(CI_SEED, ("cpu", "simulate")), CI_EXAMPLES)
    assert campaign.examples == CI_EXAMPLES and campaign.judged > 0
    assert campaign.failures == [], campaign.summary()


# ---------------------------------------------------------------------------------------------
# the grammar
# ---------------------------------------------------------------------------------------------
def test_examples_are_reproducible_from_seed_and_index():
    a, b = program_example(3, 17), program_example(3, 17)
    assert a.source() == b.source() and a.describe() == b.describe()
    for call in range(len(a.calls)):
        for x, y in zip(a.arguments(call), b.arguments(call)):
            assert type(x) is type(y) and np.array_equal(np.asarray(x), np.asarray(y), equal_nan=True)
    assert program_example(3, 18).source() != a.source()


def test_grammar_draws_every_op_dtype_layout_scalar_and_option():
    programs = [program_example(7, i) for i in range(400) if not is_cascade(i)]
    ops = Counter(n.op for p in programs for n in p.nodes)
    dtypes = Counter(a.data.dtype for p in programs for call in p.calls for a in call if a.is_array)
    layouts = Counter(a.layout for p in programs for call in p.calls for a in call if a.is_array)
    scalars = [a.scalar for p in programs for call in p.calls for a in call if not a.is_array]
    options = Counter(k for p in programs for k, _ in p.options)
    casts = Counter(n.params[0] for p in programs for n in p.nodes if n.op == "astype")
    labels = Counter(x for p in programs for x in p.label.split("+") if x)
    assert set(ops) >= {"add", "sub", "mul", "div", "maximum", "minimum", "where", "where_c", "lt", "eq", "and",
                        "or", "not", "abs", "neg", "exp", "log", "sum", "max", "min", "matmul", "topk",
                        "topk_values", "swapaxes", "transpose", "index", "arange", "astype", "to_int"}, ops
    assert set(dtypes) >= {"float32", "float16", "bfloat16", "int32", "bool"}
    assert set(casts) >= {"float32", "float16", "bfloat16", "float8_e4m3fn", "int32", "bool_"}
    assert set(layouts) == set(LAYOUTS)
    assert {type(s) for s in scalars} >= {int, float, bool, np.float32} and any(
        isinstance(s, float) and s == 0 and np.signbit(s) for s in scalars)
    assert set(options) >= {"block_m", "block_n", "block_k", "split", "num_warps", "prefetch", "skip_masked"}
    assert set(labels) >= {"softmax", "attention", "routing", "quantize", "mask", "causal", "window", "flash_attention",
                           "constant_terms", "moments", "tempered_product"}
    sizes = {s for p in programs for a in p.calls[0] if a.is_array for s in a.data.shape}
    assert {1, 2, 3, 5, 7, 13} <= sizes and max(sizes) >= 100
    assert sum(len(p.calls) > 1 for p in programs) > len(programs) // 4


def test_array_sources_build_the_same_arrays(tmp_path):
    cases = [ArrayData("float32", (3, 5), None, 4, "normal", ((1, float("nan")), (7, -0.0))),
             ArrayData("bfloat16", (40, 7), None, 5, "wide", ((3, float("inf")),)),
             ArrayData("int32", (2, 3), (1, 3), 6, "int_edge"), ArrayData("bool", (4,), None, 7, "bool"),
             ArrayData("float16", (2, 4), (2, 1), 8, "ints", mask_seed=3), ArrayData("float32", (), None, 9, "wide")]
    cases.append(cases[0].literal_form())
    lines, expected = ["import numpy as np", "import redfuser as rf", "out = {}"], {}
    for k, data in enumerate(cases):
        for layout in LAYOUTS:
            name = f"a{k}_{layout}"
            lines += data.source(name, layout) + [f"out[{name!r}] = describe({name})"]
            expected[name] = _describe_array(data.present(layout))
    script = "\n".join([textwrap.dedent(inspect.getsource(_describe_array)).replace("_describe_array", "describe")]
                       + lines + ["import pickle", f"pickle.dump(out, open({str(tmp_path / 'a.pkl')!r}, 'wb'))"])
    subprocess.run([sys.executable, "-c", script], check=True, cwd=REPO)
    with open(tmp_path / "a.pkl", "rb") as f:
        built = pickle.load(f)
    assert built == expected


def _describe_array(x):
    """Type, dtype, shape, strides, bytes and mask of an array (pickling would lose the strides)."""
    import numpy as np

    data = np.ma.getdata(x)
    mask = np.ma.getmaskarray(x).tobytes() if isinstance(x, np.ma.MaskedArray) else None
    return type(x).__name__, str(x.dtype), x.shape, data.strides, np.ascontiguousarray(data).tobytes(), mask


# ---------------------------------------------------------------------------------------------
# the oracle and the judge
# ---------------------------------------------------------------------------------------------
def test_storage_precision_overflow_is_unsure_and_only_there():
    """``(x * x) / 1000`` in f16: numpy overflows 300 * 300 to inf, a kernel computing in f32 gives 90."""
    p = _program([Node(("v0",), "mul", ("x0", "x0")), Node(("v1",), "div_c", ("v0",), (1000.0,))], ("v1",),
                 (_array([300.0, 2.0], "float16"),))
    out = reference(p, 0).outputs[0]
    assert list(np.asarray(out.unsure)) == [True, False]
    for kernel_value in (np.inf, 90.0):
        got = np.array([kernel_value, 0.004], np.float16)
        assert program_judge.compare(got, reference(p, 0), "cpu", 0) is None
    wrong = np.array([90.0, np.inf], np.float16)
    assert program_judge.compare(wrong, reference(p, 0), "cpu", 0).kind == "wrong class"


def test_an_infinity_times_a_sum_that_may_cancel_is_unsure():
    p = _program([Node(("v0",), "sum", ("x0",), (-1, True)), Node(("v1",), "mul", ("v0", "x1"))], ("v1",),
                 (_array([[0.1, 0.2, -0.30000001]]), _array([[np.inf, 1.0, 2.0]])))
    assert np.asarray(reference(p, 0).outputs[0].unsure).tolist() == [[True, False, False]]


def test_an_expanded_product_with_an_infinity_is_unsure():
    """docs/fusion.md: ``(x - Y) @ w`` may be fused as ``x @ w - Y sum(w)``, inf - inf where numpy has inf."""
    p = _program([Node(("v0",), "sum", ("x0",), (-1, True)), Node(("v1",), "sub", ("x0", "v0")),
                  Node(("v2",), "matmul", ("v1", "x1"))], ("v2",),
                 (_array([[1.0, 2.0], [3.0, 5.0]]), _array([[np.inf, 1.0], [2.0, 3.0]])))
    assert np.asarray(reference(p, 0).outputs[0].unsure).tolist() == [[True, False], [True, False]]


def test_a_guarded_divisor_in_f16_is_not_exact_even_in_a_float64_result():
    """``i / (abs(h) + 1.0)``, int32 over f16: numpy rounds ``abs(h) + 1`` to f16 before the f64 division."""
    h = np.array([-0.9462890625, 2.837890625], np.float16)
    p = _program([Node(("v0",), "div_safe", ("x0", "x1"))], ("v0",), (_array([-2, 5], "int32"), _array(h, "float16")))
    ref = reference(p, 0)
    kernel = np.array([-2, 5]) / (np.abs(h.astype(np.float32)) + np.float32(1)).astype(np.float64)
    assert not ref.outputs[0].exact and program_judge.compare(kernel, ref, "cpu", 0) is None


def test_a_small_error_in_a_long_sum_fails_and_an_exact_value_must_be_equal():
    x = np.abs(np.random.default_rng(0).standard_normal((2, 512))).astype(np.float32) + 0.5
    p = _program([Node(("v0",), "sum", ("x0",), (-1, False)), Node(("v1",), "max", ("x0",), (-1, False))],
                 ("v0", "v1"), (_array(x),))
    ref = reference(p, 0)
    s, m = np.asarray(ref.outputs[0].ref), np.asarray(ref.outputs[1].ref)
    assert program_judge.compare((s, m), ref, "cpu", 0) is None
    assert program_judge.compare(((s * np.float32(1 + 1 / 512)).astype(np.float32), m), ref, "cpu", 0) is not None
    assert program_judge.compare((s, np.nextafter(m, np.float32(0))), ref, "cpu", 0).kind == "wrong value"


def test_gpu_backends_compute_f64_exp_in_f32_and_only_they_are_allowed_to():
    """docs/gpu-backend.md: ``exp`` of a float64 value (numpy's promotion of int32 * 2.5) is f32 on the GPU."""
    p = _program([Node(("v0",), "mul_c", ("x0",), (2.5,)), Node(("v1",), "exp", ("v0",))], ("v1",),
                 (_array([8, 20, 40], "int32"),))
    exact = np.exp(np.array([20.0, 50.0, 100.0]))
    f32 = np.exp(np.array([20.0, 50.0, 100.0], np.float32)).astype(np.float64)  # exp(100) overflows f32
    assert program_judge.compare(f32, reference(p, 0, "simulate"), "simulate", 0) is None
    assert program_judge.compare(f32, reference(p, 0, "cpu"), "cpu", 0) is not None
    assert program_judge.compare(exact * (1 + 1e-3), reference(p, 0, "simulate"), "simulate", 0) is not None


def _routing(logits) -> Program:
    """softmax then top-2 indices: the routing idiom's ranking of inexact probabilities."""
    nodes = [Node(("v0",), "max", ("x0",), (-1, True)), Node(("v1",), "sub", ("x0", "v0")),
             Node(("v2",), "exp", ("v1",)), Node(("v3",), "sum", ("v2",), (-1, True)),
             Node(("v4",), "div", ("v2", "v3")), Node(("v5",), "topk_indices", ("v4",), (2,))]
    return _program(nodes, ("v5",), (_array(logits),))


def test_routing_indices_are_judged_exactly_where_ties_are_structural_or_values_separated():
    """Issue 20: equal logits tie by index in every correct kernel, a +inf logit makes numpy's row all NaN
    (positions 0..k-1); both are judged, and a kernel ordering them otherwise fails (the fused top-k of
    before, which ordered ties across chunks by an ulp and missed the +inf row, did)."""
    p = _routing([[1.0, 3.0, 0.0, 3.0, -2.0], [np.inf, 2.0, 1.0, 0.0, 3.0], [0.5, 0.25, 2.0, 1.0, 1.5]])
    ref = reference(p, 0)
    assert not np.asarray(ref.outputs[0].unsure).any()
    want = np.asarray(ref.outputs[0].ref)
    assert want.tolist() == [[1, 3], [0, 1], [2, 4]]
    assert program_judge.compare(want, ref, "cpu", 0) is None
    for row, other in ((0, [3, 1]), (1, [4, 1]), (2, [4, 2])):
        wrong = want.copy()
        wrong[row] = other
        assert program_judge.compare(wrong, ref, "cpu", 0).kind == "wrong value"


def test_routing_indices_are_unsure_on_a_rounding_level_near_tie():
    """Two logits an ulp apart: a correct kernel's exp may round their probabilities either way."""
    a = np.float32(1.0)
    p = _routing([[float(a), float(np.nextafter(a, np.float32(2))), -3.0]])
    assert np.asarray(reference(p, 0).outputs[0].unsure).all()


def test_integers_and_bools_are_judged_exactly_and_dtypes_must_match():
    p = _program([Node(("v0",), "mul", ("x0", "x1"))], ("v0",), (_array([True, False, True], "bool"),
                                                                _array([True, True, False], "bool")))
    ref = reference(p, 0)
    assert program_judge.compare(np.array([True, False, False]), ref, "cpu", 0) is None
    assert program_judge.compare(np.array([False, True, True]), ref, "cpu", 0).kind == "wrong value"  # XOR
    assert program_judge.compare(np.array([1, 0, 0], np.int64), ref, "cpu", 0).kind == "wrong dtype"


class _FakeKernel:
    def __init__(self, behaviour):
        self.behaviour = behaviour

    def __call__(self, *args):
        return self.behaviour(*args)


@pytest.mark.parametrize("behaviour, numpy_refuses, kind", [
    (lambda *a: (_ for _ in ()).throw(rf.ShapeError("no", op="add")), True, None),
    (lambda *a: np.zeros(3, np.float32), True, "accepted"),
    (lambda *a: (_ for _ in ()).throw(rf.ShapeError("no", op="add")), False, "refused"),
    (lambda *a: (_ for _ in ()).throw(rf.VerifyError("bad IR")), False, "internal error"),
    (lambda *a: (_ for _ in ()).throw(rf.SimulationError("race", "two writers")), False, "simulation error"),
    (lambda *a: (_ for _ in ()).throw(IndexError("oops")), False, "exception"),
])
def test_errors_are_judged_by_who_refused(monkeypatch, behaviour, numpy_refuses, kind):
    second = _array([1.0, 2.0] if numpy_refuses else [1.0, 2.0, 3.0])
    p = _program([Node(("v0",), "add", ("x0", "x1"))], ("v0",), (_array([1.0, 2.0, 3.0]), second))
    monkeypatch.setattr(program_judge.rf, "kernel", lambda *a, **k: _FakeKernel(behaviour))
    failures = run(p, "cpu").failures
    assert [f.kind for f in failures] == ([kind] if kind else [])


def test_a_masked_array_must_be_refused_when_its_mask_matters(monkeypatch):
    data = ArrayData("float32", (2, 3), None, 1, "normal", mask_seed=0)
    p = _program([Node(("v0",), "sum", ("x0",), (-1, False))], ("v0",), (Arg(data, "masked"),))
    assert reference(p, 0).mask_matters
    plain = np.sum(data.build(), axis=-1)
    monkeypatch.setattr(program_judge.rf, "kernel", lambda *a, **k: _FakeKernel(lambda *args: plain))
    assert [f.kind for f in run(p, "cpu").failures] == ["mask dropped"]


def test_static_scalars_that_compare_equal_are_judged_call_by_call(monkeypatch):
    """A kernel that kept what its first call compiled (``x * 2`` as int32) is caught on ``x * 2.0``."""
    p = _program([Node(("v0",), "mul", ("x0", "x1"))], ("v0",), (_array([3, 4], "int32"), Arg(scalar=2)),
                 (_array([3, 4], "int32"), Arg(scalar=2.0)))
    assert [np.asarray(reference(p, c).outputs[0].ref).dtype for c in (0, 1)] == [np.int32, np.float64]
    monkeypatch.setattr(program_judge.rf, "kernel",
                        lambda *a, **k: _FakeKernel(lambda x, s: (np.asarray(x) * 2).astype(np.int32)))
    failures = run(p, "cpu").failures
    assert [(f.kind, f.call) for f in failures] == [("wrong dtype", 1)]


# ---------------------------------------------------------------------------------------------
# shrinking and reproducers
# ---------------------------------------------------------------------------------------------
def test_shrinking_keeps_the_failure_and_makes_the_program_small(monkeypatch):
    """A fake backend whose ``maximum`` is ``minimum``: found in a bigger program, shrunk to a few nodes."""
    make = rf.kernel

    def kernel(fn, backend=None, **options):
        return make(fn, backend="interpret")

    monkeypatch.setattr(program_judge.rf, "kernel", kernel)
    monkeypatch.setattr(rf, "maximum", _bad_maximum(rf.maximum))
    candidates = (program_example(11, i) for i in range(400) if not is_cascade(i))
    p, target = next((q, f) for q in candidates if sum(n.op == "maximum" for n in q.nodes) and len(q.nodes) >= 4
                     for f in run(q, "cpu").failures[:1] if f.kind.startswith("wrong"))
    small, tried = shrink(p, same_failure(target), budget=200)
    assert tried > 0 and same_failure(target)(small)
    assert len(small.nodes) < len(p.nodes) and any(n.op == "maximum" for n in small.nodes)
    assert sum(a.data.size() for a in small.calls[0] if a.is_array) <= 16


def _bad_maximum(good):
    from redfuser.tracer import Tracer

    def maximum(a, b):
        if isinstance(a, Tracer) or isinstance(b, Tracer):
            return rf.minimum(a, b)
        return good(a, b)
    return maximum


def _run_script(text: str, tmp_path: Path, prelude: str = "") -> subprocess.CompletedProcess:
    path = tmp_path / "repro.py"
    path.write_text(text)
    code = f"{prelude}\nexec(compile(open({str(path)!r}).read(), {str(path)!r}, 'exec'), {{'__name__': '__main__'}})"
    env = {**os.environ, "REDFUSER_CACHE": "0", "PYTHONPATH": str(tmp_path)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=300, check=False)


PLANT = textwrap.dedent('''
    """A planted codegen bug: the cpu backend's abs of an integer returns its operand."""
    from redfuser.codegen.host import rules
    from redfuser.ir import UnaryOp

    _good = rules._unary

    def _unary(em, op, idx):
        if op.op is UnaryOp.ABS and op.x.dtype.is_int:
            return em.value(op.x, idx)
        return _good(em, op, idx)

    rules._unary = _unary
    rules.RULES[rules.t.Unary] = _unary
''')


def test_a_planted_codegen_bug_is_found_shrunk_and_reproduced(tmp_path):
    """In a subprocess with the bug planted, one campaign on cpu finds it and prints a script; the script fails
    with the bug planted and passes without it."""
    index = next(i for i in range(2000) if not is_cascade(i) and _has_negative_int_abs(program_example(1, i)))
    (tmp_path / "plant.py").write_text(PLANT)
    campaign = ("import sys, plant\nfrom redfuser.testing.fuzz import main\n"
                f"sys.exit(main(['--backend', 'cpu', '--seed', '1', '--first', '{index}', '--examples', '1', "
                f"'--jobs', '0', '--out', {str(tmp_path / 'out')!r}]))")
    env = {**os.environ, "REDFUSER_CACHE": "0", "PYTHONPATH": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", campaign], capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=600, check=False)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "cpu / wrong value" in done.stdout and "---- reproducer: wrong value on cpu" in done.stdout
    script = (tmp_path / "out" / "fuzz_repro_0.py").read_text()
    assert "rf.abs(" in script and script.count("\n    v") <= 4, script
    with_bug = _run_script(script, tmp_path, "import plant")
    assert with_bug.returncode != 0 and "AssertionError" in with_bug.stderr, with_bug.stdout + with_bug.stderr
    fixed = _run_script(script, tmp_path)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr


def _has_negative_int_abs(p: Program) -> bool:
    """Whether `p` returns ``rf.abs`` of an int32 value that has negative elements (or uses it on the way)."""
    try:
        env, _ = evaluate(p, p.arguments(0))
    except Exception:
        return False
    live = set(p.outputs)
    for n in reversed(p.nodes):
        if live & set(n.outs):
            live |= set(n.args)
    return any(n.op == "abs" and n.outs[0] in live and env[n.args[0]].dtype == np.int32
               and (np.asarray(env[n.args[0]].ref) < 0).any() for n in p.nodes)


def test_reproducer_of_a_cache_sharing_bug_replays_the_calls_in_order(tmp_path):
    p = _program([Node(("v0",), "mul", ("x0", "x1"))], ("v0",), (_array([3, 4], "int32"), Arg(scalar=2)),
                 (_array([3, 4], "int32"), Arg(scalar=2.0)))
    f = Failure("wrong dtype", "interpret", 1, "output 0: dtype int32, numpy float64")
    text = reproducer(p, f)
    assert "kernel(x0, 2)  # call 0" in text and "got = kernel(x0, 2.0)" in text
    done = _run_script(text, tmp_path)
    judged = run(p, "interpret").failures  # the script fails exactly when the judge does
    assert (done.returncode != 0) == bool(judged), done.stdout + done.stderr


WRITES_ITS_INPUT = textwrap.dedent('''
    """A planted bug: interpret kernels add 1 to the first element of their first float array argument."""
    import numpy as np
    from redfuser.kernel import Kernel

    real = Kernel.__call__

    def call(self, *args, **kwargs):
        for a in args:
            if isinstance(a, np.ndarray) and a.dtype.kind == "f" and a.size and a.flags.writeable:
                a.reshape(-1)[0] += 1
                break
        return real(self, *args, **kwargs)

    Kernel.__call__ = call
''')


def test_reproducer_of_a_kernel_that_writes_its_input_checks_the_inputs(tmp_path):
    """A "wrote memory" failure's script compares the arguments with copies taken before the call: it ran the
    call and printed "fixed", exit 0, with the bug there (and a wrong value's script ran the body after the
    kernel, on the changed input)."""
    p = _program([Node(("v0",), "mul", ("x0", "x0"))], ("v0",), (_array([1.0, 2.0, 3.0]),))
    script = reproducer(p, Failure("wrote memory", "interpret", 0, "the kernel changed input array 0"))
    (tmp_path / "plant.py").write_text(WRITES_ITS_INPUT)
    with_bug = _run_script(script, tmp_path, "import plant")
    assert with_bug.returncode != 0 and "argument 0 was changed by the call" in with_bug.stderr, with_bug.stderr
    fixed = _run_script(script, tmp_path)
    assert fixed.returncode == 0 and "no argument changed: fixed" in fixed.stdout, fixed.stdout + fixed.stderr
    wrong = reproducer(p, Failure("wrong value", "interpret", 0, "planted", index=(0,)))
    assert wrong.index("want = program(") < wrong.index("got = kernel(")


def test_reproducer_of_a_timeout_times_the_call(tmp_path):
    """(Found by a helper.) A timed-out example's script ran the call and printed "fixed" however long it took:
    it times the call against the campaign's limit now (here a limit no compile meets, then a generous one)."""
    p = _program([Node(("v0",), "mul", ("x0", "x0"))], ("v0",), (_array([1.0, 2.0, 3.0]),))
    message = "the worker ran {} s on this backend and was killed"
    slow = _run_script(reproducer(p, Failure("timeout", "cpu", 0, message.format(1e-06))), tmp_path)
    assert slow.returncode != 0 and "over the campaign limit of 1e-06 s" in slow.stderr, slow.stderr[-2000:]
    fast = _run_script(reproducer(p, Failure("timeout", "cpu", 0, message.format(300))), tmp_path)
    assert fast.returncode == 0 and "no failure: fixed" in fast.stdout, fast.stdout + fast.stderr


def test_a_lost_example_is_described_as_a_finished_one_is():
    """(Found by a helper.) A timed-out example's ``--verbose`` line named only its kind, no program."""
    from redfuser.testing.fuzz_tasks import describe_example
    config = Config(5, ("cpu",))
    assert describe_example(config, 0) == run_example(config, 0).description != ""


def test_a_cascade_that_crashed_its_worker_is_printed_without_running_it(monkeypatch):
    """A cascade whose worker crashed (or hung) was checked again in the campaign's own process to build its
    reproducer: a segfaulting kernel ended the campaign with no reproducer, a hanging one hung it."""
    index = next(i for i in range(64) if is_cascade(i))
    monkeypatch.setattr(fuzz, "check", lambda cascade: pytest.fail("a lost cascade was run in the campaign"))
    for kind in ("crash", "timeout"):
        script = fuzz._cascade_reproducer(Config(0, ("interpret",)), index, Failure(kind, "interpret", 0, "died"), 5)
        assert "rf.kernel(" in script


def test_failures_are_listed_by_example_whatever_order_workers_finish_in():
    """With two workers the first failure (reported, shrunk) was whichever finished first."""
    campaign = fuzz.Campaign(Config(0, ("interpret",)))
    for index in (5, 2, 9):
        campaign.record(Result(index, "program", failures=[Failure("wrong value", "interpret", 0, "planted")]))
    assert [i for i, _ in campaign.failures] == [2, 5, 9] and "first example 2" in campaign.summary()


# ---------------------------------------------------------------------------------------------
# the worker pool
# ---------------------------------------------------------------------------------------------
def test_a_worker_that_dies_is_a_crash_and_the_campaign_goes_on():
    """A worker killed by SIGSEGV mid-example is that example's crash; a fresh worker takes the rest, and is
    itself replaced after `recycle` examples."""
    with Pool(1, Config(0, ("interpret",)), timeout=120, recycle=2) as pool:
        pool._give(0, ("example", 0))
        os.kill(pool.slots[0].process.pid, signal.SIGSEGV)
        answers = []
        while not answers:
            answers = [a for _, _, a in pool._poll()]
        assert isinstance(answers[0], Failure) and answers[0].kind == "crash" and "SIGSEGV" in answers[0].message
        fresh = pool.slots[0].process.pid
        results = list(pool.examples([1, 2, 3]))
        assert sorted(r.index for r in results) == [1, 2, 3] and not any(r.failures for r in results)
        assert pool.slots[0].process.pid != fresh and pool.slots[0].history == [3]


def test_a_worker_that_outlives_the_timeout_is_killed():
    with Pool(1, Config(0, ("cpu",)), timeout=0.05) as pool:
        results = list(pool.examples([0]))
    assert [f.kind for f in results[0].failures] == ["timeout"]


def test_a_lost_cascade_counts_as_a_cascade():
    """A cascade example whose worker was lost was recorded as a program ("8 programs, 0 cascades")."""
    index = next(i for i in range(64) if is_cascade(i))
    with Pool(1, Config(0, ("cpu",)), timeout=0.05) as pool:
        (result,) = list(pool.examples([index]))
    assert result.kind == "cascade" and [f.kind for f in result.failures] == ["timeout"]


def test_a_workers_start_up_is_not_its_first_examples_time(tmp_path, monkeypatch):
    """A spawned worker imports numpy, LLVM and RedFuser first (1-1.5 s, more on a loaded machine): that counted
    toward its first example, and with a short --timeout every new worker's first example was a timeout."""
    (tmp_path / "sitecustomize.py").write_text("import os, time\nif os.environ.get('SLOW_START'):\n    time.sleep(3)\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.setenv("SLOW_START", "1")
    with Pool(1, Config(0, ("interpret",)), timeout=2.0) as pool:
        results = list(pool.examples([0, 1]))
    assert not [f for r in results for f in r.failures], [f.message for r in results for f in r.failures]


# ---------------------------------------------------------------------------------------------
# the cascade campaign inside the new one
# ---------------------------------------------------------------------------------------------
def test_cascade_examples_keep_the_fusion_properties_and_run_on_other_backends():
    index = next(i for i in range(64) if is_cascade(i))
    result = run_example(Config(0, ("interpret", "cpu")), index)
    assert result.kind == "cascade" and result.cascade_status and "cpu" in result.seconds
    assert result.failures == []


def test_a_cascade_failure_on_cpu_prints_a_script_that_runs_cpu(tmp_path):
    index = next(i for i in range(64) if is_cascade(i))
    failure = Failure("wrong value", "cpu", 0, "cascade `r1`: planted")
    script = fuzz._cascade_reproducer(Config(0, ("cpu",)), index, failure, 0)
    assert 'backend="cpu"' in script and "interpret_chunk" not in script
    assert _run_script(script, tmp_path).returncode == 0   # nothing is wrong with the kernel itself
    # (found by a helper) it asserted shapes and NaN positions only, so it passed a kernel 1.5x off too
    off = _run_script(script, tmp_path, prelude=_KERNEL_OFF)
    assert off.returncode != 0 and "outside the tolerance" in off.stderr, off.stderr[-2000:]


_KERNEL_OFF = textwrap.dedent('''
    """A planted wrong kernel: every result 1.5 times the right one."""
    import numpy as np
    import redfuser as rf
    _make = rf.kernel

    def _off_by_half(*args, **kwargs):
        made = _make(*args, **kwargs)

        class Off:
            def __call__(self, *a, **k):
                out = made(*a, **k)
                return tuple(np.asarray(o) * 1.5 for o in out) if isinstance(out, tuple) else np.asarray(out) * 1.5

            def __getattr__(self, name):
                return getattr(made, name)
        return Off()
    rf.kernel = _off_by_half
''')


def test_int8_quantization_with_a_running_absmax_is_judged_within_a_grid_step():
    """``clip(rint(x / (max|x| / 127))) @ w`` fuses, rounding with the running absmax (fusion/grid_quantization.py):
    the oracle allows one grid step per element (it judged the fused kernel wrong before), times the judge's
    safety factor C, and no more."""
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((3, 64)).astype(np.float32), rng.integers(-9, 10, (64, 5)).astype(np.float32)
    nodes = [Node(("v0",), "abs", ("x0",)), Node(("v1",), "max", ("v0",), (-1, True)),
             Node(("v2",), "div_c", ("v1",), (127.0,)), Node(("v3",), "div", ("x0", "v2")),
             Node(("v4",), "rint", ("v3",)), Node(("v5",), "clip_c", ("v4",), (-127.0, 127.0)),
             Node(("v6",), "matmul", ("v5", "x1"))]
    p = _program(nodes, ("v6",), (_array(x), _array(w)), options=(("block_k", 16),))
    assert rf.kernel(p.body, backend="cpu", block_k=16).lower(x, w).groups[0].fused
    for backend in ("interpret", "cpu"):
        assert run(p, backend).failures == []
    ref = reference(p, 0)
    q = np.asarray(ref.outputs[0].ref)
    step = np.abs(w).sum(axis=0)                              # every element one grid step off
    assert program_judge.compare(q + 0.5 * step, ref, "cpu", 0) is None
    assert program_judge.compare(q + 1.5 * C * step, ref, "cpu", 0) is not None


def test_a_rounded_numerator_over_an_exact_zero_is_unsure():
    """Seed 22, example 773: ``(x - sum(x) / 33) / mask`` on a constant row. numpy's mean of 33 equal values
    is x exactly (0/0: NaN), a kernel summing in another order is off by an ulp (-inf): a numerator that may be
    zero over an exact 0 has no determined class, so it is not judged; over a 1 it still is."""
    x0 = np.full((1, 33), -0.39565697, np.float32)
    mask = (np.arange(33) % 3 == 0).reshape(1, 33)
    nodes = [Node(("v0",), "sum", ("x0",), (-1, True)), Node(("v1",), "div_c", ("v0",), (33.0,)),
             Node(("v2",), "sub", ("x0", "v1")), Node(("v3",), "div", ("v2", "x1"))]
    p = _program(nodes, ("v3",), (_array(x0), Arg(ArrayData("bool", mask.shape, values=tuple(mask.ravel().tolist())))))
    ref = reference(p, 0)
    assert np.array_equal(np.asarray(ref.outputs[0].unsure)[0], ~mask[0])
    got = np.where(mask, 1e-8, -np.inf).astype(np.float32)      # a kernel's -1e-8 / 0 where numpy has 0 / 0
    assert program_judge.compare(got, ref, "cpu", 0) is None
    assert program_judge.compare(np.where(mask, 1.0, np.nan).astype(np.float32), ref, "cpu", 0) is not None


def test_a_std_whose_variance_may_round_to_zero_is_unsure():
    """Seed 1, example 2136 at 17e4aa1: the std of ``1 / x`` on a constant row. The engine expands that
    variance (``1/x`` is not centred; explain says so), which leaves -1e-9 for numpy's 0 and a NaN std. As
    rule (2) does for ``sqrt``, a std of a variance within its bound of 0 is unsure; elsewhere it is judged."""
    x0 = np.array([[2.0] * 7, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]], np.float32)
    nodes = [Node(("v0",), "recip", ("x0",)), Node(("v1",), "std", ("v0",), (-1, True, 0))]
    p = _program(nodes, ("v1",), (_array(x0),))
    ref = reference(p, 0)
    assert np.asarray(ref.outputs[0].unsure).ravel().tolist() == [True, False]
    got = np.array([[np.nan], [np.std(1 / x0[1])]], np.float32)
    assert program_judge.compare(got, ref, "cpu", 0) is None
    assert program_judge.compare(np.array([[np.nan], [np.nan]], np.float32), ref, "cpu", 0) is not None


def test_a_mean_of_e4m3_values_is_outside_the_subset():
    """Seed 1, example 2674 at 9dc1f40: ``rf.mean`` of float8_e4m3fn values, which RedFuser refuses by design
    (numpy accumulates them in e4m3; the conformance table's note): the oracle takes the refusal as the user
    error it is, not as a kernel refusing what numpy runs."""
    x = np.array([[1.0, 2.0, 3.0]], np.float32)
    nodes = [Node(("v0",), "astype", ("x0",), ("float8_e4m3fn",)), Node(("v1",), "mean", ("v0",), (-1, False))]
    p = _program(nodes, ("v1",), (_array(x),))
    assert reference(p, 0).unsupported
    assert run(p, "cpu").failures == []


def test_logaddexp_is_judged_relative_to_its_parts_not_its_cancelled_sum():
    """Campaign at fea91e6, example 5557: ``logaddexp(a, b)`` near 0 from ``max + log1p(exp(-|a - b|))`` of
    opposite signs: each part rounds relative to its own size (a kernel's log1p and numpy's differ by an ulp of
    5.5), so the bound follows the parts; an error of 1e-3 still fails."""
    a = np.array([-0.3, -0.31, -4.21], np.float32)     # results 5.8e-5, -9.9e-3 (cancelled) and -3.56
    b = np.array([-1.35, -1.36, -4.3], np.float32)
    p = _program([Node(("v0",), "logaddexp", ("x0", "x1"))], ("v0",), (_array(a), _array(b)))
    ref = reference(p, 0)
    want = np.asarray(ref.outputs[0].ref)
    assert program_judge.compare((want + np.float32(3e-7)).astype(np.float32), ref, "cpu", 0) is None
    assert program_judge.compare((want + np.float32(1e-3)).astype(np.float32), ref, "cpu", 0) is not None


def test_the_options_that_change_what_an_example_is_are_named_with_its_seed():
    """(Found by a helper.) ``--max-size`` and ``--max-axis`` change example i of seed S, but neither the
    campaign's header nor a reproducer named them, so a rerun by seed and index drew another example."""
    assert Config(0, ("interpret",)).drawing() == ""
    wide = Config(0, ("interpret",), max_axis=64, max_size=4096)
    assert wide.drawing() == " --max-axis 64 --max-size 4096"
    campaign = fuzz.run(wide, 1)
    assert "seed 0 --max-axis 64 --max-size 4096, backends interpret" in campaign.summary()
    assert program_example(0, 1, 4096).describe() != program_example(0, 1, 256).describe()
    failure = Failure("wrong value", "interpret", 0, "planted", index=(0,))
    script = fuzz._program_reproducer(wide, 1, failure, 0, None)
    assert "(seed 0 --max-axis 64 --max-size 4096, example 1)" in script
