"""The CPU JIT: native object code (cached) -> linked in memory -> ctypes calls over a thread pool.

The code itself is made by `codegen.native` (host LLVM IR -> optimized object for this CPU).

- `cached_object(text, options, kernels)`: `codegen.native.compile_object` through
  the compile cache (`runtime.cache`), keyed by the IR text, options, the target
  (triple, CPU, features) and versions: cold builds, warm hits in memory, later
  processes hit disk. An object read from disk is linked only after
  `runtime.object_check` has read it (MCJIT would crash the process on a bad one):
  a bad entry is rebuilt with a `CacheWarning` at the user's call. On a machine the
  check has no table for, host objects are cached in memory only. The ``cpu``
  backend's ``native`` stage calls it (`redfuser.backends`);
- `JitLibrary` links an object in memory with MCJIT (memcpy/memset come from the
  process); `compile_cached(text, ...)` is both steps;
- `GridPool`: worker threads with large stacks (tiles live on the stack) that
  split a kernel's program instances; ctypes releases the GIL during each call;
- `CpuProgram.direct`: a cached call's function, its kernels called through one
  builtin (`runtime.native_entry`) where the interpreter allows it.
"""
from __future__ import annotations

import ctypes
import functools
import math
import os
import queue
import re
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import llvmlite
import llvmlite.binding as llvm
import numpy as np

from ..codegen.native import compile_object, host_target, jit_machine
from ..ir.array_memory import memory_of
from ..ir.sizes import bind_buffers, concrete, evaluate
from .addresses import data_address
from .native_entry import entry_of
from .native_pool import NativeWorkers, native_kernel, pool_functions
from .object_check import BadObject, check_host_object
from .object_machines import Machine, machine_of_triple

if TYPE_CHECKING:
    from ..codegen.host import KernelABI

STACK_BYTES = 256 << 20
"""Stack of each worker thread: room for the largest tiles a schedule keeps (virtual, paid when touched)."""


class JitLibrary:
    """Object code linked in memory; `address(symbol)` gives a function's entry point."""

    def __init__(self, obj: bytes) -> None:
        target = host_target()
        empty = llvm.parse_assembly(f'target triple = "{target.triple}"')
        # the engine takes ownership of its target machine, so each library gets its own
        self._engine = llvm.create_mcjit_compiler(empty, jit_machine(target.triple, target.cpu, target.features))
        self._engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
        self._engine.finalize_object()

    def address(self, symbol: str) -> int:
        addr = self._engine.get_function_address(symbol)
        if not addr:
            from ..ir.errors import InternalError

            raise InternalError(f"symbol {symbol} is missing from the compiled object", pass_name="cpu_jit")
        return addr


@dataclass(frozen=True)
class CompileInfo:
    """Where the object code came from (``build``, ``memory`` or ``disk``) and how long getting it took."""

    source: str
    seconds: float


def cached_object(text: str, options: dict | None = None,
                  kernels: Sequence[KernelABI] | None = None) -> tuple[bytes, CompileInfo]:
    """The object code of a host module, served by the compile cache, and where it came from.

    `kernels`: the calling conventions `codegen.host.build_host_module` returned
    with the module; their symbols must be defined in an object read from disk
    (default: every function the module text defines for export).
    """
    from .cache import CacheKey, default_cache

    target = host_target()
    symbols = [k.symbol for k in kernels] if kernels is not None else exported_functions(text)
    key = CacheKey.build(artifact="host-object", stage=text, options=dict(options or {}),
                         target=target.key, versions=None)
    machine = machine_of_triple(target.triple)
    cache = default_cache() if machine is not None else _memory_cache()
    check = _load_check(machine, tuple(symbols)) if machine is not None else None
    fetched = cache.fetch(key, lambda: compile_object(text), {"llvmlite": llvmlite.__version__, "symbols": symbols},
                          check=check, describe=_describe(text, kernels, symbols))
    return fetched.payload, CompileInfo(fetched.source, fetched.seconds)


def compile_cached(text: str, options: dict | None = None,
                   kernels: Sequence[KernelABI] | None = None) -> tuple[JitLibrary, CompileInfo]:
    """The linked library of a host module, its object code from `cached_object`."""
    obj, info = cached_object(text, options, kernels)
    return JitLibrary(obj), info


