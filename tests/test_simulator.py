"""The SIMT simulator: hand-built kernels against numpy, PTX shuffle/mma semantics, and planted bugs caught."""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import simt_kernels as K
from redfuser.ir.simt.fragments import fragment_a, fragment_b, fragment_c
from redfuser.codegen.simulator import SimOptions, simulate
from redfuser.codegen.simulator.arith import convert
from redfuser.codegen.simulator.warp import shuffle_sources
from redfuser.ir.errors import RedFuserError, SimulationError
from redfuser.ir.semantics import BinaryOp
from redfuser.ir.simt.nodes import MmaShape, ShuffleKind
from redfuser.ir.simt.builder import SimtBuilder
from redfuser.ir.types import bfloat16, float8_e4m3fn, float16, float32, int32

RNG = np.random.default_rng(7)


# --- kernels against numpy --------------------------------------------------------------------------

@pytest.mark.parametrize("index64", [False, True])
def test_elementwise_masked_ragged(index64):
    n = 1000                                       # 16 blocks of 64 threads: the last one is ragged
    x = RNG.standard_normal(n).astype(np.float16)
    y = RNG.standard_normal(n).astype(np.float32)
    out = simulate(K.elementwise(n, index64=index64), [x, y, np.full(n, -7.0), np.zeros(n), n])
    ref = np.where(y > 0, np.exp(x.astype(np.float32)) * y + 1, np.sqrt(np.abs(y))).astype(np.float32)
    np.testing.assert_allclose(out["out"], ref, rtol=1e-6)
    assert np.array_equal(out["out_bf16"], ref.astype(ml_dtypes.bfloat16))


@pytest.mark.parametrize("dtype", [float32, float16, bfloat16])
def test_vector_loads_16_bytes_with_scalar_tail(dtype):
    n = 1001
    x = RNG.standard_normal(n).astype(dtype.numpy)
    out = simulate(K.vector_scale(n, dtype), [x, np.zeros(n), 1.5])["out"]
    assert np.array_equal(out, (x.astype(np.float32) * np.float32(1.5)).astype(dtype.numpy))


def test_block_reduction():
    x = RNG.standard_normal((3, 300)).astype(np.float32)
    out = simulate(K.block_sum(3, 300), [x, np.zeros(3)])["out"]
    np.testing.assert_allclose(out, x.sum(axis=1), rtol=1e-5)


def test_online_softmax_merge_across_warps():
    x = (RNG.standard_normal((3, 70)) * 4).astype(np.float32)
    x[1, :20] = -np.inf                            # masked scores; warp 3 sees no element at all (n = 70)
    got = simulate(K.softmax_stats(3, 70), [x, np.zeros(3), np.zeros(3), np.zeros(3)])
    m = x.max(axis=1)
    l = np.exp(x - m[:, None]).sum(axis=1)
    np.testing.assert_array_equal(got["m"], m)
    np.testing.assert_allclose(got["l"], l, rtol=1e-5)
    np.testing.assert_allclose(got["lse"], m + np.log(l), rtol=1e-5)


@pytest.mark.parametrize("shape", list(MmaShape))
def test_mma_tile_product(shape):
    kernel = K.mma_gemm(shape)
    a_buf, b_buf, _ = kernel.buffers
    a = RNG.standard_normal(a_buf.shape).astype(shape.operand_dtype.numpy)
    b = RNG.standard_normal(b_buf.shape).astype(shape.operand_dtype.numpy)
    c = simulate(kernel, [a, b, np.zeros((a.shape[0], b.shape[1]))])["c"]
    np.testing.assert_allclose(c, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-5, atol=1e-5)


def test_mma_fragments_cover_each_element_once():
    for k in (16, 32):
        a = [rc for lane in range(32) for reg in fragment_a(lane, k) for rc in reg]
        b = [rc for lane in range(32) for reg in fragment_b(lane, k) for rc in reg]
        assert sorted(a) == [(r, c) for r in range(16) for c in range(k)]
        assert sorted(b) == [(r, c) for r in range(k) for c in range(8)]
    assert sorted(rc for lane in range(32) for rc in fragment_c(lane)) == [(r, c) for r in range(16) for c in range(8)]


