"""The variable that the user's statement assigns an op's value to, read from the statement's syntax tree.

A temporary is printed with the name of the variable its statement assigns as a prefix (``mu_sum`` for the sum
in ``mu = rf.sum(x) / n``). The op's place is the exact span of the instruction the user's frame was running
(`CodeType.co_positions`), so a statement written over several lines is read whole, and an op of a lambda's
body is not taken for the value of the statement that holds the lambda (``lam = rf.kernel(lambda x: ...)``
assigns the kernel, not a value of its body). A regex over one physical line read ``keepdims=True) * ...``,
a continuation line, as an assignment to ``keepdims``.
"""
from __future__ import annotations

import ast
import functools
import linecache
from dataclasses import dataclass
from types import CodeType

_Point = tuple[int, int]   # (line, column), columns in UTF-8 bytes as both `ast` and `co_positions` count them


@dataclass(frozen=True, slots=True)
class OpSite:
    """Where in the user's source an op was traced: the code object running and its instruction's offset."""

    code: CodeType
    lasti: int


def _span(site: OpSite) -> tuple[_Point, _Point, bool] | None:
    """The instruction's source span, and whether it has columns (``-X no_debug_ranges`` keeps lines only)."""
    positions = list(site.code.co_positions())
    index = site.lasti // 2          # (one position per 2-byte code unit)
    if not 0 <= index < len(positions):
        return None
    line, end_line, col, end_col = positions[index]
    if line is None:
        return None
    end_line = end_line or line
    if col is None or end_col is None:
        return (line, 0), (end_line, 0), False
    return (line, col), (end_line, end_col), True


@dataclass(frozen=True, slots=True)
class _Node:
    start: _Point
    end: _Point
    node: ast.AST


@functools.lru_cache(maxsize=64)
def _nodes(source: str) -> tuple[_Node, ...]:
    """The statements and lambdas of `source` with their spans (empty where it does not parse)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return ()
    return tuple(_Node((n.lineno, n.col_offset), (n.end_lineno, n.end_col_offset), n)
                 for n in ast.walk(tree) if isinstance(n, (ast.stmt, ast.Lambda)) and n.end_lineno is not None)


def _encloses(outer: tuple[_Point, _Point], inner: tuple[_Point, _Point], exact: bool) -> bool:
    """Whether the span `outer` holds `inner` (by lines alone where `inner` has no columns)."""
    if not exact:
        return outer[0][0] <= inner[0][0] and inner[1][0] <= outer[1][0]
    return outer[0] <= inner[0] and inner[1] <= outer[1]


def assigned_variable(site: OpSite) -> str | None:
    """The variable the statement holding the op at `site` assigns its value to (``x = ...`` or ``x: T = ...``,
    the first target of ``a = b = ...``), or None: the statement is no such assignment, the op is in a lambda's
    body, or the source cannot be read."""
    found = _span(site)
    if found is None or site.code.co_name == "<lambda>":
        return None    # (a lambda's value is a function: the variable holding it names no value of its body)
    *span, exact = found
    nodes = _nodes("".join(linecache.getlines(site.code.co_filename)))
    enclosing = [n for n in nodes if _encloses((n.start, n.end), span, exact)]
    if not enclosing:
        return None
    # statements and lambdas nest: the innermost one starts last (and, at a tie, ends first)
    inner = max(enclosing, key=lambda n: (n.start, (-n.end[0], -n.end[1]), isinstance(n.node, ast.Lambda)))
    node = inner.node
    if isinstance(node, ast.Assign):
        target, value = node.targets[0], node.value
    elif isinstance(node, ast.AnnAssign) and node.value is not None:
        target, value = node.target, node.value
    else:
        return None
    inside = _encloses(((value.lineno, value.col_offset), (value.end_lineno, value.end_col_offset)), span, exact)
    return target.id if isinstance(target, ast.Name) and inside else None
