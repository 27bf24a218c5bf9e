"""GPU offsets past 2^31 elements: each thread's part of an offset (its warp's row times the row's stride) is
computed in 64 bits where it can pass 2^31 - 1, not in 32 bits widened afterwards. Compiled from shapes alone
(`rf.ShapeDtype`): such arrays are larger than the simulator copies, and no GPU is needed to read the code."""
from __future__ import annotations

import re

import pytest

import redfuser as rf
from redfuser.ir.errors import RedFuserError


def _row_sums(x):
    return rf.sum(x, axis=-1)


def _simt(shape: tuple[int, ...], strides: tuple[int, ...] | None = None) -> str:
    lowered = rf.kernel(_row_sums, backend="cuda", sm="sm_90").lower(rf.ShapeDtype(shape, rf.float16, strides))
    return str(lowered.stages["simt"])


@pytest.mark.parametrize("shape,strides,stride", [
    ((4, 715_827_883), None, 715_827_883),          # rows 2 and 3 start past 2^31 elements
    ((64, 64), (2**30 + 1, 1), 2**30 + 1),           # a slice of much longer rows
])
def test_a_threads_offset_that_can_pass_2_31_is_computed_in_64_bits(shape, strides, stride):
    """``warp * stride`` was an i32 product cast to i64 afterwards: warp 3 of the (4, 715827883) row sums read
    4 GiB before ``x`` (a fault or a wrong row on a device). The stride now only appears as a 64-bit value.
    Found by a helper (hunt_huge/01)."""
    text = _simt(shape, strides)
    narrow = [line.strip() for line in text.splitlines()
              if re.search(rf"i32 = const {stride}\b", line) or re.search(rf"\* {stride}\b.*i32", line)]
    assert not narrow, narrow
    assert re.search(rf"i64 = const {stride}\b", text)


def test_a_row_longer_than_2_31_elements_compiles_for_the_gpu():
    """A stride of 2^31 + 5 elements was an i32 constant, an internal verifier error after ``lower_to_simt``
    (hunt_huge/02)."""
    try:
        text = _simt((3, 2**31 + 5))
    except RedFuserError as err:          # (an internal error is a RedFuserError too: the test says which)
        pytest.fail(f"{type(err).__name__}: {err}")
    assert re.search(rf"i64 = const {2**31 + 5}\b", text)

