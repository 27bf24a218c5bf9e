"""The cpu backend's worker threads in native code: a kernel's program instances split over POSIX threads
without the interpreter in the way.

`GridPool`'s Python workers cost a call 50-150 us before any work (a queue, an event, and a Python thread per
worker woken through the GIL; docs/cpu-backend.md): a group norm of 8 x 64x32x32 ran 289 us a call where
the work on two cores is about 120. Here the pool is a few functions compiled once per process (through the
compile cache) from the LLVM IR below, called through ctypes (which releases the GIL for the call):

- ``redfuser_pool_init(pool)`` sets up the pool's two mutexes and two condition variables in a block of
  memory Python owns for the life of the process (`POOL_BYTES`, laid out as `_Field` says);
- ``redfuser_pool_start(pool, threads, stack_bytes)`` starts `threads` detached workers with stacks of
  `stack_bytes` (tiles live on the stack) and returns how many started;
- ``redfuser_pool_run(pool, job)`` runs one kernel ``f(ptr * k, ptr sizes, i64 begin, i64 end)`` over
  ``[0, n)`` in `parts` contiguous parts: ``job`` is an i64 array ``[f, k, sizes, n, parts, wake, helps,
  buffer_0, ..., buffer_k-1]``. It publishes the job, wakes `wake` workers, takes parts itself where `helps`
  is set, and returns once every part has run;
- ``redfuser_pool_stop(pool)`` makes the workers return (a pool that could not start all of them).

The protocol is one lock: the job's fields, the next part to take and the parts not yet finished change only
under the pool's mutex, and a worker copies the job into its own frame when it takes a part, so a worker that
wakes late never runs one job's function on another's parts (there is no next part of a job that has
finished). A second mutex lets one call in at a time: callers on several Python threads queue for the pool
rather than oversubscribing the cores (each call still gets every worker). The threads are named
``redfuser-cpu`` on Linux (``top -H``, ``/proc/self/task/*/comm``).

Where this cannot be made (no POSIX threads in the process: Windows; a JIT without this target) `GridPool`
keeps its Python workers. `pthread_mutex_t`, `pthread_cond_t` and `pthread_attr_t` are opaque and their
sizes differ between C libraries (40, 48 and 56 bytes on glibc x86-64, 64, 48 and 64 on macOS): each gets
`_OPAQUE_BYTES`, more than any of them takes.
"""
from __future__ import annotations

import ctypes
import enum
import functools
import logging
import sys
from typing import Any

from .native_entry import MAX_PARAMS, _address

_OPAQUE_BYTES = 128
"""Room for one `pthread_mutex_t`, `pthread_cond_t` or `pthread_attr_t` on any C library."""


class _Field(enum.IntEnum):
    """Byte offsets of the pool's fields in its memory."""

    LOCK = 0                         # pthread_mutex_t: the job's fields below
    CALLERS = 1 * _OPAQUE_BYTES      # pthread_mutex_t: one call at a time
    WORK = 2 * _OPAQUE_BYTES         # pthread_cond_t: a job was published (or stop)
    DONE = 3 * _OPAQUE_BYTES         # pthread_cond_t: the last part finished
    NEXT = 4 * _OPAQUE_BYTES         # i64: the next part to take
    PARTS = NEXT + 8                 # i64: the job's parts (0: no job)
    UNFINISHED = NEXT + 16           # i64: parts taken or not, not yet finished
    N = NEXT + 24                    # i64: program instances
    FN = NEXT + 32                   # ptr: the kernel
    K = NEXT + 40                    # i64: its buffer parameters
    SIZES = NEXT + 48                # ptr: its run-time extents (or null)
    STOP = NEXT + 56                 # i64: workers return
    BUFFERS = NEXT + 64              # ptr[MAX_PARAMS]


POOL_BYTES = _Field.BUFFERS + 8 * MAX_PARAMS
"""Bytes of a pool's memory."""

_JOB_HEADER = 7     # f, k, sizes, n, parts, wake, helps


def _field(name: str, field: _Field, ty: str) -> list[str]:
    """``%name`` = the address of `field` in ``%pool`` (typed `ty` for the reader's benefit)."""
    return [f"  %{name} = getelementptr i8, ptr %pool, i64 {int(field)}   ; {ty}"]


