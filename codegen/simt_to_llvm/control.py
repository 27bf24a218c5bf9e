"""Structured control flow as LLVM IR: `For` as header/body/exit blocks with phis, `If` as a diamond."""
from __future__ import annotations

from typing import Callable

from llvmlite import ir

from ...ir.simt.nodes import For, If, Reg
from .emitter import Emitter
from .types import reg_type


def _bound(v: Reg | int, em: Emitter, typ: ir.Type) -> ir.Value:
    return em[v] if isinstance(v, Reg) else ir.Constant(typ, v)


def _for(s: For, em: Emitter) -> None:
    b, body = em.builder, s.body
    name = em.block_name("for")
    ivt = reg_type(body.iv.type)
    start, stop = _bound(s.start, em, ivt), _bound(s.stop, em, ivt)
    pre = b.block
    header = b.append_basic_block(f"{name}.header")
    loop = b.append_basic_block(f"{name}.body")
    done = b.append_basic_block(f"{name}.exit")
    b.branch(header)
    b.position_at_end(header)
    iv = b.phi(ivt, name=body.iv.name)
    iv.add_incoming(start, pre)
    carried = []
    for arg, init in zip(body.args, s.inits):
        phi = b.phi(reg_type(arg.type), name=arg.name)
        phi.add_incoming(em[init], pre)
        carried.append(phi)
    b.cbranch(b.icmp_signed("<", iv, stop), loop, done)
    b.position_at_end(loop)
    em.set(body.iv, iv)
    for arg, phi in zip(body.args, carried):
        em.set(arg, phi)
    em.emit(body.stmts)
    yields = [em[y] for y in body.yields]
    step = b.add(iv, ir.Constant(ivt, s.step), name=f"{body.iv.name}.next")
    latch = b.block
    iv.add_incoming(step, latch)
    for phi, value in zip(carried, yields):
        phi.add_incoming(value, latch)
    b.branch(header)
    b.position_at_end(done)
    for result, phi in zip(s.results, carried):   # the header's values when the loop exits
        em.set(result, phi)


def _if(s: If, em: Emitter) -> None:
    b = em.builder
    name = em.block_name("if")
    then = b.append_basic_block(f"{name}.then")
    has_else = bool(s.orelse.stmts or s.results)
    orelse = b.append_basic_block(f"{name}.else") if has_else else None
    merge = b.append_basic_block(f"{name}.end")
    b.cbranch(em[s.cond], then, orelse or merge)
    incoming = []
    for block, side in ((then, s.then), (orelse, s.orelse)):
        if block is None:
            continue
        b.position_at_end(block)
        em.emit(side.stmts)
        incoming.append(([em[y] for y in side.yields], b.block))
        b.branch(merge)
    b.position_at_end(merge)
    for i, result in enumerate(s.results):
        phi = b.phi(reg_type(result.type), name=result.name)
        for values, block in incoming:
            phi.add_incoming(values[i], block)
        em.set(result, phi)


RULES: dict[type, Callable[..., None]] = {
    For: _for,
    If: _if,
}
