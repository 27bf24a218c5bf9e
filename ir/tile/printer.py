"""Deterministic, readable text for the Tile IR (``lowered.stages["tile"]``).

Each op is one line ``%name: type = op operands``, loops are indented blocks::

    kernel softmax_0 grid (4,) params (x, m):
      %pid0: i32 = program_id 0
      %m_part: f32[16] = reduce max %x axis 1
      %m, %l = for %k: i32 = 0 to 1000 step 128 iter (%m_run = %m0, %l_run = %l0) {
        ...
        yield %m_new, %l_new
      }
      store m[%offs] = %m mask %mask

A top-k prints both results: ``%v: f32[16,2], %vi: i64[16,2] = topk %x, %xi axis 1 into (%v_run, %vi_run)``.
"""
from __future__ import annotations

from typing import Callable

from ..excerpt import LineIndex, note_line
from ..loop.printer import format_const
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
    TopK,
    TileProgram,
    Unary,
    Value,
)


def _decl(v: Value) -> str:
    return f"%{v.name}: {v.type}"


def _mask(m: Value | None) -> str:
    return f" mask {m}" if m is not None else ""


def _binary(op: Binary) -> str:
    if op.op.is_infix:
        return f"{op.a} {op.op.value} {op.b}"
    return f"{op.op.value} {op.a}, {op.b}"


_RHS: dict[type, Callable[..., str]] = {
    ProgramId: lambda op: f"program_id {op.axis}",
    Extent: lambda op: f"extent {op.size}",
    Constant: lambda op: f"const {format_const(op.value)}",
    Arange: lambda op: "arange",
    Unary: lambda op: f"{op.op.value} {op.x}",
    Binary: _binary,
    Select: lambda op: f"select {op.cond}, {op.a}, {op.b}",
    Cast: lambda op: f"cast {op.x}",
    Broadcast: lambda op: f"broadcast {op.x}",
    ExpandDims: lambda op: f"expand_dims {op.x} axis {op.axis}",
    Permute: lambda op: f"permute {op.x} ({', '.join(map(str, op.perm))})",
    Load: lambda op: f"load {op.buffer.name}[{op.offsets}]{_mask(op.mask)}"
                     + (f" other {format_const(op.other)}" if op.mask is not None else ""),
    Reduce: lambda op: f"reduce {op.op.value} {op.x} axis {op.axis}",
    Dot: lambda op: f"dot {op.a}, {op.b}" + (f" + {op.acc}" if op.acc is not None else "") + _held(op),
}


def _held(op: Dot) -> str:
    """The types numpy holds the dot's f32-computed operands in, where it holds them narrow."""
    held = [f"{side} as {d}" for side, d in zip("ab", op.held) if d is not None]
    return f" (numpy holds {' and '.join(held)})" if held else ""


def format_op(op: Op, indent: str = "") -> list[str]:
    """The lines of one op (several for a loop)."""
    lines: list[str] = []
    _emit_op(op, indent, lines, None)
    return lines


def _emit_op(op: Op, indent: str, lines: list[str], index: LineIndex | None) -> None:
    """Append `op`'s lines to `lines`, noting in `index` where it and each op of a loop body start."""
    note_line(index, op, len(lines))
    if isinstance(op, Store):
        lines.append(f"{indent}store {op.buffer.name}[{op.offsets}] = {op.value}{_mask(op.mask)}")
    elif isinstance(op, TopK):
        into = f" into ({op.acc}, {op.acc_indices})" if op.acc is not None else ""
        lines.append(f"{indent}{_decl(op.out)}, {_decl(op.out_indices)} = topk {op.x}, {op.indices} "
                     f"axis {op.axis}{into}")
    elif isinstance(op, For):
        body = op.body
        outs = ", ".join(_decl(r) for r in op.results)
        carried = ", ".join(f"{a} = {i}" for a, i in zip(body.args, op.inits))
        head = f"{outs} = " if op.results else ""
        lines.append(f"{indent}{head}for {_decl(body.iv)} = {op.start} to {op.stop} step {op.step}"
                     + (f" iter ({carried})" if carried else "") + " {")
        for inner in body.ops:
            _emit_op(inner, indent + "  ", lines, index)
        lines.append(f"{indent}  yield {', '.join(str(y) for y in body.yields)}")
        lines.append(f"{indent}}}")
    else:
        lines.append(f"{indent}{_decl(op.out)} = {_RHS[type(op)](op)}")


def kernel_lines(k: TileKernel, indent: str = "", index: LineIndex | None = None) -> list[str]:
    """`format_kernel`'s lines; with `index`, where each op starts (for `excerpt.excerpt_at`)."""
    grid = "(" + ", ".join(str(g) for g in k.grid) + ("," if len(k.grid) == 1 else "") + ")"
    lines = [f"{indent}kernel {k.name} grid {grid} params ({', '.join(b.name for b in k.params)}):"]
    for op in k.body:
        _emit_op(op, indent + "  ", lines, index)
    return lines


def format_kernel(k: TileKernel, indent: str = "") -> str:
    """A kernel: its header (grid and the global buffers it touches), then its ops."""
    return "\n".join(kernel_lines(k, indent))


def format_tile_program(p: TileProgram) -> str:
    """The whole program: signature, scratch buffers, then each kernel in launch order."""
    params = ", ".join(f"{b.name}: {b.type}" for b in p.inputs)
    outs = ", ".join(f"{b.name}: {b.type}" for b in p.outputs)
    lines = [f"tile program {p.name}({params}) -> ({outs})"]
    lines += [f"  scratch {b.name}: {b.type}" for b in p.scratch]
    lines += [format_kernel(k, "  ") for k in p.kernels]
    return "\n".join(lines)
