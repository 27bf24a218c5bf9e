"""`trace`: run a kernel body on tracers and return its unfused Loop IR program."""
from __future__ import annotations

import functools
import linecache
import inspect
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import Callable, Union

import numpy as np

from .ir import DType, Program, SourceLoc, UnsupportedError, BufferType
from .ir.types import scalar_key
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


StaticValue = Union[None, bool, int, float, str, np.generic, type, np.dtype, tuple]
"""What a static (non-array) kernel argument may be: a Python or numpy scalar, a string, None, a dtype (a
numpy scalar type such as ``rf.float16``, or an ``np.dtype``: what ``astype`` takes), or a tuple of these."""


def is_dtype_value(value: object) -> bool:
    """A numpy scalar type (``np.float16``, ``rf.bfloat16``) or an ``np.dtype``: a dtype a body may cast to."""
    return isinstance(value, np.dtype) or (isinstance(value, type) and issubclass(value, np.generic))


def kernel_name(fn: Callable) -> str:
    """A kernel's name: its function's, a functools.partial's function's, or a callable object's class's."""
    target = fn.func if isinstance(fn, functools.partial) else fn
    name = getattr(target, "__name__", None)
    return name if isinstance(name, str) and name else type(target).__name__


def static_key(value: object) -> tuple:
    """What two static values must share to share a compiled kernel: their type and their exact value.

    Python's ``==`` is not enough: ``2``, ``2.0`` and ``True`` are equal but numpy promotes them to
    different dtypes; ``0.0`` and ``-0.0`` are equal but ``1 / x`` differs; NaN is not even equal to
    itself. So floats are keyed by their bits and numpy scalars by their dtype and bytes.
    """
    if value is None:
        return ("none",)
    if isinstance(value, np.generic | bool | int | float):
        return scalar_key(value)
    if isinstance(value, str):
        return ("str", value)
    if is_dtype_value(value):     # (the class and the np.dtype apart: a body may test ``dt is np.float16``)
        return ("dtype" if isinstance(value, np.dtype) else "scalar type", np.dtype(value).name)
    if isinstance(value, tuple):
        return ("tuple",) + tuple(static_key(v) for v in value)
    raise TypeError(f"not a static value: {type(value).__name__}")


@dataclass(frozen=True, slots=True)
class StaticSpec:
    """A static argument (see `StaticValue`), baked into the traced program; two specs are equal when
    their names and `static_key`s are (the cache key of compiled kernels)."""

    name: str
    value: StaticValue = field(compare=False)
    key: tuple = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", static_key(self.value))

    def __str__(self) -> str:
        return f"{self.name} = {self.value!r}"


ArgSpec = ArraySpec | StaticSpec


@functools.lru_cache(maxsize=4096)
def _user_file(file: str) -> bool:
    """Whether frames of `file` may hold the user's variable names (not RedFuser's, numpy's, ml_dtypes')."""
    return not is_internal(file) and not os.path.abspath(file).startswith(_LIBRARY_DIRS)


def _on_return(builder: TraceBuilder, body: object, returns: list[SourceLoc]) -> Callable[[FrameType], None]:
    """What happens when a user frame returns: its local variables name the buffers they hold; when it is
    the kernel body's own frame (code object `body`), the line of its ``return`` goes to `returns`, so
    an error about the returned value can point at it."""

    def returned(frame: FrameType) -> None:
        builder.name_user_variables(frame)
        if frame.f_code is body:
            file = frame.f_code.co_filename
            returns.append(SourceLoc(file, frame.f_lineno, linecache.getline(file, frame.f_lineno).rstrip("\n")))

    return returned


@contextmanager
def _watching_returns(returned: Callable[[FrameType], None]):
    """Call `returned(frame)` as each user frame returns, for the ``with`` body.

    A trace function sees only Python calls, and here only user frames get a local one (no line events),
    so the body runs at nearly full speed; a profile hook would also be called around every C call
    (isinstance, len, ...) in every frame -- 85% of a trace's time. Where a tracer is already installed
    (a debugger, coverage), it is left alone and the profile hook used instead, as before.
    """
    def local(frame: FrameType, event: str, arg: object):
        if event == "return":
            returned(frame)
        return local

    def on_call(frame: FrameType, event: str, arg: object):
        if not _user_file(frame.f_code.co_filename):
            return None
        frame.f_trace_lines = False
        return local

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event == "return" and _user_file(frame.f_code.co_filename):
            returned(frame)

    if sys.gettrace() is None:
        sys.settrace(on_call)
        try:
            yield
        finally:
            sys.settrace(None)
    else:
        previous = sys.getprofile()
        sys.setprofile(profile)
        try:
            yield
        finally:
            sys.setprofile(previous)


