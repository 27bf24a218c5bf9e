"""The load check of host object code: an ELF relocatable object is read in pure Python before MCJIT sees it.

MCJIT trusts the object it links: a truncated file, a section or relocation
pointing outside the data, a relocation type RuntimeDyld does not implement or an
object for another machine ends in a segfault or an LLVM abort, which no Python
code can catch. `check_host_object` therefore reads the object itself, with
bounds checked at every step (nothing here can crash), and raises `BadObject`
(a `ValueError`) naming the first problem:

- header: ELF magic, 64-bit, the host's byte order, ``ET_REL``, the host's
  ``e_machine`` (from LLVM's host triple), no program headers; the section
  header table and every section's bytes inside the payload;
- symbols: one symbol table with its string table; every symbol's name inside
  it, its kind one LLVM writes, its section a real one (or undefined or absolute)
  and its extent inside that section; every kernel symbol the caller expects defined once, as a global
  function in an allocated, executable section; every undefined symbol one the
  process provides (MCJIT aborts on an unresolved one) or one the JIT linker
  makes itself (x86-64's ``_GLOBAL_OFFSET_TABLE_``);
- relocations: each section's entries refer to a real symbol (not a file one)
  and patch bytes inside their target section, with a type from the machine's
  table (`runtime.object_machines`, which says which types and why);
- ``.eh_frame`` (MCJIT registers it with the unwinder): a chain of records that
  ends inside the section, each FDE pointing back at a CIE.

Each rule closes a way a bad object crashed or aborted the process: besides the
obvious (garbage, truncation, another machine), a fuzzing campaign that mutated
the headers, symbol and relocation tables of real objects and linked whatever
passed found an empty section with an offset past the end of the file, an
undefined section symbol, a common-typed symbol and a relocation against a file
symbol, each of which LLVM aborts on.

What a structural check cannot see is whether the code bytes are the ones LLVM
emitted; the compile cache's build record (the payload's sha256 in the entry's
metadata) covers that against corruption.
"""
from __future__ import annotations

import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from .object_machines import Machine

__all__ = ["BadObject", "check_host_object"]


class BadObject(ValueError):
    """A host object that must not be handed to MCJIT; the message says why."""


# ELF constants (System V gABI).
_ET_REL, _EV_CURRENT = 1, 1
_SHT_SYMTAB, _SHT_STRTAB, _SHT_RELA, _SHT_NOBITS, _SHT_REL, _SHT_PROGBITS = 2, 3, 4, 8, 9, 1
_SHF_ALLOC, _SHF_EXECINSTR, _SHF_TLS, _SHF_COMPRESSED = 0x2, 0x4, 0x400, 0x800
_SHN_UNDEF, _SHN_LORESERVE, _SHN_ABS = 0, 0xFF00, 0xFFF1
_STT_NOTYPE, _STT_OBJECT, _STT_FUNC, _STT_FILE = 0, 1, 2, 4
_STB_GLOBAL, _STB_WEAK = 1, 2
_MAX_SECTIONS = 4096      # an LLVM object of one module has a few dozen
_MAX_ALIGN = 4096         # LLVM aligns kernel code and constants to 64 bytes at most
_MAX_ZEROED = 256 << 20   # bytes MCJIT would allocate for a zero-filled (NOBITS) section


@dataclass(frozen=True)
class _Section:
    index: int
    name: bytes
    type: int
    flags: int
    offset: int
    size: int
    link: int
    info: int
    entsize: int

    def label(self) -> str:
        return f"section {self.index} ({self.name.decode('ascii', 'replace') or '<unnamed>'})"


@dataclass(frozen=True)
class _Symbol:
    index: int
    name: bytes
    type: int
    bind: int
    shndx: int
    value: int
    size: int


class _Reader:
    """Bounds-checked little/big-endian reads from the payload."""

    def __init__(self, data: bytes, little: bool) -> None:
        self.data = data
        self.order = "<" if little else ">"

    def unpack(self, fmt: str, offset: int, what: str) -> tuple:
        layout = struct.Struct(self.order + fmt)
        if offset < 0 or offset + layout.size > len(self.data):
            raise BadObject(f"{what} at byte {offset} lies outside the {len(self.data)}-byte object")
        return layout.unpack_from(self.data, offset)


