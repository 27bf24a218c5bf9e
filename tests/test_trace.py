"""Tracing and the kernel object: names, determinism, equality, the compile cache, backends, dumps."""
from __future__ import annotations

import numpy as np
import pytest

import redfuser as rf
from redfuser import backends
from redfuser.ir import Program, verify_program
from redfuser.testing import assert_close


def attention(q, k, v):
    s = (q @ rf.swapaxes(k, -1, -2)) * 0.125
    m = rf.max(s, axis=-1, keepdims=True)
    p = rf.exp(s - m)
    l = rf.sum(p, axis=-1, keepdims=True)  # noqa: E741  (the paper's name)
    return (p / l) @ v


def qkv(shape=(2, 3, 16, 8), dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(shape).astype(dtype) for _ in range(3))


def traced_text(fn, *args) -> str:
    return str(rf.kernel(fn, backend="interpret").lower(*args).stages["traced"])


# ---------------------------------------------------------------------------------------------
# what the trace records
# ---------------------------------------------------------------------------------------------
def test_printed_ir_names_buffers_after_user_variables():
    text = traced_text(attention, *qkv())
    lines = [line.strip() for line in text.splitlines()]
    for name in ("s", "m", "p", "l"):
        assert any(line.startswith(f"{name}: f32[") for line in lines), f"no '{name}:' line in\n{text}"
    assert lines[0] == "kernel attention(q: f32[2,3,16,8], k: f32[2,3,16,8], v: f32[2,3,16,8]) -> (out: f32[2,3,16,8])"
    assert any(line.startswith("m: f32[2,3,16] = ") and "max over r0<16 of s[" in line for line in lines)
    assert any(line.startswith("l: f32[2,3,16] = ") and "sum over r0<16 of p[" in line for line in lines)


def _doubled(x):
    doubled = x * 2.0                # no op of this frame runs after: the name is seen only as it returns
    return doubled


def _helper_kernel(x):
    return rf.sum(_doubled(x), axis=-1)


@pytest.mark.parametrize("under_a_tracer", [False, True])
def test_names_come_from_returning_helper_frames_with_or_without_a_debugger(under_a_tracer):
    """Buffers are named after locals of user frames as they return (a helper's too), whether RedFuser
    watches returns with a trace function or, under a debugger or coverage tool already tracing, with a
    profile hook -- and the user's tracer is left installed."""
    import sys

    def debugger(frame, event, arg):
        return None

    x = np.ones((4, 8), np.float32)
    previous = sys.gettrace()
    sys.settrace(debugger if under_a_tracer else None)
    try:
        text = traced_text(_helper_kernel, x)
        assert sys.gettrace() is (debugger if under_a_tracer else None)
    finally:
        sys.settrace(previous)
    assert any(line.strip().startswith("doubled: f32[4,8] = ") for line in text.splitlines()), text


def _tripled(t):
    return t * 3.0                   # the helper's parameter `t` is bound to the caller's `h` at this op


def _tripled_unnamed(t):
    return rf.exp(t)


def _passes_to_a_helper(x):
    h = rf.exp(x)
    out = _tripled(h)
    g = _tripled_unnamed(out)
    return rf.sum(g, axis=-1)


@pytest.mark.parametrize("under_a_tracer", [False, True])
def test_a_value_is_named_in_the_frame_that_made_it_not_after_a_helpers_parameter(under_a_tracer):
    """``h = rf.exp(x); _tripled(h)``: the helper's first op saw its parameter `t` bound to exp(x) before the
    kernel's frame named it, and `t` won ("first binding wins"). The variable of the frame that made the value
    names it; a value a helper returns unnamed still takes its caller's name (`g`)."""
    import sys

    x = np.ones((4, 8), np.float32)
    previous = sys.gettrace()
    sys.settrace((lambda frame, event, arg: None) if under_a_tracer else None)
    try:
        lines = [line.strip() for line in traced_text(_passes_to_a_helper, x).splitlines()]
    finally:
        sys.settrace(previous)
    assert "h: f32[4,8] = for i0<4, i1<8: exp(x[i0,i1])" in lines, lines
    assert "out: f32[4,8] = for i0<4, i1<8: h[i0,i1] * 3.0" in lines, lines
    assert "g: f32[4,8] = for i0<4, i1<8: exp(out[i0,i1])" in lines, lines
    assert not any(line.startswith("t:") for line in lines), lines


