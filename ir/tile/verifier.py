"""The Tile IR verifier: the invariants every scheduler output and every Tile IR pass keeps.

- SSA: every value is defined once per kernel, before it is used; a loop's
  induction variable, carried arguments and body values are visible only inside it;
- types: elementwise operands share one shape (broadcasting is explicit),
  comparisons give bool, arithmetic is never in f16/bf16/f8 (those are storage
  types: load, store, cast, dot operands), loads and stores use integer offsets
  of the value's shape and bool masks, reductions and dots have consistent shapes;
- loops: inits, carried arguments, yields and results agree one to one in type;
- top-k: f32/f64 candidate values with i32/i64 indices of one shape; the results
  replace dimension `axis` by k >= 1; an `acc` list has exactly the results' types;
- buffers: a kernel touches only its params, which are program inputs, outputs or
  scratch; no kernel stores into an input; every non-empty output is stored.
"""
from __future__ import annotations

from ..errors import VerifyError
from ..excerpt import excerpt_around
from .nodes import (
    Arange,
    Binary,
    Broadcast,
    Cast,
    Constant,
    Extent,
    Dot,
    ExpandDims,
    For,
    Load,
    Op,
    Permute,
    ProgramId,
    Reduce,
    Select,
    Store,
    TileKernel,
    TileProgram,
    TopK,
    Unary,
    Value,
    operands,
    results,
    walk_ops,
)
from .printer import kernel_lines
from ..semantics import UnaryOp
from ..sizes import is_static
from ..types import DType, bool_, int32, int64

def _fail(msg: str, op: Op | None, pass_name: str, kernel: TileKernel | None = None) -> None:
    """Raise `VerifyError`: `msg`, then `kernel`'s printed ops around `op`, marked (none without an op)."""
    context = ""
    if op is not None and kernel is not None:
        context = excerpt_around(op, lambda index: kernel_lines(kernel, index=index))
    raise VerifyError(msg, pass_name=pass_name, context=context)


def _arith(d: DType) -> bool:
    return not d.storage_only


def _check_op(op: Op, kernel: TileKernel, pass_name: str) -> None:
    def need(cond: bool, msg: str) -> None:
        if not cond:
            _fail(msg, op, pass_name, kernel)

    if isinstance(op, ProgramId):
        need(op.out.shape == () and op.out.dtype in (int32, int64), "program_id gives an i32/i64 scalar")
        need(0 <= op.axis < len(kernel.grid), f"program_id axis {op.axis} outside grid {kernel.grid}")
    elif isinstance(op, Arange):
        need(op.out.type.rank == 1 and op.out.dtype.is_int, "arange gives a 1-d integer tile")
    elif isinstance(op, Constant):
        pass
    elif isinstance(op, Extent):
        need(op.out.shape == () and op.out.dtype in (int32, int64), "extent gives an i32/i64 scalar")
    elif isinstance(op, Unary | Binary | Select | Cast):
        ins = operands(op)
        need(all(v.shape == op.out.shape for v in ins), "elementwise operands and result must share one shape")
        if isinstance(op, Binary):
            need(op.a.dtype == op.b.dtype, f"operands of {op.op.value} differ in dtype")
            need(op.out.dtype == (bool_ if op.op.is_comparison else op.a.dtype), f"{op.op.value} gives the wrong dtype")
            need(_arith(op.a.dtype), f"arithmetic in {op.a.dtype}: compute in f32 and cast on store")
        elif isinstance(op, Unary):
            need(op.out.dtype == op.x.dtype, "unary op changes dtype")
            need(_arith(op.x.dtype), f"arithmetic in {op.x.dtype}: compute in f32 and cast on store")
            need(op.op is not UnaryOp.NOT or op.x.dtype == bool_, "not is on bool")
        elif isinstance(op, Select):
            need(op.cond.dtype == bool_, "select condition must be bool")
            need(op.a.dtype == op.b.dtype == op.out.dtype, "select branches and result differ in dtype")
    elif isinstance(op, Broadcast):
        x, out = op.x.shape, op.out.shape
        need(op.x.dtype == op.out.dtype, "broadcast changes dtype")
        need(x == () or (len(x) == len(out) and all(a in (1, b) for a, b in zip(x, out))),
             f"cannot broadcast {op.x.type} to {op.out.type}")
    elif isinstance(op, ExpandDims):
        x = op.x.shape
        need(0 <= op.axis <= len(x) and op.out.shape == x[:op.axis] + (1,) + x[op.axis:] and op.x.dtype == op.out.dtype,
             f"expand_dims axis {op.axis} of {op.x.type} is not {op.out.type}")
    elif isinstance(op, Permute):
        need(sorted(op.perm) == list(range(op.x.type.rank)), f"permute {op.perm} is not a permutation")
        need(op.out.shape == tuple(op.x.shape[p] for p in op.perm) and op.x.dtype == op.out.dtype,
             "permute result has the wrong type")
    elif isinstance(op, Load | Store):
        shape = op.out.shape if isinstance(op, Load) else op.value.shape
        dtype = op.out.dtype if isinstance(op, Load) else op.value.dtype
        need(op.buffer in kernel.params, f"{op.buffer.name} is not a param of kernel {kernel.name}")
        need(op.offsets.dtype in (int32, int64) and op.offsets.shape == shape, "offsets must be i32/i64 of the tile's shape")
        need(op.mask is None or (op.mask.dtype == bool_ and op.mask.shape == shape), "mask must be bool of the tile's shape")
        need(dtype == op.buffer.dtype, f"{op.buffer.name} holds {op.buffer.dtype}, the tile is {dtype}")
    elif isinstance(op, Reduce):
        x = op.x.shape
        need(0 <= op.axis < len(x), f"reduce axis {op.axis} outside {op.x.type}")
        need(op.out.type == op.x.type.with_shape(x[:op.axis] + x[op.axis + 1:]), "reduce result has the wrong type")
        need(_arith(op.x.dtype), f"reduction in {op.x.dtype}: accumulate in f32")
    elif isinstance(op, Dot):
        a, b = op.a.shape, op.b.shape
        need(len(a) == 2 and len(b) == 2 and a[1] == b[0], f"dot of {op.a.type} and {op.b.type}")
        need(op.out.shape == (a[0], b[1]), "dot result has the wrong shape")
        need(op.out.dtype.is_float and _arith(op.out.dtype), "dot accumulates in f32 or f64")
        need(op.a.dtype.is_float and op.b.dtype.is_float, "dot operands are floats")
        need(op.acc is None or op.acc.type == op.out.type, "dot accumulator differs from the result type")
    elif isinstance(op, TopK):
        x = op.x.shape
        need(0 <= op.axis < len(x), f"topk axis {op.axis} outside {op.x.type}")
        need(op.x.dtype.is_float and _arith(op.x.dtype), "topk ranks f32/f64 values (cast others first)")
        need(op.indices.dtype in (int32, int64) and op.indices.shape == x, "topk indices must be i32/i64 of x's shape")
        k = op.out.shape[op.axis] if 0 <= op.axis < len(op.out.shape) else 0
        need(k >= 1 and op.out.type == op.x.type.with_shape(x[:op.axis] + (k,) + x[op.axis + 1:]),
             f"topk result {op.out.type} is not {op.x.type} with axis {op.axis} of length k >= 1")
        need(op.out_indices.type == op.out.type.with_dtype(op.indices.dtype), "topk indices result has the wrong type")
        need((op.acc is None) == (op.acc_indices is None), "topk takes both acc lists or neither")
        need(op.acc is None or (op.acc.type == op.out.type and op.acc_indices.type == op.out_indices.type),
             "topk acc lists differ from the result types")
    elif isinstance(op, For):
        body = op.body
        need(op.step > 0, "loop step must be positive")
        need(body.iv.shape == () and body.iv.dtype in (int32, int64), "induction variable is an i32/i64 scalar")
        need(not isinstance(op.stop, Value) or op.stop.type == body.iv.type,
             f"loop stop {op.stop} is not a {body.iv.type} scalar")
        n = len(op.inits)
        need(len(body.args) == n and len(body.yields) == n and len(op.results) == n,
             "inits, carried args, yields and results differ in number")
        for i, a, y, r in zip(op.inits, body.args, body.yields, op.results):
            need(i.type == a.type == y.type == r.type, f"carried value {a} changes type")
    else:
        _fail(f"unknown Tile IR op {type(op).__name__}", None, pass_name)


