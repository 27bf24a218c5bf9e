"""A kernel's call, as the compiler sees it: each argument bound to its parameter and described as a spec.

- `check_signature`: when the kernel is made, the parameters it can take (positional, keyword, with
  defaults; not ``*args``/``**kwargs``, whose count would change the program; not ``stream`` or ``out``,
  the names of the call's own keywords: the ``cuda`` backend's stream, the arrays results go into).
- `bind`: the call's arguments by parameter name, Python's rules and the defaults applied.
- `spec_of`: one argument as an `ArraySpec` (dtype, shape, strides) or a `StaticSpec` (its exact
  value), and the array to run with: the argument itself (a view is read in place), or a copy where
  it cannot be (byte strides that are not whole elements), never one larger than the argument.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .ir import ArgumentError, DTypeError, SourceLoc, UnsupportedError
from .ir import types as T
from .ir.types import BufferType
from .runtime import arrays as arrays_rt
from .source_info import user_loc
from .trace import ArgSpec, ArraySpec, StaticSpec, body_signature, is_dtype_value

@dataclass(frozen=True)
class ShapeDtype:
    """An array argument known only by its shape and dtype (and, optionally, its element strides), for
    compiling without data: ``kernel.lower(rf.ShapeDtype((4096, 4096), rf.float16))``. A kernel cannot run on
    one; it compiles exactly what an array of that layout compiles (dense row-major when `strides` is None)."""

    shape: tuple[int, ...]
    dtype: object
    strides: tuple[int, ...] | None = None

    def buffer_type(self, arg: str, op: str, loc: SourceLoc) -> BufferType:
        dtype = T.from_numpy(self.dtype)
        if dtype is None or dtype == T.float64:
            raise DTypeError(f"argument {arg!r} has dtype {self.dtype!r}, which is not supported; supported: "
                             f"{SUPPORTED_ARRAY_DTYPES}", op=op, loc=loc)
        shape = tuple(int(n) for n in self.shape)
        if self.strides is None or 0 in shape:
            return BufferType(dtype, shape)
        if len(self.strides) != len(shape):
            raise ArgumentError(f"argument {arg!r}: {len(self.strides)} strides for shape {shape}", op=op, loc=loc)
        given = tuple(0 if n == 1 else int(s) for n, s in zip(shape, self.strides))
        dense = tuple(0 if n == 1 else s for n, s in zip(shape, T.row_major_strides(shape)))
        strides = None if given == dense else given
        return BufferType(dtype, shape, strides)


RESERVED = {"stream": "the CUDA stream to run on", "out": "the arrays the results are written into"}
"""Keyword arguments of a kernel call that are not the kernel's: ``stream=`` (the ``cuda`` backend) and
``out=`` (`redfuser.outputs`), with what each means."""

SUPPORTED_ARRAY_DTYPES = ", ".join(d.numpy_name for d in T.ALL_DTYPES if d != T.float64)


def function_loc(fn: Callable) -> SourceLoc:
    """Where `fn` is defined (its ``def`` line), for errors about the function itself."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return SourceLoc("<unknown>", 0)
    import linecache

    return SourceLoc(code.co_filename, code.co_firstlineno,
                     linecache.getline(code.co_filename, code.co_firstlineno).rstrip("\n"))


def check_signature(fn: Callable, name: str) -> inspect.Signature:
    """`fn`'s signature, when a kernel can take it (see the module docstring)."""
    if isinstance(fn, classmethod):
        raise UnsupportedError("@rf.kernel over @classmethod: a classmethod is not callable until Python binds it "
                               "to its class; put @classmethod above @rf.kernel", op=name,
                               loc=function_loc(fn.__func__))
    try:
        signature = body_signature(fn)
    except (TypeError, ValueError) as exc:
        raise ArgumentError(f"cannot read the parameters of {fn!r}: {exc}", op=name, loc=user_loc()) from None
    for p in signature.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise UnsupportedError(f"kernels take named parameters only, not {p}: the number of arguments would "
                                   "change the program", op=name, loc=function_loc(fn))
        if p.name in RESERVED:
            raise ArgumentError(f"a kernel parameter cannot be named {p.name!r}: kernel(..., {p.name}=...) is "
                                f"{RESERVED[p.name]}; rename the parameter", op=name, loc=function_loc(fn))
    return signature


