"""A fast LLVM IR *text* builder with the `llvmlite.ir` builder's interface, for the GPU emission.

`llvmlite.ir` builds a Python object per instruction and prints each through a
general formatter; for a 2 000-instruction attention kernel that was 30 ms, a
fifth of the whole compile. `TextModule` / `TextBuilder` take the same calls
the SIMT -> LLVM rules and the `codegen.nvvm` helpers make (``b.fadd(x, y)``,
``b.call(fn, args)``, ``b.phi(t)``, blocks, globals, metadata) and make each
instruction's text when it is built: its operands are final by then (a value
is named before anything reads it; `_Local.name` refuses a rename after a
read). Only a phi, whose incoming values arrive later, is printed at the end.
Text made at once holds no closures: the earlier deferred form kept a closure
and its cells per instruction, all of them cyclic garbage that the collector
had to walk after each compile.
Types and constants stay `llvmlite.ir` objects (their text is cached), so the
two builders mix freely in helpers; the text is the same LLVM IR up to value
names. Only what the GPU emission uses is here; the host (CPU) code generator
and the hand-built NVPTX samples keep using `llvmlite.ir`.
"""
from __future__ import annotations

import itertools
from contextlib import contextmanager
from typing import Iterable, Iterator, Sequence

from llvmlite import ir

from ..ir.errors import InternalError

_CMP = {"==": "eq", "!=": "ne", "<": "lt", "<=": "le", ">": "gt", ">=": "ge"}   # llvmlite's operators


def _ref(v) -> str:
    return v.get_reference()


def _typed(v) -> str:
    return f"{v.type} {v.get_reference()}"


class _Local:
    """A named local (an instruction's result or an argument), printed ``%"name"``; a name set later is
    made unique in the function's scope too, and only while nothing has read the value yet (the text
    that read it is made already)."""

    __slots__ = ("type", "_name", "_scope", "read")

    def __init__(self, typ: ir.Type, scope: "_Scope", name: str) -> None:
        self.type, self._scope = typ, scope
        self._name = scope.fresh(name)
        self.read = False      # whether an instruction's text names it already

    @property
    def name(self) -> str:
        return self._name

    @name.setter
    def name(self, value: str) -> None:
        if self.read:
            raise InternalError(f"renaming %{self._name} to {value!r} after an instruction read it",
                                pass_name="simt_to_llvm")
        self._name = self._scope.fresh(value)

    def get_reference(self) -> str:
        self.read = True
        return f'%"{self._name}"'


class TextValue(_Local):
    """An instruction's result and its text (without the ``%x =`` part, which is printed with the name
    the value has at the end)."""

    __slots__ = ("_line",)

    def __init__(self, typ: ir.Type, scope: "_Scope", name: str, line: str) -> None:
        super().__init__(typ, scope, name)
        self._line = line

    def render(self) -> str:
        return f'  %"{self._name}" = {self._line}'


class _Effect:
    """An instruction without a result (store, branch, a void call): its text."""

    __slots__ = ("_line",)

    def __init__(self, line: str) -> None:
        self._line = line

    def render(self) -> str:
        return f"  {self._line}"


class TextSlot:
    """A place kept in a block for instructions made later (`TextBuilder.reserve`): a value is emitted
    there only when something first reads it, yet sits where its statement was, so it dominates every
    read. Prints what was put there, in order (nothing if no one asked)."""

    __slots__ = ("function", "instructions")

    def __init__(self, function: "TextFunction") -> None:
        self.function = function
        self.instructions: list = []

    def render(self) -> str:
        return "\n".join(i.render() for i in self.instructions)


class _Phi(TextValue):
    """A phi: its incoming values arrive after it is made, so its text is made when it is printed."""

    __slots__ = ("incoming",)

    def __init__(self, typ: ir.Type, scope: "_Scope", name: str) -> None:
        super().__init__(typ, scope, name, "")
        self.incoming: list[tuple[object, "TextBlock"]] = []

    def add_incoming(self, value, block: "TextBlock") -> None:
        self.incoming.append((value, block))

    def render(self) -> str:
        incoming = ", ".join(f"[{_ref(v)}, {_ref(b)}]" for v, b in self.incoming)
        return f'  %"{self._name}" = phi {self.type} {incoming}'


class _Scope:
    """Unique local names of one function (``x``, ``x.1``, ...; unnamed values ``.N``)."""

    def __init__(self) -> None:
        self.used: set[str] = set()
        self.counter = itertools.count(1)
        # base name -> the next suffix to try: a function with thousands of blocks of one name (a masked store
        # per element) tried every suffix from 1 for each, quadratic (a fuzz example spent 500 s here)
        self.suffix: dict[str, int] = {}

    def fresh(self, name: str) -> str:
        if not name:
            name = f".{next(self.counter)}"
            while name in self.used:
                name = f".{next(self.counter)}"
        elif name in self.used:
            base, n = name, self.suffix.get(name, 1)
            while f"{base}.{n}" in self.used:
                n += 1
            name, self.suffix[base] = f"{base}.{n}", n + 1
        self.used.add(name)
        return name


