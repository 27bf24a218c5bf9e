"""The SIMT IR verifier: the invariants every Tile -> SIMT lowering output keeps.

- SSA: every register is defined once per kernel, before use; a loop's induction
  variable and carried args, and the registers defined in a region, are visible
  only inside it; scalar params are defined for the whole body;
- types: register vectors have 1, 2, 4, 8 or 16 elements; elementwise operands
  agree; arithmetic is never in f16/bf16/f8 (storage types); transcendental ops
  are f32 only; indices are i32/i64 scalars (i64 into a buffer of more than 2**31
  elements); masks are bool scalars; memory vectors are at most 16 bytes;
- warp ops: shuffles move f32/i32 scalars over a power-of-two width; every `Mma`
  fragment has the shape and dtype its instruction wants;
- memory: globals are params, shared arrays are declared, static shared memory
  fits 48 KiB, and an unconditional access whose index range is known exactly
  (see `ranges`) stays inside its array;
- launch: 1 to 32 warps, 1 to 3 grid dimensions of at least one block, within CUDA's limits.
"""
from __future__ import annotations

from typing import Callable, Union

from ..errors import VerifyError
from ..excerpt import excerpt_around
from ..semantics import TRANSCENDENTAL, BinaryOp, UnaryOp
from ..buffer import Buffer
from .nodes import (
    MAX_DYNAMIC_SHARED_BYTES,
    MAX_STATIC_SHARED_BYTES,
    MAX_VECTOR,
    Barrier,
    Binary,
    Bitcast,
    BlockIdx,
    Cast,
    Const,
    Extract,
    For,
    If,
    IntBinary,
    LaneId,
    LdMatrix,
    LoadGlobal,
    LoadShared,
    Mma,
    Pack,
    Reg,
    RegType,
    Select,
    Shuffle,
    SimtKernel,
    Stmt,
    StoreGlobal,
    StoreShared,
    ThreadIdx,
    Unary,
    WarpId,
    FenceProxyAsync,
    MbarrierArrive,
    MbarrierInit,
    MbarrierWait,
    TmaLoad,
    SetMaxNReg,
    SharedAddress,
    Wgmma,
    WgmmaCommit,
    WgmmaDescriptor,
    WgmmaFence,
    WgmmaWait,
    defs,
    uses,
)
from .printer import simt_kernel_lines
from .ranges import Ranges, transfer, trip_range
from ..sizes import is_static
from ..types import DType, bfloat16, bool_, float8_e4m3fn, float16, float32, int32, int64

# A check's message: text, or a function making it -- most messages show values, and formatting them
# for every statement that passes was a third of the verifier's time.
Message = Union[str, Callable[[], str]]
Need = Callable[[bool, Message], None]
_I64_ABOVE = 2**31


class _Ctx:
    """What the checks of one kernel share: the kernel, known ranges, and whether the code is conditional."""

    def __init__(self, kernel: SimtKernel, pass_name: str) -> None:
        self.kernel, self.pass_name = kernel, pass_name
        self.ranges: Ranges = {}
        self.conditional = False


def _fail(msg: str, s: Stmt | None, ctx: _Ctx) -> None:
    """Raise `VerifyError`: `msg`, then the kernel's printed statements around `s`, marked (none without `s`)."""
    context = excerpt_around(s, lambda index: simt_kernel_lines(ctx.kernel, index)) if s is not None else ""
    raise VerifyError(f"kernel {ctx.kernel.name}: {msg}", pass_name=ctx.pass_name, context=context)


def _arith(d: DType) -> bool:
    return not d.storage_only


def _index(r: Reg) -> bool:
    return r.dtype in (int32, int64) and not r.type.is_vector


def _is_bool_scalar(r: Reg | None) -> bool:
    return r is None or (r.dtype == bool_ and not r.type.is_vector)


