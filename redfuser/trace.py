"""`trace`: run a kernel body on tracers and return its unfused Loop IR program."""
from __future__ import annotations

import linecache
import os
import sys
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .ir import DType, Program, SourceLoc, UnsupportedError, BufferType
from .source_info import is_internal, user_loc
from .tracer import TraceBuilder, Tracer, tracing

import ml_dtypes

# Frames of these libraries never hold the user's variable names.
_LIBRARY_DIRS = tuple(os.path.join(os.path.dirname(m.__file__), "") for m in (np, ml_dtypes))


@dataclass(frozen=True, slots=True)
class ArraySpec:
    """What a kernel is specialized on for one array argument: its name, dtype and shape."""

    name: str
    type: BufferType

    def __str__(self) -> str:
        return f"{self.name}: {self.type}"


@dataclass(frozen=True, slots=True)
class StaticSpec:
    """A Python scalar argument, baked into the traced program (part of the cache key)."""

    name: str
    value: bool | int | float

    def __str__(self) -> str:
        return f"{self.name} = {self.value!r}"


ArgSpec = ArraySpec | StaticSpec


def _naming_hook(builder: TraceBuilder, body: object = None, returns: list[SourceLoc] | None = None):
    """A profile hook that names buffers after the user's local variables when a user frame returns.

    When the kernel body's own frame (code object `body`) returns, the line of its
    ``return`` goes to `returns`, so an error about the returned value can point at it.
    """

    def hook(frame, event, arg):
        if event == "return":
            file = frame.f_code.co_filename
            if not is_internal(file) and not os.path.abspath(file).startswith(_LIBRARY_DIRS):
                builder.name_user_variables(frame.f_locals)
                if returns is not None and frame.f_code is body:
                    returns.append(SourceLoc(file, frame.f_lineno, linecache.getline(file, frame.f_lineno).rstrip("\n")))

    return hook


def trace(fn: Callable, specs: tuple[ArgSpec, ...]) -> Program:
    """Run `fn` on tracers for `specs`; return the unfused Loop IR of what it computes."""
    builder = TraceBuilder(getattr(fn, "__name__", "kernel"))
    args = [builder.add_input(s.name, s.type.dtype, s.type.shape) if isinstance(s, ArraySpec) else s.value
            for s in specs]
    previous = sys.getprofile()
    returns: list[SourceLoc] = []
    with tracing(builder):
        sys.setprofile(_naming_hook(builder, getattr(fn, "__code__", None), returns))
        try:
            result = fn(*args)
        finally:
            sys.setprofile(previous)
    outputs = list(result) if isinstance(result, tuple | list) else [result]
    for n, out in enumerate(outputs):
        if not isinstance(out, Tracer):
            raise UnsupportedError(
                f"a kernel must return traced arrays (or a tuple of them); output {n} is {type(out).__name__}",
                op="return", loc=returns[-1] if returns else user_loc())
    names = ["out"] if len(outputs) == 1 else [f"out{n}" for n in range(len(outputs))]
    return builder.finish(outputs, names)


def as_ir_dtype(dtype: np.dtype) -> DType | None:
    from .ir.types import from_numpy

    return from_numpy(dtype)