class TextBlock:
    """A basic block: a label and its instructions."""

    __slots__ = ("name", "instructions", "function")

    def __init__(self, function: "TextFunction", name: str) -> None:
        self.function = function
        self.name = function.scope.fresh(name)
        self.instructions: list = []

    def get_reference(self) -> str:
        return f'%"{self.name}"'


class TextArgument(_Local):
    """A function argument (its attributes printed before its name)."""

    __slots__ = ("attributes",)

    def __init__(self, typ: ir.Type, scope: _Scope) -> None:
        super().__init__(typ, scope, "")
        self.attributes: list[str] = []

    def add_attribute(self, attribute: str) -> None:
        self.attributes.append(attribute)


class TextFunction:
    """A declaration, or (with blocks) the kernel's definition."""

    def __init__(self, module: "TextModule", function_type: ir.FunctionType, name: str) -> None:
        self.module, self.function_type, self.name = module, function_type, name
        self.calling_convention = ""
        self.scope = _Scope()
        self.args = [TextArgument(t, self.scope) for t in function_type.args]
        self.blocks: list[TextBlock] = []
        self.type = ir.PointerType()

    @property
    def return_type(self) -> ir.Type:
        return self.function_type.return_type

    def append_basic_block(self, name: str = "") -> TextBlock:
        block = TextBlock(self, name)
        self.blocks.append(block)
        return block

    def get_reference(self) -> str:
        return f'@"{self.name}"'

    def __str__(self) -> str:
        ret, params = self.function_type.return_type, self.function_type.args
        if not self.blocks:
            return f"declare {ret} @\"{self.name}\"({', '.join(str(p) for p in params)})"
        args = ", ".join(f"{a.type}{''.join(' ' + x for x in a.attributes)} {_ref(a)}" for a in self.args)
        cc = f"{self.calling_convention} " if self.calling_convention else ""
        lines = [f'define {cc}{ret} @"{self.name}"({args})', "{"]
        for block in self.blocks:
            lines.append(f"{block.name}:")
            lines += [text for text in (i.render() for i in block.instructions) if text]   # unused slots: ""
        lines.append("}")
        return "\n".join(lines)


class TextGlobal:
    """A module-level variable (the shared-memory arrays): ``@"name" = internal addrspace(3) global ...``."""

    def __init__(self, module: "TextModule", value_type: ir.Type, name: str, addrspace: int) -> None:
        self.module, self.value_type, self.name, self.addrspace = module, value_type, name, addrspace
        self.linkage = ""
        self.initializer = None
        self.align: int | None = None
        self.type = ir.PointerType(addrspace=addrspace)

    def get_reference(self) -> str:
        return f'@"{self.name}"'

    def __str__(self) -> str:
        space = f" addrspace({self.addrspace})" if self.addrspace else ""
        init = f" {self.initializer.get_reference()}" if self.initializer is not None else ""
        align = f", align {self.align}" if self.align else ""
        linkage = f"{self.linkage} " if self.linkage else ""
        return f'@"{self.name}" = {linkage}{space.strip()}{" " if space else ""}global {self.value_type}{init}{align}'