def test_all_ops_match_numpy():
    kernel, names = K.all_ops()
    f = RNG.standard_normal(32).astype(np.float32) * 3
    f[:4] = [0.0, -0.0, np.inf, np.nan]
    g = RNG.uniform(0.1, 4, 32).astype(np.float32)
    i = RNG.integers(-1000, 1000, 32).astype(np.int32)
    j = RNG.integers(1, 50, 32).astype(np.int32) * RNG.choice([-1, 1], 32).astype(np.int32)
    q = np.arange(0, 256, 8, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn)
    got = simulate(kernel, [f, g, i, j, q, np.zeros(32 * len(names))])["out"].reshape(len(names), 32)
    res = dict(zip(names, got))
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(res["exp"], np.exp(f))
        np.testing.assert_array_equal(res["f**"], np.power(g, f))
        np.testing.assert_array_equal(res["fmaximum"], np.maximum(f, g))   # NaN propagates
        np.testing.assert_array_equal(res["f!="], (f != g).astype(np.float32))
        np.testing.assert_array_equal(res["div"], np.trunc(i / j))       # C division, not floor
        np.testing.assert_array_equal(res["rem"], np.fmod(i, j))
        np.testing.assert_array_equal(res["shr"], i >> (j & 7))
        saturated = np.array([0, 0, 2**31 - 1, 0], np.int32)                    # cvt.rzi: inf saturates, NaN -> 0
        np.testing.assert_array_equal(res["cast_i32"], np.concatenate([saturated, np.trunc(f[4:])]).astype(np.float32))
        np.testing.assert_array_equal(res["cast_bool"], (f != 0).astype(np.float32))
        np.testing.assert_array_equal(res["cast_bf16"], f.astype(ml_dtypes.bfloat16).astype(np.float32))
        np.testing.assert_array_equal(res["e4m3"], q.astype(np.float32))
    lanes = np.arange(32)
    np.testing.assert_array_equal(res["shfl_idx"], f[(lanes & ~7) | ((j & 31) & 7)])
    np.testing.assert_array_equal(res["shfl_down"], np.where((lanes & 15) + 3 <= 15, i[np.minimum(lanes + 3, 31)], i))


def test_fp8_conversion_saturates_like_the_hardware():
    x = np.array([0.0, 1.0, -2.5, 448.0, 460.0, 500.0, -1e6, np.inf, np.nan, 2.0**-9, 3e-3] + [0.1] * 53,
                 dtype=np.float32)
    got = simulate(K.fp8_roundtrip(), [x, np.zeros(64), np.zeros(64)])
    assert list(got["out"][:8]) == [0.0, 1.0, -2.5, 448.0, 448.0, 448.0, -448.0, 448.0]   # numpy would give NaN
    assert np.isnan(got["out"][8]) and got["out"][9] == 2.0**-9
    assert got["q"].view(np.uint8)[7] == 0x7E and got["q"].view(np.uint8)[8] & 0x7F == 0x7F


@given(st.lists(st.floats(width=32, allow_nan=True), min_size=1, max_size=16))
def test_casts_follow_the_gpu(values):
    x = np.array(values, dtype=np.float32)
    assert np.array_equal(convert(x, float32, float16), x.astype(np.float16), equal_nan=True)
    assert np.array_equal(convert(x, float32, bfloat16).astype(np.float32),
                          x.astype(ml_dtypes.bfloat16).astype(np.float32), equal_nan=True)
    e4m3 = convert(x, float32, float8_e4m3fn).astype(np.float32)
    finite = ~np.isnan(x)
    assert np.all(np.abs(e4m3[finite]) <= 448) and np.all(np.isnan(e4m3[~finite]))
    i = convert(x, float32, int32)
    assert np.all(i[np.isnan(x)] == 0) and np.all((i >= np.iinfo(np.int32).min) & (i <= np.iinfo(np.int32).max))


# --- shuffles: the CUDA programming guide's statement of the PTX semantics -----------------------------

def _expected(kind: ShuffleKind, operand: int, width: int) -> list[int]:
    out = []
    for lane in range(32):
        base = lane - lane % width
        if kind is ShuffleKind.BFLY:
            src = lane ^ operand
            out.append(src if src < base + width else lane)   # earlier groups are readable, later ones are not
        elif kind is ShuffleKind.IDX:
            out.append(base + operand % width)
        else:
            out.append(lane + operand if lane + operand < base + width else lane)
    return out


@pytest.mark.parametrize("kind,operand,width", [
    (ShuffleKind.BFLY, 1, 32), (ShuffleKind.BFLY, 16, 32), (ShuffleKind.BFLY, 8, 8), (ShuffleKind.BFLY, 3, 4),
    (ShuffleKind.IDX, 5, 32), (ShuffleKind.IDX, 11, 8), (ShuffleKind.DOWN, 1, 32), (ShuffleKind.DOWN, 5, 16),
    (ShuffleKind.DOWN, 2, 4),
])
def test_shuffle_semantics(kind, operand, width):
    expected = _expected(kind, operand, width)
    lanes = np.arange(32)
    assert list(shuffle_sources(kind, lanes, np.full(32, operand), width)) == expected
    for by_register in (False, True):
        out = simulate(K.shuffle_probe(kind, operand, width, by_register=by_register), [np.zeros(32)])["out"]
        assert list(out) == expected


