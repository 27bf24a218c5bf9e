"""The environment walker of the SIMT -> LLVM emission: registers to LLVM values, a rule per statement type."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from llvmlite import ir

from ...ir.errors import InternalError
from ...ir.simt import Reg, SimtKernel, Stmt
from ...ir.simt_printer import format_stmt


@dataclass(frozen=True, slots=True)
class LlvmOptions:
    """Choices of the NVPTX emission.

    `fast_math`: ``exp(x)`` as one ``ex2.approx.ftz(x * log2 e)`` (what fast attention
    kernels use; error grows with ``|x|``) instead of the range-reduced ~2-ulp form.
    """

    fast_math: bool = False


class Emitter:
    """Where code goes (`builder`), what each register is (`env`), and the module-level objects."""

    def __init__(self, kernel: SimtKernel, builder: ir.IRBuilder, rules: dict[type, Callable[[Stmt, "Emitter"], None]],
                 options: LlvmOptions) -> None:
        self.kernel, self.builder, self.rules, self.options = kernel, builder, rules, options
        self.env: dict[str, ir.Value] = {}
        self.buffers: dict[str, ir.Value] = {}
        self.shared: dict[str, ir.GlobalVariable] = {}
        self._blocks = 0

    @property
    def module(self) -> ir.Module:
        return self.builder.module

    def __getitem__(self, reg: Reg) -> ir.Value:
        try:
            return self.env[reg.name]
        except KeyError:
            raise InternalError(f"{reg} has no LLVM value (was the kernel verified?)", pass_name="simt_to_llvm") from None

    def set(self, reg: Reg, value: ir.Value) -> None:
        """Bind `reg` to `value`; an unnamed instruction takes the register's name (readable LLVM IR)."""
        if isinstance(value, ir.Instruction) and (not value.name or value.name.startswith(".")):
            value.name = reg.name
        self.env[reg.name] = value

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
