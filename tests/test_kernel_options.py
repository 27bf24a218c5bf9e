"""`rf.KernelOptions`: a frozen dataclass checked when made, the kernel's keywords building one, deriving the
schedule's and the GPU lowering's options, equal options one compile-cache entry."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import redfuser as rf
from redfuser import workloads
from redfuser.backends import BACKENDS
from redfuser.kernel_options import DEFAULT_OPTIONS


def test_keywords_and_an_options_object_make_the_same_kernel():
    by_keywords = rf.kernel(workloads.softmax, backend="cpu", block_m=16, fuse=False)
    by_object = rf.kernel(workloads.softmax, backend="cpu", options=rf.KernelOptions(block_m=16, fuse=False))
    assert by_keywords.options == by_object.options == rf.KernelOptions(block_m=16, fuse=False)
    x = np.random.default_rng(0).standard_normal((8, 40)).astype(np.float32)
    np.testing.assert_array_equal(by_keywords(x), by_object(x))
    assert by_object.lower(x).options.block_m == 16


def test_options_are_frozen_and_hashable_and_replace_makes_new_ones():
    options = rf.KernelOptions(block_m=32)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.block_m = 64   # type: ignore[misc]
    wider = dataclasses.replace(options, block_n=128)
    assert wider.block_m == 32 and wider.block_n == 128 and options.block_n is None
    assert len({options, rf.KernelOptions(block_m=32), wider}) == 2
    assert rf.KernelOptions().as_dict() == {name: getattr(DEFAULT_OPTIONS, name) for name in rf.KernelOptions.names()}


@pytest.mark.parametrize("option,value", [("num_warps", 3), ("llvm_opt", True), ("sm", "sm_1"), ("block_m", 0)])
def test_a_bad_value_is_refused_when_the_options_are_made(option, value):
    with pytest.raises(rf.ArgumentError, match=f"option {option} must be"):
        rf.KernelOptions(**{option: value})
    with pytest.raises(rf.ArgumentError, match=f"option {option} must be"):
        dataclasses.replace(rf.KernelOptions(), **{option: value})


def test_options_and_keywords_together_or_not_an_options_object_are_refused():
    with pytest.raises(rf.ArgumentError, match="not both"):
        rf.kernel(workloads.softmax, options=rf.KernelOptions(), block_m=16)
    with pytest.raises(rf.ArgumentError, match="rf.KernelOptions"):
        rf.kernel(workloads.softmax, options={"block_m": 16})


def test_every_option_has_a_meaning():
    meanings = rf.KernelOptions.meanings()
    assert list(meanings) == list(rf.KernelOptions.names()) and all(meanings.values())


def test_schedule_and_gpu_options_derive_from_the_kernel_options():
    options = rf.KernelOptions(block_m=16, split=2, num_warps=8, sm="sm_80", min_blocks_per_sm=2)
    cpu = options.schedule_options(BACKENDS["cpu"].schedule, lambda: 5)
    assert (cpu.block_m, cpu.block_n, cpu.split, cpu.workers, cpu.pow2, cpu.whole_rows) == (16, 64, 2, 5, False, False)
    gpu = options.schedule_options(BACKENDS["cuda"].schedule, lambda: 132)
    assert gpu.pow2 and gpu.block_m == 16 and not gpu.whole_rows   # a tile the user chose is the tile
    assert rf.KernelOptions().schedule_options(BACKENDS["cuda"].schedule, lambda: 132).whole_rows
    lowering = options.gpu_options(lambda: "sm_90")
    assert (lowering.sm, lowering.num_warps, lowering.min_blocks_per_sm, lowering.tma) == ("sm_80", 8, 2, True)
    assert rf.KernelOptions().gpu_options(lambda: "sm_90").sm == "sm_90"
    assert not rf.KernelOptions(tma=False).gpu_options(lambda: "sm_90a").tma
    assert (cpu.whole_max, gpu.whole_max) == (512, 256)                       # schedule/options.py, WHOLE_MAX
    assert rf.KernelOptions(whole_max=64).schedule_options(BACKENDS["cuda"].schedule, lambda: 132).whole_max == 64


def test_equal_options_share_one_compiled_specialization():
    k = rf.kernel(workloads.softmax, backend="interpret", options=rf.KernelOptions(interpret_chunk=8))
    x = np.ones((2, 16), np.float32)
    k(x)
    k(x)
    assert k.cache_size == 1
