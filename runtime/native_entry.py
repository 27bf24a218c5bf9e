"""A compiled program's call as a builtin function: the cached call path without ctypes.

A cached ``cpu`` call on tiny arrays spent most of its host time in ctypes: a foreign call through a
``CFUNCTYPE`` converts each argument (0.8 us for softmax's two buffers on the 2-core EPYC of
docs/cpu-backend.md) and the buffers' addresses are read one by one before it (0.25 us each). Here the
call is a CPython builtin instead, of the ``METH_FASTCALL`` kind (``f(self, args, nargs)``), whose code is
one trampoline compiled once per process from the LLVM IR below:

- ``self`` is the *plan*: an int64 numpy array laid out by `plan_of` (the kernels' entry points, each one's
  buffer positions and program count, the result to return, whether to release the GIL);
- ``args`` are the buffers as numpy arrays (inputs, outputs, scratch, in `CpuProgram`'s order); the
  trampoline reads each one's data pointer from the array object (the field `runtime.addresses` found),
  calls each kernel ``f(ptr..., null sizes, 0, programs)`` through a switch over its parameter count, and
  returns the plan's result argument with one more reference (``ob_refcnt`` + 1: a GIL build's
  ``Py_INCREF`` of an array, which is never immortal).

Where a kernel may run long (more than `INLINE_WORK_BYTES` of buffers) the plan says to release the GIL
around the kernels (``PyEval_SaveThread`` / ``PyEval_RestoreThread``, their addresses in the plan), as
ctypes does; tiny kernels keep it (taking and giving it back costs more than they run).

Nothing is assumed about the interpreter: `entry_of` gives None (the caller keeps ctypes) on another Python
than CPython, a free-threaded build, where the data field was not found, for a kernel of more than
`MAX_PARAMS` buffers, or when a first call on a probe array does not leave its reference count as
``Py_INCREF`` would (checked once per process). The arrays a call passes are checked by its caller (the
call key: C-contiguous arrays of the right dtypes and shapes): the trampoline checks nothing.
"""
from __future__ import annotations

import ctypes
import functools
import platform
import sys
import sysconfig
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from . import addresses

MAX_PARAMS = 32
"""The most buffers one kernel of a program may take for the builtin call (the trampoline's switch)."""

_METH_FASTCALL = 0x0080
_HEADER = 5     # n_kernels, release_gil, PyEval_SaveThread, PyEval_RestoreThread, the result's argument


class _MethodDef(ctypes.Structure):
    """CPython's ``PyMethodDef``."""

    _fields_ = [("ml_name", ctypes.c_char_p), ("ml_meth", ctypes.c_void_p), ("ml_flags", ctypes.c_int),
                ("ml_doc", ctypes.c_char_p)]


def trampoline_ir(data_offset: int, max_params: int = MAX_PARAMS) -> str:
    """The LLVM IR of ``redfuser_entry(self, args, nargs)`` (module docstring), the arrays' data pointers at
    byte `data_offset` of their objects."""
    lines = [
        '; ModuleID = "redfuser_entry"',
        "define ptr @redfuser_entry(ptr %self, ptr %args, i64 %nargs) {",
        "entry:",
        f"  %plan.at = getelementptr i8, ptr %self, i64 {data_offset}",
        "  %plan = load ptr, ptr %plan.at",
        "  %n.kernels = load i64, ptr %plan",
        "  %gil.at = getelementptr i64, ptr %plan, i64 1",
        "  %gil = load i64, ptr %gil.at",
        "  %release = icmp ne i64 %gil, 0",
        "  br i1 %release, label %save, label %loop",
        "save:",
        "  %save.at = getelementptr i64, ptr %plan, i64 2",
        "  %save.fn = load ptr, ptr %save.at",
        "  %state.saved = call ptr %save.fn()",
        "  br label %loop",
        "loop:",
        "  %state = phi ptr [null, %entry], [%state.saved, %save], [%state, %next]",
        f"  %pos = phi i64 [{_HEADER}, %entry], [{_HEADER}, %save], [%pos.next, %next]",
        "  %k = phi i64 [0, %entry], [0, %save], [%k.next, %next]",
        "  %more = icmp ult i64 %k, %n.kernels",
        "  br i1 %more, label %kernel, label %done",
        "kernel:",
        "  %fn.at = getelementptr i64, ptr %plan, i64 %pos",
        "  %fn = load ptr, ptr %fn.at",
        "  %programs.at = getelementptr i64, ptr %fn.at, i64 1",
        "  %programs = load i64, ptr %programs.at",
        "  %n.at = getelementptr i64, ptr %fn.at, i64 2",
        "  %n = load i64, ptr %n.at",
        "  %index.at = getelementptr i64, ptr %fn.at, i64 3",
        "  switch i64 %n, label %next [" + " ".join(f"i64 {n}, label %call{n}" for n in range(max_params + 1)) + "]",
    ]
    for n in range(max_params + 1):
        lines.append(f"call{n}:")
        pointers = []
        for i in range(n):
            lines += [f"  %c{n}.i{i}.at = getelementptr i64, ptr %index.at, i64 {i}",
                      f"  %c{n}.i{i} = load i64, ptr %c{n}.i{i}.at",
                      f"  %c{n}.o{i}.at = getelementptr ptr, ptr %args, i64 %c{n}.i{i}",
                      f"  %c{n}.o{i} = load ptr, ptr %c{n}.o{i}.at",
                      f"  %c{n}.d{i}.at = getelementptr i8, ptr %c{n}.o{i}, i64 {data_offset}",
                      f"  %c{n}.d{i} = load ptr, ptr %c{n}.d{i}.at"]
            pointers.append(f"ptr %c{n}.d{i}")
        arguments = ", ".join(pointers + ["ptr null", "i64 0", "i64 %programs"])
        lines += [f"  call void %fn({arguments})", "  br label %next"]
    lines += [
        "next:",
        "  %k.next = add i64 %k, 1",
        "  %skip = add i64 %n, 3",
        "  %pos.next = add i64 %pos, %skip",
        "  br label %loop",
        "done:",
        "  br i1 %release, label %restore, label %return",
        "restore:",
        "  %restore.at = getelementptr i64, ptr %plan, i64 3",
        "  %restore.fn = load ptr, ptr %restore.at",
        "  call void %restore.fn(ptr %state)",
        "  br label %return",
        "return:",
        "  %result.at = getelementptr i64, ptr %plan, i64 4",
        "  %result.index = load i64, ptr %result.at",
        "  %result.slot = getelementptr ptr, ptr %args, i64 %result.index",
        "  %result = load ptr, ptr %result.slot",
        "  %count = load i64, ptr %result",
        "  %count.more = add i64 %count, 1",
        "  store i64 %count.more, ptr %result",
        "  ret ptr %result",
        "}",
    ]
    return "\n".join(lines) + "\n"


