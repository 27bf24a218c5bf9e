"""The cpu backend's native worker threads (`runtime.native_pool`): every part of a grid runs once, on the
workers and the helping caller, whatever the kernel's number of buffers, from several Python threads at once,
and kernels of the real backend take them."""
from __future__ import annotations

import os
import signal
import sys
import threading
import time

import numpy as np
import pytest

import redfuser as rf
from redfuser.runtime import cpu_jit, native_pool

pytestmark = pytest.mark.skipif(native_pool.pool_functions() is None,
                                reason="no POSIX threads here: the Python workers run the kernels")

MARK_IR = """
define void @mark(ptr %counts, ptr %sizes, i64 %begin, i64 %end) {
entry:
  br label %loop
loop:
  %i = phi i64 [%begin, %entry], [%i.next, %body]
  %more = icmp slt i64 %i, %end
  br i1 %more, label %body, label %done
body:
  %at = getelementptr i32, ptr %counts, i64 %i
  atomicrmw add ptr %at, i32 1 seq_cst
  %i.next = add i64 %i, 1
  br label %loop
done:
  ret void
}
"""
"""A kernel ``mark(counts, sizes, begin, end)`` adding 1 to ``counts[begin:end]``."""


def wide_ir(k: int) -> str:
    """A kernel of `k` buffers whose program ``i`` writes ``j * 1000 + i`` into element ``i`` of buffer ``j``
    (an int64 each): a wrong argument order or count shows in the values."""
    params = ", ".join([f"ptr %b{j}" for j in range(k)] + ["ptr %sizes"])
    body = []
    for j in range(k):
        body += [f"  %v{j} = add i64 %i, {j * 1000}",
                 f"  %at{j} = getelementptr i64, ptr %b{j}, i64 %i",
                 f"  store i64 %v{j}, ptr %at{j}"]
    return "\n".join([
        f"define void @wide({params}, i64 %begin, i64 %end) {{",
        "entry:", "  br label %loop",
        "loop:", "  %i = phi i64 [%begin, %entry], [%i.next, %body]",
        "  %more = icmp slt i64 %i, %end", "  br i1 %more, label %body, label %done",
        "body:", *body, "  %i.next = add i64 %i, 1", "  br label %loop",
        "done:", "  ret void", "}", ""])


def compiled(ir: str, symbol: str, k: int):
    library, _ = cpu_jit.compile_cached(ir)
    fn = cpu_jit.kernel_function(library, symbol, k)
    fn._library = library           # (kept alive with the function)
    return fn


@pytest.fixture(scope="module")
def mark():
    return compiled(MARK_IR, "mark", 1)


def address(a: np.ndarray) -> int:
    return a.ctypes.data


@pytest.mark.parametrize("n, max_parts, helps", [(1, None, False), (37, None, True), (1000, 3, False),
                                                 (1000, 64, True), (5, 64, True)])
def test_every_part_runs_once(mark, n, max_parts, helps):
    pool = cpu_jit.GridPool(2)
    counts = np.zeros(n + 8, np.int32)
    pool.run(mark, (address(counts), None), n, max_parts, helps)
    assert pool._native_workers() is not None
    np.testing.assert_array_equal(counts[:n], 1)
    np.testing.assert_array_equal(counts[n:], 0)      # (nothing past the grid)


@pytest.mark.parametrize("k", [0, 1, 7, native_pool.MAX_PARAMS])
def test_kernels_of_any_number_of_buffers_get_their_own_arguments(k):
    fn = compiled(wide_ir(k), "wide", k)
    n = 50
    buffers = [np.full(n, -1, np.int64) for _ in range(k)]
    cpu_jit.GridPool(2).run(fn, (*[address(b) for b in buffers], None), n, caller_helps=True)
    for j, b in enumerate(buffers):
        np.testing.assert_array_equal(b, np.arange(n) + j * 1000)


def test_a_kernel_of_more_buffers_than_the_switch_takes_runs_on_python_workers():
    k = native_pool.MAX_PARAMS + 1
    fn = compiled(wide_ir(k), "wide", k)
    assert not native_pool.native_kernel(fn)
    buffers = [np.full(9, -1, np.int64) for _ in range(k)]
    cpu_jit.GridPool(2).run(fn, (*[address(b) for b in buffers], None), 9)
    np.testing.assert_array_equal(buffers[-1], np.arange(9) + (k - 1) * 1000)