def _call_kernel_ir(max_params: int) -> list[str]:
    """``redfuser_pool_call(fn, k, buffers, sizes, begin, end)``: ``fn(buffers[0..k), sizes, begin, end)``
    through a switch over `k` (a C call cannot take a run-time number of arguments)."""
    lines = ["define internal void @redfuser_pool_call(ptr %fn, i64 %k, ptr %buffers, ptr %sizes, i64 %begin, "
             "i64 %end) {",
             "entry:",
             "  switch i64 %k, label %done [" + " ".join(f"i64 {k}, label %call{k}" for k in range(max_params + 1))
             + "]"]
    for k in range(max_params + 1):
        lines.append(f"call{k}:")
        pointers = []
        for i in range(k):
            lines += [f"  %c{k}.b{i}.at = getelementptr ptr, ptr %buffers, i64 {i}",
                      f"  %c{k}.b{i} = load ptr, ptr %c{k}.b{i}.at"]
            pointers.append(f"ptr %c{k}.b{i}")
        arguments = ", ".join(pointers + ["ptr %sizes", "i64 %begin", "i64 %end"])
        lines += [f"  call void %fn({arguments})", "  br label %done"]
    lines += ["done:", "  ret void", "}"]
    return lines


def _take_parts_ir(fn_name: str, wait_for_work: bool) -> list[str]:
    """A loop, entered and left holding the pool's lock, that takes the job's parts one by one and runs each
    with the lock released; when none is left a worker (`wait_for_work`) sleeps until the next job and a
    caller returns."""
    idle = ["  %stop = load i64, ptr %stop.at",
            "  %stopped = icmp ne i64 %stop, 0",
            "  br i1 %stopped, label %leave, label %sleep",
            "sleep:",
            "  call i32 @pthread_cond_wait(ptr %work, ptr %lock)",
            "  br label %loop"] if wait_for_work else ["  br label %leave"]
    return [
        f"define internal void @{fn_name}(ptr %pool) {{",
        "entry:",
        *_field("lock", _Field.LOCK, "pthread_mutex_t"),
        *_field("work", _Field.WORK, "pthread_cond_t"),
        *_field("done", _Field.DONE, "pthread_cond_t"),
        *_field("next.at", _Field.NEXT, "i64"),
        *_field("parts.at", _Field.PARTS, "i64"),
        *_field("unfinished.at", _Field.UNFINISHED, "i64"),
        *_field("n.at", _Field.N, "i64"),
        *_field("fn.at", _Field.FN, "ptr"),
        *_field("k.at", _Field.K, "i64"),
        *_field("sizes.at", _Field.SIZES, "ptr"),
        *_field("stop.at", _Field.STOP, "i64"),
        *_field("buffers.at", _Field.BUFFERS, f"[{MAX_PARAMS} x ptr]"),
        f"  %buffers = alloca [{MAX_PARAMS} x ptr]",
        "  br label %loop",
        "loop:",
        "  %next = load i64, ptr %next.at",
        "  %parts = load i64, ptr %parts.at",
        "  %more = icmp slt i64 %next, %parts",
        "  br i1 %more, label %take, label %idle",
        "take:",
        "  %after = add i64 %next, 1",
        "  store i64 %after, ptr %next.at",
        "  %n = load i64, ptr %n.at",
        "  %fn = load ptr, ptr %fn.at",
        "  %k = load i64, ptr %k.at",
        "  %sizes = load ptr, ptr %sizes.at",
        "  %bytes = shl i64 %k, 3",
        "  call void @llvm.memcpy.p0.p0.i64(ptr %buffers, ptr %buffers.at, i64 %bytes, i1 false)",
        "  call i32 @pthread_mutex_unlock(ptr %lock)",
        # part i is [n i / parts, n (i + 1) / parts): n < 2^47 elements and parts <= 4 x threads keep it in i64
        "  %begin.scaled = mul i64 %n, %next",
        "  %begin = sdiv i64 %begin.scaled, %parts",
        "  %end.scaled = mul i64 %n, %after",
        "  %end = sdiv i64 %end.scaled, %parts",
        "  call void @redfuser_pool_call(ptr %fn, i64 %k, ptr %buffers, ptr %sizes, i64 %begin, i64 %end)",
        "  call i32 @pthread_mutex_lock(ptr %lock)",
        "  %unfinished = load i64, ptr %unfinished.at",
        "  %left = sub i64 %unfinished, 1",
        "  store i64 %left, ptr %unfinished.at",
        "  %last = icmp eq i64 %left, 0",
        "  br i1 %last, label %finished, label %loop",
        "finished:",
        "  call i32 @pthread_cond_broadcast(ptr %done)",
        "  br label %loop",
        "idle:",
        *idle,
        "leave:",
        "  ret void",
        "}",
    ]


