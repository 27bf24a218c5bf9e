"""Programs run end to end on every host-side backend, ``cpu`` (compiled host code) and ``simulate`` (the
SIMT program that becomes PTX, run by the simulator with its bound, race and divergence checks), against
the numpy body under the tolerance rule (`redfuser.testing.tolerance`). What only one backend has is tested
in its own module (`test_cpu_backend.py`, `test_simulate_backend.py`)."""
from __future__ import annotations

import numpy as np
import pytest
from helpers import as_tuple, outputs, run_backend
from hypothesis import given, note
from hypothesis import strategies as st

import redfuser as rf
from redfuser.testing import assert_close
from redfuser.testing.strategies import arrays, programs
from redfuser.workloads import attention, causal_attention

BACKENDS = ["cpu", "simulate"]

RANDOM_PROGRAM_TILES = {"cpu": [(3, 4, 5)], "simulate": [(4, 8, 8), (16, 16, 16), (64, 64, 32)]}
"""(block_m, block_n, block_k) of the random programs: small and ragged on the CPU; on the simulator, from
tiles smaller than a warp's share to the GPU's usual ones."""


def _oracle(program) -> tuple[np.ndarray, ...]:
    """The numpy body: never a stage of the compiler under test (the fused interpreter included)."""
    with np.errstate(all="ignore"):
        return tuple(np.asarray(e) for e in as_tuple(program.body(*program.inputs)))


@pytest.mark.parametrize("backend", BACKENDS)
@given(programs(max_steps=5, max_size=256), st.data())
def test_random_programs(backend, program, data):
    note(repr(program))
    m, n, k = data.draw(st.sampled_from(RANDOM_PROGRAM_TILES[backend]), label="tiles")
    actual = outputs(backend, program.body, *program.inputs, block_m=m, block_n=n, block_k=k)
    for a, e in zip(actual, _oracle(program)):
        assert_close(a, e, program.dtype, program.reduction_length, repr(program), scale=program.scale,
                     any_nonfinite=True)


@pytest.mark.parametrize("backend", BACKENDS)
@given(st.data(), st.sampled_from([(1, 1, 1, 1), (1, 2, 7, 3), (2, 1, 17, 8), (1, 1, 33, 5)]),
       st.sampled_from([attention, causal_attention]), st.sampled_from([(16, 64), (4, 8), (5, 3)]))
def test_attention_with_masks_ragged_tiles_and_large_scores(backend, data, shape, fn, tiles):
    q, k, v = (data.draw(arrays(np.dtype(np.float32), shape, large=True)) for _ in range(3))
    with np.errstate(all="ignore"):
        expected = fn(q, k, v)
    actual = outputs(backend, fn, q, k, v, block_m=tiles[0], block_n=tiles[1])[0]
    assert_close(actual, expected, np.float32, shape[-2], scale=float(np.abs(v).max(initial=1.0)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_fully_masked_rows_give_the_references_nan(backend):
    def masked_softmax(x, keep):
        s = rf.where(keep, x, -rf.inf)
        m = rf.max(s, axis=-1, keepdims=True)
        e = rf.exp(s - m)
        return e / rf.sum(e, axis=-1, keepdims=True)

    x = np.random.default_rng(0).standard_normal((6, 37)).astype(np.float32)
    keep = np.ones((6, 37), bool)
    keep[1] = False
    keep[3, :30] = False
    for fuse in (True, False):
        actual, expected = run_backend(backend, masked_softmax, x, keep, fuse=fuse, block_n=8)
        assert np.isnan(expected[0][1]).all()
        assert_close(actual[0], expected[0], np.float32, 37)