def _verify_block(ops: tuple[Op, ...], scope: set[str], defined: set[str], kernel: TileKernel, pass_name: str) -> None:
    for op in ops:
        for v in operands(op):
            if v.name not in scope:
                _fail(f"{v} is used before it is defined (or outside its loop)", op, pass_name, kernel)
        _check_op(op, kernel, pass_name)
        if isinstance(op, For):
            inner = set(scope)
            for v in (op.body.iv,) + op.body.args:
                _define(v, inner, defined, op, pass_name, kernel)
            _verify_block(op.body.ops, inner, defined, kernel, pass_name)
            for y in op.body.yields:
                if y.name not in inner:
                    _fail(f"yield of {y}, which is not defined in the loop", op, pass_name, kernel)
        for r in results(op):
            _define(r, scope, defined, op, pass_name, kernel)


def _define(v: Value, scope: set[str], defined: set[str], op: Op, pass_name: str, kernel: TileKernel) -> None:
    if v.name in defined:
        _fail(f"{v} is defined twice", op, pass_name, kernel)
    defined.add(v.name)
    scope.add(v.name)


def verify_kernel(k: TileKernel, pass_name: str = "") -> TileKernel:
    """Check one kernel's SSA form and op types; return it unchanged or raise `VerifyError`."""
    if any(is_static(g) and g < 0 for g in k.grid):
        _fail(f"kernel {k.name} has a negative grid {k.grid}", None, pass_name)
    _verify_block(k.body, set(), set(), k, pass_name)
    return k


def verify_tile_program(p: TileProgram, pass_name: str = "") -> TileProgram:
    """Check every kernel and the program's buffers; return `p` unchanged or raise `VerifyError`."""
    known = {b.name: b for b in p.inputs + p.outputs + p.scratch}
    if len(known) != len(p.inputs) + len(p.outputs) + len(p.scratch):
        _fail("a buffer is both an input, an output or scratch (names repeat)", None, pass_name)
    stored: set[str] = set()
    for k in p.kernels:
        for b in k.params:
            if known.get(b.name) != b:
                _fail(f"kernel {k.name} param {b.name} is not a buffer of the program", None, pass_name)
        verify_kernel(k, pass_name)
        for b in k.stored():
            if b in p.inputs:
                store = next(op for op in walk_ops(k.body) if isinstance(op, Store) and op.buffer == b)
                _fail(f"kernel {k.name} stores into input {b.name}", store, pass_name, k)
            stored.add(b.name)
    for b in p.outputs:
        if b.name not in stored and b.type.size > 0:
            _fail(f"output {b.name} is never stored", None, pass_name)
    return p