def pool_ir(name_threads: bool) -> str:
    """The LLVM IR of the pool's functions (module docstring); `name_threads`: each worker is named as it starts,
    ``pthread_setname_np(thread, name)`` (Linux's signature)."""
    declarations = [
        "declare i32 @pthread_mutex_init(ptr, ptr)",
        "declare i32 @pthread_mutex_lock(ptr)",
        "declare i32 @pthread_mutex_unlock(ptr)",
        "declare i32 @pthread_cond_init(ptr, ptr)",
        "declare i32 @pthread_cond_wait(ptr, ptr)",
        "declare i32 @pthread_cond_signal(ptr)",
        "declare i32 @pthread_cond_broadcast(ptr)",
        "declare i32 @pthread_attr_init(ptr)",
        "declare i32 @pthread_attr_setstacksize(ptr, i64)",
        "declare i32 @pthread_attr_destroy(ptr)",
        "declare i32 @pthread_create(ptr, ptr, ptr, ptr)",
        "declare i32 @pthread_detach(i64)",
        "declare void @llvm.memcpy.p0.p0.i64(ptr, ptr, i64, i1)",
    ]
    naming = []
    if name_threads:
        declarations += ["declare i32 @pthread_setname_np(i64, ptr)",
                         '@thread.name = private constant [13 x i8] c"redfuser-cpu\\00"']
        naming = ["  call i32 @pthread_setname_np(i64 %id, ptr @thread.name)"]
    lines = ['; ModuleID = "redfuser_pool"', *declarations, ""]
    lines += _call_kernel_ir(MAX_PARAMS) + [""]
    lines += _take_parts_ir("redfuser_pool_work", wait_for_work=True) + [""]
    lines += _take_parts_ir("redfuser_pool_help", wait_for_work=False) + [""]
    lines += [
        "define internal ptr @redfuser_pool_worker(ptr %pool) {",
        "entry:",
        *_field("lock", _Field.LOCK, "pthread_mutex_t"),
        "  call i32 @pthread_mutex_lock(ptr %lock)",
        "  call void @redfuser_pool_work(ptr %pool)",
        "  call i32 @pthread_mutex_unlock(ptr %lock)",
        "  ret ptr null",
        "}",
        "",
        "define i32 @redfuser_pool_init(ptr %pool) {",
        "entry:",
        *_field("lock", _Field.LOCK, "pthread_mutex_t"),
        *_field("callers", _Field.CALLERS, "pthread_mutex_t"),
        *_field("work", _Field.WORK, "pthread_cond_t"),
        *_field("done", _Field.DONE, "pthread_cond_t"),
        "  %e0 = call i32 @pthread_mutex_init(ptr %lock, ptr null)",
        "  %e1 = call i32 @pthread_mutex_init(ptr %callers, ptr null)",
        "  %e2 = call i32 @pthread_cond_init(ptr %work, ptr null)",
        "  %e3 = call i32 @pthread_cond_init(ptr %done, ptr null)",
        "  %e01 = or i32 %e0, %e1",
        "  %e23 = or i32 %e2, %e3",
        "  %e = or i32 %e01, %e23",
        "  ret i32 %e",
        "}",
        "",
        "define i64 @redfuser_pool_start(ptr %pool, i64 %threads, i64 %stack) {",
        "entry:",
        f"  %attr = alloca [{_OPAQUE_BYTES} x i8], align 16",
        "  %thread = alloca i64, align 16",
        "  call i32 @pthread_attr_init(ptr %attr)",
        "  call i32 @pthread_attr_setstacksize(ptr %attr, i64 %stack)",
        "  br label %loop",
        "loop:",
        "  %i = phi i64 [0, %entry], [%i.next, %started]",
        "  %more = icmp slt i64 %i, %threads",
        "  br i1 %more, label %create, label %done",
        "create:",
        "  %error = call i32 @pthread_create(ptr %thread, ptr %attr, ptr @redfuser_pool_worker, ptr %pool)",
        "  %failed = icmp ne i32 %error, 0",
        "  br i1 %failed, label %done, label %started",
        "started:",
        "  %id = load i64, ptr %thread",
        *naming,
        "  call i32 @pthread_detach(i64 %id)",
        "  %i.next = add i64 %i, 1",
        "  br label %loop",
        "done:",
        "  call i32 @pthread_attr_destroy(ptr %attr)",
        "  ret i64 %i",
        "}",
        "",
        "define void @redfuser_pool_stop(ptr %pool) {",
        "entry:",
        *_field("lock", _Field.LOCK, "pthread_mutex_t"),
        *_field("work", _Field.WORK, "pthread_cond_t"),
        *_field("stop.at", _Field.STOP, "i64"),
        "  call i32 @pthread_mutex_lock(ptr %lock)",
        "  store i64 1, ptr %stop.at",
        "  call i32 @pthread_cond_broadcast(ptr %work)",
        "  call i32 @pthread_mutex_unlock(ptr %lock)",
        "  ret void",
        "}",
        "",
        "define void @redfuser_pool_run(ptr %pool, ptr %job) {",
        "entry:",
        *_field("lock", _Field.LOCK, "pthread_mutex_t"),
        *_field("callers", _Field.CALLERS, "pthread_mutex_t"),
        *_field("work", _Field.WORK, "pthread_cond_t"),
        *_field("done", _Field.DONE, "pthread_cond_t"),
        *_field("next.at", _Field.NEXT, "i64"),
        *_field("parts.at", _Field.PARTS, "i64"),
        *_field("unfinished.at", _Field.UNFINISHED, "i64"),
        *_field("n.at", _Field.N, "i64"),
        *_field("fn.at", _Field.FN, "ptr"),
        *_field("k.at", _Field.K, "i64"),
        *_field("sizes.at", _Field.SIZES, "ptr"),
        *_field("buffers.at", _Field.BUFFERS, f"[{MAX_PARAMS} x ptr]"),
        "  %job.k.at = getelementptr i64, ptr %job, i64 1",
        "  %job.sizes.at = getelementptr i64, ptr %job, i64 2",
        "  %job.n.at = getelementptr i64, ptr %job, i64 3",
        "  %job.parts.at = getelementptr i64, ptr %job, i64 4",
        "  %job.wake.at = getelementptr i64, ptr %job, i64 5",
        "  %job.helps.at = getelementptr i64, ptr %job, i64 6",
        f"  %job.buffers = getelementptr i64, ptr %job, i64 {_JOB_HEADER}",
        "  %fn = load ptr, ptr %job",
        "  %k = load i64, ptr %job.k.at",
        "  %sizes = load ptr, ptr %job.sizes.at",
        "  %n = load i64, ptr %job.n.at",
        "  %parts = load i64, ptr %job.parts.at",
        "  %wake = load i64, ptr %job.wake.at",
        "  %helps = load i64, ptr %job.helps.at",
        "  %bytes = shl i64 %k, 3",
        "  call i32 @pthread_mutex_lock(ptr %callers)",
        "  call i32 @pthread_mutex_lock(ptr %lock)",
        "  store ptr %fn, ptr %fn.at",
        "  store i64 %k, ptr %k.at",
        "  store ptr %sizes, ptr %sizes.at",
        "  store i64 %n, ptr %n.at",
        "  call void @llvm.memcpy.p0.p0.i64(ptr %buffers.at, ptr %job.buffers, i64 %bytes, i1 false)",
        "  store i64 0, ptr %next.at",
        "  store i64 %parts, ptr %unfinished.at",
        "  store i64 %parts, ptr %parts.at",
        "  br label %wake.loop",
        "wake.loop:",
        "  %w = phi i64 [0, %entry], [%w.next, %wake.one]",
        "  %wake.more = icmp slt i64 %w, %wake",
        "  br i1 %wake.more, label %wake.one, label %woken",
        "wake.one:",
        "  call i32 @pthread_cond_signal(ptr %work)",
        "  %w.next = add i64 %w, 1",
        "  br label %wake.loop",
        "woken:",
        "  %help = icmp ne i64 %helps, 0",
        "  br i1 %help, label %helping, label %wait",
        "helping:",
        "  call void @redfuser_pool_help(ptr %pool)",
        "  br label %wait",
        "wait:",
        "  %unfinished = load i64, ptr %unfinished.at",
        "  %finished = icmp sle i64 %unfinished, 0",
        "  br i1 %finished, label %leave, label %sleep",
        "sleep:",
        "  call i32 @pthread_cond_wait(ptr %done, ptr %lock)",
        "  br label %wait",
        "leave:",
        "  store i64 0, ptr %parts.at",
        "  store i64 0, ptr %next.at",
        "  call i32 @pthread_mutex_unlock(ptr %lock)",
        "  call i32 @pthread_mutex_unlock(ptr %callers)",
        "  ret void",
        "}",
    ]
    return "\n".join(lines) + "\n"