def _ldmatrix_reference(tile: np.ndarray, starts: np.ndarray, count: int, trans: bool) -> np.ndarray:
    """The PTX ISA's rule, lane by lane: lane 8m + r gives where row r of matrix m starts; lane 4r + w
    gets columns 2w, 2w + 1 of row r (with .trans: rows 2w, 2w + 1 of column r) of each matrix m."""
    out = np.zeros((32, 2 * count), tile.dtype)
    for lane in range(32):
        r, w = divmod(lane, 4)
        for m in range(count):
            for e in range(2):
                if trans:
                    out[lane, 2 * m + e] = tile[starts[8 * m + 2 * w + e] + r]
                else:
                    out[lane, 2 * m + e] = tile[starts[8 * m + r] + 2 * w + e]
    return out


@pytest.mark.parametrize("count", [1, 2, 4])
@pytest.mark.parametrize("trans", [False, True])
@pytest.mark.parametrize("dtype", [float16, bfloat16])
def test_ldmatrix_semantics(count, trans, dtype):
    """Rows at shuffled, 16-byte aligned places; lanes past 8 * count give addresses nobody reads."""
    x = RNG.standard_normal(64 * 8).astype(dtype.numpy)
    starts = (RNG.permutation(64)[:32] * 8).astype(np.int32)
    got = simulate(K.ldmatrix_probe(count, trans, dtype), [x, starts, np.zeros((32, 2 * count), dtype.numpy)])["out"]
    assert np.array_equal(got, _ldmatrix_reference(x, starts, count, trans))


# --- planted bugs ---------------------------------------------------------------------------------------

def _raises(kind: str, kernel, args, *needles: str) -> SimulationError:
    with pytest.raises(SimulationError) as info:
        simulate(kernel, args)
    assert info.value.kind == kind, str(info.value)
    for needle in needles:
        assert needle in str(info.value), str(info.value)
    assert isinstance(info.value, RedFuserError)
    return info.value


def test_missing_barrier_is_a_race():
    x = np.ones((3, 300), np.float32)
    _raises("race", K.block_sum(3, 300, barrier=False), [x, np.zeros(3)], "shared partials[1]",
            "thread 1 (warp 0, lane 1) of block (0,) reads", "thread 32 (warp 1, lane 0) of block (0,)",
            "no barrier orders them", "at: %partials: f32 = load.shared partials[%lane]")
    relaxed = simulate(K.block_sum(3, 300, barrier=False), [x, np.zeros(3)], options=SimOptions(check_races=False))
    assert list(relaxed["out"]) == [300.0] * 3      # lock-step order hides the race: only the tracker sees it


def test_off_by_one_index_is_out_of_bounds():
    n = 1000
    args = [np.zeros(n, np.float16), np.zeros(n, np.float32), np.zeros(n), np.zeros(n), n]
    _raises("out_of_bounds", K.elementwise(n, off_by_one=True), args,
            "load of global x[1000] by thread 40 (warp 1, lane 8) of block (15,)", "x has 1000 elements",
            "at: %x: f16 = load.global x[%add] mask %le other 0.0")


def test_divergent_barrier():
    _raises("divergent_barrier", K.block_sum(divergent_barrier=True), [np.ones((3, 300)), np.zeros(3)],
            "thread 32 (warp 1, lane 0)", "at: barrier")


def test_uninitialized_shared_read():
    _raises("uninitialized", K.uninitialized_read(), [np.zeros(64)], "thread 32 (warp 1, lane 0) of block (0,) reads "
            "shared slots[32], which no thread has written")
    _raises("uninitialized", K.block_sum(slots=8), [np.ones((3, 300)), np.zeros(3)], "shared partials[4]")


def test_shared_memory_starts_poisoned_with_nan():
    kernel = K.uninitialized_read()
    out = simulate(kernel, [np.zeros(64)], options=SimOptions(check_uninitialized=False))["out"]
    assert list(out[:32]) == list(range(32)) and np.isnan(out[32:]).all()


def _overwrite(barrier_before_write: bool):
    """Each thread reads its neighbour's slot, then overwrites its own: a write-after-read race without a barrier."""
    b = SimtBuilder("overwrite", warps=1, grid=(1,))
    out = b.buffer("out", float32, (32,))
    s = b.shared("s", float32, (32,))
    tid = b.thread_idx()
    b.store_shared(s, tid, b.cast(tid, float32))
    b.barrier()
    nxt = b.int_op(K.IntOp.AND, b.add(tid, b.const(1, int32)), b.const(31, int32))
    v = b.load_shared(s, nxt)
    if barrier_before_write:
        b.barrier()
    b.store_shared(s, tid, b.add(v, v))
    b.barrier()
    b.store_global(out, tid, b.load_shared(s, tid))
    return b.build()