def _fits(value: object, dtype: DType) -> bool:
    if dtype.is_bool:
        return isinstance(value, bool)
    if dtype.is_int:
        bits = 8 * dtype.itemsize - 1
        return isinstance(value, int) and not isinstance(value, bool) and -(1 << bits) <= value < (1 << bits)
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_unary(s: Unary, need: Need) -> None:
    need(s.out.type == s.x.type, "unary op changes type")
    need(_arith(s.x.dtype), lambda: f"arithmetic in {s.x.dtype}: compute in f32 and cast")
    if s.op is UnaryOp.NOT:
        need(s.x.dtype == bool_, "not is on bool")
    elif s.op in (UnaryOp.NEG, UnaryOp.ABS):
        need(not s.x.dtype.is_bool, lambda: f"{s.op.value} of bool")
    else:
        need(s.x.dtype == float32 or (s.x.dtype.is_float and s.op not in TRANSCENDENTAL),
             lambda: f"{s.op.value} of {s.x.dtype}: the GPU computes it in f32 only")


def _check_binary(s: Binary, need: Need) -> None:
    a = s.a.dtype
    need(s.a.type == s.b.type, lambda: f"operands of {s.op.value} differ: {s.a.type} and {s.b.type}")
    need(s.out.type == (s.a.type.with_dtype(bool_) if s.op.is_comparison else s.a.type),
         lambda: f"{s.op.value} gives the wrong type")
    need(_arith(a), lambda: f"arithmetic in {a}: compute in f32 and cast")
    if a.is_bool:
        need(s.op in (BinaryOp.AND, BinaryOp.OR, BinaryOp.EQ, BinaryOp.NE), lambda: f"{s.op.value} of bool")
    else:
        need(s.op not in (BinaryOp.AND, BinaryOp.OR), lambda: f"{s.op.value} is on bool; use int ops for bits")
    if s.op is BinaryOp.DIV:
        need(a.is_float, "integer division is IntBinary div (truncating)")
    if s.op in (BinaryOp.FLOORDIV, BinaryOp.MOD):
        need(a.is_int, lambda: f"{s.op.value} is numpy's floored integer op: integers only")
    if s.op is BinaryOp.POW:
        need(a == float32, lambda: f"** of {a}: the GPU computes it in f32 only")


def _check_memory(s: Stmt, ctx: _Ctx, need: Need) -> None:
    load = isinstance(s, LoadGlobal | LoadShared)
    reg = s.out if load else s.value
    target = s.buffer if isinstance(s, LoadGlobal | StoreGlobal) else s.alloc
    if isinstance(target, Buffer):
        need(target in ctx.kernel.buffers, lambda: f"{target.name} is not a buffer param of the kernel")
        need(s.index.dtype == int64 or target.type.span <= _I64_ABOVE,
             lambda: f"{target.name} has {target.type.span} elements: index it with i64")
    else:
        need(target in ctx.kernel.shared, lambda: f"{target.name} is not a shared allocation of the kernel")
    need(reg.dtype == target.dtype, lambda: f"{target.name} holds {target.dtype}, the register is {reg.type}")
    need(_index(s.index), lambda: f"index {s.index} must be an i32/i64 scalar")
    need(_is_bool_scalar(s.mask), lambda: f"mask {s.mask} must be a bool scalar")
    need(reg.type.nbytes <= 16, lambda: f"memory vectors are at most 16 bytes, {reg.type} is {reg.type.nbytes}")
    if load:
        need(_fits(s.other, reg.dtype), lambda: f"other {s.other!r} is not a {reg.dtype}")
    if s.mask is None:
        _check_reach(s.index, reg.length, target, "reaches", ctx, need)


def _check_reach(index: Reg, length: int, target, reach: str, ctx: _Ctx, need: Need) -> None:
    """Where the range of `index` is known exactly and every thread gets here (no condition on the way),
    elements ``index .. index + length - 1`` must lie inside `target`."""
    r = ctx.ranges.get(index.name)
    if not ctx.conditional and r is not None and r.exact:
        need(r.lo >= 0 and r.hi + length <= target.type.span,
             lambda: f"{target.name}[{index}] {reach} elements {r.lo}..{r.hi + length - 1}, "
             f"outside the {target.type.span} of {target.name}: {target.type}")


def _check_coordinates(s: ThreadIdx | LaneId | WarpId | BlockIdx, ctx: _Ctx, need: Need) -> None:
    need(s.out.type.dtype == int32 and not s.out.type.is_vector, "thread coordinates are i32 scalars")
    if isinstance(s, BlockIdx):
        need(0 <= s.axis < len(ctx.kernel.grid), lambda: f"block_idx axis {s.axis} outside grid {ctx.kernel.grid}")