@dataclass(frozen=True, slots=True)
class Traced:
    """What one trace of a kernel body found: its unfused Loop IR and what the program cannot say."""

    program: Program
    length_needs: tuple[tuple[int, int], ...]
    """the body's length checks, ``(length, least)`` each (`TraceBuilder.need_length`), dead code's included"""
    updated_inputs: dict[str, SourceLoc]
    """the arguments the body updates in place, with where (`TraceBuilder.updated_inputs`)"""
    returns_sequence: bool | type
    """whether the body returned a tuple or a list: a body returning ``(y,)`` gives a 1-tuple, as numpy's does,
    not ``y`` (the program's outputs cannot say). False for one value, True for a tuple, else the sequence's
    type, which a call's value is made of too: a list, or a named tuple's class (``r.mean`` works as in
    numpy's body)"""


def trace(fn: Callable, specs: tuple[ArgSpec, ...]) -> Traced:
    """Run `fn` on tracers for `specs`; return the unfused Loop IR of what it computes, with what the trace
    found beside it (`Traced`)."""
    builder = TraceBuilder(kernel_name(fn))
    values = {s.name: builder.add_input(s.name, s.type) if isinstance(s, ArraySpec) else s.value for s in specs}
    args, kwargs = _call_arguments(fn, values)
    returns: list[SourceLoc] = []
    with tracing(builder), _watching_returns(_on_return(builder, getattr(fn, "__code__", None), returns)):
        try:
            result = fn(*args, **kwargs)
        except Exception as exc:
            _raise_python_value_error(builder, exc)
            raise
    _raise_python_value_error(builder)
    outputs = list(result) if isinstance(result, tuple | list) else [result]
    for n, out in enumerate(outputs):
        if not isinstance(out, Tracer):
            raise UnsupportedError(
                f"a kernel must return traced arrays (or a tuple of them); output {n} is {type(out).__name__}",
                op="return", loc=returns[-1] if returns else user_loc())
    for out in outputs:
        builder.check_current(out, loc=returns[-1] if returns else None)
    names = ["out"] if len(outputs) == 1 else [f"out{n}" for n in range(len(outputs))]
    return Traced(builder.finish(outputs, names), tuple(builder.length_needs), dict(builder.updated_inputs),
                  _sequence_type(result))


def _sequence_type(result: object) -> bool | type:
    """`Traced.returns_sequence` of a body's value."""
    if type(result) is tuple:
        return True
    return type(result) if isinstance(result, tuple | list) else False


def _raise_python_value_error(builder: TraceBuilder, raised: BaseException | None = None) -> None:
    """Raise the first conversion of a traced value to a Python value the body met (`TraceBuilder.
    python_value_error`), where the body swallowed it (``except Exception: pass``, ``contextlib.suppress``) or
    raised something else from its handler: the trace went down a path numpy's body would not take, and the
    conversion is where it went wrong."""
    error = builder.python_value_error
    if error is None or error is raised:
        return
    raise error.with_traceback(None) from None


def body_signature(fn: Callable) -> inspect.Signature:
    """The parameters `fn` is called with, as Python calls it: its own, where a ``functools.wraps`` decorator's
    wrapper names its parameters (its defaults are the ones that apply, and a parameter it binds itself is not
    the caller's); the wrapped function's (``__wrapped__``) where the wrapper takes ``*args`` or ``**kwargs``
    and so says nothing of them. A ``staticmethod`` calls its function. `TypeError` or `ValueError` where Python
    cannot tell (a builtin)."""
    own = inspect.signature(fn.__func__ if isinstance(fn, staticmethod) else fn, follow_wrapped=False)
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in own.parameters.values()):
        return inspect.signature(fn)
    return own


def _call_arguments(fn: Callable, values: dict[str, object]) -> tuple[list[object], dict[str, object]]:
    """`values` (by parameter name, every parameter's) as the positional and keyword arguments of `fn`:
    keyword-only parameters by name, the others by position."""
    try:
        params = body_signature(fn).parameters.values()
    except (TypeError, ValueError):   # a callable without a signature: everything by position
        return list(values.values()), {}
    args = [values[p.name] for p in params if p.kind is not p.KEYWORD_ONLY and p.name in values]
    kwargs = {p.name: values[p.name] for p in params if p.kind is p.KEYWORD_ONLY and p.name in values}
    return args, kwargs


def as_ir_dtype(dtype: np.dtype) -> DType | None:
    from .ir.types import from_numpy

    return from_numpy(dtype)