def test_write_after_read_race():
    _raises("race", _overwrite(False), [np.zeros(32)], "writes shared s[0]", "thread 31 (warp 0, lane 31)",
            "read in the same barrier interval")
    out = simulate(_overwrite(True), [np.zeros(32)])["out"]
    assert list(out) == [2.0 * ((t + 1) % 32) for t in range(32)]


def test_conflicting_writes_and_cross_block_reads():
    def kernel(same_value: bool, read_other_block: bool):
        b = SimtBuilder("conflict", warps=1, grid=(2,))
        out = b.buffer("out", float32, (4,))
        tid, bid = b.thread_idx(), b.block_idx()
        value = b.cast(tid, float32) if not same_value else b.const(1.0, float32)
        zero = b.const(0, int32)
        if read_other_block:
            first = b.eq(tid, zero)
            b.store_global(out, bid, b.load_global(out, zero, mask=first), mask=first)
        else:
            b.store_global(out, bid, value, mask=b.lt(tid, b.const(2, int32)))
        return b.build()

    assert list(simulate(kernel(True, False), [np.zeros(4)])["out"]) == [1.0, 1.0, 0.0, 0.0]
    _raises("race", kernel(False, False), [np.zeros(4)], "write different values to global out[0] in one store")
    _raises("race", kernel(True, True), [np.zeros(4)], "block (1,) reads global out[0]", "blocks are not ordered")


def test_misaligned_vector_access_and_divergent_shuffle():
    b = SimtBuilder("misaligned", warps=1, grid=(1,))
    x = b.buffer("x", float32, (256,))
    v = b.load_global(x, b.add(b.mul(b.thread_idx(), b.const(4, int32)), b.const(2, int32)), length=4)
    b.store_global(x, b.mul(b.thread_idx(), b.const(4, int32)), v)
    _raises("misaligned", b.build(), [np.zeros(256)], "4-element vector load of global x[2]", "multiple of 4")

    b = SimtBuilder("divergent_shuffle", warps=1, grid=(1,))
    out = b.buffer("out", int32, (32,))
    tid = b.thread_idx()
    b.if_(b.lt(tid, b.const(16, int32)),
          lambda: b.store_global(out, tid, b.shuffle(ShuffleKind.BFLY, tid, 1)))
    _raises("divergent_warp_op", b.build(), [np.zeros(32)], "shfl.sync.bfly needs all 32 lanes of warp 0",
            "thread 16 (warp 0, lane 16)")


def test_divergent_loops_and_nested_ifs():
    # Thread t runs t % 5 trips: lock-step with a shrinking mask; ifs yield per thread.
    got = simulate(K.branchy(), [np.zeros(64)])["out"]
    assert list(got) == K.branchy_reference()


def test_argument_errors():
    kernel = K.block_sum()
    with pytest.raises(SimulationError, match="1 arguments"):
        simulate(kernel, [np.zeros((3, 300))])
    with pytest.raises(SimulationError, match="x wants 900 elements"):
        simulate(kernel, [np.zeros(10), np.zeros(3)])
    with pytest.raises(SimulationError, match=r"missing \['out'\]"):
        simulate(kernel, {"x": np.zeros((3, 300))})


def test_inputs_are_not_modified_and_comparisons_keep_nan():
    x = np.array([math.nan] * 64, np.float16)
    y = np.full(64, np.nan, np.float32)
    got = simulate(K.elementwise(64), [x, y, np.zeros(64), np.zeros(64), 64])
    assert np.isnan(got["out"]).all() and np.isnan(x).all()   # nan > 0 is false: sqrt(|nan|) = nan
    assert BinaryOp.NE.is_comparison


def test_ldmatrix_row_must_be_16_byte_aligned_and_inside():
    x = np.zeros(64 * 8, np.float16)
    starts = np.arange(32, dtype=np.int32) * 8
    starts[5] = 12
    _raises("misaligned", K.ldmatrix_probe(4, False), [x, starts, np.zeros((32, 8), np.float16)],
            "tile[12:20]", "lane 5", "multiple of 8")
    starts[5] = 64 * 8
    _raises("out_of_bounds", K.ldmatrix_probe(4, True), [x, starts, np.zeros((32, 8), np.float16)], "tile[512:520]")
