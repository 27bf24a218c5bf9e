"""The environment walker of the SIMT -> LLVM emission: registers to LLVM values, a rule per statement type."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from llvmlite import ir

from ...ir.errors import InternalError
from ..llvm_text import TextBuilder, TextModule, TextSlot, TextValue
from ..nvvm import i32
from ...ir.simt.nodes import For, If, Mma, Pack, Reg, SimtKernel, Stmt, Wgmma, uses, walk_stmts
from ...ir.simt.printer import format_stmt


@dataclass(frozen=True, slots=True)
class LlvmOptions:
    """Choices of the NVPTX emission.

    `fast_math`: ``exp(x)`` as one ``ex2.approx.ftz(x * log2 e)`` (what fast attention
    kernels use; error grows with ``|x|``) instead of the range-reduced ~2-ulp form.
    """

    fast_math: bool = False


class Emitter:
    """Where code goes (`builder`), what each register is (`env`), and the module-level objects."""

    def __init__(self, kernel: SimtKernel, builder: TextBuilder, rules: dict[type, Callable[[Stmt, "Emitter"], None]],
                 options: LlvmOptions) -> None:
        self.kernel, self.builder, self.rules, self.options = kernel, builder, rules, options
        self.env: dict[str, ir.Value] = {}
        self.lanes: dict[str, list[ir.Value]] = {}     # a register's elements as scalars, where known
        # derived values: per basic block under `in_block` (mma operand registers), kernel-wide under keys
        # of their own (an index's known zero bits, an ldmatrix's words)
        self.memo: dict[tuple, object] = {}
        self.buffers: dict[str, ir.Value] = {}
        self.shared: dict[str, ir.GlobalVariable] = {}
        self.tensor_maps: dict[str, ir.Value] = {}     # a TMA source buffer's CUtensorMap parameter (generic, i64)
        # each register's defining statement (the statements with one result)
        self.defs = {s.out.name: s for s in walk_stmts(kernel.body) if isinstance(getattr(s, "out", None), Reg)}
        mma_results = {name for name, s in self.defs.items() if isinstance(s, Mma)}
        self.vector_uses = _vector_uses(kernel, mma_results) if mma_results else set()   # read by `set_lanes` only
        # A call anywhere in a kernel serializes its wgmmas (ptxas C7509), and IEEE division and square root
        # are calls: such a kernel computes them in straight-line code (codegen/correctly_rounded.py), with the
        # same results.
        self.without_calls = any(isinstance(s, Wgmma) for s in self.defs.values())
        self._blocks = 0

    @property
    def module(self) -> TextModule:
        return self.builder.module

    def dispose(self) -> None:
        """Drop what the emission kept (registers' values, memos) once the kernel is emitted: the deferred
        values' closures refer back to this emitter, and without this the whole graph would wait for
        the cyclic garbage collector."""
        self.env.clear()
        self.lanes.clear()
        self.memo.clear()

    def __getitem__(self, reg: Reg) -> ir.Value:
        try:
            value = self.env[reg.name]
        except KeyError:
            raise InternalError(f"{reg} has no LLVM value (was the kernel verified?)", pass_name="simt_to_llvm") from None
        if value.__class__ is _Deferred:
            with self.builder.at(value.slot):
                value.make()
            value = self.env[reg.name]
        return value

    def defer(self, reg: Reg, make: Callable[[], None]) -> None:
        """Bind `reg` on its first read: `make()` (which `set`s it) runs then, its instructions put in a slot
        kept here, where the statement is, so they dominate every read. For the plumbing that the mma path
        reads around (a fragment's vector, the packs and slices of it): never read, it is never written,
        and neither LLVM's parser nor its InstCombine meets it."""
        self.env[reg.name] = _Deferred(make, self.builder.reserve())

    def in_block(self, key: tuple, make: Callable[[], object]) -> object:
        """`make()`, once per `key` and basic block (a value made in one block is reused only there, where
        it certainly dominates the use)."""
        full = (id(self.builder.block),) + key
        found = self.memo.get(full)
        if found is None:
            found = self.memo[full] = make()
        return found

    def set(self, reg: Reg, value: ir.Value) -> None:
        """Bind `reg` to `value`; an unnamed instruction nothing has read yet takes the register's name
        (readable LLVM IR)."""
        if isinstance(value, TextValue) and not value.read and (not value.name or value.name.startswith(".")):
            value.name = reg.name
        self.env[reg.name] = value

    def set_lanes(self, reg: Reg, values: list[ir.Value], vector_type: ir.Type) -> None:
        """Bind `reg` to its elements; the vector itself is built only when something other than an mma
        accumulator reads `reg` (see `_vector_uses`)."""
        self.lanes[reg.name] = values
        if reg.name in self.vector_uses:
            vec: ir.Value = ir.Constant(vector_type, ir.Undefined)
            for i, value in enumerate(values):
                vec = self.builder.insert_element(vec, value, i32(i))
            self.set(reg, vec)

    def elements(self, reg: Reg) -> list[ir.Value]:
        """`reg`'s elements as scalars (extracted from its vector unless known already)."""
        found = self.lanes.get(reg.name)
        if found is None:
            vec = self[reg]
            found = [self.builder.extract_element(vec, i32(i)) for i in range(reg.length)]
        return found

    def block_name(self, kind: str) -> str:
        """A fresh, readable basic-block name prefix (``for3``, ``if4``)."""
        self._blocks += 1
        return f"{kind}{self._blocks}"

    def emit(self, stmts: tuple[Stmt, ...]) -> None:
        """Emit statements in order at the builder's position."""
        for s in stmts:
            rule = self.rules.get(type(s))
            if rule is None:
                raise InternalError(f"no LLVM rule for {type(s).__name__}", pass_name="simt_to_llvm",
                                    context="\n".join(format_stmt(s)))
            rule(s, self)


@dataclass(frozen=True, slots=True)
class _Deferred:
    """A register's value not emitted yet (`Emitter.defer`)."""

    make: Callable[[], None]
    slot: TextSlot


def deferred(rule: Callable[[Stmt, "Emitter"], None]) -> Callable[[Stmt, "Emitter"], None]:
    """`rule` for a pure one-result statement, run only when its result is first read (`Emitter.defer`)."""
    def run_when_read(s: Stmt, em: "Emitter") -> None:
        em.defer(s.out, lambda: rule(s, em))  # type: ignore[attr-defined]

    run_when_read.__doc__ = rule.__doc__
    return run_when_read


def _vector_uses(kernel: SimtKernel, mma_results: set[str]) -> set[str]:
    """Registers read as whole vectors: by any statement or yield, except an `Mma` result (one of
    `mma_results`) read as the next mma's accumulator or as a `Pack` part. An mma chain (``d = a b + c``
    down a k loop) passes its accumulator as four scalars, so a result becomes a vector only when
    something else reads it."""
    used: set[str] = set()
    for s in walk_stmts(kernel.body):
        if isinstance(s, Mma):
            read: tuple = (s.a, s.b)
        elif isinstance(s, Pack):   # packs take an mma result's elements one by one
            read = tuple(p for p in s.parts if p.name not in mma_results)
        else:
            read = uses(s)
        used.update(r.name for r in read if isinstance(r, Reg))
        if isinstance(s, For):
            used.update(r.name for r in s.body.yields)
        elif isinstance(s, If):
            used.update(r.name for r in s.then.yields + s.orelse.yields)
    return used
