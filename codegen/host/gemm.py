"""A tile ``dot`` as a register-blocked micro-kernel: the GEMM core of the host code generator.

``out[m, n] = acc + a[m, k] @ b[k, n]`` with both operands materialized row-major in stack arrays
(`plan.py`). The plain loop nest ``for i, k: for j: out[i, j] += a[i, k] * b[k, j]`` vectorizes along
``j`` but loads and stores ``out[i, j]`` for every multiply-add: two loads and a store per vector FMA,
which bounds it by the load/store ports at a fraction of the FMA units' rate. Here the output is cut
into blocks of ``MR`` rows by ``NV`` vectors of ``VW`` lanes, each block's ``MR x NV`` accumulators stay
in vector registers across the whole ``k`` loop, and each step loads ``NV`` vectors of ``b``'s row
``k`` and broadcasts ``MR`` elements of ``a``'s column ``k``: ``MR * NV`` FMAs for ``NV`` loads and
``MR`` broadcasts. Operands of a tile are already in L1 (the schedule's blocks are tens of KiB), so no
packing is needed: ``b``'s rows are contiguous and ``a``'s elements are scalar loads.

The shape of the block follows the host's vector registers (LLVM's host features, part of the compile
cache's key): ``VW`` lanes of the widest vector (64 bytes with AVX-512, 32 with AVX/AVX2, 16 else),
and ``MR * NV`` accumulators plus ``NV`` operand vectors and a broadcast fitting the register file
(32 vector registers with AVX-512, 16 else). ``MR`` divides ``m`` and ``NV * VW`` divides ``n``;
a dot the block does not tile (``n`` not a multiple of ``VW``), or with operands of another dtype than
its result (the narrow-operand casts), keeps the loop nest. Each output element is the same sum of
products in the same ``k`` order as the loop nest computes (one rounding per FMA where LLVM fuses
``fmuladd``, as the nest's ``contract`` flags allow).
"""
from __future__ import annotations

from dataclasses import dataclass

import llvmlite.ir as ir

from ...ir.tile import nodes as t
from ...ir.types import float32, float64
from ..llvm_dtypes import memory_type
from ..llvm_utils import I32, I64, call_intrinsic, counted_loop, entry_alloca
from ..native import host_target
from .emitter import KernelEmitter, Slot


@dataclass(frozen=True)
class Block:
    """One micro-kernel block: `rows` output rows by `vectors` vectors of `lanes` elements."""

    rows: int
    vectors: int
    lanes: int

    @property
    def cols(self) -> int:
        return self.vectors * self.lanes


def vector_registers() -> tuple[int, int]:
    """(bytes per vector register, number of vector registers) of this host."""
    features = set(host_target().features.split(","))
    if "+avx512f" in features:
        return 64, 32
    if "+avx" in features:
        return 32, 16
    return 16, 16


def choose_block(m: int, n: int, itemsize: int) -> Block | None:
    """The micro-kernel block for an ``m x n`` output of `itemsize`-byte elements (None: keep the nest)."""
    width, registers = vector_registers()
    lanes = width // itemsize
    if n % lanes:
        return None
    for vectors in (2, 1):
        if (n // lanes) % vectors:
            continue
        # accumulators + one operand vector each + one broadcast within the register file
        limit = min(14, (registers - vectors - 1) // vectors)
        rows = max(r for r in range(1, min(limit, m) + 1) if m % r == 0)
        if rows >= 2 or vectors == 1:
            return Block(rows, vectors, lanes)
    return None


def emit_register_blocked_dot(em: KernelEmitter, op: t.Dot, out: Slot) -> bool:
    """``out += a @ b`` as the micro-kernel (`out` already holds the accumulator); False where the dot is not
    one it computes (the caller then emits the loop nest)."""
    d = op.out.dtype
    if d not in (float32, float64) or op.a.dtype != d or op.b.dtype != d:
        return False
    a_slot, b_slot = em.slots.get(op.a.name), em.slots.get(op.b.name)
    if a_slot is None or b_slot is None:
        return False
    m, n = op.out.shape
    k = op.a.shape[1]
    block = choose_block(m, n, d.itemsize)
    if block is None:
        return False
    b = em.b
    scalar = memory_type(d)
    vec = ir.VectorType(scalar, block.lanes)
    accs = [[entry_alloca(b, vec, name=f"{op.out.name}.c{r}_{v}") for v in range(block.vectors)]
            for r in range(block.rows)]
    zeros = ir.Constant(ir.VectorType(I32, block.lanes), [0] * block.lanes)
    fma = f"llvm.fmuladd.v{block.lanes}{'f32' if d == float32 else 'f64'}"

    def element(slot: Slot, row: ir.Value, col: ir.Value) -> ir.Value:
        return em.address(slot, (row, col))

    with em.loop(m // block.rows, f"{op.out.name}.mb") as ib:
        i0 = b.mul(ib, ir.Constant(I64, block.rows), flags=("nsw", "nuw"))
        rows = [i0 if r == 0 else b.add(i0, ir.Constant(I64, r), flags=("nsw", "nuw")) for r in range(block.rows)]
        with em.loop(n // block.cols, f"{op.out.name}.nb") as jb:
            j0 = b.mul(jb, ir.Constant(I64, block.cols), flags=("nsw", "nuw"))
            cols = [j0 if v == 0 else b.add(j0, ir.Constant(I64, v * block.lanes), flags=("nsw", "nuw"))
                    for v in range(block.vectors)]
            for r, row in enumerate(rows):
                for v, col in enumerate(cols):
                    b.store(b.load(element(out, row, col), typ=vec, align=d.itemsize), accs[r][v])
            with counted_loop(b, ir.Constant(I64, 0), ir.Constant(I64, k), name=f"{op.out.name}.k") as kk:
                bv = [b.load(element(b_slot, kk, col), typ=vec, align=d.itemsize) for col in cols]
                for r, row in enumerate(rows):
                    x = b.load(element(a_slot, row, kk), typ=scalar)
                    splat = b.shuffle_vector(b.insert_element(ir.Constant(vec, ir.Undefined), x,
                                                              ir.Constant(I32, 0)),
                                             ir.Constant(vec, ir.Undefined), zeros)
                    for v in range(block.vectors):
                        acc = b.load(accs[r][v], typ=vec)
                        b.store(call_intrinsic(b, fma, vec, [splat, bv[v], acc]), accs[r][v])
            for r, row in enumerate(rows):
                for v, col in enumerate(cols):
                    b.store(b.load(accs[r][v], typ=vec), element(out, row, col), align=d.itemsize)
    return True
