"""The cpu backend's software prefetch of a chunk loop's next-trip rows (`codegen/host/stream_prefetch.py`)."""
import re

import numpy as np
import pytest

import redfuser as rf
from redfuser.testing.tolerance import assert_close
from redfuser.workloads import attention, mean_abs_deviation

from redfuser.codegen.host.stream_prefetch import LINE_BYTES


def _prefetches(text: str) -> list[str]:
    return [line for line in text.splitlines() if "@\"llvm.prefetch.p0\"(" in line and "call" in line]


@pytest.mark.parametrize("n", [300, 1024])
def test_decoding_asks_for_the_next_chunks_key_and_value_rows(n):
    """Decoding's loop reads a chunk of 128 keys (64 KiB of ``k`` and of ``v`` at head 128) per trip; its two
    reductions ask, row by row, for the same row of the next trip's ``k`` and ``v`` tiles: every line of a
    512-byte row (and the one after, for a row that does not start on a line), 128 x 128 elements on. The
    results are the body's (n = 300: the last chunk is masked, and its prefetches past the end are
    harmless)."""
    rng = np.random.default_rng(3)
    q = rng.standard_normal((1, 2, 1, 128)).astype(np.float32)
    k, v = (rng.standard_normal((1, 2, n, 128)).astype(np.float32) for _ in range(2))
    kernel = rf.kernel(attention, backend="cpu")
    llvm = str(kernel.lower(q, k, v).stages["llvm"])
    calls = _prefetches(llvm)
    per_row = 128 * 4 // LINE_BYTES + 1
    assert len(calls) == 2 * per_row
    assert {re.search(r'ptr %"(\w+)"', line) is None for line in calls} == {True}   # (addresses, not buffers)
    assert re.search(r"add i64 %[\w.\"]+, 16384\n", llvm), "the next trip's rows: 128 keys x 128 elements on"
    ref = attention(*(a.astype(np.float64) for a in (q, k, v))).astype(np.float32)
    assert_close(kernel(q, k, v), ref, np.float32, n)


def test_a_chunk_of_a_long_row_is_left_to_the_hardware():
    """A loop over chunks of long rows (64 elements on per trip, in the same 4 KiB page) gets no prefetch:
    the hardware streamer follows a row, and the prefetches would only add instructions."""
    x = np.random.default_rng(4).standard_normal((64, 1000)).astype(np.float32)
    kernel = rf.kernel(mean_abs_deviation, backend="cpu")
    lowered = kernel.lower(x)
    assert "for %r0" in str(lowered.stages["tile"])
    assert _prefetches(str(lowered.stages["llvm"])) == []


def test_a_gathered_chunk_is_not_prefetched():
    """Rows picked by an index array (``take_along_axis(k, idx)``: offsets computed from loaded values) move by no constant
    from one trip to the next, so nothing is prefetched for them; the result is still the body's."""
    def gathered_decode(q, k, idx):
        s = rf.sum(q * rf.take_along_axis(k, idx[:, None], axis=0), axis=-1)
        m = rf.max(s, axis=-1, keepdims=True)
        return rf.sum(rf.exp(s - m), axis=-1)

    rng = np.random.default_rng(5)
    q = rng.standard_normal((1, 128)).astype(np.float32)
    k = rng.standard_normal((4096, 128)).astype(np.float32)
    idx = rng.integers(0, 4096, 2048)
    kernel = rf.kernel(gathered_decode, backend="cpu")
    lowered = kernel.lower(q, k, idx)
    assert " for " in str(lowered.stages["tile"])
    assert _prefetches(str(lowered.stages["llvm"])) == []
    ref = gathered_decode(q.astype(np.float64), k.astype(np.float64), idx).astype(np.float32)
    assert_close(kernel(q, k, idx), ref, np.float32, 2048)