def test_printed_ir_shows_the_user_source_lines():
    text = traced_text(attention, *qkv())
    assert "# test_trace.py:" in text
    assert "m = rf.max(s, axis=-1, keepdims=True)" in text
    assert "return (p / l) @ v" in text


def _returns_views(x):
    t = x.T
    s = rf.sum(x, axis=-1, keepdims=True)
    u = rf.sum(x, axis=-1)
    v = x[:, ::-1]
    return t, s, u, v


def test_returned_views_are_named_and_placed_after_the_lines_that_made_them():
    """A returned view (a transpose, a keepdims sum, a slice) is copied into an output of its own: it is named
    after the variable that held it (it printed as ``out0``) and shown under the line that made it (``x.T``
    printed under the next statement's line); a keepdims sum keeps the variable's name, its copy is ``s_1``."""
    import inspect

    text = traced_text(_returns_views, np.ones((2, 3), np.float32))
    lines = [line.strip() for line in text.splitlines()]
    assert lines[0].endswith("-> (t: f32[3,2], s_1: f32[2,1], u: f32[2], v: f32[2,3])"), text
    first = inspect.getsourcelines(_returns_views)[1]
    for name, line in (("t", first + 1), ("s_1", first + 2), ("v", first + 4)):
        at = next(i for i, text_line in enumerate(lines) if text_line.startswith(f"{name}: "))
        comment = next(text_line for text_line in reversed(lines[:at]) if text_line.startswith("#"))
        assert f"test_trace.py:{line} " in comment, (name, comment)
    assert "s_1: f32[2,1] = for i0<2, i1<1: s[i0]" in lines, text


def test_printed_ir_is_deterministic():
    args = qkv()
    first = traced_text(attention, *args)
    assert traced_text(attention, *args) == first  # a re-created kernel prints the same text
    k = rf.kernel(attention, backend="interpret")
    assert str(k.lower(*args).stages["traced"]) == first
    assert str(k.lower(*args).stages["traced"]) == first


def test_python_control_flow_on_shapes_runs_at_trace_time():
    def body(x):
        out = x
        for _ in range(x.shape[0]):  # unrolled: one multiply per row count
            out = out * 0.5
        if x.shape[-1] > 4:
            out = rf.sum(out, axis=-1)
        return out

    for shape in ((3, 8), (2, 4)):
        x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
        k = rf.kernel(body, backend="interpret")
        assert_close(k(x), body(x), np.float32, shape[-1])
        text = str(k.lower(x).stages["traced"])
        statements = [line for line in text.splitlines() if not line.strip().startswith("#")]
        assert sum(" * 0.5" in line for line in statements) == shape[0]
        assert ("sum over" in text) == (shape[-1] > 4)


def test_static_python_scalar_arguments_are_baked_in():
    def body(x, scale, n):
        return x * scale + n

    k = rf.kernel(body, backend="interpret")
    x = np.ones((2, 3), np.float32)
    np.testing.assert_array_equal(k(x, 0.5, 2), body(x, 0.5, 2))
    np.testing.assert_array_equal(k(x, 3.0, 1), body(x, 3.0, 1))
    assert k.cache_size == 2


# ---------------------------------------------------------------------------------------------
# programs as values: equality, hashing
# ---------------------------------------------------------------------------------------------
def test_same_function_traced_twice_gives_equal_programs():
    args = qkv()
    p1 = rf.kernel(attention, backend="interpret").lower(*args).stages["traced"]
    p2 = rf.kernel(attention, backend="interpret").lower(*args).stages["traced"]
    assert isinstance(p1, Program) and p1 is not p2
    assert p1 == p2 and hash(p1) == hash(p2)
    assert len({p1, p2}) == 1


def test_different_shapes_or_dtypes_give_different_programs():
    base = rf.kernel(attention, backend="interpret").lower(*qkv()).stages["traced"]
    other_shape = rf.kernel(attention, backend="interpret").lower(*qkv((2, 3, 16, 4))).stages["traced"]
    other_dtype = rf.kernel(attention, backend="interpret").lower(*qkv(dtype=np.float16)).stages["traced"]
    assert base != other_shape and base != other_dtype and other_shape != other_dtype
    assert len({base, other_shape, other_dtype}) == 3


def test_traced_programs_verify():
    program = rf.kernel(attention, backend="interpret").lower(*qkv()).stages["traced"]
    assert verify_program(program) is program