def _check_bitcast(s: Bitcast, ctx: _Ctx, need: Need) -> None:
    f, i = (s.x, s.out) if s.x.dtype.is_float else (s.out, s.x)
    need(f.dtype.is_float and i.dtype in (int32, int64) and f.dtype.itemsize <= i.dtype.itemsize
         and s.x.length == s.out.length, lambda: f"bitcast {s.x.type} to {s.out.type}: a float and an integer "
         "at least as wide, of one length")


def _check_shuffle(s: Shuffle, ctx: _Ctx, need: Need) -> None:
    need(s.value.dtype in (float32, int32) and not s.value.type.is_vector,
         lambda: f"shuffle of {s.value.type}: only f32 and i32 scalars")
    need(s.out.type == s.value.type, "shuffle changes type")
    need(s.width in (1, 2, 4, 8, 16, 32), lambda: f"shuffle width {s.width} is not a power of two <= 32")
    need(_index(s.lane) and s.lane.dtype == int32 if isinstance(s.lane, Reg) else 0 <= s.lane < 32,
         lambda: f"shuffle lane {s.lane} must be an i32 scalar or a constant in [0, 32)")


def _check_ldmatrix(s: LdMatrix, ctx: _Ctx, need: Need) -> None:
    target = s.alloc
    need(target in ctx.kernel.shared, lambda: f"{target.name} is not a shared allocation of the kernel")
    need(s.count in (1, 2, 4), lambda: f"ldmatrix of {s.count} matrices: 1, 2 or 4")
    need(target.dtype.itemsize == 2, lambda: f"ldmatrix reads 16-bit elements, {target.name} holds {target.dtype}")
    need(s.out.type == RegType(target.dtype, 2 * s.count), lambda: f"ldmatrix.x{s.count} of {target.dtype} gives "
         f"{2 * s.count} of them per lane, not {s.out.type}")
    need(_index(s.index), lambda: f"index {s.index} must be an i32/i64 scalar")
    _check_reach(s.index, 8, target, "rows reach", ctx, need)


def _check_mma(s: Mma, ctx: _Ctx, need: Need) -> None:
    for what, reg, want in (("A", s.a, s.shape.a_type), ("B", s.b, s.shape.b_type),
                            ("C", s.c, s.shape.c_type), ("D", s.out, s.shape.c_type)):
        need(reg.type == want, lambda: f"mma.{s.shape.value} {what} fragment is {reg.type}, wants {want}")


def _check_wgmma(s: Wgmma, ctx: _Ctx, need: Need) -> None:
    shape = s.shape
    need(8 <= shape.n <= 256 and shape.n % 8 == 0, lambda: f"wgmma n={shape.n}: a multiple of 8 from 8 to 256")
    need(shape.dtype in (float16, bfloat16, float8_e4m3fn), lambda: f"wgmma of {shape.dtype}: f16, bf16 or e4m3")
    need((s.a is None) != (s.a_desc is None), "wgmma reads A from registers or from a descriptor, one of them")
    if s.a is not None:
        need(s.a.type == shape.a_type, lambda: f"wgmma.{shape.value} A fragment is {s.a.type}, wants {shape.a_type}")
        need(shape.dtype != float8_e4m3fn,
             "an e4m3 wgmma takes A from shared memory here (its register layout differs)")
    need(not s.b_mn_major or shape.dtype.itemsize == 2, "an N-major B (imm-trans-b) is for 16-bit types only")
    for what, reg in (("A", s.a_desc), ("B", s.b_desc)):
        if reg is not None:
            need(reg.type == RegType(int64), lambda: f"wgmma {what} descriptor {reg} must be an i64 scalar")
    for what, reg in (("C", s.c), ("D", s.out)):
        if reg is not None:
            need(reg.type == shape.c_type, lambda: f"wgmma.{shape.value} {what} is {reg.type}, wants {shape.c_type}")


