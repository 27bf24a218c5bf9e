"""RedFuser kernels as PyTorch custom operators: ``redfuser.torch.op(kernel, "namespace::name")``.

The op is registered with `torch.library.custom_op`, so PyTorch treats it like one of its own: it runs
inside ``torch.compile(fullgraph=True)`` without a graph break (its fake implementation gives each result's
shape and dtype from tracing the kernel, `Kernel.output_types`, without compiling or running it), inside
``nn.Module``s, and under CUDA graphs on the ``cuda`` backend (a call of device tensors allocates through
torch and never synchronizes). CPU tensors run on the ``cpu`` backend and CUDA tensors on ``cuda``, read and
written in place (zero copy both); the kernel's options apply to both. Symbolic sizes (``torch.compile``'s
dynamic shapes) stay symbolic: the fake implementation traces them at probe lengths and gives them back in
the results' shapes, so one graph serves every length, and the kernel behind it compiles one shape class
for them (docs/shapes.md). ``op.kernels`` maps each device to its kernel (``cache_info()``).

Every parameter of the kernel without a default becomes a ``Tensor`` argument of the op (by position or by
name; one with a default, or bound by a ``functools.partial``, keeps that value); the op returns the kernel's
result, or a tuple of them. There is no backward: calling the op where autograd would need its gradient (an input
that requires grad, grad mode on) raises an `UnsupportedError` saying so.

PyTorch is an optional dependency (``pip install -e '.[torch]'``): without it this module still imports,
and `op` raises a `BackendError` that says what to install.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .ir import BackendError, UnsupportedError
from .ir.errors import ArgumentError
from .kernel import Kernel
from .kernel import kernel as make_kernel
from .arguments import ShapeDtype
from .shapes import PROBES


def _torch():
    try:
        import torch
    except ImportError as exc:
        raise BackendError(f"redfuser.torch needs PyTorch, which is not installed here ({exc}); install it with "
                           "pip install -e '.[torch]'") from None
    return torch


def _numpy_dtype(torch, dtype) -> np.dtype:
    import ml_dtypes

    table = {torch.float32: np.float32, torch.float16: np.float16, torch.bfloat16: ml_dtypes.bfloat16,
             torch.int32: np.int32, torch.int64: np.int64, torch.bool: np.bool_, torch.float64: np.float64,
             getattr(torch, "float8_e4m3fn", None): ml_dtypes.float8_e4m3fn}
    if dtype not in table:
        raise ArgumentError(f"a redfuser op takes tensors of {', '.join(str(d) for d in table if d is not None)}; "
                            f"got {dtype}")
    return np.dtype(table[dtype])


def _torch_dtype(torch, dtype: np.dtype):
    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "int32": torch.int32,
            "int64": torch.int64, "bool": torch.bool, "float64": torch.float64,
            "float8_e4m3fn": getattr(torch, "float8_e4m3fn", None)}[np.dtype(dtype).name]


def op(kernel: Kernel | Callable, name: str) -> Callable[..., Any]:
    """Register `kernel` (an `rf.kernel`, or a function to make one of) as the PyTorch custom op `name`
    (``"namespace::name"``) and return the callable op (see the module docstring)."""
    torch = _torch()
    if not isinstance(kernel, Kernel):
        kernel = make_kernel(kernel)
    namespace, sep, opname = name.partition("::")
    if not sep or not namespace.isidentifier() or not opname.isidentifier():
        raise ArgumentError(f"an op name is 'namespace::name' with two identifiers, got {name!r}", op=kernel.__name__)
    # the tensor arguments: the parameters without a default (a functools.partial's bound ones, and
    # defaulted static values, keep the value the kernel gives them)
    params = [p.name for p in kernel._signature.parameters.values() if p.default is p.empty]
    schema = "(" + ", ".join(f"Tensor {p}" for p in params) + ") -> Tensor[]"
    on = {"cpu": make_kernel(kernel.__wrapped__, backend="cpu", options=kernel.options)}

    def run(*tensors):
        tensors = tuple(t.detach() for t in tensors)     # (called under no_grad, they may still require it)
        device = "cuda" if any(t.is_cuda for t in tensors) else "cpu"
        if device not in on:
            on[device] = make_kernel(kernel.__wrapped__, backend=device, options=kernel.options)
        results = on[device](*tensors)
        results = results if isinstance(results, tuple) else (results,)
        return [r if isinstance(r, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(r)) for r in results]

    custom = torch.library.custom_op(name, run, mutates_args=(), schema=schema)

    @custom.register_fake
    def _(*tensors):
        # A symbolic size (torch.compile's dynamic shapes) is traced at a probe length, and the results'
        # lengths that are probes are that size again: the op's shapes follow its inputs' symbols, so one
        # graph serves every length (and the kernel behind it is shape-polymorphic, docs/shapes.md).
        probes, symbolic = iter(PROBES), {}
        specs = []
        for t in tensors:
            shape = []
            for n in t.shape:
                if isinstance(n, torch.SymInt):
                    key = str(n)
                    if key not in symbolic:
                        symbolic[key] = (next(probes), n)
                    shape.append(symbolic[key][0])
                else:
                    shape.append(int(n))
            specs.append(ShapeDtype(tuple(shape), _numpy_dtype(torch, t.dtype)))
        back = {probe: n for probe, n in symbolic.values()}
        shapes = kernel.output_types(*specs)
        device = tensors[0].device if tensors else "cpu"
        return [torch.empty(tuple(back.get(n, n) for n in s.shape), dtype=_torch_dtype(torch, s.dtype), device=device)
                for s in shapes]

    def no_backward(ctx, *grads):
        raise UnsupportedError(f"the redfuser op {name} has no backward: RedFuser compiles forward kernels only")

    custom.register_autograd(no_backward)

    def call(*tensors, **named):
        if named:       # by name, as the kernel's parameters are named
            unknown = sorted(set(named) - set(params[len(tensors):]))
            if unknown:
                raise ArgumentError(f"the redfuser op {name} takes ({', '.join(params)}); got {', '.join(unknown)} by "
                                    "name, which is not among them or is also given by position", op=opname)
            tensors = tensors + tuple(named[p] for p in params[len(tensors):] if p in named)
        if torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in tensors):
            raise UnsupportedError(f"the redfuser op {name} has no backward, and an input requires grad: call it "
                                   "under torch.no_grad() or on tensors that do not require grad")
        results = custom(*tensors)
        return results[0] if len(results) == 1 else tuple(results)

    call.__name__ = opname
    call.__doc__ = f"The redfuser op {name} ({kernel.__name__}); see redfuser.torch."
    call.op = custom
    call.kernels = on          # device -> the kernel its tensors run on (cache_info: what it compiled)
    return call


__all__ = ["op"]
