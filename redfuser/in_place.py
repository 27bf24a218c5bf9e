"""Arguments a kernel's body updates in place (``a += 1``), checked at every call that passes them.

numpy's body writes such an argument's array. A kernel never writes the caller's arrays: it updates a value
of its own, which is numpy's result as long as nothing else sees the caller's memory change. A call is
refused (`ArgumentError`, at the body's line that updates it) where numpy's body would be something else:

- another argument shares memory with it (the same array passed twice, overlapping views): numpy's update
  changes that argument too (``f(x, x)`` of ``a += 1; return a + b`` is ``2x + 2``);
- two of its elements are one memory location (a 0 stride, ``np.broadcast_to``, a hand-made ``as_strided``):
  numpy writes that place once for each of them;
- the body also reads an array it shares memory with from outside (a global ``W`` passed as the argument):
  numpy's body reads ``W`` updated, a trace read it as it was;
- it is a read-only numpy array: numpy's update raises.

Memory is compared by address ranges, as `redfuser.outputs` compares ``out=`` arrays, so interleaved views
count as sharing (the check errs towards refusing). A kernel with such an argument takes the full call path
(no cached fast path skips this check: `Kernel.__call__`).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.lib.array_utils import byte_bounds

from .ir import ArgumentError, SourceLoc
from .outputs import _meet, _overlap, _self_overlapping, _span
from .runtime import arrays as arrays_rt


def check(updated: dict[str, SourceLoc], arguments: Sequence[tuple[str, object]], kernel: str,
          captured: Sequence[tuple[str, np.ndarray]] = ()) -> None:
    """Refuse the call where an argument named in `updated` (name -> the line updating it) has memory that
    another of `arguments` (name, the caller's array) shares, or a numpy array the body reads from outside
    (`captured`: label, array; numpy's body reads it updated, a trace read it as it was), elements sharing
    memory, or is read-only."""
    described = [(name, arrays_rt.describe(a, f"argument {name!r}"), a) for name, a in arguments]
    outside = [(label, byte_bounds(a)) for label, a in captured]     # (numpy arrays of any dtype, in host memory)
    for name, info, array in described:
        loc = updated.get(name)
        if loc is None:
            continue
        why = "its array is read-only, and numpy's body raises there" \
            if getattr(getattr(array, "flags", None), "writeable", True) is False else \
            f"two of its elements share memory (strides {info.strides} for shape {tuple(info.shape)}), and numpy's " \
            "body writes that place once for each of them" if _self_overlapping(info) else ""
        if not why:
            shared = [other for other, o_info, _ in described if other != name and _overlap(info, o_info)]
            if shared:
                why = f"argument {shared[0]!r} shares its memory, and numpy's body would change {shared[0]!r} too"
        if not why and not info.on_gpu:
            read = [label for label, bounds in outside if _meet(_span(info), bounds)]
            if read:
                why = (f"the body also reads the captured array {read[0]} whose memory it shares, and numpy's body "
                       "would read it updated")
        if why:
            raise ArgumentError(f"the body updates argument {name!r} in place, but {why}; a kernel never writes "
                                f"its arguments. Pass a copy, or write {name} = {name} + ... in the body",
                                op=kernel, loc=loc)

