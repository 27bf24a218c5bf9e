"""Deterministic, readable text for the SIMT IR (``lowered.stages["simt"]``).

One statement per line, ``%name: type = op operands``; regions are indented::

    simt kernel block_sum(x: f32[1000], out: f32[4], %n: i32) grid (4,) block 128 (4 warps)
      shared partials: f32[4]
      %tid: i32 = thread_idx
      %v: f32 = load.global x[%i] mask %inside other 0.0
      %s: f32 = shfl.bfly %v, 16 width 32
      store.shared partials[%warp] = %s mask %lane0
      barrier
      %acc: f32 = for %k: i32 = 0 to %n step 128 iter (%run = %zero) {
        ...
        yield %next
      }
"""
from __future__ import annotations

from typing import Callable

from ..excerpt import LineIndex, note_line
from ..buffer import Buffer
from ..loop.printer import format_const
from .nodes import (
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
)

_AXES = "xyz"


def _decl(r: Reg) -> str:
    return f"%{r.name}: {r.type}"


def _mask(mask: Reg | None) -> str:
    return f" mask {mask}" if mask is not None else ""


def _load(space: str, name: str, s: LoadGlobal | LoadShared) -> str:
    other = f" other {format_const(s.other)}" if s.mask is not None else ""
    return f"load.{space} {name}[{s.index}]{_mask(s.mask)}{other}"


def _binary(s: Binary) -> str:
    if s.op.is_infix:
        return f"{s.a} {s.op.value} {s.b}"
    return f"{s.op.value} {s.a}, {s.b}"


_RHS: dict[type, Callable[..., str]] = {
    ThreadIdx: lambda s: "thread_idx",
    LaneId: lambda s: "lane_id",
    WarpId: lambda s: "warp_id",
    BlockIdx: lambda s: f"block_idx {_AXES[s.axis] if 0 <= s.axis < 3 else s.axis}",
    Const: lambda s: f"const {format_const(s.value)}",
    Unary: lambda s: f"{s.op.value} {s.x}",
    Binary: _binary,
    IntBinary: lambda s: f"{s.op.value} {s.a}, {s.b}",
    Select: lambda s: f"select {s.cond}, {s.a}, {s.b}",
    Cast: lambda s: f"cast {s.x}",
    Bitcast: lambda s: f"bitcast {s.x}",
    Pack: lambda s: f"pack {', '.join(str(p) for p in s.parts)}",
    Extract: lambda s: f"extract {s.vec}[{s.index}]",
    LoadGlobal: lambda s: _load("global", s.buffer.name, s),
    LoadShared: lambda s: _load("shared", s.alloc.name, s),
    Shuffle: lambda s: f"shfl.{s.kind.value} {s.value}, {s.lane} width {s.width}",
    LdMatrix: lambda s: f"ldmatrix.x{s.count}{'.trans' if s.trans else ''} {s.alloc.name}[{s.index}]",
    Mma: lambda s: f"mma.{s.shape.value} {s.a}, {s.b}, {s.c}",
    SharedAddress: lambda s: f"shared_address {s.alloc.name}",
    WgmmaDescriptor: lambda s: (f"wgmma_descriptor {s.address} leading {s.leading} stride {s.stride} "
                                f"swizzle {('none', '128B', '64B', '32B')[s.swizzle]}"),
    Wgmma: lambda s: (f"wgmma.{s.shape.value} " + (f"{s.a}" if s.a is not None else f"desc {s.a_desc}")
                      + f", desc {s.b_desc}{' n-major' if s.b_mn_major else ''}, {s.c if s.c is not None else 'zero'}"),
}

_BARE: dict[type, Callable[..., str]] = {
    Barrier: lambda s: "barrier",
    WgmmaFence: lambda s: "wgmma.fence",
    WgmmaCommit: lambda s: "wgmma.commit_group",
    WgmmaWait: lambda s: f"wgmma.wait_group {s.pending}",
    FenceProxyAsync: lambda s: "fence.proxy.async",
    MbarrierInit: lambda s: f"mbarrier.init {s.alloc.name}[{s.index}] count {s.count}",
    SetMaxNReg: lambda s: f"setmaxnreg.{'inc' if s.increase else 'dec'} {s.count}",
    MbarrierArrive: lambda s: (f"mbarrier.arrive {s.alloc.name}[{s.index}]"
                               + (f" expect_tx {s.tx_bytes}" if s.tx_bytes else "")),
    MbarrierWait: lambda s: f"mbarrier.wait {s.alloc.name}[{s.index}] parity {s.parity}",
    TmaLoad: lambda s: (f"tma.load {s.dst.name}[{s.dst_index}] <- {s.src.name}[{', '.join(str(c) for c in s.coords)}] "
                        f"box {'x'.join(map(str, s.box))} swizzle {('none', '128B', '64B', '32B')[s.swizzle]} "
                        f"barrier {s.barrier.name}[{s.barrier_index}]"),
}