class NativeWorkers:
    """`threads` native workers sharing one pool (module docstring); `run` runs a compiled kernel over them."""

    def __init__(self, functions: dict[str, Any], threads: int, stack_bytes: int) -> None:
        self._run = functions["redfuser_pool_run"]
        self.threads = threads
        # the pool's memory lives as long as the process: detached workers wait on it until the process ends
        self._memory = ctypes.create_string_buffer(POOL_BYTES)
        _KEPT.append(self._memory)
        address = ctypes.addressof(self._memory)
        if functions["redfuser_pool_init"](address) != 0:
            raise OSError("pthread_mutex_init or pthread_cond_init failed")
        started = functions["redfuser_pool_start"](address, threads, stack_bytes)
        if started < threads:
            functions["redfuser_pool_stop"](address)       # (the started ones return)
            from ..ir.errors import BackendError

            raise BackendError(f"cpu: could not start {threads} worker threads (num_threads): the system allowed "
                               f"{started}")
        self._address = address

    def run(self, fn: Any, args: tuple, n: int, parts: int, wake: int, helps: bool) -> None:
        """Run the compiled kernel `fn` (a ctypes function) on `args` (its buffers' addresses, then its sizes' or
        None) over ``[0, n)`` in `parts` parts, waking `wake` workers, the caller taking parts if it `helps`."""
        *buffers, sizes = args
        job = (ctypes.c_int64 * (_JOB_HEADER + len(buffers)))(
            _address(fn), len(buffers), sizes or 0, n, parts, wake, int(helps), *buffers)
        self._run(self._address, job)


