"""Hopper's warpgroup MMA as LLVM IR for ``.target sm_90a`` (HOPPER.md: which parts LLVM 22 has intrinsics for).

- `Wgmma`: inline PTX (LLVM has no ``wgmma.mma_async`` intrinsic). The accumulator is N/2 f32 outputs
  (``=f``); a C given is tied to them (inputs ``"0"`` .. ``"N/2-1"``), so D takes C's registers as the
  hardware does; the scale-d predicate is set from an i32 input (0 where C is absent: D = A·B). A comes as
  four 32-bit registers (16-bit pairs, low half first) or a descriptor (``l``), B as a descriptor.
- `WgmmaFence`, `WgmmaCommit`, `WgmmaWait`: ``llvm.nvvm.wgmma.{fence,commit_group,wait_group}.sync.aligned``;
  `FenceProxyAsync`: inline ``fence.proxy.async.shared::cta`` (its intrinsic's name differs between LLVM
  versions; an unknown one only fails in ptxas).
- `SharedAddress`: the allocation's ``addrspace(3)`` address as i32 (its global is aligned as the
  allocation asks: 1024 bytes for a 128-byte-swizzled tile); `WgmmaDescriptor`: the descriptor's bits
  from it, ``((addr & 0x3FFFF) >> 4) | fields`` (`ir.simt.wgmma_fragments.MatrixDescriptor`).

TMA and mbarriers (inline PTX, ``shared::cta`` 32-bit addresses): `MbarrierInit`, `MbarrierArrive` (with
``expect_tx``), `MbarrierWait` (a ``try_wait.parity`` loop), `TmaLoad` (``cp.async.bulk.tensor.Nd``, the
coordinates innermost first, the tensor map the kernel's extra parameter ``<buffer>_tmap``: see
`kernel.emit_module`).

Only an sm_90a target assembles ``wgmma`` (ptxas rejects it under ``sm_90``); TMA needs sm_90.
"""
from __future__ import annotations

from typing import Callable

from llvmlite import ir

from ...ir.simt.nodes import (FenceProxyAsync, MbarrierArrive, MbarrierInit, MbarrierWait, Reg, SetMaxNReg, SharedAddress,
                              TmaLoad, Wgmma, WgmmaCommit, WgmmaDescriptor, WgmmaFence, WgmmaWait)
from ...ir.simt.wgmma_fragments import MatrixDescriptor, Swizzle
from ...ir.types import bfloat16, float16
from ..nvvm import F32, I32, call_intrinsic, i32
from .emitter import Emitter
from .types import reg_type

I64 = ir.IntType(64)
VOID = ir.VoidType()


def _shared_address(s: SharedAddress, em: Emitter) -> None:
    em.set(s.out, em.builder.ptrtoint(em.shared[s.alloc.name], I32))


def _descriptor(s: WgmmaDescriptor, em: Emitter) -> None:
    b = em.builder
    address = em[s.address]
    wide = b.zext(address, I64) if address.type != I64 else address
    start = b.lshr(b.and_(wide, ir.Constant(I64, 0x3FFFF)), ir.Constant(I64, 4))
    fields = MatrixDescriptor(0, s.leading, s.stride, 0, Swizzle(s.swizzle)).encode()
    em.set(s.out, b.or_(start, ir.Constant(I64, fields)))


def _ptx_type(s: Wgmma) -> str:
    return {float16: "f16", bfloat16: "bf16"}.get(s.shape.dtype, "e4m3")


def _wgmma(s: Wgmma, em: Emitter) -> None:
    b = em.builder
    outs = s.shape.n // 2
    t = _ptx_type(s)
    operands: list[ir.Value] = []
    constraints = ["=f"] * outs
    if s.c is not None:
        operands += em.elements(s.c)
        constraints += [str(i) for i in range(outs)]
    slot = outs + (outs if s.c is not None else 0)   # the next operand's number: outputs, then tied C
    if s.a is not None:
        words = b.bitcast(em[s.a], ir.VectorType(I32, 4))
        operands += [b.extract_element(words, i32(r)) for r in range(4)]
        constraints += ["r"] * 4
        a_text = "{" + ", ".join(f"${slot + r}" for r in range(4)) + "}"
        slot += 4
    else:
        operands.append(em[s.a_desc])
        constraints.append("l")
        a_text = f"${slot}"
        slot += 1
    operands.append(em[s.b_desc])
    constraints.append("l")
    b_text = f"${slot}"
    slot += 1
    operands.append(i32(1 if s.c is not None else 0))
    constraints.append("r")
    scale_d = f"${slot}"
    # immediates: scale-a, scale-b = 1; the transposes (16-bit types only): A K-major, B as `b_mn_major` says
    trans_b = str(int(s.b_mn_major))
    tail = "1, 1" + ("" if t == "e4m3" else (f", {trans_b}" if s.a is not None else f", 0, {trans_b}"))
    d_text = "{" + ", ".join(f"${i}" for i in range(outs)) + "}"
    asm = ("{ .reg .pred p; setp.ne.b32 p, " + scale_d + ", 0; "
           f"wgmma.mma_async.sync.aligned.m64n{s.shape.n}k{s.shape.k}.f32.{t}.{t} {d_text}, {a_text}, {b_text}, p, "
           f"{tail}; }}")
    ret = ir.LiteralStructType([F32] * outs)
    fn = ir.InlineAsm(ir.FunctionType(ret, [v.type for v in operands]), asm, ",".join(constraints), side_effect=True)
    result = b.call(fn, operands)
    values = [b.extract_value(result, i) for i in range(outs)]
    em.lanes[s.out.name] = values
    vec: ir.Value = ir.Constant(reg_type(s.out.type), ir.Undefined)
    for i, value in enumerate(values):
        vec = b.insert_element(vec, value, i32(i))
    em.set(s.out, vec)


