"""NVPTX building blocks emitted with `llvmlite.ir`: the vocabulary the SIMT lowering speaks.

Every helper takes the `ir.IRBuilder` positioned where the code goes and
declares the intrinsics it needs in the builder's module; the GPU emission
passes the text builder of `codegen.llvm_text` (same interface, faster), the
hand-built samples and tests an `llvmlite.ir` one. Names are the
LLVM 22 ones (llvmlite 0.50): ``llvm.nvvm.barrier0`` is gone, a CTA barrier is
``llvm.nvvm.barrier.cta.sync.aligned.all(i32 0)``. Kernels are functions with
the ``ptx_kernel`` calling convention (no ``!nvvm.annotations`` "kernel").

LLVM's NVPTX backend *aborts the process* ("Cannot select: intrinsic") when an
intrinsic is used on a target that lacks it, so each intrinsic emitted here is
listed in `INTRINSIC_REQUIREMENTS` and `codegen.nvptx` refuses, with a Python
error, a module that uses one on a too-old ``sm``/PTX version.

Tensor-core helpers (mma, fragment layouts, ldmatrix, cp.async, bf16/fp8 packing) live in
`codegen.nvvm_mma`; both call intrinsics through `codegen.llvm_utils.call_intrinsic`.
"""
from __future__ import annotations

import functools
import math
from typing import Callable

from llvmlite import ir

from ..ir.errors import InternalError

from .llvm_text import TextModule
from .llvm_utils import F16, F32, F64, I1, I8, I16, I32, I64, PTR  # noqa: F401  (re-exported)
from .llvm_utils import call_intrinsic, like, new_function, splat  # noqa: F401  (re-exported)
from .llvm_utils import declare_intrinsic as intrinsic  # noqa: F401  (re-exported)

HALF2 = ir.VectorType(F16, 2)
# PTR (from llvm_utils) is the generic address space (0).
PTR_GLOBAL = ir.PointerType(addrspace=1)
PTR_SHARED = ir.PointerType(addrspace=3)
FULL_MASK = 0xFFFFFFFF


class BFloat16Type(ir.Type):
    """LLVM's ``bfloat`` (llvmlite.ir has none); only used for conversions, values travel as i16."""

    intrinsic_name = "bf16"

    def __str__(self) -> str:
        return "bfloat"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BFloat16Type)

    def __hash__(self) -> int:
        return hash("bfloat")


BF16 = BFloat16Type()

# Intrinsic-name prefix -> (minimum sm as an int like 80, minimum PTX ISA as an int like 70).
# Checked by codegen.nvptx before LLVM sees the module (see the module docstring for why).
INTRINSIC_REQUIREMENTS: dict[str, tuple[int, int]] = {
    "llvm.nvvm.mma.m16n8k32.row.col.f32.e4m3": (89, 84),
    "llvm.nvvm.mma.m16n8k32.row.col.f32.e5m2": (89, 84),
    "llvm.nvvm.mma.m16n8k16.row.col.f32.f32": (80, 70),
    "llvm.nvvm.mma.m16n8k16.row.col.bf16": (80, 70),
    "llvm.nvvm.ff.to.e4m3x2": (89, 81),
    "llvm.nvvm.ff.to.e5m2x2": (89, 81),
    "llvm.nvvm.cp.async": (80, 70),
    "llvm.nvvm.ldmatrix.sync.aligned.m8n8": (75, 65),
    "llvm.nvvm.shfl.sync": (30, 60),
    "llvm.nvvm.barrier.cta": (30, 60),
}


@functools.lru_cache(maxsize=1024)
def i32(value: int) -> ir.Constant:
    """The i32 constant `value`, one object per value (llvmlite caches a constant's text per object, and
    element indices are printed thousands of times)."""
    return ir.Constant(I32, value)


def lanewise(b: ir.IRBuilder, out_type: ir.Type, fn: Callable[..., ir.Value], *operands: ir.Value) -> ir.Value:
    """`fn` applied to each element of the vector operands (scalar operands passed as they are)."""
    if not isinstance(out_type, ir.VectorType):
        return fn(*operands)
    vec = ir.Constant(out_type, ir.Undefined)
    for i in range(out_type.count):
        at = i32(i)
        elems = [b.extract_element(v, at) if isinstance(v.type, ir.VectorType) else v for v in operands]
        vec = b.insert_element(vec, fn(*elems), at)
    return vec


# --- kernels -------------------------------------------------------------------------------