def bind(signature: inspect.Signature, name: str, args: tuple[Any, ...], kwargs: dict[str, Any],
         loc: SourceLoc) -> dict[str, Any]:
    """Every parameter's value for this call, by name (defaults applied); `ArgumentError` as Python would
    raise `TypeError`."""
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as exc:
        names = list(signature.parameters)
        required = [p for p in signature.parameters.values() if p.default is p.empty]
        if not kwargs and not len(required) <= len(args) <= len(names):
            raise ArgumentError(f"takes {len(names)} argument(s) ({', '.join(names)}) but {len(args)} were given",
                                op=name, loc=loc) from None
        raise ArgumentError(f"{exc}; its parameters: ({', '.join(str(p) for p in signature.parameters.values())})",
                            op=name, loc=loc) from None
    bound.apply_defaults()
    return dict(bound.arguments)


def _is_static(value: object) -> bool:
    if value is None or isinstance(value, bool | int | float | str):
        return not isinstance(value, np.ndarray)
    if isinstance(value, np.generic) or is_dtype_value(value):
        return True
    return isinstance(value, tuple) and all(_is_static(v) for v in value)


def _check_numpy_scalar(value: object, arg: str, op: str, loc: SourceLoc) -> None:
    """numpy scalars inside a static value must have a dtype kernels compute in (float64 included: numpy
    scalars are strong types, so ``x * np.float64(2)`` is float64 in the reference too)."""
    if isinstance(value, tuple):
        for v in value:
            _check_numpy_scalar(v, arg, op, loc)
    elif isinstance(value, np.generic) and T.from_numpy(value.dtype) is None:
        raise DTypeError(f"argument {arg!r} is a numpy {value.dtype} scalar, which is not supported; numpy "
                         f"scalars may be {', '.join(d.numpy_name for d in T.ALL_DTYPES)}", op=op, loc=loc)


def spec_of(arg: str, value: Any, op: str, loc: SourceLoc) -> tuple[ArgSpec, Any | None]:
    """(the spec of argument `arg`, the array to run with or None for a static value)."""
    if isinstance(value, ShapeDtype):
        return ArraySpec(arg, value.buffer_type(arg, op, loc)), value
    if _is_static(value):
        _check_numpy_scalar(value, arg, op, loc)
        return StaticSpec(arg, value), None
    refusal = arrays_rt.subclass_refusal(value, f"argument {arg!r}")
    if refusal is not None:
        raise ArgumentError(refusal, op=op, loc=loc)
    if isinstance(value, tuple):      # (a tuple of static values is static: this one holds something else)
        k, item = next((k, v) for k, v in enumerate(value) if not _is_static(v))
        raise ArgumentError(f"argument {arg!r} is a tuple holding a {type(item).__name__} at {arg}[{k}]: a tuple "
                            "argument is a static value (scalars, strings, None), and arrays are passed as arguments "
                            "of their own", op=op, loc=loc)
    if not arrays_rt.is_array(value):
        raise ArgumentError(f"argument {arg!r} must be an array (numpy, DLPack or __cuda_array_interface__), a "
                            f"scalar, a string, a dtype, None or a tuple of those, got {type(value).__name__}",
                            op=op, loc=loc)
    try:
        info = arrays_rt.describe(value, f"argument {arg!r}")
        if info.dtype == T.float64:
            raise DTypeError(f"argument {arg!r} has dtype float64, which is not supported; supported: "
                             f"{SUPPORTED_ARRAY_DTYPES}")
        value, info = arrays_rt.readable_in_place(value, info, f"argument {arg!r}")
    except (ArgumentError, DTypeError) as err:
        raise type(err)(err.message, op=op, loc=loc) from None
    return ArraySpec(arg, BufferType(info.dtype, info.shape, arrays_rt.specialized_strides(info))), value