def _asm(em: Emitter, text: str, constraints: str, operands: list[ir.Value]) -> None:
    fn = ir.InlineAsm(ir.FunctionType(VOID, [v.type for v in operands]), text,
                      ",".join([constraints, "~{memory}"]) if constraints else "~{memory}", side_effect=True)
    em.builder.call(fn, operands)


def _element_address(em: Emitter, alloc, index: int | Reg, itemsize: int) -> ir.Value:
    """The 32-bit ``shared::cta`` address of element `index` (a constant or an i32 register) of `alloc`."""
    b = em.builder
    offset = i32(itemsize * index) if isinstance(index, int) else b.mul(em[index], i32(itemsize))
    return b.add(b.ptrtoint(em.shared[alloc.name], I32), offset)


def _barrier_address(em: Emitter, alloc, index: int | Reg) -> ir.Value:
    return _element_address(em, alloc, index, 8)


def _mbarrier_init(s: MbarrierInit, em: Emitter) -> None:
    _asm(em, "mbarrier.init.shared::cta.b64 [$0], $1;", "r,r", [_barrier_address(em, s.alloc, s.index), i32(s.count)])


def _mbarrier_arrive(s: MbarrierArrive, em: Emitter) -> None:
    address = _barrier_address(em, s.alloc, s.index)
    if s.tx_bytes:
        _asm(em, "mbarrier.arrive.expect_tx.shared::cta.b64 _, [$0], $1;", "r,r", [address, i32(s.tx_bytes)])
    else:
        _asm(em, "mbarrier.arrive.shared::cta.b64 _, [$0];", "r", [address])


def _mbarrier_wait(s: MbarrierWait, em: Emitter) -> None:
    parity = em[s.parity] if not isinstance(s.parity, int) else i32(s.parity)
    _asm(em, "{ .reg .pred p; WAIT_${:uid}: mbarrier.try_wait.parity.shared::cta.b64 p, [$0], $1; "
             "@!p bra WAIT_${:uid}; }", "r,r", [_barrier_address(em, s.alloc, s.index), parity])


def _tma_load(s: TmaLoad, em: Emitter) -> None:
    dst = _element_address(em, s.dst, s.dst_index, s.dst.dtype.itemsize)
    coords = [em[c] for c in reversed(s.coords)]            # innermost first, as the tensor map numbers them
    names = ", ".join(f"${2 + i}" for i in range(len(coords)))
    text = (f"cp.async.bulk.tensor.{len(coords)}d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
            f"[$0], [$1, {{{names}}}], [${2 + len(coords)}];")
    _asm(em, text, ",".join(["r", "l"] + ["r"] * len(coords) + ["r"]),
         [dst, em.tensor_maps[s.src.name], *coords, _barrier_address(em, s.barrier, s.barrier_index)])


def _intrinsic(name: str, args: Callable[[object], list] = lambda s: []) -> Callable[..., None]:
    return lambda s, em: call_intrinsic(em.builder, name, VOID, args(s))


RULES: dict[type, Callable[..., None]] = {
    SharedAddress: _shared_address,
    WgmmaDescriptor: _descriptor,
    Wgmma: _wgmma,
    WgmmaFence: _intrinsic("llvm.nvvm.wgmma.fence.sync.aligned"),
    WgmmaCommit: _intrinsic("llvm.nvvm.wgmma.commit_group.sync.aligned"),
    WgmmaWait: _intrinsic("llvm.nvvm.wgmma.wait_group.sync.aligned", lambda s: [ir.Constant(I64, s.pending)]),
    FenceProxyAsync: lambda s, em: _asm(em, "fence.proxy.async.shared::cta;", "", []),
    MbarrierInit: _mbarrier_init,
    MbarrierArrive: _mbarrier_arrive,
    MbarrierWait: _mbarrier_wait,
    TmaLoad: _tma_load,
    SetMaxNReg: lambda s, em: call_intrinsic(em.builder, f"llvm.nvvm.setmaxnreg.{'inc' if s.increase else 'dec'}"
                                             ".sync.aligned.u32", VOID, [i32(s.count)]),
}

__all__ = ["RULES"]