def define_kernel(module: ir.Module, name: str, arg_types: list[ir.Type], *, noalias: bool = True) -> ir.Function:
    """A ``.entry`` kernel: ``ptx_kernel`` calling convention; pointer args ``noalias`` when asked
    (our buffers never overlap, and it lets LLVM use ``ld.global.nc`` for read-only ones)."""
    fn = new_function(module, ir.FunctionType(ir.VoidType(), arg_types), name)
    fn.calling_convention = "ptx_kernel"
    if noalias:
        for arg in fn.args:
            if isinstance(arg.type, ir.PointerType):
                arg.add_attribute("noalias")
    return fn


def set_launch_bounds(fn: ir.Function, max_threads: int, min_blocks_per_sm: int | None = None) -> None:
    """``.maxntid`` (and ``.minnctapersm``), so ptxas budgets registers for the real block size.

    llvmlite cannot write string function attributes; LLVM upgrades these
    ``!nvvm.annotations`` entries to ``"nvvm.maxntid"``/``"nvvm.minctasm"`` attributes.
    """
    module = fn.module
    text = isinstance(module, TextModule)

    def string(s: str):
        return s if text else ir.MetaDataString(module, s)

    module.add_named_metadata("nvvm.annotations", [fn, string("maxntidx"), ir.Constant(I32, max_threads)])
    if min_blocks_per_sm is not None:
        module.add_named_metadata("nvvm.annotations", [fn, string("minctasm"), ir.Constant(I32, min_blocks_per_sm)])


# --- special registers ------------------------------------------------------------------------

def _sreg(builder: ir.IRBuilder, reg: str, axis: str) -> ir.Value:
    if axis not in ("x", "y", "z"):
        raise InternalError(f"no axis {axis!r}; use x, y or z", pass_name="nvvm")
    return call_intrinsic(builder, f"llvm.nvvm.read.ptx.sreg.{reg}.{axis}", I32, [])


def thread_idx(builder: ir.IRBuilder, axis: str = "x") -> ir.Value:
    """``%tid.<axis>`` (i32)."""
    return _sreg(builder, "tid", axis)


def block_idx(builder: ir.IRBuilder, axis: str = "x") -> ir.Value:
    """``%ctaid.<axis>`` (i32): the program id along `axis`."""
    return _sreg(builder, "ctaid", axis)


def block_dim(builder: ir.IRBuilder, axis: str = "x") -> ir.Value:
    """``%ntid.<axis>`` (i32): threads per block along `axis`."""
    return _sreg(builder, "ntid", axis)


def grid_dim(builder: ir.IRBuilder, axis: str = "x") -> ir.Value:
    """``%nctaid.<axis>`` (i32): blocks in the grid along `axis`."""
    return _sreg(builder, "nctaid", axis)


def lane_id(builder: ir.IRBuilder) -> ir.Value:
    """``%laneid`` (i32, 0..31)."""
    return call_intrinsic(builder, "llvm.nvvm.read.ptx.sreg.laneid", I32, [])


def global_index_i64(builder: ir.IRBuilder, axis: str = "x") -> ir.Value:
    """``ctaid * ntid + tid`` widened to i64 before multiplying (indices past 2**31 stay right)."""
    block = builder.zext(block_idx(builder, axis), I64)
    width = builder.zext(block_dim(builder, axis), I64)
    return builder.add(builder.mul(block, width), builder.zext(thread_idx(builder, axis), I64), name="gidx")


# --- synchronization and warp shuffles ------------------------------------------------------------

def barrier(builder: ir.IRBuilder) -> None:
    """``bar.sync 0``: every thread of the block waits here (the old ``__syncthreads``)."""
    call_intrinsic(builder, "llvm.nvvm.barrier.cta.sync.aligned.all", ir.VoidType(), [ir.Constant(I32, 0)])


def _shuffle(builder: ir.IRBuilder, kind: str, value: ir.Value, lane: ir.Value | int, clamp: int,
             member_mask: int) -> ir.Value:
    if value.type != F32 and value.type != I32:
        raise InternalError(f"shuffle of {value.type}: only f32 and i32 (bitcast or split others)", pass_name="nvvm")
    lane_value = ir.Constant(I32, lane) if isinstance(lane, int) else lane
    args = [ir.Constant(I32, member_mask), value, lane_value, ir.Constant(I32, clamp)]
    return call_intrinsic(builder, f"llvm.nvvm.shfl.sync.{kind}.{value.type.intrinsic_name}", value.type, args)