_KEPT: list = []
"""Pools' memory and the code's libraries, kept for the life of the process (detached workers use them)."""


def native_kernel(fn: Any) -> bool:
    """Whether `fn` is a compiled kernel the native pool can call (a ctypes function taking at most
    `MAX_PARAMS` buffers, its sizes and its bounds)."""
    return isinstance(fn, ctypes._CFuncPtr) and len(fn.argtypes or ()) <= MAX_PARAMS + 3


@functools.cache
def pool_functions() -> dict[str, Any] | None:
    """The pool's functions as ctypes functions, compiled once per process (through the compile cache), or None
    where native workers cannot be made here (module docstring)."""
    from .cpu_jit import compile_cached, in_process

    if ctypes.sizeof(ctypes.c_void_p) != 8 or not all(
            in_process(name) for name in ("pthread_create", "pthread_cond_wait", "pthread_attr_setstacksize")):
        return None
    try:
        library, _ = compile_cached(pool_ir(name_threads=sys.platform.startswith("linux")))
    except Exception as exc:   # (an LLVM without this target's JIT, a broken install: the Python workers stay)
        logging.getLogger("redfuser.runtime").warning("the cpu backend's native worker threads could not be made "
                                                      "(%s); Python threads run the kernels", exc)
        return None
    _KEPT.append(library)
    c = ctypes
    kinds = {"redfuser_pool_init": (c.c_int32, [c.c_void_p]),
             "redfuser_pool_start": (c.c_int64, [c.c_void_p, c.c_int64, c.c_int64]),
             "redfuser_pool_stop": (None, [c.c_void_p]),
             "redfuser_pool_run": (None, [c.c_void_p, c.c_void_p])}
    return {name: c.CFUNCTYPE(result, *params)(library.address(name)) for name, (result, params) in kinds.items()}
