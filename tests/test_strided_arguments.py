"""Views are read in place: a kernel is specialized on its arguments' strides (zero and negative ones too)
instead of copying them to dense memory.

Before, the ``cpu`` and ``simulate`` backends copied every view with ``np.ascontiguousarray``: a 4-byte
``np.broadcast_to`` view of a large shape became an 8 GiB allocation and died with numpy's MemoryError.
"""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import redfuser as rf
from redfuser.ir.tile import nodes as t
from redfuser.ir.array_memory import memory_of
from redfuser.ir.types import BufferType, float32
from redfuser.testing import assert_close

BACKENDS = ("interpret", "cpu", "simulate")
RNG = np.random.default_rng(7)
BASE = RNG.standard_normal((6, 10)).astype(np.float32)


def weighted_rows(x, w):
    return rf.sum(x * w, axis=-1, keepdims=True) + rf.max(x, axis=0)


VIEWS = {
    "transpose": BASE.T[:, :6],
    "column_step": BASE[:, ::3],
    "negative": BASE[::-1, ::-2],
    "negative_offset": BASE[4:0:-2, 9:2:-3],
    "broadcast_scalar": np.broadcast_to(np.float32(2.5), (6, 7)),
    "broadcast_row": np.broadcast_to(BASE[1], (3, 10)),
    "size_one_dims": BASE[2:3, ::2],
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(VIEWS))
def test_views_equal_numpy_and_are_specialized_on_their_strides(name, backend):
    x = VIEWS[name]
    w = RNG.standard_normal(x.shape).astype(np.float32)
    k = rf.kernel(weighted_rows, backend=backend)
    assert_close(k(x, w), weighted_rows(x, w), np.float32, x.shape[-1])
    traced = k.lower(x, w).stages["traced"]
    assert traced.inputs[0].type.strides is not None and traced.inputs[1].type.strides is None
    k(np.ascontiguousarray(x), w)
    assert k.cache_size == 2                        # the dense copy is another specialization


@pytest.mark.parametrize("backend", ("cpu", "simulate"))
def test_a_broadcast_view_is_never_materialized(backend):
    """8 GiB of float32 that are one element in memory: the kernel reads the element."""
    shape = (1 << 16, 1 << 15) if backend == "cpu" else (64, 1 << 15)   # the simulator runs every thread
    big = np.broadcast_to(np.float32(1.5), shape)
    k = rf.kernel(lambda x: rf.max(x, axis=-1), backend=backend)
    k.lower(big)                                    # compiling allocates what it allocates; calling must not
    tracemalloc.start()
    try:
        out = k(big)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(out, np.full(shape[0], 1.5, np.float32))
    assert peak < out.nbytes + (8 << 20), f"{peak} bytes allocated for a {big.nbytes}-byte view of 4 bytes"


def test_a_view_that_is_not_whole_elements_is_copied_when_the_copy_is_no_larger():
    raw = np.zeros(4 * 12 + 1, np.uint8)
    odd = np.frombuffer(raw.data, dtype=np.float32, count=12, offset=1).reshape(3, 4)   # misaligned floats
    assert not odd.flags.aligned
    out = rf.kernel(lambda x: x * 2, backend="cpu")(odd)
    np.testing.assert_array_equal(out, odd * 2)


def test_a_copy_larger_than_the_argument_is_refused_before_allocating():
    raw = np.zeros(5, np.uint8)
    one = np.frombuffer(raw.data, dtype=np.float32, count=1, offset=1)            # one misaligned float
    huge = np.broadcast_to(one, (1 << 20, 1 << 16))                               # 256 GiB if copied
    with pytest.raises(rf.ArgumentError, match="would take .* bytes where the view spans 4") as info:
        rf.kernel(lambda x: rf.sum(x), backend="cpu")(huge)
    assert "argument 'x'" in str(info.value) and __file__ in str(info.value)


def test_memory_of_is_the_span_from_the_lowest_element():
    x = BASE[::-1, ::-2]
    t = BufferType(float32, x.shape, tuple(s // 4 for s in x.strides))
    flat = memory_of(x, t)
    assert flat.size == t.span and not flat.flags.writeable
    idx = np.indices(x.shape).reshape(2, -1).T
    for i in idx:
        assert flat[t.base_offset + int(np.dot(i, t.element_strides))] == x[tuple(i)]


def test_nothing_the_user_passed_is_modified():
    x = VIEWS["negative"]
    before = BASE.copy()
    for backend in BACKENDS:
        rf.kernel(lambda a: a * 3 + 1, backend=backend)(x)
    np.testing.assert_array_equal(BASE, before)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_view_spanning_more_elements_than_it_has(backend):
    """Every second element of a repeated row: 32 elements spanning 63, which the SIMT verifier once
    compared with the 32 (found by the program fuzzer)."""
    x = np.repeat(np.arange(32, dtype=np.float32).reshape(4, 8), 2, axis=-1)[..., ::2]
    np.testing.assert_array_equal(rf.kernel(lambda a: a * 2.0, backend=backend)(x), x * 2.0)


def test_a_view_whose_offsets_pass_2_to_the_31_is_indexed_in_64_bits():
    """A view of 2 x 2**20 elements 2**12 apart spans 2**32 elements: its offsets need i64 though a dense
    array of its shape would not."""
    view = rf.ShapeDtype((2, 2**20), np.float32, strides=(2**32, 2**12))
    tile = rf.kernel(lambda a: a * 2.0, backend="simulate").lower(view).stages["tile"]
    loads = [op for k in tile.kernels for op in t.walk_ops(k.body) if isinstance(op, t.Load)]
    assert loads and all(op.offsets.dtype.name == "i64" for op in loads)
