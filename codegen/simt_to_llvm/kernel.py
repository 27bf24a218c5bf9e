"""`emit_module` (`emit_text`): one `SimtKernel` as a verified nvptx64 LLVM module, and `compile_simt` on to PTX."""
from __future__ import annotations

import llvmlite.binding as llvm
from llvmlite import ir

from ...ir.buffer import Buffer
from ...ir.errors import BackendError
from ...ir.simt.nodes import (FenceProxyAsync, MbarrierArrive, MbarrierInit, MbarrierWait, SetMaxNReg, SimtKernel,
                              TmaLoad, Wgmma, WgmmaCommit, WgmmaFence, WgmmaWait, shared_offsets, walk_stmts)
from ...ir.simt.verifier import verify_simt_kernel
from .. import nvvm
from ..llvm_text import TextBuilder, TextModule
from ..nvptx import PtxArtifact, compile_module, new_module, parse_and_verify
from ..llvm_utils import I8, I64
from ..nvvm import PTR, PTR_GLOBAL
from . import arith, control, memory, warp, wgmma
from .emitter import Emitter, LlvmOptions
from .types import mem_type

RULES = {**arith.RULES, **memory.RULES, **warp.RULES, **wgmma.RULES, **control.RULES}
WGMMA_OPS = (Wgmma, WgmmaFence, WgmmaCommit, WgmmaWait, FenceProxyAsync, SetMaxNReg)
"""Statements that need ``.target sm_90a``."""
ASYNC_COPY_OPS = (TmaLoad, MbarrierInit, MbarrierArrive, MbarrierWait)
"""Statements that need sm_90."""


def emit_module(kernel: SimtKernel, options: LlvmOptions = LlvmOptions(), *, verify: bool = True) -> TextModule:
    """`kernel` as an LLVM module for ``nvptx64-nvidia-cuda``: a ``ptx_kernel`` function taking the buffers
    as pointers and the scalars by value (bool as a byte), its shared arrays as ``addrspace(3)`` globals
    named ``smem_<name>``, and ``.maxntid`` set to the block size. LLVM's verifier checks the result."""
    module = _build(kernel, options, verify)
    parse_and_verify(str(module), pass_name="simt_to_llvm")
    return module


def emit_text(kernel: SimtKernel, options: LlvmOptions = LlvmOptions(), *, verify: bool = True) -> str:
    """The text of `emit_module(kernel)` (verified by LLVM the same way), printed once: printing a big
    llvmlite module costs as much as building it."""
    return emit_parsed(kernel, options, verify=verify)[0]


def emit_parsed(kernel: SimtKernel, options: LlvmOptions = LlvmOptions(), *,
                verify: bool = True) -> tuple[str, llvm.ModuleRef]:
    """`emit_text(kernel)` and LLVM's verified parse of it, for `compile_module(text, parsed=...)` to start
    from instead of parsing the text again. `verify=False` skips the SIMT verifier, for a kernel the stage
    that made it verified (`lower_to_simt`)."""
    module = _build(kernel, options, verify)
    text = str(module)
    module.dispose()
    return text, parse_and_verify(text, pass_name="simt_to_llvm")