def _address(fn: Any) -> int:
    return ctypes.cast(fn, ctypes.c_void_p).value


def plan_of(kernels: Sequence[tuple[Any, Sequence[int], int]], result: int, release_gil: bool) -> np.ndarray:
    """The plan `self` of a builtin call: `kernels` as (ctypes function, buffer positions, program count), run
    in order, then the argument at position `result` returned."""
    api = ctypes.pythonapi
    words = [len(kernels), int(release_gil), _address(api.PyEval_SaveThread), _address(api.PyEval_RestoreThread),
             result]
    for fn, params, programs in kernels:
        words += [_address(fn), programs, len(params), *params]
    return np.array(words, dtype=np.int64)


@functools.cache
def _trampoline() -> int | None:
    """The trampoline's entry point, compiled once per process (through the compile cache), or None where a
    builtin call cannot be made here (module docstring)."""
    offset = addresses._OFFSET
    if platform.python_implementation() != "CPython" or sysconfig.get_config_var("Py_GIL_DISABLED") \
            or offset is None or ctypes.sizeof(ctypes.c_void_p) != 8:
        return None
    from .cpu_jit import compile_cached

    try:
        library, _ = compile_cached(trampoline_ir(offset))
    except Exception as exc:   # (an LLVM without this target's JIT, a broken install: calls keep ctypes)
        import logging

        logging.getLogger("redfuser.runtime").warning("the cached call's builtin could not be made (%s); "
                                                      "calls go through ctypes", exc)
        return None
    _LIBRARIES.append(library)                      # the code lives as long as the process
    address = library.address("redfuser_entry")
    if not _increfs_like_python(address):
        return None
    return address


_LIBRARIES: list = []


@functools.cache
def _method(address: int) -> _MethodDef:
    """The ``PyMethodDef`` of the builtins calling `address`: one for all of them, kept for the process (a
    builtin refers to its definition as long as it lives)."""
    return _MethodDef(b"redfuser_entry", address, _METH_FASTCALL, None)


def _builtin(address: int, plan: np.ndarray) -> Callable[..., Any]:
    """A builtin function calling the code at `address` with `plan` as its ``self``."""
    new = ctypes.pythonapi.PyCFunction_NewEx
    new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.py_object, ctypes.py_object]
    return new(ctypes.addressof(_method(address)), plan, None)


def _increfs_like_python(address: int) -> bool:
    """Whether a call of the trampoline with no kernels returns its argument with one reference added, as
    ``Py_INCREF`` would (the reference count at the object's start: a GIL build of CPython)."""
    probe = np.zeros(3)
    fn = _builtin(address, plan_of([], 0, False))
    before = sys.getrefcount(probe)
    returned = fn(probe)
    held = sys.getrefcount(probe)
    del returned
    return held == before + 1 and sys.getrefcount(probe) == before


def entry_of(kernels: Sequence[tuple[Any, Sequence[int], int]], result: int,
             release_gil: bool) -> Callable[..., Any] | None:
    """A builtin ``f(*buffers)`` running `kernels` (ctypes function, buffer positions, program count) on the
    buffers' data and returning ``buffers[result]``, or None where the call cannot be made so (module
    docstring)."""
    if any(len(params) > MAX_PARAMS for _, params, _ in kernels):
        return None
    address = _trampoline()
    if address is None:
        return None
    return _builtin(address, plan_of(kernels, result, release_gil))