# ---------------------------------------------------------------------------------------------
# the kernel object
# ---------------------------------------------------------------------------------------------
def test_compiles_once_per_signature():
    traces = []

    def body(x):
        traces.append(x.shape)  # a side effect that runs only while tracing
        return x + 1.0

    k = rf.kernel(body, backend="interpret", dynamic=False)     # one kernel per exact shape
    x = np.zeros((2, 3), np.float32)
    k(x)
    k(x)
    k(x + 5)  # same shape and dtype, other values: no new trace
    assert traces == [(2, 3)] and k.cache_size == 1
    k(np.zeros((3, 2), np.float32))
    k(np.zeros((2, 3), np.float16))
    k.lower(x)
    assert traces == [(2, 3), (3, 2), (2, 3)] and k.cache_size == 3
    # by default a second length makes a shape class, traced twice at probe lengths (redfuser.shapes), and
    # a third length traces nothing
    traces.clear()
    k = rf.kernel(body, backend="interpret")
    k(np.zeros((2, 3), np.float32)), k(np.zeros((2, 5), np.float32))
    assert traces[0] == (2, 3) and len(traces) == 3 and traces[1][1] > 10000 and traces[2][1] > 10000
    k(np.zeros((2, 9), np.float32))
    assert len(traces) == 3 and k.cache_size == 2


def test_kernel_spellings():
    args = qkv()
    expected = attention(*args)

    @rf.kernel
    def bare(q, k, v):
        return attention(q, k, v)

    @rf.kernel(backend="interpret")
    def with_backend(q, k, v):
        return attention(q, k, v)

    called = rf.kernel(attention, backend="interpret")
    for k in (bare, with_backend, called):
        assert_close(k(*args), expected, np.float32, 16)
    assert with_backend.lower(*args).backend == "interpret"
    assert called.__wrapped__ is attention
    assert called.__name__ == "attention" and bare.__name__ == "bare"
    assert "attention" in repr(called) and "interpret" in repr(called)


def test_backend_from_environment(monkeypatch):
    monkeypatch.setenv("REDFUSER_BACKEND", "interpret")
    k = rf.kernel(attention)
    args = qkv()
    assert k.lower(*args).backend == "interpret"
    assert_close(k(*args), attention(*args), np.float32, 16)
    monkeypatch.setenv("REDFUSER_BACKEND", "no-such-backend")
    with pytest.raises(rf.BackendError, match="no-such-backend"):
        rf.kernel(attention)(*args)


def test_explicit_backend_wins_over_environment(monkeypatch):
    monkeypatch.setenv("REDFUSER_BACKEND", "no-such-backend")
    assert rf.kernel(attention, backend="interpret").lower(*qkv()).backend == "interpret"


def test_lower_keeps_the_traced_stage():
    lowered = rf.kernel(attention, backend="interpret").lower(*qkv())
    assert list(lowered.stages)[0] == "traced"
    assert isinstance(lowered.stages["traced"], Program)
    assert str(lowered.stages["traced"]).startswith("kernel attention(")
    assert "=== traced ===" in str(lowered)


def test_wrapped_is_the_python_function():
    k = rf.kernel(attention, backend="interpret")
    assert k.__wrapped__ is attention
    args = qkv()
    np.testing.assert_array_equal(k.__wrapped__(*args), attention(*args))


@pytest.mark.parametrize("name", ["cpu", "cuda", "simulate"])
def test_backends_not_built_yet_say_so(name):
    """Until a backend lands it raises a clear error; once it lands it must run (so this never goes stale)."""
    backend = backends.BACKENDS[name]
    args = qkv()
    k = rf.kernel(attention, backend=name)
    if backend.build is None:
        with pytest.raises(rf.BackendError, match="not built yet"):
            k(*args)
    elif backend.usable() is not None:  # built, but not usable here (e.g. cuda without a device)
        with pytest.raises(rf.BackendError):
            k(*args)
    else:
        assert_close(k(*args), attention(*args), np.float32, 16)


def test_inputs_are_never_modified():
    def body(x, y):
        s = x.mT @ y
        return rf.exp(s - rf.max(s, axis=-1, keepdims=True)), x * 2.0, y.T

    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((4, 5)).astype(np.float32), rng.standard_normal((4, 3)).astype(np.float32)
    x_copy, y_copy = x.copy(), y.copy()
    outs = rf.kernel(body, backend="interpret")(x, y)
    assert np.array_equal(x, x_copy) and np.array_equal(y, y_copy)
    for out in outs:  # outputs are fresh arrays, not views of the inputs
        assert not np.shares_memory(out, x) and not np.shares_memory(out, y)
    outs[1][...] = 0
    assert np.array_equal(x, x_copy)


