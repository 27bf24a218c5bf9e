"""`codegen/simt/barriers.py`: a barrier goes only where it separates no conflicting accesses.

Hand-built SIMT kernels pin the rule (a conflict across the barrier keeps it, through a loop's back edge
too), attention's lowered key loop keeps 2 of its 4, and the simulator, whose race trackers flag any
shared access that conflicts within one barrier interval, runs the result.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import redfuser as rf
from redfuser.codegen.simt.barriers import drop_redundant_barriers
from redfuser.codegen.simulator import simulate
from redfuser.ir import SimulationError
from redfuser.ir.simt.nodes import Barrier, For, IntOp, SimtKernel, walk_stmts
from redfuser.ir.simt.builder import SimtBuilder
from redfuser.ir.types import float32, int32
from redfuser.testing import assert_close
from redfuser.workloads import attention


def barriers(kernel: SimtKernel, inside_loop: bool | None = None) -> int:
    """Barriers of `kernel`: all, or only those in (True) or outside (False) a loop body."""
    if inside_loop is None:
        return sum(isinstance(s, Barrier) for s in walk_stmts(kernel.body))
    outside = sum(isinstance(s, Barrier) for s in kernel.body)
    return barriers(kernel) - outside if inside_loop else outside


def exchange(arrays: tuple[str, str], loop: bool) -> SimtKernel:
    """Each of 32 threads writes its value to array one, reads its neighbour's, writes that to array two and
    reads its other neighbour's, then stores it: 2 exchanges, each store behind a barrier and each load
    behind another, optionally in a loop of 3 trips. `arrays` names the two arrays (the same name: one)."""
    b = SimtBuilder("exchange", warps=1, grid=(1,))
    x, out = b.buffer("x", float32, (32,)), b.buffer("out", float32, (32,))
    first = b.shared(arrays[0], float32, (32,))
    second = first if arrays[1] == arrays[0] else b.shared(arrays[1], float32, (32,))
    tid = b.thread_idx()
    mask = b.const(31, int32)
    right = b.int_op(IntOp.AND, b.add(tid, b.const(1, int32)), mask)
    left = b.int_op(IntOp.AND, b.add(tid, mask), mask)

    def rounds(v):
        b.barrier()
        b.store_shared(first, tid, v)
        b.barrier()
        w = b.load_shared(first, right)
        b.barrier()
        b.store_shared(second, tid, w)
        b.barrier()
        return b.load_shared(second, left)

    v = b.load_global(x, tid)
    if loop:
        (v,) = b.for_(0, 3, 1, [v], lambda k, run: [rounds(run)], names=["v"], iv_name="k")
    else:
        v = rounds(v)
    b.store_global(out, tid, v)
    return b.build()


def run(kernel: SimtKernel, x: np.ndarray) -> np.ndarray:
    return simulate(kernel, {"x": x.copy(), "out": np.zeros(32, np.float32)})["out"]


def test_a_barrier_between_conflicting_accesses_stays_and_others_go():
    x = np.arange(32, dtype=np.float32)
    for loop in (False, True):
        shared_one = exchange(("s", "s"), loop)
        # one array: each barrier separates a store from a load of it, or a load from the next store,
        # except the leading one of the straight-line kernel, which nothing shared precedes
        assert barriers(drop_redundant_barriers(shared_one)) == (4 if loop else 3)
        np.testing.assert_array_equal(run(drop_redundant_barriers(shared_one), x), run(shared_one, x))
        two = exchange(("s", "t"), loop)
        kept = drop_redundant_barriers(two)
        # the leading barrier (nothing before it, or only the other array around the back edge) and the
        # one in front of the second array's store (only the first array's reads since the last) go
        assert barriers(two) == 4 and barriers(kept) == 2
        np.testing.assert_array_equal(run(kept, x), run(two, x))      # the simulator finds no race


def test_a_loop_with_one_array_keeps_its_leading_barrier():
    """In a loop over one array, the barrier at the top separates the last iteration's read from this
    iteration's write: removing it would be a race, and the pass keeps it."""
    kernel = exchange(("s", "s"), loop=True)
    loop = next(s for s in kernel.body if isinstance(s, For))
    assert isinstance(loop.body.stmts[0], Barrier)
    kept = drop_redundant_barriers(kernel)
    assert isinstance(next(s for s in kept.body if isinstance(s, For)).body.stmts[0], Barrier)


def test_attention_key_loop_keeps_two_barriers_and_equals_numpy():
    """k and v alternate between two scratch arrays, so each key block needs a barrier after each store
    only: 2, not 4. The simulated kernel (races checked) equals the numpy body."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 128, 64)).astype(np.float16) for _ in range(3))
    kernel = rf.kernel(attention, backend="simulate", sm="sm_90")
    (simt,) = kernel.lower(q, k, v).stages["simt"].kernels
    assert barriers(simt, inside_loop=True) == 2
    assert {a.name for a in simt.shared} == {"smem_f16_a", "smem_f16_b"}
    assert_close(kernel(q, k, v), attention(q, k, v), np.float16, 128)


def test_without_the_kept_barrier_the_simulator_finds_the_race():
    """What the pass keeps is needed: the one-array loop without its leading barrier is a write-after-read
    race across iterations, and the simulator says so."""
    kernel = exchange(("s", "s"), loop=True)
    at = next(i for i, s in enumerate(kernel.body) if isinstance(s, For))
    loop = kernel.body[at]
    racy = replace(kernel, body=kernel.body[:at] + (replace(loop, body=replace(loop.body, stmts=loop.body.stmts[1:])),)
                   + kernel.body[at + 1:])
    with pytest.raises(SimulationError, match="race"):
        run(racy, np.arange(32, dtype=np.float32))