def _check_descriptor(s: WgmmaDescriptor, ctx: _Ctx, need: Need) -> None:
    need(s.address.type in (RegType(int32), RegType(int64)), "a descriptor's address is an i32/i64 scalar")
    need(s.out.type == RegType(int64), "a descriptor is an i64 scalar")
    need(0 <= s.swizzle <= 3, lambda: f"swizzle mode {s.swizzle}: 0 to 3")
    for what, v in (("leading", s.leading), ("stride", s.stride)):
        need(v % 16 == 0 and 0 <= v >> 4 < 1 << 14, lambda: f"descriptor {what} byte offset {v}: a multiple of 16 "
             "below 2^18")


def _check_barrier_slot(alloc, index: int | Reg, ctx: _Ctx, need: Need) -> None:
    need(alloc in ctx.kernel.shared, lambda: f"{alloc.name} is not a shared allocation of the kernel")
    if isinstance(index, Reg):      # a ring's stage: bounded by the ring, not checkable here
        need(alloc.dtype == int64 and index.type == RegType(int32),
             lambda: f"mbarrier {alloc.name}[{index}]: an i64 allocation indexed by an i32 scalar")
        return
    need(alloc.dtype == int64 and 0 <= index < alloc.size,
         lambda: f"mbarrier {alloc.name}[{index}]: an i64 allocation with at least {index + 1} elements")


def _check_tma(s: TmaLoad, ctx: _Ctx, need: Need) -> None:
    _check_barrier_slot(s.barrier, s.barrier_index, ctx, need)
    need(s.src in ctx.kernel.buffers and s.src.type.strides is None, lambda: f"{s.src.name} is not a dense global "
         "buffer of the kernel")
    need(s.dst in ctx.kernel.shared and s.dst.dtype == s.src.dtype, lambda: f"tma into {s.dst.name}: a shared "
         f"allocation of {s.src.dtype}")
    need(len(s.coords) == len(s.box) == len(s.src.shape) and 1 <= len(s.box) <= 5,
         lambda: f"tma of a {len(s.src.shape)}-d tensor with {len(s.coords)} coordinates and a {len(s.box)}-d box")
    need(all(c.type == RegType(int32) for c in s.coords), "tma coordinates are i32 scalars")
    need(all(1 <= b <= 256 for b in s.box), lambda: f"tma box {s.box}: each extent 1 to 256")
    need(0 <= s.swizzle <= 3, lambda: f"swizzle mode {s.swizzle}: 0 to 3")
    box_elems = 1
    for b in s.box:
        box_elems *= b
    if isinstance(s.dst_index, Reg):
        need(s.dst_index.type == RegType(int32) and box_elems <= s.dst.size,
             lambda: f"tma box of {box_elems} elements at {s.dst.name}[{s.dst_index}]: an i32 index into an "
                     f"allocation of at least {box_elems} elements")
    else:
        need(0 <= s.dst_index and s.dst_index + box_elems <= s.dst.size,
             lambda: f"tma box of {box_elems} elements at {s.dst.name}[{s.dst_index}] overruns {s.dst.size}")


def _check_for(s: For, ctx: _Ctx, need: Need) -> None:
    body = s.body
    need(s.step > 0, "loop step must be positive")
    need(_index(body.iv), "induction variable is an i32/i64 scalar")
    for bound in (s.start, s.stop):
        need(bound.type == body.iv.type if isinstance(bound, Reg) else _fits(bound, body.iv.dtype),
             lambda: f"loop bound {bound} is not a {body.iv.type}")
    n = len(s.inits)
    need(len(body.args) == n and len(body.yields) == n and len(s.results) == n,
         "inits, carried args, yields and results differ in number")
    for i, a, y, r in zip(s.inits, body.args, body.yields, s.results):
        need(i.type == a.type == y.type == r.type, lambda: f"carried value {a} changes type")


def _check_if(s: If, ctx: _Ctx, need: Need) -> None:
    need(_is_bool_scalar(s.cond), "if condition must be a bool scalar")
    for side in (s.then, s.orelse):
        need(len(side.yields) == len(s.results) and all(y.type == r.type for y, r in zip(side.yields, s.results)),
             "a branch yields values that do not match the results")


