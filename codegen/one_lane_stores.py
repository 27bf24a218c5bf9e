"""A work-around for an x86 code-generation bug of LLVM 22.1: one-lane masked stores of truncated vectors.

LLVM's loop vectorizer finishes a loop whose trip count is known (a tile row of 13 elements, vectorized by 4)
with a masked store whose constant mask enables a single lane::

    %v = trunc <4 x i32> %w to <4 x i8>
    call void @llvm.masked.store.v4i8.p0(<4 x i8> %v, ptr align 1 %p, <4 x i1> <i1 true, i1 false, i1 false, i1 false>)

LLVM 22.1's x86 back end turns a one-lane masked store into a scalar store, but of a *truncated* vector it
stores the untruncated element: ``vmovss %xmm0, (%rdi)`` writes 4 bytes where one i8 was meant (8 bytes for
``i64 -> i32``). The extra bytes belong to the next tile: a cpu kernel whose program instances run on several
threads overwrote its neighbour's first elements with garbage when the neighbour had already written them
(found by the fuzzer's long campaign, seed 1 example 2469: an f8e4m3 output of 13-element rows), and the last
instance wrote past the end of its array. Masks of two or more lanes, and masks known only at run time,
are compiled correctly (``vpmovdb`` under a k-mask).

`scalarize_one_lane_masked_stores` rewrites every masked store whose mask is a constant with exactly one lane
on into ``extractelement`` and a plain scalar store of that lane, in the optimized module's text, after the
optimizer has run (so nothing merges it back) and before the back end sees it.
"""
from __future__ import annotations

import re

_MASKED_STORE = re.compile(
    r"^(?P<indent>\s*)(?:tail |notail |musttail )?call void @llvm\.masked\.store\.[\w.]+\("
    r"<(?P<n>\d+) x (?P<elem>[^>]+)> (?P<value>.+?), ptr(?: align \d+)? (?P<ptr>%[-\w.$]+|%\"[^\"]+\"), "
    r"<\d+ x i1> <(?P<mask>[^>]*)>\)(?P<rest>.*)$")


def _one_lane(mask: str) -> int | None:
    """The index of the only ``i1 true`` lane of a constant mask's text, or None."""
    lanes = [m.strip() for m in mask.split(",")]
    on = [i for i, lane in enumerate(lanes) if lane == "i1 true"]
    if len(on) != 1 or any(lane not in ("i1 true", "i1 false") for lane in lanes):
        return None
    return on[0]


def scalarize_one_lane_masked_stores(text: str) -> tuple[str, int]:
    """`text` with each one-lane constant-mask ``llvm.masked.store`` written as a scalar store of that lane,
    and how many were rewritten."""
    out: list[str] = []
    count = 0
    for line in text.splitlines():
        m = _MASKED_STORE.match(line)
        lane = _one_lane(m["mask"]) if m else None
        if m is None or lane is None:
            out.append(line)
            continue
        n, elem, value, ptr, indent = m["n"], m["elem"], m["value"], m["ptr"], m["indent"]
        name = f"%rf.one_lane.{count}"
        out.append(f"{indent}{name}.value = extractelement <{n} x {elem}> {value}, i64 {lane}")
        out.append(f"{indent}{name}.ptr = getelementptr inbounds {elem}, ptr {ptr}, i64 {lane}")
        out.append(f"{indent}store {elem} {name}.value, ptr {name}.ptr, align 1")
        count += 1
    return "\n".join(out) + "\n", count


__all__ = ["scalarize_one_lane_masked_stores"]