_DEFINE = re.compile(r'^define\s([^@\n]*)@"?([-\w$.]+)"?\(', re.M)
_MODULE_ID = re.compile(r'^; ModuleID = "([^"\n]*)"', re.M)


def exported_functions(text: str) -> list[str]:
    """The functions an LLVM module's text defines with external linkage (what another module can call)."""
    return [name for linkage, name in _DEFINE.findall(text) if not {"internal", "private"} & set(linkage.split())]


def _describe(text: str, kernels: Sequence[KernelABI] | None, symbols: list[str]) -> str:
    """``object code of softmax (kernel softmax_0)``: the program and its kernels, for warnings."""
    program = _MODULE_ID.search(text)
    names = [k.name for k in kernels] if kernels is not None else symbols
    which = f"kernel{'s' if len(names) != 1 else ''} {', '.join(names)}"
    return f"object code of {program.group(1)} ({which})" if program else f"object code of {which}"


def _load_check(machine: Machine, symbols: tuple[str, ...]) -> Callable[[bytes], str | None]:
    """The compile cache's check of a host object for `machine` defining `symbols` (`runtime.object_check`)."""
    def check(payload: bytes) -> str | None:
        try:
            check_host_object(payload, machine, symbols, in_process)
        except BadObject as bad:
            return str(bad)
        return None

    return check


@functools.cache
def _memory_cache():
    """A memory-only cache for host objects on machines without a load check (never read back from disk)."""
    import logging

    from .cache import CompileCache

    logging.getLogger("redfuser.cache").info("compile cache: no load check for %s host objects; caching them "
                                             "in memory only", host_target().triple)
    return CompileCache(None)


@functools.cache
def _process_library() -> ctypes.CDLL:
    return ctypes.CDLL(None)


def in_process(name: str) -> bool:
    """Whether MCJIT can resolve an undefined symbol `name` from this process (as it does memcpy)."""
    if llvm.address_of_symbol(name):
        return True
    try:
        _process_library()[name]
    except (AttributeError, ValueError, OSError):
        return False
    return True


def _stop_worker() -> None:
    raise SystemExit    # (ends the worker thread that runs it, quietly)


_POOLS: "weakref.WeakSet[GridPool]" = weakref.WeakSet()
"""Every pool made: a child of ``os.fork()`` has only the thread that forked, so each pool there forgets its
workers (`GridPool._after_fork`) and starts them again on its next call. Done in the fork hook, where the
child has one thread: a reset in `GridPool.run` raced between threads making their first calls, and two
sets of workers started (found by a helper)."""


def _pools_after_fork() -> None:
    global _SHARED_POOLS_LOCK
    _SHARED_POOLS_LOCK = threading.Lock()      # (another thread of the parent may have held it)
    for pool in list(_POOLS):
        pool._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_pools_after_fork)


