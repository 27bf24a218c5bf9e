"""RedFuser kernels as PyTorch custom operators: ``redfuser.torch.op(kernel, "namespace::name")``.

The op is registered with `torch.library.custom_op`, so PyTorch treats it like one of its own: it runs
inside ``torch.compile(fullgraph=True)`` without a graph break (its fake implementation gives each result's
shape and dtype from tracing the kernel, `Kernel.output_types`, without compiling or running it), inside
``nn.Module``s, and under CUDA graphs on the ``cuda`` backend (a call of device tensors allocates through
torch and never synchronizes). CPU tensors run on the ``cpu`` backend and CUDA tensors on ``cuda``, read and
written in place (zero copy both); the kernel's options apply to both. Symbolic sizes (``torch.compile``'s
dynamic shapes) stay symbolic where a result's length is an input's symbol for every length, so one graph
serves every length and the kernel behind it compiles one shape class for them (docs/shapes.md); a size
the body decides on or compiles in (a branch on it, a slice, a concatenation or reshape of it), or whose
result length is another function of the sizes, is guarded to its value, and equal sizes torch gave separate
symbols are asserted equal where the body needs them so (`redfuser.symbolic_results`). A data-dependent size
(``x[x > 0]`` with ``torch._dynamo.config.capture_dynamic_output_shape_ops``, torch's unbacked ``u0``) has no
value while the graph is traced: a result length that is that symbol stays it, and where the body would
need its value (it would be guarded) the fake implementation raises a `DataDependentLength` error naming the
op and the argument (torch.compile reports it inside its own error).
``op.kernels`` maps each device to its kernel (``cache_info()``), made with the kernel's options and
``dynamic=`` choice.

Every parameter of the kernel without a default becomes a ``Tensor`` argument of the op (by position or by
name, a keyword-only one too; one with a default, or bound by a ``functools.partial``, keeps that value); the
op returns the kernel's result, or a tuple of them. There is no backward: calling the op where autograd would need its gradient (an input
that requires grad, grad mode on) raises an `UnsupportedError` saying so.

PyTorch is an optional dependency (``pip install -e '.[torch]'``): without it this module still imports,
and `op` raises a `BackendError` that says what to install.
"""
from __future__ import annotations

import keyword
import types
from typing import Any, Callable

import numpy as np

from .ir import BackendError, UnsupportedError
from .ir.errors import ArgumentError
from .source_info import user_loc
from .kernel import Kernel
from .kernel import kernel as make_kernel
from .runtime.arrays import as_caller_type, c_contiguous
from .symbolic_results import DataDependentLength, symbolic_output_types


def _torch():
    try:
        import torch
    except ImportError as exc:
        raise BackendError(f"redfuser.torch needs PyTorch, which is not installed here ({exc}); install it with "
                           "pip install -e '.[torch]'") from None
    return torch


def _numpy_dtype(torch, dtype, name: str = "", arg: str = "", loc=None) -> np.dtype:
    """The numpy dtype of a tensor argument (`name`: the op, `arg`: its parameter, for the refusal)."""
    import ml_dtypes

    table = {torch.float32: np.float32, torch.float16: np.float16, torch.bfloat16: ml_dtypes.bfloat16,
             torch.int32: np.int32, torch.int64: np.int64, torch.bool: np.bool_,
             getattr(torch, "float8_e4m3fn", None): ml_dtypes.float8_e4m3fn}
    if dtype not in table:
        where = f"the redfuser op {name}'s argument {arg!r}" if name else "a redfuser op"
        raise ArgumentError(f"{where} is a tensor of {dtype}; it takes "
                            f"{', '.join(str(d) for d in table if d is not None)}", op=name or None, loc=loc)
    return np.dtype(table[dtype])


_REGISTERED: dict[str, object] = {}
"""The ops `op` registered in this process, by name: torch would let a second registration of a name
silently replace the first op's kernel (a name defined otherwise is found in torch's registry,
`_defined_in_torch`; this one says which kernel holds it)."""


def _torch_dtype(torch, dtype: np.dtype):
    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "int32": torch.int32,
            "int64": torch.int64, "bool": torch.bool, "float64": torch.float64,
            "float8_e4m3fn": getattr(torch, "float8_e4m3fn", None)}[np.dtype(dtype).name]


def _hint(n) -> int | None:
    """A symbolic size's present value (its hint), or None for a data-dependent size (an unbacked ``u0``),
    which has none while the graph is traced (`redfuser.symbolic_results` probes it without one)."""
    hint = n.node.hint
    return int(hint) if hint is not None else None