def _build(kernel: SimtKernel, options: LlvmOptions, verify: bool) -> TextModule:
    """The module of `emit_module`, not yet checked by LLVM."""
    if verify:
        verify_simt_kernel(kernel, "simt_to_llvm")
    module = new_module(kernel.name, TextModule)
    arg_types = [PTR if isinstance(p, Buffer) else mem_type(p.dtype) for p in kernel.params]
    maps = tensor_map_sources(kernel)
    fn = nvvm.define_kernel(module, kernel.name, arg_types + [PTR] * len(maps))
    for arg, name in zip(fn.args[len(kernel.params):], maps):
        # a CUtensorMap the host encoded, read in place from the parameter space (no local copy: TMA needs that)
        arg.name = f"{name}_tmap"
        for attribute in ("byval([128 x i8])", "align 64", '"nvvm.grid_constant"'):
            arg.add_attribute(attribute)
    nvvm.set_launch_bounds(fn, kernel.threads, kernel.min_blocks_per_sm)
    builder = TextBuilder(fn.append_basic_block("entry"))
    em = Emitter(kernel, builder, RULES, options)
    for param, arg in zip(kernel.params, fn.args):
        arg.name = param.name
        if isinstance(param, Buffer):   # a kernel's buffers are global memory: said here, not left to inference
            em.buffers[param.name] = builder.addrspacecast(arg, PTR_GLOBAL, name=f"{param.name}.global")
        elif param.dtype.is_bool:
            em.set(param, builder.icmp_unsigned("!=", arg, ir.Constant(arg.type, 0)))
        else:
            em.set(param, arg)
    for arg, name in zip(fn.args[len(kernel.params):], maps):
        em.tensor_maps[name] = builder.ptrtoint(arg, ir.IntType(64))
    _declare_shared(kernel, module, builder, em)
    em.emit(kernel.body)
    em.dispose()
    builder.ret_void()
    return module


def _declare_shared(kernel: SimtKernel, module: TextModule, builder: TextBuilder, em: Emitter) -> None:
    """Each shared allocation's pointer: a static ``.shared`` array, or in a `SimtKernel.dynamic_shared` kernel
    its offset (`shared_offsets`) into the launch's ``extern .shared`` array, aligned as the most aligned
    allocation asks (1024 bytes for 128-byte-swizzled wgmma tiles)."""
    if not kernel.dynamic_shared:
        for alloc in kernel.shared:
            em.shared[alloc.name] = nvvm.declare_shared(module, f"smem_{alloc.name}", mem_type(alloc.dtype),
                                                        alloc.size, align=alloc.align)
        return
    base = nvvm.declare_dynamic_shared(module, align=max((a.align for a in kernel.shared), default=16))
    for alloc, offset in zip(kernel.shared, shared_offsets(kernel.shared).values()):
        em.shared[alloc.name] = builder.gep(base, [ir.Constant(I64, offset)], inbounds=True, source_etype=I8,
                                            name=f"smem_{alloc.name}")


def tensor_map_sources(kernel: SimtKernel) -> list[str]:
    """The global buffers a `TmaLoad` reads, in order of first use: each is passed a second time, as a
    128-byte ``CUtensorMap`` parameter ``<name>_tmap`` after the kernel's own parameters (encoded on the
    host with the copy's box and swizzle; the runtime does not launch such kernels yet)."""
    out: list[str] = []
    for s in walk_stmts(kernel.body):
        if isinstance(s, TmaLoad) and s.src.name not in out:
            out.append(s.src.name)
    return out


def compile_simt(kernel: SimtKernel, sm: str = "sm_90", options: LlvmOptions = LlvmOptions(), *,
                 ptx_version: int | None = None) -> PtxArtifact:
    """`kernel` to PTX for `sm` (every stage's text kept in the artifact). Needs no GPU. A kernel with
    Hopper's warpgroup MMA (`Wgmma` and its fences) compiles for ``sm_90a`` only."""
    stmts = list(walk_stmts(kernel.body))
    if sm != "sm_90a" and any(isinstance(s, WGMMA_OPS) for s in stmts):
        raise BackendError(f"kernel {kernel.name} uses wgmma or setmaxnreg, which only sm_90a has (asked for {sm})")
    if sm not in ("sm_90", "sm_90a") and any(isinstance(s, ASYNC_COPY_OPS) for s in stmts):
        raise BackendError(f"kernel {kernel.name} uses TMA and mbarriers, which need sm_90 (asked for {sm})")
    return compile_module(emit_module(kernel, options), sm, ptx_version=ptx_version)


__all__ = ["emit_module", "emit_parsed", "emit_text", "compile_simt", "RULES"]