class GridPool:
    """Persistent worker threads that run ``fn(*args, begin, end)`` over slices of ``range(n)``.

    A compiled kernel (a ctypes function) runs on native workers (`runtime.native_pool`: no Python between
    the call and the work, 50-150 us a call less than Python threads); any other callable, and every call where
    native workers cannot be made, runs on Python threads. Each kind is started on its first use, and again in
    a child of ``os.fork()`` (whose workers stayed in the parent)."""

    def __init__(self, threads: int, native: bool = True) -> None:
        self.threads = max(1, threads)
        self._native_wanted = native
        self._after_fork()
        _POOLS.add(self)

    def _after_fork(self) -> None:
        """No workers yet (at creation; in a child of ``os.fork()``, whose workers stayed in the parent)."""
        self._lock = threading.Lock()
        self._native: NativeWorkers | None | bool = None      # None: not yet made; False: cannot be
        self._tasks: queue.SimpleQueue | None = None

    def _native_workers(self) -> NativeWorkers | None:
        """The native workers, started on first use; None where they cannot be made here."""
        if self._native is None:
            with self._lock:
                if self._native is None:
                    functions = pool_functions() if self._native_wanted else None
                    self._native = NativeWorkers(functions, self.threads, STACK_BYTES) if functions else False
        return self._native or None

    def _python_tasks(self) -> queue.SimpleQueue:
        """The Python workers' task queue, the workers started on first use."""
        if self._tasks is None:
            with self._lock:
                if self._tasks is None:
                    self._tasks = self._start_python()
        return self._tasks

    def _start_python(self) -> queue.SimpleQueue:
        """A new task queue and `threads` Python worker threads taking tasks from it."""
        tasks: queue.SimpleQueue = queue.SimpleQueue()
        previous = threading.stack_size()
        threading.stack_size(STACK_BYTES)
        try:
            workers = [threading.Thread(target=self._work, args=(tasks,), name=f"redfuser-cpu-{i}", daemon=True)
                       for i in range(self.threads)]
            for i, w in enumerate(workers):
                try:
                    w.start()
                except RuntimeError as err:     # ("can't start new thread": the process's limit, its memory)
                    from ..ir.errors import BackendError

                    for _ in range(i):          # (the started ones end: a task that raises SystemExit)
                        tasks.put(_stop_worker)
                    raise BackendError(f"cpu: could not start {self.threads} worker threads (num_threads): "
                                       f"{err}; the system allowed {i}") from None
        finally:
            threading.stack_size(previous)
        return tasks

    @staticmethod
    def _work(tasks: queue.SimpleQueue) -> None:
        while True:
            tasks.get()()

    def run(self, fn, args: tuple, n: int, max_parts: int | None = None, caller_helps: bool = False) -> None:
        """Call `fn` on `n` program instances split into contiguous parts, taken in turn by the workers; with
        `caller_helps` the calling thread takes parts too (it starts at once, where a worker first has to wake
        up), and one worker fewer is woken. The caller only ever runs parts of its own call: another call's
        kernel may need a worker's larger stack."""
        if n <= 0:
            return
        parts = min(n, max_parts or self.threads * 4)
        wake = min(parts, self.threads) - (1 if caller_helps else 0)
        native = self._native_workers() if native_kernel(fn) else None
        if native is not None:
            native.run(fn, args, n, parts, wake, caller_helps)
            return
        tasks = self._python_tasks()
        bounds = [n * i // parts for i in range(parts + 1)]
        lock = threading.Lock()
        state = [0, parts]          # the next part to take, the parts not yet finished
        finished = threading.Event()

        def drain() -> None:
            while True:
                with lock:
                    i = state[0]
                    state[0] += 1
                if i >= parts:
                    return
                try:
                    fn(*args, bounds[i], bounds[i + 1])
                finally:
                    with lock:
                        state[1] -= 1
                        if state[1] == 0:
                            finished.set()

        for _ in range(wake):
            tasks.put(drain)
        try:
            if caller_helps:
                drain()
            finished.wait()
        except BaseException:
            # (Ctrl-C in the caller: the workers still write this call's buffers, which the caller frees as
            # the exception unwinds; a helper saw them overwrite a new array. No part is started after this,
            # and the call raises once the started ones are done.)
            with lock:
                untaken = max(parts - state[0], 0)
                state[0] = parts
                state[1] -= untaken
                if state[1] == 0:
                    finished.set()
            while not finished.is_set():
                try:
                    finished.wait()
                except BaseException:  # (a second Ctrl-C: the parts still run)
                    pass
            raise


_SHARED_POOLS: dict[int, GridPool] = {}
_SHARED_POOLS_LOCK = threading.Lock()


def grid_pool(threads: int = 0) -> GridPool:
    """The shared pool with `threads` workers (0: one per core); one per count, also when several threads ask
    at once (a `functools.cache` made two, each with its workers, for first calls on two threads)."""
    n = threads or os.cpu_count() or 1
    pool = _SHARED_POOLS.get(n)
    if pool is None:
        with _SHARED_POOLS_LOCK:
            pool = _SHARED_POOLS.setdefault(n, GridPool(n)) if n not in _SHARED_POOLS else _SHARED_POOLS[n]
    return pool


def kernel_function(library: JitLibrary, symbol: str, num_params: int):
    """The ctypes function for a kernel ``void f(ptr * num_params, ptr sizes, i64 begin, i64 end)``."""
    proto = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * (num_params + 1)), ctypes.c_int64, ctypes.c_int64)
    return proto(library.address(symbol))