def shfl_bfly(builder: ir.IRBuilder, value: ir.Value, lane_mask: ir.Value | int, *, width: int = 32,
              member_mask: int = FULL_MASK) -> ir.Value:
    """``shfl.sync.bfly``: the value of lane ``laneid ^ lane_mask`` within groups of `width` lanes.

    `value` is f32 or i32 (bitcast other 32-bit values; split 64-bit ones).
    """
    return _shuffle(builder, "bfly", value, lane_mask, _clamp(width), member_mask)


def shfl_idx(builder: ir.IRBuilder, value: ir.Value, src_lane: ir.Value | int, *, width: int = 32,
             member_mask: int = FULL_MASK) -> ir.Value:
    """``shfl.sync.idx``: the value of lane `src_lane` of this lane's group of `width` (a broadcast)."""
    return _shuffle(builder, "idx", value, src_lane, _clamp(width), member_mask)


def shfl_down(builder: ir.IRBuilder, value: ir.Value, delta: ir.Value | int, *, width: int = 32,
              member_mask: int = FULL_MASK) -> ir.Value:
    """``shfl.sync.down``: the value of lane ``laneid + delta`` (own value past the group's end)."""
    return _shuffle(builder, "down", value, delta, _clamp(width), member_mask)


def _clamp(width: int) -> int:
    # PTX's c operand: segment mask in bits 8..12, clamp lane in bits 0..4 (PTX ISA, shfl.sync).
    if width not in (1, 2, 4, 8, 16, 32):
        raise InternalError(f"shuffle width {width} is not a power of two <= 32", pass_name="nvvm")
    return ((32 - width) << 8) | 0x1F


def warp_allreduce(builder: ir.IRBuilder, value: ir.Value, combine, *, width: int = 32) -> ir.Value:
    """Butterfly all-reduce over groups of `width` lanes: log2(width) ``shfl.sync.bfly`` steps.

    `combine(builder, a, b)` is the monoid's operation (e.g. ``builder.fadd``-like);
    every lane ends with the group's total.
    """
    offset = width // 2
    while offset:
        value = combine(builder, value, shfl_bfly(builder, value, offset, width=width))
        offset //= 2
    return value


# --- shared memory and address spaces ------------------------------------------------------------

def declare_shared(module: ir.Module, name: str, elem_type: ir.Type, count: int, *,
                   align: int = 16) -> ir.GlobalVariable:
    """A static ``.shared`` array of `count` `elem_type` (addrspace 3, internal, undefined contents)."""
    array = ir.ArrayType(elem_type, count)
    var = (module.add_global_variable(array, name, addrspace=3) if isinstance(module, TextModule)
           else _opaque(ir.GlobalVariable(module, array, name, addrspace=3)))
    var.linkage = "internal"
    var.initializer = ir.Constant(var.value_type, ir.Undefined)
    var.align = align
    return var


def declare_dynamic_shared(module: ir.Module, name: str = "redfuser_dynamic_smem", *,
                           align: int = 16) -> ir.GlobalVariable:
    """The ``extern .shared`` array sized at launch (the dynamic shared-memory bytes of the launch)."""
    existing = module.globals.get(name)
    if existing is not None:
        return existing
    array = ir.ArrayType(I8, 0)
    var = (module.add_global_variable(array, name, addrspace=3) if isinstance(module, TextModule)
           else _opaque(ir.GlobalVariable(module, array, name, addrspace=3)))
    var.linkage = "external"
    var.align = align
    return var


def _opaque(var: ir.GlobalVariable) -> ir.GlobalVariable:
    # llvmlite still gives globals a typed pointer type (``[N x float] addrspace(3)*``), which makes its
    # builder reject loads/stores of elements through a GEP; the value is an opaque pointer in LLVM 22.
    var.type = ir.PointerType(addrspace=var.type.addrspace)
    return var


def shared_gep(builder: ir.IRBuilder, var: ir.GlobalVariable, elem_type: ir.Type, index: ir.Value) -> ir.Value:
    """``&var[index]`` as a shared-space pointer (``ptr addrspace(3)``); `index` i32 or i64."""
    return builder.gep(var, [index], source_etype=elem_type)


def to_generic(builder: ir.IRBuilder, ptr: ir.Value) -> ir.Value:
    """Cast a specific-space pointer (shared, global) to a generic one."""
    return builder.addrspacecast(ptr, PTR)


def to_global(builder: ir.IRBuilder, ptr: ir.Value) -> ir.Value:
    """Cast a generic pointer to the global space (``ptr addrspace(1)``)."""
    return builder.addrspacecast(ptr, PTR_GLOBAL)