# The checks of each statement kind (a table: the verifier runs on every statement of every kernel, and a
# chain of isinstance tests was a fifth of its time).
_CHECKS: dict[type, Callable[[Stmt, _Ctx, Need], None]] = {
    ThreadIdx: _check_coordinates, LaneId: _check_coordinates, WarpId: _check_coordinates,
    BlockIdx: _check_coordinates,
    Const: lambda s, ctx, need: need(_fits(s.value, s.out.dtype),
                                     lambda: f"constant {s.value!r} is not a {s.out.dtype}"),
    Unary: lambda s, ctx, need: _check_unary(s, need),
    Binary: lambda s, ctx, need: _check_binary(s, need),
    IntBinary: lambda s, ctx, need: need(s.a.type == s.b.type == s.out.type and s.a.dtype in (int32, int64),
                                         lambda: f"{s.op.value} wants one i32/i64 type"),
    Select: lambda s, ctx, need: (
        need(s.cond.dtype == bool_ and s.cond.type.length in (1, s.a.type.length), "select condition must be bool"),
        need(s.a.type == s.b.type == s.out.type, "select branches and result differ in type")),
    Cast: lambda s, ctx, need: need(s.x.type.length == s.out.type.length, "cast changes the vector length"),
    Bitcast: _check_bitcast,
    Pack: lambda s, ctx, need: (
        need(all(p.dtype == s.out.dtype for p in s.parts), "pack parts differ in dtype from the result"),
        need(sum(p.length for p in s.parts) == s.out.length, "pack parts do not add up to the result length")),
    Extract: lambda s, ctx, need: need(
        s.vec.dtype == s.out.dtype and 0 <= s.index and s.index + s.out.length <= s.vec.length,
        lambda: f"extract {s.out.type} at {s.index} of {s.vec.type}"),
    LoadGlobal: _check_memory, StoreGlobal: _check_memory, LoadShared: _check_memory, StoreShared: _check_memory,
    Shuffle: _check_shuffle,
    LdMatrix: _check_ldmatrix,
    Mma: _check_mma,
    SharedAddress: lambda s, ctx, need: (
        need(s.alloc in ctx.kernel.shared, lambda: f"{s.alloc.name} is not a shared allocation of the kernel"),
        need(s.out.type == RegType(int32), "a shared address is an i32 scalar")),
    WgmmaDescriptor: _check_descriptor,
    Wgmma: _check_wgmma,
    WgmmaFence: lambda s, ctx, need: None,
    WgmmaCommit: lambda s, ctx, need: None,
    WgmmaWait: lambda s, ctx, need: need(0 <= s.pending <= 7, "wgmma.wait_group takes 0 to 7"),
    FenceProxyAsync: lambda s, ctx, need: None,
    MbarrierInit: lambda s, ctx, need: (_check_barrier_slot(s.alloc, s.index, ctx, need),
                                        need(s.count >= 1, "an mbarrier expects at least one arrival")),
    MbarrierArrive: lambda s, ctx, need: (_check_barrier_slot(s.alloc, s.index, ctx, need),
                                          need(0 <= s.tx_bytes < 1 << 20, "expect_tx of 0 to 2^20 - 1 bytes")),
    MbarrierWait: lambda s, ctx, need: (_check_barrier_slot(s.alloc, s.index, ctx, need),
                                        need(s.parity in (0, 1) if isinstance(s.parity, int)
                                             else s.parity.type == RegType(int32),
                                             "a wait's parity is 0, 1 or an i32")),
    TmaLoad: _check_tma,
    SetMaxNReg: lambda s, ctx, need: need(24 <= s.count <= 256 and s.count % 8 == 0,
                                          lambda: f"setmaxnreg {s.count}: 24 to 256, a multiple of 8"),
    For: _check_for,
    If: _check_if,
    Barrier: lambda s, ctx, need: None,
}
_VECTOR_LENGTHS = frozenset({1, 2, 4, 8, MAX_VECTOR})