_MAIN_THREAD = threading.main_thread().ident

INLINE_STACK_BYTES = 1 << 20
"""A kernel whose tiles take at most this many bytes in all may run on the caller's (main) thread, whose
stack is the process's (8 MiB by default on Linux); workers get `STACK_BYTES`."""


INLINE_WORK_BYTES = 512 << 10
"""A kernel whose buffers take at most this many bytes in all runs on the caller's thread, all its program
instances in turn: waking the pool's workers and waiting for them costs more than such a kernel runs (with
Python workers 50-150 us: MoE routing 256x64 481 -> 104-143 us a call; the native workers, 15-25 us, kept
the bound: docs/cpu-backend.md). A larger one runs on the pool, the caller taking parts too."""


INLINE_STREAM_BYTES = 1 << 20
"""`INLINE_WORK_BYTES` for a kernel with no `dot` (its work a few operations per element it reads or writes).
Measured on the 2-core EPYC here with the native workers (`runtime.native_pool`; medians, same run), the pool
with the caller helping against the caller alone: ``x + 1`` of 0.5, 1, 2 and 4 MiB of buffers 34/20, 43/22,
53/37, 136/209 us; a softmax 66/69, 101/136, 167/266, 302/544; group norm of 1-4 x 64x32x32 (0.5-2 MiB, two
kernels) 115/79, 110/68, 124/122, 132/135. With the Python workers the bound was 4 MiB (their wake-ups cost
50-150 us a kernel). A kernel with a dot does O(n) work per element (attention's keys per query), so it keeps
the smaller bound."""


def small_work(buffers: tuple[tuple[int, tuple], ...], values: dict[str, int] | None,
               limit: int = INLINE_WORK_BYTES) -> bool:
    """Whether buffers of these (itemsize, shape) take at most `limit` bytes (run-time extents from
    `values`)."""
    total = 0
    for itemsize, shape in buffers:
        total += itemsize * math.prod(concrete(shape, values) if values else shape)
    return total <= limit


def streams(kernel) -> bool:
    """Whether a Tile IR kernel has no `dot` (`INLINE_STREAM_BYTES`)."""
    from ..ir.tile import nodes as t

    return not any(isinstance(op, t.Dot) for op in t.walk_ops(kernel.body))


def tile_bytes(kernel) -> int:
    """Bytes of every tile value of a Tile IR kernel together: a bound on the stack arrays its code keeps
    (materialized tiles; the rest live in registers)."""
    from ..ir.tile import nodes as t

    return sum(v.dtype.itemsize * math.prod(v.shape) for op in t.walk_ops(kernel.body) for v in t.results(op))


def _tensor_call(made: tuple, n_out: int, dense: Callable, launch: Callable[..., Any]) -> Callable[..., Any]:
    """`CpuProgram.direct`'s function for torch CPU tensors (see there): their numpy views to `launch`."""
    import torch

    from_numpy, empty, ident = torch.from_numpy, np.empty, threading.get_ident
    if any(np.dtype(dtype).kind == "V" for _, dtype in made[:n_out]):     # bfloat16, float8: torch takes the bits
        from .arrays import as_caller_type

        def from_numpy(r: np.ndarray) -> Any:
            return as_caller_type(r, "torch")

    def call(tensors: Sequence) -> Any:
        if ident() != _MAIN_THREAD:
            results = dense([t.numpy() for t in tensors])
        else:
            results = [empty(shape, dtype) for shape, dtype in made]
            launch(*[t.numpy() for t in tensors], *results)
        return from_numpy(results[0]) if n_out == 1 else tuple(from_numpy(r) for r in results[:n_out])
    return call


def _ctypes_launch(kernels: tuple, result: int) -> Callable[..., Any]:
    """`native_entry.entry_of`'s builtin done in Python where there is none: ``f(*buffers)`` calls each of
    `kernels` (ctypes function, buffer positions, program count) on the buffers' addresses and returns
    ``buffers[result]``."""
    address = data_address

    def launch(*memory: np.ndarray) -> np.ndarray:
        at = [address(m) for m in memory]
        for fn, params, programs in kernels:
            fn(*[at[i] for i in params], None, 0, programs)
        return memory[result]
    return launch