def _defined_in_torch(torch: Any, namespace: str, opname: str) -> bool:
    """Whether ``namespace::opname`` (its default overload, the one `op` registers) is an operator torch
    already has: torch's custom_op would silently take the name over from whoever defined it."""
    packet = getattr(getattr(torch.ops, namespace), opname, None)    # (torch.ops raises AttributeError if not)
    return isinstance(packet, torch._ops.OpOverloadPacket) and "default" in packet.overloads()


def _torch_identifier(part: str) -> bool:
    """Whether `part` is a name torch's schema parser takes for a namespace or an op: an ASCII identifier,
    not a Python keyword (``class``, ``None``) and not a ``__dunder__`` (torch's registry's own attributes)."""
    return (part.isascii() and part.isidentifier() and not keyword.iskeyword(part)
            and not (part.startswith("__") and part.endswith("__")))


def op(kernel: Kernel | Callable, name: str) -> Callable[..., Any]:
    """Register `kernel` (an `rf.kernel`, or a function to make one of) as the PyTorch custom op `name`
    (``"namespace::name"``) and return the callable op (see the module docstring)."""
    torch = _torch()
    if not isinstance(kernel, Kernel):
        kernel = make_kernel(kernel)
    namespace, sep, opname = name.partition("::")
    if not sep or not all(_torch_identifier(part) for part in (namespace, opname)):
        raise ArgumentError(f"an op name is 'namespace::name' with two identifiers torch's schemas take (ASCII "
                            f"letters, digits and _, not a Python keyword, not __dunder__), got {name!r}",
                            op=kernel.__name__, loc=user_loc())
    if name in _REGISTERED:
        raise ArgumentError(f"the op {name} is already registered in this process (by redfuser.torch.op, for "
                            f"{_REGISTERED[name]}); torch would run the new kernel for both: choose another name",
                            op=kernel.__name__, loc=user_loc())
    if _defined_in_torch(torch, namespace, opname):
        raise ArgumentError(f"the op {name} is already defined in torch's operator registry (by "
                            "torch.library.custom_op, torch.library.define or a C++ extension); registering it "
                            "again would make its callers run this kernel instead: choose another name",
                            op=kernel.__name__, loc=user_loc())
    # the tensor arguments: the parameters without a default (a functools.partial's bound ones, and
    # defaulted static values, keep the value the kernel gives them)
    signature = kernel._signature.parameters.values()     # (named ones only: a kernel refuses *args)
    params = [p.name for p in signature if p.default is p.empty]
    # keyword-only ones (after a `*`, or left by a functools.partial that bound an earlier one by name) are
    # passed to the kernel by name; they follow every positional one, in the schema as in the signature
    positional = sum(1 for p in signature if p.default is p.empty and p.kind != p.KEYWORD_ONLY)
    schema = "(" + ", ".join(f"Tensor {p}" for p in params) + ") -> Tensor[]"

    def in_schema_order(fn: Callable[..., Any]) -> Callable[..., Any]:
        """`fn` (the kernel, or its `output_types`) called with the op's arguments in schema order."""
        def call(*values: Any) -> Any:
            return fn(*values[:positional], **dict(zip(params[positional:], values[positional:])))
        return call

    def on_device(device: str) -> Kernel:
        """The kernel on `device`'s backend, with `kernel`'s options and ``dynamic=`` choice (without it, a
        ``dynamic=True`` kernel compiled its first length exactly, ``False`` made classes)."""
        return make_kernel(kernel.__wrapped__, backend=device, options=kernel.options, dynamic=kernel.dynamic)

    on = {"cpu": on_device("cpu")}
    # whether the body returns a tuple or a list, so that `call` gives a 1-tuple for one result as the kernel
    # and numpy's body do (the op's schema returns a list either way): noted by the first run or fake run
    # (a bare tensor made ``op(x)[0]`` the first row of the result)
    returned = {"sequence": False}

    def run(*tensors):
        tensors = tuple(t.detach() for t in tensors)     # (called under no_grad, they may still require it)
        device = "cuda" if any(t.is_cuda for t in tensors) else "cpu"
        if device not in on:
            on[device] = on_device(device)
        results = in_schema_order(on[device])(*tensors)
        returned["sequence"] = isinstance(results, tuple | list)
        results = tuple(results) if isinstance(results, tuple | list) else (results,)
        # (numpy results of a kernel without tensor arguments: bfloat16 and float8 ones by their bits)
        return [r if isinstance(r, torch.Tensor) else as_caller_type(c_contiguous(r), "torch") for r in results]

    custom = torch.library.custom_op(name, run, mutates_args=(), schema=schema)
    _REGISTERED[name] = kernel.__name__

    @custom.register_fake
    def _(*tensors):
        # torch.compile's symbolic sizes stay symbols in the results' shapes where that holds for every
        # length (one graph serves them all, and the kernel behind it is shape-polymorphic); lengths the
        # body reads or compiles in are guarded to their present values (redfuser.symbolic_results)
        symbols = {}
        inputs = []
        for t in tensors:
            shape = []
            for n in t.shape:
                if isinstance(n, torch.SymInt):
                    symbols.setdefault(str(n), n)
                    shape.append(str(n))     # a symbol, by its expression
                else:
                    shape.append(int(n))
            inputs.append((tuple(shape), _numpy_dtype(torch, t.dtype, name, params[len(inputs)])))
        def output_types(*values: Any) -> tuple:
            types, returned["sequence"] = in_schema_order(kernel.output_structure)(*values)
            return types

        try:
            found = symbolic_output_types(output_types, inputs, lambda s: _hint(symbols[s]))
        except DataDependentLength as err:
            # (each symbol named by the first argument it is a length of: later ones are written over)
            owners = {s: params[i] for i, (shape, _) in reversed(list(enumerate(inputs))) for s in shape}
            where = ", ".join(f"{s} (a length of argument {owners[s]!r})" for s in err.symbols)
            raise DataDependentLength(err.symbols, f"the redfuser op {name}'s results need the value of the "
                                      f"data-dependent length {where}, which torch.compile does not know while it "
                                      "traces: the kernel reads it as a number or compiles it in (a branch on it, "
                                      "a slice, a reshape), or a result's length is another function of it; call "
                                      "the op outside the compiled region, or on a tensor of a known length"
                                      ) from None
        for group in found.merged:
            for other in group[1:]:
                torch._check(symbols[group[0]] == symbols[other])
        for s in found.specialized:
            int(symbols[s])            # a guard: the graph holds for this length only
        device = tensors[0].device if tensors else "cpu"
        return [torch.empty(tuple(d if isinstance(d, int) else symbols[d] for d in shape),
                            dtype=_torch_dtype(torch, dtype), device=device) for shape, dtype in found.results]

    refusal = (f"the redfuser op {name} has no backward (RedFuser compiles forward kernels only), and an input "
               "requires grad: call it under torch.no_grad() or on tensors that do not require grad")

    def no_backward(ctx, *grads):      # (never reached: the setup below refuses first)
        raise UnsupportedError(refusal)

    def refuse_autograd(ctx, inputs, output):
        # called as the op runs wherever autograd would record it: eagerly, and while torch.compile traces
        # it (the error reaches the user through dynamo's; a check in `call` would be traced by dynamo,
        # which cannot construct the error there)
        raise UnsupportedError(refusal)

    custom.register_autograd(no_backward, setup_context=refuse_autograd)

    def call(*tensors, **named):
        if named:       # by name, as the kernel's parameters are named
            unknown = sorted(set(named) - set(params[len(tensors):]))
            if unknown:
                raise ArgumentError(f"the redfuser op {name} takes ({', '.join(params)}); got {', '.join(unknown)} by "
                                    "name, which is not among them or is also given by position", op=opname)
            missing = [p for p in params[len(tensors):] if p not in named]
            if missing:     # (appended in order, a later keyword took the place of the missing one)
                raise ArgumentError(f"the redfuser op {name} takes ({', '.join(params)}); "
                                    f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not given",
                                    op=opname, loc=user_loc())
            tensors = tensors + tuple(named[p] for p in params[len(tensors):])
        if not torch.compiler.is_compiling():       # (eagerly; dynamo cannot construct the errors)
            if torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in tensors):
                raise UnsupportedError(refusal, loc=user_loc())    # before compiling or running anything
            for p, t in zip(params, tensors):
                if isinstance(t, torch.Tensor):
                    if t.layout != torch.strided:
                        raise ArgumentError(f"the redfuser op {name}'s argument {p!r} is a {t.layout} tensor; it "
                                            "takes dense (strided) tensors: call .to_dense()", op=name, loc=user_loc())
                    _numpy_dtype(torch, t.dtype, name, p, user_loc())
        results = custom(*tensors)
        return results[0] if len(results) == 1 and not returned["sequence"] else tuple(results)

    # a code object of its own: torch.compile's per-code-object recompile limit (8) counted every op's
    # compile as a recompile of one shared `call`, and the ninth op compiled alone failed (found by a helper)
    code = call.__code__.replace(co_name=opname)
    if hasattr(code, "co_qualname"):     # (Python 3.11+)
        code = code.replace(co_qualname=f"redfuser_op.{namespace}.{opname}")
    call = types.FunctionType(code, call.__globals__, opname, call.__defaults__, call.__closure__)
    call.__doc__ = f"The redfuser op {name} ({kernel.__name__}); see redfuser.torch."
    call.op = custom
    call.kernels = on          # device -> the kernel its tensors run on (cache_info: what it compiled)
    return call


__all__ = ["op"]