def to_shared(builder: ir.IRBuilder, ptr: ir.Value) -> ir.Value:
    """Cast a generic pointer to the shared space (``ptr addrspace(3)``)."""
    return builder.addrspacecast(ptr, PTR_SHARED)


# --- global memory ---------------------------------------------------------------------------

def element_ptr(builder: ir.IRBuilder, base: ir.Value, elem_type: ir.Type, index: ir.Value) -> ir.Value:
    """``&base[index]`` by GEP (index widened to i64: never integer pointer arithmetic)."""
    if isinstance(index.type, ir.IntType) and index.type.width < 64:
        index = builder.sext(index, I64)
    return builder.gep(base, [index], source_etype=elem_type)


def load_masked(builder: ir.IRBuilder, ptr: ir.Value, elem_type: ir.Type, mask: ir.Value, other: ir.Value,
                *, align: int | None = None) -> ir.Value:
    """``mask ? *ptr : other``; the load only executes where `mask` holds (never touches memory otherwise)."""
    entry = builder.block
    # fixed names (llvmlite numbers repeats): deriving them from `entry` would grow a name per masked load
    then = builder.append_basic_block("mload")
    done = builder.append_basic_block("mload.done")
    builder.cbranch(mask, then, done)
    builder.position_at_end(then)
    loaded = builder.load(ptr, typ=elem_type, align=align)
    builder.branch(done)
    builder.position_at_end(done)
    phi = builder.phi(elem_type)
    phi.add_incoming(other, entry)
    phi.add_incoming(loaded, then)
    return phi


def store_masked(builder: ir.IRBuilder, value: ir.Value, ptr: ir.Value, mask: ir.Value, *,
                 align: int | None = None) -> None:
    """``if mask: *ptr = value``."""
    then = builder.append_basic_block("mstore")
    done = builder.append_basic_block("mstore.done")
    builder.cbranch(mask, then, done)
    builder.position_at_end(then)
    builder.store(value, ptr, align=align)
    builder.branch(done)
    builder.position_at_end(done)


def vector_type(elem_type: ir.Type, nbytes: int = 16) -> ir.VectorType:
    """The vector of `elem_type` that fills `nbytes` (16: one ``ld.global.v4.b32``)."""
    size = {F16: 2, BF16: 2, I16: 2, F32: 4, I32: 4, F64: 8, I64: 8, I8: 1}.get(elem_type)
    if size is None or nbytes % size:
        raise InternalError(f"no {nbytes}-byte vector of {elem_type}", pass_name="nvvm")
    return ir.VectorType(elem_type, nbytes // size)


def load_vector(builder: ir.IRBuilder, ptr: ir.Value, vec_type: ir.VectorType, *, align: int = 16) -> ir.Value:
    """One vector load (16 bytes and ``align=16``: ``ld.global.v4``); `ptr` must be that aligned."""
    return builder.load(ptr, typ=vec_type, align=align)


def store_vector(builder: ir.IRBuilder, value: ir.Value, ptr: ir.Value, *, align: int = 16) -> None:
    """One vector store (16 bytes and ``align=16``: ``st.global.v4``)."""
    builder.store(value, ptr, align=align)


def load_vector_masked(builder: ir.IRBuilder, ptr: ir.Value, vec_type: ir.VectorType, mask: ir.Value,
                       *, align: int = 16) -> ir.Value:
    """A whole vector where `mask` holds, zeros elsewhere (ragged edges use the scalar path)."""
    return load_masked(builder, ptr, vec_type, mask, ir.Constant(vec_type, None), align=align)


# --- fast math ---------------------------------------------------------------------------------

def ex2_approx(builder: ir.IRBuilder, x: ir.Value, *, ftz: bool = True) -> ir.Value:
    """``ex2.approx[.ftz].f32``: 2**x in one SFU instruction (~2 ulp)."""
    name = "llvm.nvvm.ex2.approx.ftz.f32" if ftz else "llvm.nvvm.ex2.approx.f32"
    return call_intrinsic(builder, name, F32, [x])


def exp_fast(builder: ir.IRBuilder, x: ir.Value, *, ftz: bool = True) -> ir.Value:
    """e**x as ``ex2.approx(x * log2 e)`` (what fast softmax kernels use)."""
    return ex2_approx(builder, builder.fmul(x, ir.Constant(F32, math.log2(math.e))), ftz=ftz)
