"""The printed IR around a bad statement, for `VerifyError` at every level.

Each level's printer can print a whole kernel while noting the line each statement starts on (a
`LineIndex`); `excerpt` cuts the lines around one statement and marks it with ``>>`` (`excerpt_around` does both)::

         4 |   %ar: i32[4] = arange
         5 |   %startb: i32[4] = broadcast %start
    >>   6 |   %r: i32[4] = %ar + %B
         7 |   %nrows: i32[4] = broadcast %n

One helper, so the Loop, Tile and SIMT verifiers show their faults alike.
"""
from __future__ import annotations

from typing import Callable, Sequence

LineIndex = dict[int, int]
"""Where each printed statement starts: ``id(node) -> line number`` (0-based) in the printed lines. Keyed by
identity because equal statements repeat (two ``barrier``s); a verifier holds the very node it rejects."""

MARK = ">>"
CONTEXT_LINES = 3
"""Lines shown before and after the bad one."""


def note_line(index: LineIndex | None, node: object, line: int) -> None:
    """Record that `node`'s text starts at `line` (printers call this; nothing when not indexing)."""
    if index is not None:
        index[id(node)] = line


def excerpt(lines: Sequence[str], bad: int, radius: int = CONTEXT_LINES) -> str:
    """Lines ``bad - radius .. bad + radius`` numbered from 1, ``>>`` before line `bad`, ``...`` where cut."""
    lo, hi = max(0, bad - radius), min(len(lines), bad + radius + 1)
    width = len(str(hi))
    blank = " " * len(MARK)
    out = [f"{blank} {'':>{width}} | ..."] if lo > 0 else []
    out += [f"{MARK if i == bad else blank} {i + 1:>{width}} | {lines[i]}" for i in range(lo, hi)]
    if hi < len(lines):
        out.append(f"{blank} {'':>{width}} | ...")
    return "\n".join(out)


def excerpt_at(lines: Sequence[str], index: LineIndex, node: object, radius: int = CONTEXT_LINES) -> str:
    """`excerpt` around `node`'s first line, or ``""`` when the printer did not print `node`."""
    line = index.get(id(node))
    return "" if line is None else excerpt(lines, line, radius)


def excerpt_around(node: object, print_lines: Callable[[LineIndex], Sequence[str]],
                   radius: int = CONTEXT_LINES) -> str:
    """The printed IR around `node`: `print_lines(index)` prints the whole kernel or program, noting in `index`
    where each statement starts. ``""`` when `node` is not among them, or when the printer fails on the broken
    IR: the verifier's own message must come out whatever else is wrong with the IR."""
    index: LineIndex = {}
    try:
        lines = print_lines(index)
    except Exception:   # an IR broken past printing (an unknown node, a missing field): no excerpt
        return ""
    return excerpt_at(lines, index, node, radius)