class CpuProgram:
    """A compiled Tile IR program: call it with the input arrays, get the outputs.

    Kernels run in launch order; each one's program instances are split over the
    pool. Outputs and scratch buffers are fresh arrays per call; inputs are read only.
    A shape-polymorphic program's run-time extents are read off its inputs' shapes
    (`redfuser.ir.sizes.bind_buffers`) and each kernel gets the values of its own.
    What a call needs of the program is laid out once, when it is made: the buffers in
    one list (inputs, outputs, scratch), each kernel's parameters as positions in it,
    each input's dtype and each result's shape, so a call only reads its arrays'
    addresses and allocates its results.
    """

    def __init__(self, tile_program, abis, library: JitLibrary, threads: int = 0) -> None:
        self.program = p = tile_program
        self.pool = grid_pool(threads)
        made = p.outputs + p.scratch
        position = {b.name: i for i, b in enumerate(p.inputs + made)}
        self._kernels = [(kernel_function(library, a.symbol, len(a.params)), tuple(position[n] for n in a.params),
                          a.programs, a.sizes) for a in abis]
        buffers = p.inputs + made
        # each kernel's buffers (itemsize, shape): one whose bytes are under `INLINE_WORK_BYTES` runs on the caller
        self._work = [tuple((buffers[i].dtype.itemsize, buffers[i].shape) for i in params)
                      for _, params, _, _ in self._kernels]
        self._symbolic = any(not isinstance(n, int) for b in p.inputs for n in b.shape)
        self._limits = [INLINE_STREAM_BYTES if streams(k) else INLINE_WORK_BYTES for k in p.kernels]
        # decided once where the shapes are static (a call then only reads it), per call where they are not
        self._small = [None if self._symbolic else small_work(w, None, limit)
                       for w, limit in zip(self._work, self._limits)]
        self._inputs = [(b.type, b.type.strides is None, np.dtype(b.dtype.numpy)) for b in p.inputs]
        self._made = [(b.shape, np.dtype(b.dtype.numpy)) for b in made]
        self._library = library  # keeps the code alive as long as the functions
        self._small_stack = all(tile_bytes(k) <= INLINE_STACK_BYTES for k in p.kernels)
        self._n_out = len(p.outputs)
        # every input read in place as given and every length static: `call_dense` may skip `__call__`'s checks
        self._dense = not self._symbolic and all(dense for _, dense, _ in self._inputs) and not any(
            a.sizes for a in abis)

    def call_dense(self, arrays: Sequence, outputs: Sequence | None = None) -> tuple:
        """`__call__` for the call path's commonest case, without its checks: `arrays` are C-contiguous,
        aligned numpy arrays of the inputs' dtypes (what `redfuser.kernel`'s call key has checked), the
        `outputs` given C-contiguous arrays of the results' shapes and dtypes (`redfuser.kernel._plain_outs`),
        and the program's shapes static. Anything else goes to `__call__`."""
        if not self._dense:
            return self(arrays, outputs)
        memory = list(arrays) + (list(outputs) if outputs is not None else [])
        for shape, dtype in self._made[len(memory) - len(arrays):]:
            memory.append(np.empty(shape, dtype))
        self._launch(memory, None)
        first = len(arrays)
        return tuple(memory[first:first + self._n_out])

    def direct(self, tensors: bool = False) -> Callable[..., Any] | None:
        """A function ``(arrays, outputs=None)`` doing what `call_dense` does, returning the call's value (the one
        result, or the tuple of them; `outputs` as given), or None where it does not apply: every kernel runs on
        the caller's thread (`_launch`'s inline case: static programs, one of them or small work, tiles that fit
        the main thread's stack). Everything a call reads is bound when the function is made, so a call
        allocates the results and scratch and runs the kernels: one call of a builtin where the interpreter
        allows it (`runtime.native_entry`: a cached softmax of a [4, 16] array 4.2 -> 2.2 us, from 6.8 through
        `call_dense`), else a ctypes call per kernel on the buffers' addresses. A thread other than the main
        one takes `call_dense` (the inline case is the main thread's). With `tensors` the arrays are contiguous
        torch CPU tensors (read through their numpy views) and the results come back as tensors viewing the
        arrays made for them (no `outputs`)."""
        if not self._dense or not self._small_stack or not all(
                programs == 1 or small for (_, _, programs, _), small in zip(self._kernels, self._small)):
            return None
        made, n_in, n_out = tuple(self._made), len(self.program.inputs), self._n_out
        scratch = made[n_out:]
        kernels = tuple((fn, params, programs) for fn, params, programs, _ in self._kernels)
        empty, ident, dense = np.empty, threading.get_ident, self.call_dense
        # one builtin call where the interpreter allows it (keeping the GIL for small kernels only: under
        # `INLINE_WORK_BYTES`, tens of microseconds), else ctypes
        quick = all(small_work(w, None) for w in self._work)
        launch = entry_of(kernels, n_in, release_gil=not quick) or _ctypes_launch(kernels, n_in)
        if tensors:
            return _tensor_call(made, n_out, dense, launch)

        if len(kernels) == 1 and n_out == 1 and not scratch:       # (a row kernel: softmax)
            ((shape, dtype),) = made

            def one(arrays: Sequence, outputs: Sequence | None = None) -> Any:
                if ident() != _MAIN_THREAD:
                    results = dense(arrays, outputs)
                    return results[0] if outputs is None else outputs
                if outputs is None:
                    return launch(*arrays, empty(shape, dtype))
                launch(*arrays, outputs[0])
                return outputs
            return one

        def call(arrays: Sequence, outputs: Sequence | None = None) -> Any:
            if ident() != _MAIN_THREAD:
                results = dense(arrays, outputs)
            else:
                if outputs is None:
                    memory = (*arrays, *[empty(shape, dtype) for shape, dtype in made])
                else:
                    memory = (*arrays, *outputs, *[empty(shape, dtype) for shape, dtype in scratch])
                launch(*memory)
                results = memory[n_in:n_in + n_out]
            if outputs is not None:
                return outputs
            return results[0] if n_out == 1 else tuple(results)
        return call

    def _launch(self, memory: list, values: dict[str, int] | None) -> None:
        """Run every kernel on the buffers `memory` (inputs, outputs, scratch), a shape-polymorphic one's
        run-time lengths from `values`."""
        address = [data_address(m) for m in memory]
        inline = self._small_stack and threading.get_ident() == _MAIN_THREAD
        for (fn, params, programs, sizes), work, small, limit in zip(self._kernels, self._work, self._small,
                                                                       self._limits):
            size_array = None
            if sizes:
                size_array = np.array([evaluate(n, values) for n in sizes], dtype=np.int64)
                programs = evaluate(programs, values)
            args = tuple(address[i] for i in params) + (data_address(size_array) if size_array is not None else None,)
            if inline and (programs == 1 or (small if small is not None else small_work(work, values, limit))):
                fn(*args, 0, programs)   # handing tiny work to the workers costs more than it runs
            else:
                self.pool.run(fn, args, programs, caller_helps=inline)

    writes_outputs = True
    """`__call__` takes arrays to write the results into (``kernel(..., out=...)``)."""

    def __call__(self, arrays, outputs=None) -> tuple:
        """The outputs for input `arrays`; with `outputs` (numpy arrays of the results' shapes and dtypes,
        checked by the caller) written into those: in place where one is C-contiguous, else copied."""
        values = bind_buffers(self.program.inputs, arrays) \
            if self._symbolic else None
        memory = [a if dense and a.flags.c_contiguous and a.dtype == dtype else memory_of(a, type_, values)
                  for a, (type_, dense, dtype) in zip(arrays, self._inputs)]   # a view is read in place
        n_out = len(self.program.outputs)
        for i, (shape, dtype) in enumerate(self._made):
            target = outputs[i] if outputs is not None and i < n_out else None
            if target is not None and target.flags.c_contiguous and target.dtype == dtype:
                memory.append(target)
            else:
                memory.append(np.empty(concrete(shape, values) if values else shape, dtype=dtype))
        self._launch(memory, values)
        first = len(arrays)
        results = memory[first:first + n_out]
        if outputs is not None:
            for target, result in zip(outputs, results):
                if result is not target:
                    np.copyto(target, result, casting="no")
            return tuple(outputs)
        return tuple(results)