def test_calls_from_several_python_threads_each_get_all_their_parts(mark):
    pool = cpu_jit.GridPool(2)
    counts = [np.zeros(997, np.int32) for _ in range(6)]
    errors: list[BaseException] = []

    def call(c: np.ndarray) -> None:
        try:
            for _ in range(25):
                pool.run(mark, (address(c), None), c.size, caller_helps=False)
        except BaseException as err:      # (reported by the main thread)
            errors.append(err)

    threads = [threading.Thread(target=call, args=(c,)) for c in counts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for c in counts:
        np.testing.assert_array_equal(c, 25)


def _native_workers() -> set[str]:
    """The ids of this process's threads named as the native workers."""
    out = set()
    for t in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{t}/comm") as f:
                if f.read().strip() == "redfuser-cpu":
                    out.add(t)
        except OSError:     # (a thread that ended meanwhile)
            pass
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread names are read from /proc")
def test_a_pool_starts_its_named_workers_once(mark):
    before = _native_workers()
    pool = cpu_jit.GridPool(3)
    assert _native_workers() - before == set()            # (started on first use)
    counts = np.zeros(64, np.int32)
    pool.run(mark, (address(counts), None), 64)
    started = _native_workers() - before
    for _ in range(4):
        pool.run(mark, (address(counts), None), 64)
    assert len(started) == 3 and _native_workers() - before == started
    np.testing.assert_array_equal(counts, 5)


def test_the_backend_runs_large_grids_on_the_native_workers(monkeypatch):
    """A kernel of the cpu backend over the pool: the native workers take it and its result is the body's."""
    monkeypatch.setattr(cpu_jit, "INLINE_STREAM_BYTES", -1)
    monkeypatch.setattr(cpu_jit, "INLINE_WORK_BYTES", -1)
    taken = []
    real = native_pool.NativeWorkers.run

    def spy(self, fn, args, n, parts, wake, helps):
        taken.append((n, parts, wake, helps))
        real(self, fn, args, n, parts, wake, helps)

    monkeypatch.setattr(native_pool.NativeWorkers, "run", spy)

    def centred(x):
        return x - rf.mean(x, axis=-1, keepdims=True)

    x = np.random.default_rng(3).standard_normal((300, 40)).astype(np.float32)
    got = rf.kernel(centred, backend="cpu", dynamic=False)(x)
    np.testing.assert_allclose(got, centred(x), rtol=1e-5, atol=1e-6)
    assert taken and max(n for n, *_ in taken) > 1


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX")
def test_a_forked_child_starts_its_own_native_workers(mark):
    pool = cpu_jit.GridPool(2)
    counts = np.zeros(100, np.int32)
    pool.run(mark, (address(counts), None), 100)         # (the parent's workers exist)
    pid = os.fork()
    if pid == 0:        # the child: the parent's workers are not here; the pool starts new ones
        code = 1
        try:
            pool.run(mark, (address(counts), None), 100)
            code = 0 if (counts == 2).all() else 2
        finally:
            os._exit(code)
    for _ in range(600):            # (a child waiting on workers that are not there would hang: 60 s at most)
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.1)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the forked child's call did not return")
    assert os.waitstatus_to_exitcode(status) == 0
    np.testing.assert_array_equal(counts, 1)             # (the child's writes were its own memory's)



def test_an_interrupted_caller_returns_only_after_the_started_parts_and_starts_no_more():
    """(Found by a helper.) Ctrl-C in the caller of the Python workers' pool raised at once while the workers
    went on writing the call's buffers, which the caller then freed: a new array was overwritten."""
    pool = cpu_jit.GridPool(2, native=False)
    started, done = [], []
    main = threading.get_ident()

    def part(begin, end):
        if threading.get_ident() == main:
            raise KeyboardInterrupt
        started.append(begin)
        time.sleep(0.05)
        done.append(begin)

    with pytest.raises(KeyboardInterrupt):
        pool.run(part, (), 16, caller_helps=True)
    assert sorted(started) == sorted(done)          # nothing still running once the call has raised
    count = len(started)
    time.sleep(0.2)
    assert len(started) == count < 16                # and nothing started after it


def test_threads_asking_for_the_shared_pool_at_once_get_one(monkeypatch):
    """(Found by a helper.) `grid_pool` was a `functools.cache`: two threads missing at once each made a pool,
    each with its workers."""
    made = []

    class SlowPool(cpu_jit.GridPool):
        def __init__(self, threads):
            time.sleep(0.05)
            made.append(threads)
            super().__init__(threads)

    monkeypatch.setattr(cpu_jit, "GridPool", SlowPool)
    monkeypatch.setattr(cpu_jit, "_SHARED_POOLS", {})
    barrier = threading.Barrier(6)
    got = []

    def ask():
        barrier.wait()
        got.append(cpu_jit.grid_pool(7))

    threads = [threading.Thread(target=ask) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert made == [7] and all(p is got[0] for p in got)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX")
def test_a_forked_child_forgets_its_parents_workers_before_any_call(mark):
    """(Found by a helper.) The child's pools were reset by their first call, a check-and-reset that raced
    between threads calling at once (two sets of workers started); the fork hook resets them, where the child
    has one thread."""
    pool = cpu_jit.GridPool(2)
    pool.run(mark, (address(np.zeros(8, np.int32)), None), 8)
    assert pool._native_workers() is not None
    pid = os.fork()
    if pid == 0:
        os._exit(0 if pool._native is None and pool._tasks is None else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
