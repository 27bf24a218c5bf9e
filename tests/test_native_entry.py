"""The cached call as one builtin (`runtime.native_entry`): what it runs, what it returns, the references it
leaves and the GIL it gives up."""
from __future__ import annotations

import ctypes
import platform
import sys
import sysconfig
import threading
import time

import numpy as np
import pytest

import redfuser as rf
from redfuser.runtime import native_entry
from redfuser.workloads import softmax

RNG = np.random.default_rng(23)
SUPPORTED = platform.python_implementation() == "CPython" and not sysconfig.get_config_var("Py_GIL_DISABLED")


def max_and_sum(x):
    m = rf.max(x, axis=-1, keepdims=True)
    return m, rf.sum(rf.exp(x - m), axis=-1)


def _builtins_called(fn) -> list[str]:
    """The names of the builtin functions `fn()` calls (the profiler's ``c_call`` events)."""
    names: list[str] = []

    def profile(frame, event, arg):
        if event == "c_call":
            names.append(getattr(arg, "__name__", ""))

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return names


def test_the_builtin_is_made_where_the_interpreter_allows_it():
    """On a GIL build of CPython (what CI runs) the trampoline is made and passes its reference-count probe;
    elsewhere the call path keeps ctypes."""
    assert (native_entry._trampoline() is not None) == SUPPORTED


@pytest.mark.skipif(not SUPPORTED, reason="the builtin call needs a GIL build of CPython (ctypes is used elsewhere)")
def test_a_cached_call_is_one_builtin_call_with_the_results_of_the_full_path():
    """A cached call of a program of three kernels (a split and its combine) and two results runs them in one
    call of the builtin, with and without ``out=``, and gives what the full path gives."""
    x = RNG.standard_normal((8, 300)).astype(np.float32)
    k = rf.kernel(max_and_sum, backend="cpu", split=2)
    k(x)
    (path,) = k._fast.values()
    full = path.run([x])
    got: list = []
    assert _builtins_called(lambda: got.append(k(x))).count("redfuser_entry") == 1
    outs = (np.full((8, 1), np.nan, np.float32), np.full(8, np.nan, np.float32))
    assert _builtins_called(lambda: k(x, out=outs)).count("redfuser_entry") == 1
    for g, o, f in zip(got[0], outs, full):
        np.testing.assert_array_equal(g, f)
        np.testing.assert_array_equal(o, f)
    np.testing.assert_allclose(got[0][1], max_and_sum(x)[1], rtol=1e-5)


@pytest.mark.skipif(not SUPPORTED, reason="the builtin call needs a GIL build of CPython")
def test_calls_leave_every_reference_count_as_python_would():
    """The result comes back with the one reference its caller holds; the inputs and outputs passed keep
    theirs, over many calls (a missing or extra ``Py_INCREF`` shows here, or as a crash later)."""
    x = RNG.standard_normal((4, 16)).astype(np.float32)
    out = np.empty_like(x)
    k = rf.kernel(softmax, backend="cpu")
    k(x)
    before = sys.getrefcount(x), sys.getrefcount(out)
    for _ in range(1000):
        r = k(x)
        assert sys.getrefcount(r) == 2          # `r` and getrefcount's argument
        k(x, out=out)
    del r
    assert (sys.getrefcount(x), sys.getrefcount(out)) == before
    np.testing.assert_allclose(out, softmax(x), rtol=1e-6)


