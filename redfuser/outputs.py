"""``kernel(*args, out=...)``: results written into arrays the caller allocated.

`out` is one array (a kernel with one result) or a tuple or list of them, one per result, of the
result's exact shape and dtype, writable, no two of its elements in one place (a 0 stride), and sharing no
memory with an argument or another `out`
(the kernel reads its arguments while it writes its results; a result written over an input would
change what the rest of the kernel reads). numpy arrays and torch CPU tensors go with the host backends
(``interpret``, ``cpu``, ``simulate``); on ``cuda`` device tensors (torch, cupy) are written in place, on
the stream the call runs on, with no allocation and no host synchronization (so the call can be
captured in a CUDA graph), and host arrays get the results copied back. Anything else is an
`ArgumentError` that names the result, what it must be and the caller's line; nothing is written then.

A torch ``out`` is written as torch's own in-place ops write: its version counter is bumped after the write
(`mark_written`), so autograd refuses a backward that saved its old values instead of silently using the
new ones; and one torch would not let an in-place op write is refused: an inference tensor outside
``torch.inference_mode()``, and a tensor that requires grad (a leaf, or a view of one, torch refuses while
autograd records; any other, a kernel has no backward for).

Memory is compared by address ranges (lowest to highest byte an array spans, on its device), so two
interleaved views of one buffer count as overlapping: the check errs towards refusing. An out without
elements (of an empty result) spans no memory and has no two elements, whatever its strides (numpy gives
``np.empty((0, 3))`` strides ``(0, 0)``): only its shape, dtype and writability are checked.
"""
from __future__ import annotations

import ctypes
import sys
from collections.abc import Sequence

import numpy as np

from .ir import ArgumentError, Buffer, DTypeError, SourceLoc
from .ir.types import BufferType
from .runtime import arrays as arrays_rt


def as_tuple(out: object, count: int, kernel: str, loc: SourceLoc | None) -> tuple[object, ...]:
    """`out` as one array per result; `ArgumentError` when the count is wrong."""
    outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
    if len(outs) != count:
        what = "one array" if count == 1 else f"a tuple of {count} arrays"
        raise ArgumentError(f"out= must be {what}, one per result of the kernel; got {len(outs)}", op=kernel, loc=loc)
    return outs


def _span(info: arrays_rt.ArrayInfo) -> tuple[int, int]:
    """The bytes ``[lowest, highest)`` an array touches (empty for an array without elements)."""
    if any(n == 0 for n in info.shape):
        return (info.pointer, info.pointer)
    low = high = 0
    for n, s in zip(info.shape, info.byte_strides):
        step = (n - 1) * s
        low, high = (low + step, high) if step < 0 else (low, high + step)
    return (info.pointer + low, info.pointer + high + info.dtype.itemsize)


def _overlap(a: arrays_rt.ArrayInfo, b: arrays_rt.ArrayInfo) -> bool:
    """Whether two arrays share a byte: their spans meet, and (in host memory) an element of each covers it
    (`_elements_meet`: ``y[:, ::2]`` and ``y[:, 1::2]`` interleave without sharing one, and were refused as
    sharing memory; found by a helper). Device memory is judged by the spans alone."""
    if (a.device_type, a.device_id) != (b.device_type, b.device_id):
        return False
    if not _meet(_span(a), _span(b)):
        return False
    return a.on_gpu or b.on_gpu or _elements_meet(a, b)


SHARES_MEMORY_WORK = 1 << 20
"""The most work ``np.shares_memory`` may do telling two interleaved arrays apart (`_elements_meet`); past it
they are taken to share memory (the check errs towards refusing)."""


def _elements_meet(a: arrays_rt.ArrayInfo, b: arrays_rt.ArrayInfo) -> bool:
    """Whether two host arrays whose spans meet share a byte of an element: each read as bytes over the one
    range both span, and numpy's exact ``shares_memory`` asked."""
    (a0, a1), (b0, b1) = _span(a), _span(b)
    low, high = min(a0, b0), max(a1, b1)
    raw = (ctypes.c_char * (high - low)).from_address(low)

    def as_bytes(info: arrays_rt.ArrayInfo) -> np.ndarray:
        return np.ndarray(tuple(info.shape) + (info.dtype.itemsize,), np.uint8, raw, offset=info.pointer - low,
                          strides=tuple(info.byte_strides) + (1,))
    try:
        return bool(np.shares_memory(as_bytes(a), as_bytes(b), max_work=SHARES_MEMORY_WORK))
    except np.exceptions.TooHardError:
        return True


def _meet(a: tuple[int, int], b: tuple[int, int]) -> bool:
    """Whether two byte ranges ``[low, high)`` share a byte (an empty one shares none)."""
    (a0, a1), (b0, b1) = a, b
    return a0 < a1 and b0 < b1 and a0 < b1 and b0 < a1