class TextModule:
    """Functions, globals and named metadata, printed as one LLVM module."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.triple = ""
        self.data_layout = ""
        self.globals: dict[str, object] = {}
        self._metadata: dict[str, list[list]] = {}

    def add_function(self, function_type: ir.FunctionType, name: str) -> TextFunction:
        fn = TextFunction(self, function_type, name)
        self.globals[name] = fn
        return fn

    def add_global_variable(self, value_type: ir.Type, name: str, addrspace: int = 0) -> TextGlobal:
        var = TextGlobal(self, value_type, name, addrspace)
        self.globals[name] = var
        return var

    def dispose(self) -> None:
        """Empty the module once printed: functions and blocks refer to each other, so without this its
        instructions would wait for the cyclic garbage collector, which walks them after every compile."""
        for g in self.globals.values():
            if isinstance(g, TextFunction):
                for block in g.blocks:
                    block.instructions.clear()
                g.blocks.clear()
        self.globals.clear()
        self._metadata.clear()

    def add_named_metadata(self, name: str, operands: Sequence) -> None:
        self._metadata.setdefault(name, []).append(list(operands))

    def __str__(self) -> str:
        lines = [f'; ModuleID = "{self.name}"', f'target triple = "{self.triple}"',
                 f'target datalayout = "{self.data_layout}"', ""]
        for g in self.globals.values():
            if isinstance(g, TextGlobal):
                lines += [str(g), ""]
        for g in self.globals.values():
            if isinstance(g, TextFunction):
                lines += [str(g), ""]
        number = 0
        nodes = []
        for name, entries in self._metadata.items():
            refs = []
            for ops in entries:
                text = ", ".join(_metadata_operand(op) for op in ops)
                nodes.append(f"!{number} = !{{{text}}}")
                refs.append(f"!{number}")
                number += 1
            lines.append(f"!{name} = !{{{', '.join(refs)}}}")
        lines += nodes
        return "\n".join(lines) + "\n"


def _metadata_operand(op) -> str:
    if isinstance(op, str):
        return f'!"{op}"'
    if isinstance(op, TextFunction):
        return f"ptr {op.get_reference()}"
    return _typed(op)


class TextBuilder:
    """The `llvmlite.ir.IRBuilder` calls the GPU emission makes, appending text records to a `TextBlock`."""

    def __init__(self, block: TextBlock) -> None:
        self.block = block

    # -- position ------------------------------------------------------------------------------------
    @property
    def function(self) -> TextFunction:
        return self.block.function

    @property
    def module(self) -> TextModule:
        return self.block.function.module

    def append_basic_block(self, name: str = "") -> TextBlock:
        return self.function.append_basic_block(name)

    def position_at_end(self, block: TextBlock) -> None:
        self.block = block

    def reserve(self) -> TextSlot:
        """A slot at the current position for instructions made later (`at`)."""
        slot = TextSlot(self.block.function)
        self.block.instructions.append(slot)
        return slot

    @contextmanager
    def at(self, slot: TextSlot) -> Iterator[None]:
        """Build into `slot` for the ``with`` body, then continue where the builder was."""
        here, self.block = self.block, slot
        try:
            yield
        finally:
            self.block = here

    # -- helpers -------------------------------------------------------------------------------------
    def _value(self, typ: ir.Type, name: str, line: str) -> TextValue:
        v = TextValue(typ, self.function.scope, name, line)
        self.block.instructions.append(v)
        return v

    def _effect(self, line: str) -> None:
        self.block.instructions.append(_Effect(line))

    def _binop(self, op: str, a, b, name: str = "", flags: Iterable[str] = ()) -> TextValue:
        prefix = " ".join((op, *flags))
        return self._value(a.type, name, f"{prefix} {_typed(a)}, {_ref(b)}")

    # -- arithmetic ----------------------------------------------------------------------------------
    def add(self, a, b, name: str = "", flags=()):
        return self._binop("add", a, b, name, flags)

    def sub(self, a, b, name: str = "", flags=()):
        return self._binop("sub", a, b, name, flags)

    def mul(self, a, b, name: str = "", flags=()):
        return self._binop("mul", a, b, name, flags)

    def sdiv(self, a, b, name: str = ""):
        return self._binop("sdiv", a, b, name)

    def srem(self, a, b, name: str = ""):
        return self._binop("srem", a, b, name)

    def shl(self, a, b, name: str = ""):
        return self._binop("shl", a, b, name)

    def lshr(self, a, b, name: str = ""):
        return self._binop("lshr", a, b, name)

    def ashr(self, a, b, name: str = ""):
        return self._binop("ashr", a, b, name)

    def and_(self, a, b, name: str = ""):
        return self._binop("and", a, b, name)

    def or_(self, a, b, name: str = ""):
        return self._binop("or", a, b, name)

    def xor(self, a, b, name: str = ""):
        return self._binop("xor", a, b, name)

    def fadd(self, a, b, name: str = ""):
        return self._binop("fadd", a, b, name)

    def fsub(self, a, b, name: str = ""):
        return self._binop("fsub", a, b, name)

    def fmul(self, a, b, name: str = ""):
        return self._binop("fmul", a, b, name)

    def fdiv(self, a, b, name: str = ""):
        return self._binop("fdiv", a, b, name)

    def fneg(self, x, name: str = ""):
        return self._value(x.type, name, f"fneg {_typed(x)}")

    # -- comparisons and select ----------------------------------------------------------------------
    def _cmp(self, kind: str, pred: str, a, b, name: str) -> TextValue:
        typ = ir.VectorType(ir.IntType(1), a.type.count) if isinstance(a.type, ir.VectorType) else ir.IntType(1)
        return self._value(typ, name, f"{kind} {pred} {_typed(a)}, {_ref(b)}")

    def icmp_signed(self, op: str, a, b, name: str = ""):
        pred = _CMP[op]
        return self._cmp("icmp", pred if pred in ("eq", "ne") else "s" + pred, a, b, name)

    def icmp_unsigned(self, op: str, a, b, name: str = ""):
        pred = _CMP[op]
        return self._cmp("icmp", pred if pred in ("eq", "ne") else "u" + pred, a, b, name)

    def fcmp_ordered(self, op: str, a, b, name: str = ""):
        return self._cmp("fcmp", op if op == "ord" else "o" + _CMP[op], a, b, name)

    def fcmp_unordered(self, op: str, a, b, name: str = ""):
        return self._cmp("fcmp", op if op == "uno" else "u" + _CMP[op], a, b, name)

    def select(self, cond, a, b, name: str = ""):
        return self._value(a.type, name, f"select {_typed(cond)}, {_typed(a)}, {_typed(b)}")

    # -- conversions ---------------------------------------------------------------------------------
    def _cast(self, op: str, x, typ: ir.Type, name: str) -> TextValue:
        return self._value(typ, name, f"{op} {_typed(x)} to {typ}")

    def bitcast(self, x, typ, name: str = ""):
        return self._cast("bitcast", x, typ, name)

    def zext(self, x, typ, name: str = ""):
        return self._cast("zext", x, typ, name)

    def ptrtoint(self, x, typ, name: str = ""):
        return self._cast("ptrtoint", x, typ, name)

    def sext(self, x, typ, name: str = ""):
        return self._cast("sext", x, typ, name)

    def trunc(self, x, typ, name: str = ""):
        return self._cast("trunc", x, typ, name)

    def fpext(self, x, typ, name: str = ""):
        return self._cast("fpext", x, typ, name)

    def fptrunc(self, x, typ, name: str = ""):
        return self._cast("fptrunc", x, typ, name)

    def sitofp(self, x, typ, name: str = ""):
        return self._cast("sitofp", x, typ, name)

    def fptosi(self, x, typ, name: str = ""):
        return self._cast("fptosi", x, typ, name)

    def uitofp(self, x, typ, name: str = ""):
        return self._cast("uitofp", x, typ, name)

    def addrspacecast(self, x, typ, name: str = ""):
        return self._cast("addrspacecast", x, typ, name)

    # -- vectors and aggregates ----------------------------------------------------------------------
    def extract_element(self, vec, index, name: str = ""):
        return self._value(vec.type.element, name, f"extractelement {_typed(vec)}, {_typed(index)}")

    def insert_element(self, vec, value, index, name: str = ""):
        return self._value(vec.type, name, f"insertelement {_typed(vec)}, {_typed(value)}, {_typed(index)}")

    def shuffle_vector(self, a, b, mask, name: str = ""):
        typ = ir.VectorType(a.type.element, mask.type.count)
        return self._value(typ, name, f"shufflevector {_typed(a)}, {_typed(b)}, {_typed(mask)}")

    def extract_value(self, agg, index: int, name: str = ""):
        return self._value(agg.type.elements[index], name, f"extractvalue {_typed(agg)}, {index}")

    # -- memory --------------------------------------------------------------------------------------
    def gep(self, ptr, indices, inbounds: bool = False, name: str = "", source_etype=None):
        kw = "getelementptr inbounds" if inbounds else "getelementptr"
        return self._value(ptr.type, name, f"{kw} {source_etype}, {_typed(ptr)}, " + ", ".join(_typed(i) for i in indices))

    def load(self, ptr, name: str = "", align: int | None = None, typ=None):
        tail = f", align {align}" if align else ""
        return self._value(typ, name, f"load {typ}, {_typed(ptr)}{tail}")

    def store(self, value, ptr, align: int | None = None) -> None:
        tail = f", align {align}" if align else ""
        self._effect(f"store {_typed(value)}, {_typed(ptr)}{tail}")

    # -- calls and control flow ----------------------------------------------------------------------
    def call(self, fn, args, name: str = ""):
        ret = fn.function_type.return_type
        text = f"call {ret} {_ref(fn)}(" + ", ".join(_typed(a) for a in args) + ")"
        if isinstance(ret, ir.VoidType):
            self._effect(text)
            return None
        return self._value(ret, name, text)

    def phi(self, typ, name: str = "") -> _Phi:
        p = _Phi(typ, self.function.scope, name)
        self.block.instructions.append(p)
        return p

    def branch(self, target: TextBlock) -> None:
        self._effect(f"br label {_ref(target)}")

    def cbranch(self, cond, then: TextBlock, orelse: TextBlock) -> None:
        self._effect(f"br {_typed(cond)}, label {_ref(then)}, label {_ref(orelse)}")

    def ret_void(self) -> None:
        self._effect("ret void")


__all__ = ["TextModule", "TextBuilder", "TextFunction", "TextGlobal", "TextValue", "TextBlock", "TextSlot"]