def test_returning_an_input_gives_a_copy():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = rf.kernel(lambda x: x, backend="interpret")(x)
    np.testing.assert_array_equal(out, x)
    out[...] = -1
    assert x[0, 1] == 1


def test_dump_dir_writes_every_stage(monkeypatch, tmp_path):
    monkeypatch.setenv("REDFUSER_DUMP_DIR", str(tmp_path))
    k = rf.kernel(attention, backend="interpret")
    lowered = k.lower(*qkv())
    folder = tmp_path / "attention" / lowered.specialization     # (a folder a compile)
    files = sorted(p.name for p in folder.iterdir())
    assert files[0] == "00-traced.txt" and len(files) == len(lowered.stages)
    assert (folder / "00-traced.txt").read_text() == f"{lowered.stages['traced']}\n"


def test_loop_indices_are_not_named_like_a_parameter():
    """A parameter named ``i0`` or ``r0`` (the tracer's loop index names) printed as ``i0[i0,i1]`` and
    ``sum over r0<3 of r0[i0,r0]``: the indices take a ``_`` while a parameter has their name."""
    def f(r0, i0):
        return rf.sum(r0 @ i0, axis=-1) + rf.max(r0, axis=0)

    x = np.arange(9, dtype=np.float32).reshape(3, 3)
    kernel = rf.kernel(f, backend="interpret")
    text = str(kernel.lower(x, x).stages["traced"])
    assert "r0[i0_,r0_] * i0[r0_,i1]" in text and "i0[i0" not in text and "of r0[r0," not in text, text
    np.testing.assert_array_equal(kernel(x, x), f(x, x))


def test_loop_indices_are_not_named_like_a_variable_assigned_later():
    """A variable ``i0`` (a reduction assigned before the nests that read it) printed as ``i0[i0]``, and ``r0``
    as ``max over r0<4 of r0[i0,r0]``: the name is the user's only once the trace ends, so the indices are
    primed then, in every nest."""
    def f(x):
        i0 = rf.sum(x, axis=-1, keepdims=True)
        r0 = x - i0
        return rf.max(r0, axis=-1)

    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    kernel = rf.kernel(f, backend="interpret")
    lowered = kernel.lower(x)
    for stage in ("traced", "fused"):
        text = str(lowered.stages[stage])
        assert "i0[i0_]" in text and "i0[i0]" not in text and "r0[r0" not in text and "r0[i0," not in text, text
    np.testing.assert_array_equal(kernel(x), f(x))


def _continued_call(x):
    return rf.exp(x -
                  rf.max(x, axis=-1,
                         keepdims=True)) * rf.sum(x, axis=-1,
                                                  keepdims=True)


def _continued_assignment(x):
    y = rf.exp(x -
               rf.max(x, axis=-1, keepdims=True))
    scaled: object = (rf.sum(y, axis=-1, keepdims=True)
                      * 2.0)
    z = y / scaled
    f = lambda t: rf.exp(t) * 2.0  # noqa: E731
    return f(z)


def _op_names(fn, x) -> list[str]:
    return [line.split(":")[0].strip() for line in traced_text(fn, x).splitlines()[1:] if not line.strip().startswith("#")]


def test_a_temporary_is_prefixed_only_by_the_variable_its_statement_assigns():
    """A temporary takes the variable its statement assigns as a prefix, read from the statement's syntax
    tree: a regex over one physical line read the continuation ``keepdims=True)) * rf.sum(`` as an assignment
    (``keepdims_sum``), and ``lam = rf.kernel(lambda x: ...)`` as the body's (``lam_max``); a lambda inside a
    body is a function, not the value its statement assigns (``f_exp``)."""
    x = np.ones((2, 4), np.float32)
    assert _op_names(_continued_call, x) == ["max", "subtract", "exp", "sum", "out"]
    lam = rf.kernel(lambda x: rf.exp(x - rf.max(x, axis=-1, keepdims=True)), backend="interpret")
    lines = str(lam.lower(x).stages["traced"]).splitlines()[1:]
    assert [line.split(":")[0].strip() for line in lines if not line.strip().startswith("#")] == \
        ["max", "subtract", "out"]
    # an assignment written over several lines prefixes every op of its value, the annotated one too
    assert _op_names(_continued_assignment, x) == \
        ["y_max", "y_subtract", "y", "scaled_sum", "scaled", "z", "exp", "out"]
