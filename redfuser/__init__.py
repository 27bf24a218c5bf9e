"""RedFuser: a tile-level compiler for fused cascaded reductions.

Write an unfused computation with the ops below inside ``@redfuser.kernel``;
on plain numpy arrays the same ops are numpy's, so the undecorated body is the
reference the compiled kernel is checked against.
"""
from __future__ import annotations

import math as _math

import ml_dtypes as _ml_dtypes
import numpy as _np

from .ir.errors import (
    ArgumentError,
    BackendError,
    CompileError,
    CudaError,
    DTypeError,
    InternalError,
    RedFuserError,
    ShapeError,
    SimulationError,
    TracerBoolError,
    UnknownNameError,
    UnsupportedError,
    VerifyError,
)
from .arguments import ShapeDtype
from .kernel import Kernel, kernel
from .kernel_options import KernelOptions
from . import ops as _ops
from .ops import (
    abs,
    add,
    all,
    any,
    arange,
    argmax,
    argmin,
    astype,
    ceil,
    clip,
    concatenate,
    cos,
    divide,
    equal,
    erf,
    exp,
    exp2,
    expm1,
    floor,
    floor_divide,
    greater,
    greater_equal,
    isfinite,
    isinf,
    isnan,
    less,
    less_equal,
    log,
    log1p,
    log2,
    logaddexp,
    logical_and,
    logical_not,
    logical_or,
    logical_xor,
    matmul,
    max,
    maximum,
    mean,
    min,
    minimum,
    multiply,
    negative,
    not_equal,
    power,
    prod,
    remainder,
    reshape,
    rint,
    round,
    rsqrt,
    sign,
    sin,
    sqrt,
    stack,
    std,
    subtract,
    sum,
    swapaxes,
    take_along_axis,
    tanh,
    topk,
    transpose,
    trunc,
    var,
    where,
)

__version__ = "0.1.0"

OPS: frozenset[str] = frozenset(_ops.PUBLIC)
"""The op namespace a kernel body uses (each is numpy's on arrays; README.md, "Op subset")."""

# ``torch`` too: ``rf.torch.op(...)`` after only ``import redfuser as rf`` works as the attribute reads.
_SUBPACKAGES = frozenset({"testing", "ir", "codegen", "runtime", "fusion", "schedule", "ops", "torch"})


def __getattr__(name: str):
    """``rf.<name>`` for a name RedFuser does not have: an error saying so (from inside a kernel, at the
    user's line); subpackages (``rf.testing``, ``rf.torch``) are imported on first use."""
    if name in _SUBPACKAGES:
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    if name.startswith("__"):
        raise AttributeError(name)
    from .source_info import user_loc

    raise UnknownNameError(f"redfuser has no {name!r}; its ops: {', '.join(sorted(OPS))} (README.md, 'Op subset')",
                           op=f"rf.{name}", loc=user_loc())

# The dtypes are numpy's and ml_dtypes' own objects, so ``x.astype(rf.bfloat16)``
# means the same inside and outside a kernel.
float32 = _np.float32
float16 = _np.float16
bfloat16 = _ml_dtypes.bfloat16
float8_e4m3fn = _ml_dtypes.float8_e4m3fn
int32 = _np.int32
int64 = _np.int64
bool_ = _np.bool_
inf = _math.inf