def _check_stmt(s: Stmt, ctx: _Ctx) -> None:
    def need(cond: bool, msg: Message) -> None:
        if not cond:
            _fail(msg if isinstance(msg, str) else msg(), s, ctx)

    for r in defs(s):
        # (a wgmma accumulator is the exception: N/2 f32 registers per thread, up to 128, made by the
        # wgmma or packed from shorter registers to be its C)
        need(r.type.length in _VECTOR_LENGTHS or isinstance(s, Wgmma)
             or (isinstance(s, Pack) and r.type.length % 4 == 0 and r.type.length <= 128),
             lambda: f"{r} has {r.type.length} elements (1, 2, 4, 8 or 16)")
    check = _CHECKS.get(type(s))
    if check is None:
        _fail(f"unknown SIMT statement {type(s).__name__}", None, ctx)
    check(s, ctx, need)


def _define(r: Reg, scope: set[str], defined: set[str], s: Stmt | None, ctx: _Ctx) -> None:
    if r.name in defined:
        _fail(f"{r} is defined twice", s, ctx)
    defined.add(r.name)
    scope.add(r.name)


def _verify_block(stmts: tuple[Stmt, ...], yields: tuple[Reg, ...], scope: set[str], defined: set[str],
                  ctx: _Ctx, conditional: bool) -> None:
    for s in stmts:
        ctx.conditional = conditional
        for r in uses(s):
            if r.name not in scope:
                _fail(f"{r} is used before it is defined (or outside its region)", s, ctx)
        _check_stmt(s, ctx)
        if isinstance(s, For):
            inner = set(scope)
            for r in (s.body.iv,) + s.body.args:
                _define(r, inner, defined, s, ctx)
            trips = trip_range(s)
            if trips is not None:
                ctx.ranges[s.body.iv.name] = trips
            _verify_block(s.body.stmts, s.body.yields, inner, defined, ctx, conditional or trips is None)
        elif isinstance(s, If):
            for side in (s.then, s.orelse):
                _verify_block(side.stmts, side.yields, set(scope), defined, ctx, True)
        else:
            transfer(s, ctx.ranges, ctx.kernel)
        for r in defs(s):
            _define(r, scope, defined, s, ctx)
    for y in yields:
        if y.name not in scope:
            _fail(f"yield of {y}, which is not visible at the end of its region", None, ctx)


def verify_simt_kernel(k: SimtKernel, pass_name: str = "") -> SimtKernel:
    """Check `k`'s launch shape, declarations, SSA form and statement types; return it or raise `VerifyError`.
    (A stage that takes a kernel another stage verified, as LLVM emission takes `lower_to_simt`'s, is told
    so and does not call this again: `codegen.simt_to_llvm.emit_parsed(verify=False)`.)"""
    _check_kernel(k, pass_name)
    return k


def _check_kernel(k: SimtKernel, pass_name: str) -> None:
    ctx = _Ctx(k, pass_name)
    if not 1 <= k.warps <= 32:
        _fail(f"{k.warps} warps per block (1 to 32)", None, ctx)
    static = [g if is_static(g) else 1 for g in k.grid]     # a run-time dimension is checked at launch
    if not 1 <= len(k.grid) <= 3 or any(g < 1 for g in static) or static[0] >= 2**31 or any(g > 65535 for g in static[1:]):
        _fail(f"grid {k.grid} must have 1 to 3 dimensions of at least one block (x < 2**31, y and z <= 65535)",
              None, ctx)
    scalars = {p.name for p in k.params if not isinstance(p, Buffer)}
    if any(name not in scalars for name, _ in k.sizes):
        _fail(f"a run-time extent of {[name for name, _ in k.sizes]} is not a scalar parameter", None, ctx)
    names = [p.name for p in k.params] + [a.name for a in k.shared]
    if len(set(names)) != len(names):
        _fail(f"params and shared allocations repeat a name: {names}", None, ctx)
    limit, kind = ((MAX_DYNAMIC_SHARED_BYTES, "dynamic") if k.dynamic_shared else (MAX_STATIC_SHARED_BYTES, "static"))
    if k.shared_bytes > limit:
        _fail(f"{k.shared_bytes} bytes of {kind} shared memory (at most {limit})", None, ctx)
    scope: set[str] = set()
    defined: set[str] = set()
    for p in k.scalars:
        if p.type.is_vector:
            _fail(f"scalar param {p} is a vector", None, ctx)
        _define(p, scope, defined, None, ctx)
    _verify_block(k.body, (), scope, defined, ctx, False)
