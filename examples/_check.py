"""Shared by the examples: run a kernel on the best backend, print what was fused and the check."""
from __future__ import annotations

import numpy as np

import redfuser as rf
from redfuser.testing import assert_close


def run_and_check(fn, args, reduction_length: int, **options) -> tuple:
    """Compile `fn` for `args`, print the fusion report, run it and compare with the numpy body."""
    k = rf.kernel(fn, **options)
    lowered = k.lower(*args)
    print(f"backend: {lowered.backend}")
    for g in lowered.groups:
        print(f"cascade {', '.join(g.reductions)}: fused={g.fused}" + (f" ({g.reason})" if g.reason else ""))
    got = k(*args)
    ref = fn(*args)
    got, ref = (got, ref) if isinstance(got, tuple) else ((got,), (ref,))
    for a, b in zip(got, ref):
        if np.issubdtype(np.asarray(b).dtype, np.integer):
            assert np.array_equal(a, b), "indices differ from the reference"
        else:
            assert_close(a, b, np.asarray(b).dtype, reduction_length)
    print("equal to the numpy reference: OK")
    return got