def _emit_branch(stmts: tuple[Stmt, ...], yields: tuple[Reg, ...], indent: str, lines: list[str],
                 index: LineIndex | None) -> None:
    for inner in stmts:
        _emit_stmt(inner, indent, lines, index)
    if yields:
        lines.append(f"{indent}yield {', '.join(str(y) for y in yields)}")


def format_stmt(s: Stmt, indent: str = "") -> list[str]:
    """The lines of one statement (several for a loop or an if)."""
    lines: list[str] = []
    _emit_stmt(s, indent, lines, None)
    return lines


def _emit_stmt(s: Stmt, indent: str, lines: list[str], index: LineIndex | None) -> None:
    """Append `s`'s lines to `lines`, noting in `index` where it and each statement of its regions start."""
    note_line(index, s, len(lines))
    if isinstance(s, StoreGlobal | StoreShared):
        name = s.buffer.name if isinstance(s, StoreGlobal) else s.alloc.name
        space = "global" if isinstance(s, StoreGlobal) else "shared"
        lines.append(f"{indent}store.{space} {name}[{s.index}] = {s.value}{_mask(s.mask)}")
    elif type(s) in _BARE:
        lines.append(f"{indent}{_BARE[type(s)](s)}")
    elif isinstance(s, For):
        body = s.body
        head = ", ".join(_decl(r) for r in s.results)
        carried = ", ".join(f"{a} = {i}" for a, i in zip(body.args, s.inits))
        lines.append(f"{indent}{head + ' = ' if head else ''}for {_decl(body.iv)} = {s.start} to {s.stop} step {s.step}"
                     + (f" iter ({carried})" if carried else "") + " {")
        _emit_branch(body.stmts, body.yields, indent + "  ", lines, index)
        lines.append(f"{indent}}}")
    elif isinstance(s, If):
        head = ", ".join(_decl(r) for r in s.results)
        lines.append(f"{indent}{head + ' = ' if head else ''}if {s.cond} {{")
        _emit_branch(s.then.stmts, s.then.yields, indent + "  ", lines, index)
        if s.orelse.stmts or s.orelse.yields:
            lines.append(f"{indent}}} else {{")
            _emit_branch(s.orelse.stmts, s.orelse.yields, indent + "  ", lines, index)
        lines.append(f"{indent}}}")
    else:
        lines.append(f"{indent}{_decl(s.out)} = {_RHS[type(s)](s)}")


def format_param(p: Buffer | Reg) -> str:
    return f"{p.name}: {p.type}" if isinstance(p, Buffer) else _decl(p)


def simt_kernel_lines(k: SimtKernel, index: LineIndex | None = None) -> list[str]:
    """`format_simt_kernel`'s lines; with `index`, where each statement starts (for `excerpt.excerpt_at`)."""
    grid = "(" + ", ".join(str(g) for g in k.grid) + ("," if len(k.grid) == 1 else "") + ")"
    params = ", ".join(format_param(p) for p in k.params)
    bound = "" if k.min_blocks_per_sm is None else f", at least {k.min_blocks_per_sm} blocks an SM"
    dynamic = f", {k.shared_bytes} bytes of dynamic shared memory" if k.dynamic_shared else ""
    lines = [f"simt kernel {k.name}({params}) grid {grid} block {k.threads} "
             f"({k.warps} warp{'s' if k.warps != 1 else ''}{bound}{dynamic})"]
    lines += [f"  shared {a.name}: {a.type}" for a in k.shared]
    lines += [f"  size %{name} = {size}" for name, size in k.sizes]   # run-time extents the launch passes
    for s in k.body:
        _emit_stmt(s, "  ", lines, index)
    return lines


def format_simt_kernel(k: SimtKernel) -> str:
    """The kernel: signature, launch shape, shared allocations, then its statements."""
    return "\n".join(simt_kernel_lines(k))
