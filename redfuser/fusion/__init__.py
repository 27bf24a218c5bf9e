"""The fusion engine: cascade analysis and the fusion theorem (ARCHITECTURE.md section 4).

`fuse` lists its passes in order:

    inline_elementwise   elementwise producers recomputed inside their readers
    share_common_nests   duplicate nests merged (CSE)
    find_candidates      reductions over one axis linked by dependencies or inputs
    fuse_cascade         per cascade: factor each body (G, H, rescale, deferred factors),
                         confirm numerically, emit one FusedLoop + epilogue
    read_extrema_safely  exponentials after a loop read its running max as the loop's terms do,
                         where a NaN guard makes the value NaN anyway (one exponential, not two)
    compute_extrema_as_numpy
                         a 16-bit max or min runs over numpy's rounded values, and each value
                         equal to its term is computed as numpy does where it meets it

Every pass's output is verified.
"""
from __future__ import annotations

from ..ir import Program, verify_program
from .cascade import find_candidates
from .cse import share_common_nests
from .group import CascadeGroup
from .inline import eliminate_dead, inline_elementwise
from .nan_guard import read_extrema_safely
from .numpy_extrema import compute_extrema_as_numpy
from .rewrite import fuse_cascade


def fuse(program: Program) -> tuple[Program, list[CascadeGroup]]:
    """`program` with every fusable cascade in one pass, and what was found (fused or not, and why)."""
    p = verify_program(inline_elementwise(program), "inline_elementwise")
    p = verify_program(share_common_nests(p), "share_common_nests")
    groups: list[CascadeGroup] = []
    for candidate in find_candidates(p):
        p, group = fuse_cascade(p, candidate)
        p = verify_program(p, "fuse_cascade")
        groups.append(group)
    p = verify_program(read_extrema_safely(p), "read_extrema_safely")
    p = verify_program(compute_extrema_as_numpy(p), "compute_extrema_as_numpy")
    p = verify_program(eliminate_dead(p), "eliminate_dead")
    return p, groups


__all__ = ["fuse", "CascadeGroup"]