def check_host_object(data: bytes, machine: Machine, symbols: Iterable[str],
                      resolvable: Callable[[str], bool]) -> None:
    """Raise `BadObject` unless `data` is an ELF object MCJIT can link safely on `machine` (module docstring).

    `symbols`: the kernel functions the caller will look up; `resolvable(name)`:
    whether the process provides an undefined symbol.
    """
    if not isinstance(data, (bytes, bytearray)):
        raise BadObject(f"expected bytes, got {type(data).__name__}")
    try:
        _check(bytes(data), machine, list(symbols), resolvable)
    except BadObject:
        raise
    except (struct.error, IndexError, ValueError, UnicodeError) as err:  # a gap in the checks: still a refusal
        raise BadObject(f"unreadable object ({type(err).__name__}: {err})") from None


def _check(data: bytes, machine: Machine, symbols: list[str], resolvable: Callable[[str], bool]) -> None:
    reader = _header(data, machine)
    sections = _sections(reader)
    symtab, table = _symbols(reader, sections)
    _check_symbols(table, sections, machine, resolvable)
    _check_kernels(table, sections, symbols)
    for section in sections:
        if section.type in (_SHT_RELA, _SHT_REL):
            _check_relocations(reader, section, sections, symtab, table, machine)
        if section.name == b".eh_frame" and section.type != _SHT_NOBITS:
            _check_eh_frame(reader, section)


def _header(data: bytes, machine: Machine) -> _Reader:
    if len(data) < 64:
        raise BadObject(f"{len(data)} bytes, shorter than an ELF header")
    if data[:4] != b"\x7fELF":
        raise BadObject(f"not an ELF object (starts with {data[:4]!r})")
    if data[4] != 2:
        raise BadObject(f"ELF class {data[4]}, expected 2 (64-bit)")
    if data[5] != (1 if machine.little_endian else 2):
        raise BadObject(f"byte order {'little' if data[5] == 1 else 'big' if data[5] == 2 else data[5]}-endian, "
                        f"expected {'little' if machine.little_endian else 'big'}-endian for {machine.name}")
    reader = _Reader(data, machine.little_endian)
    (e_type, e_machine, version, _entry, phoff, shoff, _flags, ehsize, _phentsize, phnum, shentsize, shnum,
     shstrndx) = reader.unpack("HHIQQQIHHHHHH", 16, "the ELF header")
    if e_type != _ET_REL:
        raise BadObject(f"ELF type {e_type}, expected {_ET_REL} (a relocatable object)")
    if e_machine != machine.e_machine:
        raise BadObject(f"an object for ELF machine {e_machine}, this host ({machine.name}) is {machine.e_machine}")
    if version != _EV_CURRENT or ehsize != 64 or shentsize != 64:
        raise BadObject(f"unexpected ELF header (version {version}, header size {ehsize}, "
                        f"section header size {shentsize})")
    if phoff or phnum:
        raise BadObject("a relocatable object with program headers")
    if not 0 < shnum <= _MAX_SECTIONS or not 0 < shstrndx < shnum:
        raise BadObject(f"{shnum} sections with names in section {shstrndx}")
    if shoff % 8 or shoff + 64 * shnum > len(data):
        raise BadObject(f"the section header table (at {shoff}, {shnum} entries) lies outside the object")
    return reader


def _sections(reader: _Reader) -> list[_Section]:
    shoff, shnum, shstrndx = reader.unpack("Q", 40, "e_shoff")[0], *reader.unpack("HH", 60, "e_shnum")
    raw = [reader.unpack("IIQQQQIIQQ", shoff + 64 * i, f"section header {i}") for i in range(shnum)]
    size = len(reader.data)
    for i, (_name, kind, flags, _addr, offset, length, _link, _info, align, _entsize) in enumerate(raw):
        if kind != _SHT_NOBITS and offset + length > size:   # LLVM reads the offset of an empty one too
            raise BadObject(f"section {i} (bytes {offset}..{offset + length}) lies outside the {size}-byte object")
        if kind == _SHT_NOBITS and length > _MAX_ZEROED:
            raise BadObject(f"section {i} asks for {length} zeroed bytes")
        if align & (align - 1) or align > _MAX_ALIGN:
            raise BadObject(f"section {i} has alignment {align} (a power of two up to {_MAX_ALIGN} expected)")
        if flags & _SHF_ALLOC and flags & (_SHF_TLS | _SHF_COMPRESSED):
            raise BadObject(f"section {i} is thread-local or compressed (flags {flags:#x})")
    names = raw[shstrndx]
    if names[1] != _SHT_STRTAB:
        raise BadObject(f"section {shstrndx}, named as the section-name table, is not a string table")
    strings = _string_table(reader, names[4], names[5], f"section {shstrndx}")
    sections = []
    for i, (name, kind, flags, _addr, offset, length, link, info, _align, entsize) in enumerate(raw):
        sections.append(_Section(i, _string(strings, name, f"the name of section {i}"), kind, flags, offset, length,
                                 link, info, entsize))
    return sections


