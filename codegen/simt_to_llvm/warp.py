"""Barriers, warp shuffles, ldmatrix and tensor-core mma as LLVM IR (``codegen.nvvm`` / ``codegen.nvvm_mma``).

Mma fragments are SIMT vectors in `fragment_a/b/c` order; the intrinsics want
them as 32-bit registers: f16 pairs as ``<2 x half>``, bf16 pairs and e4m3
quads as i32 (low element in the low bits, which is how a little-endian
``bitcast`` of the vector packs them).
"""
from __future__ import annotations

from typing import Callable

from llvmlite import ir

from ...ir.simt.nodes import Barrier, Extract, LdMatrix, Mma, MmaShape, Pack, Reg, Shuffle, ShuffleKind
from .. import nvvm, nvvm_mma
from ..nvvm import HALF2, I32, i32
from .emitter import Emitter
from .types import mem_type, reg_type

_SHUFFLE = {ShuffleKind.BFLY: nvvm.shfl_bfly, ShuffleKind.IDX: nvvm.shfl_idx, ShuffleKind.DOWN: nvvm.shfl_down}
_MMA = {MmaShape.M16N8K16_F16: nvvm_mma.mma_m16n8k16_f16_f32,
        MmaShape.M16N8K16_BF16: nvvm_mma.mma_m16n8k16_bf16_f32,
        MmaShape.M16N8K32_E4M3: nvvm_mma.mma_m16n8k32_e4m3_f32}


def _shuffle(s: Shuffle, em: Emitter) -> None:
    lane = em[s.lane] if isinstance(s.lane, Reg) else s.lane
    em.set(s.out, _SHUFFLE[s.kind](em.builder, em[s.value], lane, width=s.width))


def _ldmatrix(s: LdMatrix, em: Emitter) -> None:
    """The tiles' i32 words (two elements each); `s.out` is them gathered into one vector and reinterpreted,
    built only if something reads it as a vector (an mma takes the words, `_loaded_words`)."""
    b = em.builder
    ptr = nvvm.shared_gep(b, em.shared[s.alloc.name], mem_type(s.alloc.dtype), em[s.index])
    words = nvvm_mma.ldmatrix(b, ptr, s.count, trans=s.trans)
    em.memo[("ldmatrix words", s.out.name)] = words

    def vector() -> None:
        vec: ir.Value = ir.Constant(ir.VectorType(I32, s.count), ir.Undefined)
        for i, word in enumerate(words):
            vec = b.insert_element(vec, word, i32(i))
        em.set(s.out, b.bitcast(vec, reg_type(s.out.type)))

    em.defer(s.out, vector)


def _loaded_words(em: Emitter, reg: Reg) -> list[ir.Value] | None:
    """`reg`'s 32-bit words as an ``ldmatrix`` gave them, when `reg` is (a word-aligned slice of a pack of)
    ldmatrix results -- how the SIMT lowering hands mma its operands -- else None."""
    source, start = reg, 0
    made = em.defs.get(reg.name)
    if isinstance(made, Extract):
        source, start = made.vec, made.index
        made = em.defs.get(source.name)
    if isinstance(made, Pack):
        for part in made.parts:
            if start < part.length:
                source, made = part, em.defs.get(part.name)
                break
            start -= part.length
    words = em.memo.get(("ldmatrix words", source.name)) if isinstance(made, LdMatrix) else None
    per_word = 4 // reg.dtype.itemsize
    if words is None or start % per_word or start + reg.length > source.length:
        return None
    return words[start // per_word:(start + reg.length) // per_word]  # type: ignore[index]


def _registers(em: Emitter, reg: Reg, shape: MmaShape) -> list[ir.Value]:
    """A fragment vector as the intrinsic's 32-bit operand registers (made once per block: an A fragment
    feeds every n-tile's mma of its k-step); taken straight from the ``ldmatrix`` words where it came from
    one (no vector built and taken apart again)."""
    def make() -> list[ir.Value]:
        b = em.builder
        regs = _loaded_words(em, reg)
        if regs is None:
            count = reg.type.nbytes // 4
            words = b.bitcast(em[reg], ir.VectorType(I32, count))
            regs = [b.extract_element(words, i32(r)) for r in range(count)]
        return [b.bitcast(r, HALF2) for r in regs] if shape is MmaShape.M16N8K16_F16 else regs

    return em.in_block(("mma operand", reg.name, shape), make)  # type: ignore[return-value]


def _mma(s: Mma, em: Emitter) -> None:
    d = _MMA[s.shape](em.builder, _registers(em, s.a, s.shape), _registers(em, s.b, s.shape), em.elements(s.c))
    em.set_lanes(s.out, d, reg_type(s.out.type))


RULES: dict[type, Callable[..., None]] = {
    Barrier: lambda s, em: nvvm.barrier(em.builder),
    Shuffle: _shuffle,
    LdMatrix: _ldmatrix,
    Mma: _mma,
}