@pytest.mark.skipif(not SUPPORTED, reason="the builtin call needs a GIL build of CPython")
def test_a_long_kernel_gives_up_the_gil_and_a_tiny_one_keeps_it():
    """A program of a single-program kernel over 16 MiB (run on the caller's thread: one program) lets
    another Python thread run meanwhile, as a ctypes call would; tiny kernels keep the GIL (taking it back
    costs more than they run). With a switch interval of minutes the other thread runs only where a call
    gives the GIL up (it gives it back itself at once)."""
    long = RNG.standard_normal((1, 1 << 22)).astype(np.float32)
    tiny = RNG.standard_normal((4, 16)).astype(np.float32)
    k = rf.kernel(max_and_sum, backend="cpu", split=1, dynamic=False)
    k(long), k(tiny)
    path, tiny_path = k._fast.values()
    assert [n for _, _, n, _ in path.run._kernels] == [1] and not all(path.run._small)
    assert path.direct is not None and tiny_path.direct is not None
    counts, stop = [0], threading.Event()

    def spin() -> None:
        while not stop.is_set():
            counts[0] += 1
            time.sleep(0)                        # (gives the GIL back)

    interval = sys.getswitchinterval()
    spinner = threading.Thread(target=spin)
    spinner.start()
    try:
        time.sleep(0.01)
        sys.setswitchinterval(300)
        time.sleep(0.01)
        start = counts[0]
        for _ in range(50):             # (until the other thread has run: at once, unless the machine is busy)
            k(long)
            if counts[0] > start:
                break
        during_long = counts[0] - start
        start = counts[0]
        for _ in range(100):
            k(tiny)
        during_tiny = counts[0] - start
    finally:
        sys.setswitchinterval(interval)
        stop.set()
        spinner.join()
    assert during_long > 0 and during_tiny == 0, (during_long, during_tiny)


@pytest.mark.skipif(not SUPPORTED, reason="the builtin call needs a GIL build of CPython")
def test_the_trampoline_calls_each_kernel_with_its_buffers_in_order():
    """Two kernels (ctypes callbacks standing in for compiled code) get the data pointers of the buffers
    their plan names, their program counts, in launch order; the plan's result comes back."""
    calls: list = []
    proto = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                             ctypes.c_int64)
    one = proto(lambda a, b, sizes, begin, end: calls.append(("one", a, b, sizes, begin, end)))
    proto3 = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                              ctypes.c_int64, ctypes.c_int64)
    two = proto3(lambda a, b, c, sizes, begin, end: calls.append(("two", a, b, c, sizes, begin, end)))
    buffers = [np.zeros(n, np.float32) for n in (3, 5, 7)]
    at = [b.__array_interface__["data"][0] for b in buffers]
    entry = native_entry.entry_of([(one, (2, 0), 4), (two, (1, 1, 2), 9)], 1, False)
    assert entry(*buffers) is buffers[1]
    assert calls == [("one", at[2], at[0], None, 0, 4), ("two", at[1], at[1], at[2], None, 0, 9)]
    assert native_entry.entry_of([(one, tuple(range(native_entry.MAX_PARAMS + 1)), 1)], 0, False) is None


def test_without_the_builtin_the_cached_call_runs_its_kernels_through_ctypes(monkeypatch):
    """Where the builtin cannot be made (another interpreter), `direct` calls each kernel through ctypes on
    the buffers' addresses (`cpu_jit._ctypes_launch`): for a row kernel and for a program of three kernels
    and two results, with and without ``out=``, the same results as the program's full run, and never
    through the builtin."""
    from redfuser.runtime import cpu_jit

    monkeypatch.setattr(cpu_jit, "entry_of", lambda *a, **kw: None)
    x = RNG.standard_normal((8, 300)).astype(np.float32)
    for body, options in ((softmax, {}), (max_and_sum, {"split": 2})):
        k = rf.kernel(body, backend="cpu", **options)
        k(x)
        (path,) = k._fast.values()
        assert path.direct is not None
        want = path.run([x])                               # `CpuProgram.__call__`: every check, `_launch`
        got: list = []
        assert _builtins_called(lambda: got.append(k(x))).count("redfuser_entry") == 0
        got = got[0] if isinstance(got[0], tuple) else (got[0],)
        outs = tuple(np.full_like(w, np.nan) for w in want)
        k(x, out=outs if len(outs) > 1 else outs[0])
        for g, o, w in zip(got, outs, want):
            np.testing.assert_array_equal(g, w)
            np.testing.assert_array_equal(o, w)