def _string_table(reader: _Reader, offset: int, size: int, what: str) -> bytes:
    table = reader.data[offset:offset + size]
    if size == 0 or table[-1:] != b"\0":
        raise BadObject(f"{what} is not a NUL-terminated string table")
    return table


def _string(table: bytes, offset: int, what: str) -> bytes:
    if offset >= len(table):
        raise BadObject(f"{what} (string {offset}) lies outside its {len(table)}-byte string table")
    return table[offset:table.index(b"\0", offset)]


def _symbols(reader: _Reader, sections: list[_Section]) -> tuple[_Section, list[_Symbol]]:
    tables = [s for s in sections if s.type == _SHT_SYMTAB]
    if len(tables) != 1:
        raise BadObject(f"{len(tables)} symbol tables, expected 1")
    symtab = tables[0]
    if symtab.entsize != 24 or symtab.size % 24 or symtab.offset % 8 or symtab.size == 0:
        raise BadObject(f"malformed symbol table ({symtab.size} bytes of {symtab.entsize}-byte entries)")
    if not 0 < symtab.link < len(sections) or sections[symtab.link].type != _SHT_STRTAB:
        raise BadObject(f"the symbol table's names (section {symtab.link}) are not a string table")
    names = sections[symtab.link]
    strings = _string_table(reader, names.offset, names.size, names.label())
    table = []
    for i in range(symtab.size // 24):
        name, info, _other, shndx, value, size = reader.unpack("IBBHQQ", symtab.offset + 24 * i, f"symbol {i}")
        table.append(_Symbol(i, _string(strings, name, f"the name of symbol {i}"), info & 0xF, info >> 4, shndx,
                             value, size))
    return symtab, table


def _check_symbols(table: list[_Symbol], sections: list[_Section], machine: Machine,
                   resolvable: Callable[[str], bool]) -> None:
    if table[0] != _Symbol(0, b"", 0, 0, 0, 0, 0):
        raise BadObject("symbol 0 is not the null symbol")
    for sym in table[1:]:
        label = f"symbol {sym.index} ({sym.name.decode('ascii', 'replace')})"
        # The kinds LLVM writes; RuntimeDyld mis-handles others (common, TLS, ifunc, unknown bindings).
        if sym.type > _STT_FILE or sym.bind > _STB_WEAK:
            raise BadObject(f"{label} has type {sym.type} and binding {sym.bind}, not ones LLVM emits here")
        if sym.shndx == _SHN_UNDEF:
            # MCJIT looks an undefined symbol up by name; one without a name, or a section or local one,
            # reaches an "unreachable" in RuntimeDyld.
            if not sym.name or sym.type not in (_STT_NOTYPE, _STT_OBJECT, _STT_FUNC) \
                    or sym.bind not in (_STB_GLOBAL, _STB_WEAK):
                raise BadObject(f"{label} is undefined but not a named global (type {sym.type}, "
                                f"binding {sym.bind})")
            name = sym.name.decode("utf-8", "replace")
            if name not in machine.linker_symbols and not resolvable(name):
                raise BadObject(f"{label} is undefined and this process does not provide it")
        elif sym.shndx >= _SHN_LORESERVE:
            if sym.shndx != _SHN_ABS:   # common blocks too: LLVM gives our modules none
                raise BadObject(f"{label} has the reserved section index {sym.shndx:#x}")
        elif sym.shndx >= len(sections):
            raise BadObject(f"{label} is in section {sym.shndx}, past the last one ({len(sections) - 1})")
        elif sym.value + sym.size > sections[sym.shndx].size:
            raise BadObject(f"{label} (bytes {sym.value}..{sym.value + sym.size}) lies outside "
                            f"{sections[sym.shndx].label()} of {sections[sym.shndx].size} bytes")


def _check_kernels(table: list[_Symbol], sections: list[_Section], symbols: Iterable[str]) -> None:
    for wanted in symbols:
        found = [s for s in table if s.name == wanted.encode("utf-8") and s.shndx != _SHN_UNDEF]
        if len(found) != 1:
            raise BadObject(f"kernel symbol {wanted} is {'not defined' if not found else 'defined twice'}")
        sym = found[0]
        if sym.type != _STT_FUNC or sym.bind not in (_STB_GLOBAL, _STB_WEAK) or sym.size == 0:
            raise BadObject(f"kernel symbol {wanted} is not a global function (type {sym.type}, binding {sym.bind})")
        section = sections[sym.shndx] if sym.shndx < len(sections) else None
        if (section is None or section.type != _SHT_PROGBITS
                or section.flags & (_SHF_ALLOC | _SHF_EXECINSTR) != _SHF_ALLOC | _SHF_EXECINSTR):
            raise BadObject(f"kernel symbol {wanted} is not in an executable code section")


def _check_relocations(reader: _Reader, section: _Section, sections: list[_Section], symtab: _Section,
                       table: list[_Symbol], machine: Machine) -> None:
    rela = section.type == _SHT_RELA
    entry = 24 if rela else 16
    if section.entsize != entry or section.size % entry or section.offset % 8:
        raise BadObject(f"{section.label()}: malformed relocations ({section.size} bytes of {section.entsize})")
    if section.link != symtab.index:
        raise BadObject(f"{section.label()} refers to symbol table {section.link}, not {symtab.index}")
    if not 0 < section.info < len(sections) or sections[section.info].type == _SHT_NOBITS:
        raise BadObject(f"{section.label()} relocates section {section.info}, which has no bytes to patch")
    target = sections[section.info]
    for n in range(section.size // entry):
        offset, info = reader.unpack("QQ", section.offset + entry * n, f"relocation {n} of {section.label()}")
        kind, index = info & 0xFFFFFFFF, info >> 32
        where = f"relocation {n} of {section.label()}"
        width = machine.relocations.get(kind)
        if width is None:
            raise BadObject(f"{where} has type {kind}, not one MCJIT applies for {machine.name} here")
        if not 0 < index < len(table):
            raise BadObject(f"{where} refers to symbol {index} of {len(table)}")
        if offset + width > target.size:
            raise BadObject(f"{where} patches bytes {offset}..{offset + width} of {target.label()} "
                            f"({target.size} bytes)")
        if table[index].type == _STT_FILE:
            raise BadObject(f"{where} refers to a file symbol")
        if kind in machine.near_only and table[index].shndx in (_SHN_UNDEF, _SHN_ABS):
            raise BadObject(f"{where} (type {kind}, limited range) refers to a symbol outside the object")
        name = table[index].name.decode("utf-8", "replace")
        if name in machine.linker_symbols and table[index].shndx == _SHN_UNDEF and kind not in machine.got_base:
            raise BadObject(f"{where} uses {name} with type {kind}")


def _check_eh_frame(reader: _Reader, section: _Section) -> None:
    """The record chain of ``.eh_frame``: lengths inside the section, FDEs pointing at CIEs."""
    position, end, cies = section.offset, section.offset + section.size, set()
    while position + 4 <= end:
        (length,) = reader.unpack("I", position, f"{section.label()} record")
        if length == 0:
            return                                    # the terminator
        if length == 0xFFFFFFFF or length < 4 or position + 4 + length > end:
            raise BadObject(f"{section.label()}: a record of length {length:#x} at {position - section.offset} "
                            "runs past the section")
        (pointer,) = reader.unpack("I", position + 4, f"{section.label()} record")
        if pointer == 0:
            cies.add(position)
        elif position + 4 - pointer not in cies:
            raise BadObject(f"{section.label()}: the FDE at {position - section.offset} points at no CIE")
        position += 4 + length
    if position != end:
        raise BadObject(f"{section.label()} ends inside a record")
