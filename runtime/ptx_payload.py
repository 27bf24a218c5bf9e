"""One kernel's compile-cache payload for the ``cuda`` backend: its LLVM IR and PTX, and their load check.

The payload is the LLVM IR text, a NUL byte, the PTX text (neither text holds a
NUL). `problem` says why a payload read from disk must not be used, before any
of it reaches the CUDA driver or a printed stage: exactly one separator, both
parts UTF-8; the LLVM IR defines the kernel; the PTX has the ``.version`` this
compiler emits for the target (`codegen.nvptx.default_ptx_version`), a
``.target`` line naming the target, ``.address_size 64``, exactly the one
``.entry`` expected, and ends where a kernel body ends (balanced braces, a last
``}``), which a truncated text does not. What these lines cannot tell (an
instruction changed in the middle) the compile cache's build record covers.
"""
from __future__ import annotations

import re

from ..codegen.nvptx import default_ptx_version, entry_names

SEPARATOR = b"\0"

__all__ = ["SEPARATOR", "decode", "encode", "problem"]


def encode(llvm_ir: str, ptx: str) -> bytes:
    """The payload of one kernel's LLVM IR and PTX."""
    return llvm_ir.encode() + SEPARATOR + ptx.encode()


def decode(payload: bytes) -> tuple[str, str]:
    """``(llvm_ir, ptx)`` of a payload that passed `problem` (or was just encoded)."""
    llvm_ir, ptx = payload.split(SEPARATOR)
    return llvm_ir.decode(), ptx.decode()


def problem(payload: bytes, entry: str, sm: str) -> str | None:
    """Why `payload` is not the LLVM IR and PTX of kernel `entry` for `sm` (module docstring), or None."""
    parts = payload.split(SEPARATOR)
    if len(parts) != 2:
        return f"{len(parts) - 1} separators between LLVM IR and PTX, expected 1"
    try:
        llvm_ir, ptx = (part.decode("utf-8") for part in parts)
    except UnicodeDecodeError as err:
        return f"not UTF-8 text ({err.reason} at byte {err.start})"
    if not re.search(rf'^define\b[^\n]*@"?{re.escape(entry)}"?\(', llvm_ir, re.M):
        return f"the LLVM IR does not define {entry}"
    version = default_ptx_version(sm)
    if not re.search(rf"^\.version {version // 10}\.{version % 10}\s*$", ptx, re.M):
        return f"the PTX has no .version {version // 10}.{version % 10} line"
    if not re.search(rf"^\.target {re.escape(sm)}\b", ptx, re.M):
        return f"the PTX has no .target {sm} line"
    if not re.search(r"^\.address_size 64\s*$", ptx, re.M):
        return "the PTX has no .address_size 64 line"
    entries = entry_names(ptx)
    if entries != (entry,):
        return f"the PTX defines entries {list(entries)}, expected [{entry!r}]"
    if ptx.count("{") != ptx.count("}") or not ptx.rstrip().endswith("}"):
        return "the PTX ends inside a block (truncated?)"
    return None