def _self_overlapping(info: arrays_rt.ArrayInfo) -> bool:
    """Whether two elements of the array may share a byte (a 0 stride, ``torch.expand``, a hand-made
    ``as_strided``, a structured view stepping less than its element): its dims, by growing stride, must each
    step past everything the smaller ones span; a layout that interleaves without overlapping fails this too
    (the check errs towards refusing). An array with no elements has no two (numpy describes
    ``np.empty((0, 3))`` with strides ``(0, 0)``)."""
    if any(n == 0 for n in info.shape):
        return False
    span = info.dtype.itemsize       # (bytes of the elements the smaller dims reach, from one element's start)
    for n, s in sorted(((n, abs(s)) for n, s in zip(info.shape, info.byte_strides) if n > 1), key=lambda d: d[1]):
        if s < span:
            return True
        span += (n - 1) * s
    return False


def _torch_refusal(o: object, name: str) -> str | None:
    """Why torch would refuse an in-place write into the torch tensor `o` (or a kernel cannot record one), or
    None (anything else, numpy arrays too)."""
    torch = sys.modules.get("torch")     # (imported where a tensor was passed)
    if torch is None or not isinstance(o, getattr(torch, "Tensor", ())):
        return None
    if o.is_inference() and not torch.is_inference_mode_enabled():
        return (f"{name} is an inference tensor (made under torch.inference_mode()), which torch does not let an "
                "in-place write change outside inference mode: call the kernel inside torch.inference_mode(), or "
                "pass a normal tensor (o.clone() made outside it)")
    if o.requires_grad:
        if o.is_leaf or (o._base is not None and o._base.is_leaf):
            return (f"{name} is a torch tensor that requires grad, {'a leaf' if o.is_leaf else 'a view of a leaf'}, "
                    "which torch does not let an in-place write change while autograd records it; to change its "
                    "values as an optimizer step does, pass out=o.detach() under torch.no_grad()")
        return (f"{name} is a torch tensor that requires grad: autograd would have to record the write, and a "
                "kernel has no backward; pass a tensor that does not require grad")
    return None


def mark_written(outs: Sequence[object]) -> None:
    """Bump the version counter of each torch tensor among `outs` after a kernel wrote it, as torch's in-place
    ops do: autograd then refuses a backward that saved its old values (it cannot see memory written through
    a pointer). An inference tensor has no counter, and torch leaves it alone."""
    tensor = getattr(sys.modules.get("torch"), "Tensor", None)    # (torch is imported where one was passed)
    if tensor is None:
        return
    tensors = [o for o in outs if isinstance(o, tensor)]
    if tensors:
        sys.modules["torch"].autograd.graph.increment_version(tensors)


def check(outs: Sequence[object], results: Sequence[Buffer], arguments: Sequence[tuple[str, object]], kernel: str,
          loc: SourceLoc | None) -> list[arrays_rt.ArrayInfo]:
    """Each of `outs` described, after checking it against its result (shape, dtype, writable) and against
    the `arguments` (name, array) and the other outs (no shared memory); `ArgumentError` on the first
    violation."""
    infos: list[arrays_rt.ArrayInfo] = []
    described = [(arg_name, arrays_rt.describe(arg, f"argument {arg_name!r}")) for arg_name, arg in arguments]
    for i, (o, b) in enumerate(zip(outs, results)):
        name = f"out[{i}] (result {b.name!r})" if len(results) > 1 else f"out (result {b.name!r})"
        refusal = _torch_refusal(o, name) or arrays_rt.subclass_refusal(
            o, name, "np.asarray(out), a view of its data, whose writes it sees")
        if refusal is not None:     # (before `describe`: its refusal of grad does not say why for an out)
            raise ArgumentError(refusal, op=kernel, loc=loc)
        dtype = getattr(o, "dtype", None)
        if isinstance(dtype, np.dtype) and not dtype.isnative:
            raise DTypeError(f"{name} has dtype {dtype.str}, {dtype.name} in the other byte order; kernels write "
                             f"this machine's: pass an out of dtype {dtype.newbyteorder('=').str}", op=kernel,
                             loc=loc)
        try:
            info = arrays_rt.describe(o, name)
        except (ArgumentError, DTypeError) as err:    # (an unsupported dtype: uint8, complex, byte-swapped)
            raise type(err)(err.message, op=kernel, loc=loc) from None
        if (tuple(info.shape), info.dtype) != (tuple(b.shape), b.dtype):
            raise ArgumentError(f"{name} is {BufferType(info.dtype, tuple(info.shape))}; the kernel's result is "
                                f"{BufferType(b.dtype, tuple(b.shape))}", op=kernel, loc=loc)
        if getattr(getattr(o, "flags", None), "writeable", True) is False:
            raise ArgumentError(f"{name} is a read-only array", op=kernel, loc=loc)
        if _self_overlapping(info):
            raise ArgumentError(f"{name} has elements that share memory (strides {info.strides} for shape "
                                f"{tuple(info.shape)}): every result element needs a place of its own", op=kernel,
                                loc=loc)
        for arg_name, arg_info in described:
            if _overlap(info, arg_info):
                raise ArgumentError(f"{name} shares memory with argument {arg_name!r}: the kernel reads its "
                                    "arguments while it writes its results", op=kernel, loc=loc)
        for j, other in enumerate(infos):
            if _overlap(info, other):
                raise ArgumentError(f"{name} shares memory with out[{j}]", op=kernel, loc=loc)
        infos.append(info)
    return infos
