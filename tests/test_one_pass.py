"""One pass over a row: whole-row tiles by default on GPUs, one exponential an element, one division a row.

- `schedule.options.ONE_PASS_MAX` / `FusedLayout.one_pass_rows`: the GPU default tile of a loop of per-row
  states is whole rows (when the grid still fills the device), so softmax reads its row once;
- `codegen.simt.plan.choose_warps`: without ``num_warps``, such a tile gets enough warps for 32 elements a
  thread;
- `fusion.nan_guard.read_extrema_safely`: softmax's ``exp(x - m)`` after the loop reads ``m`` as the loop's
  terms do, so with one chunk the two exponentials are one;
- `schedule.exprs._times_reciprocal`: ``e / l`` rounded to f16 is ``e * (1 / l)``;
- `schedule.cleanup.COMMUTATIVE`: ``a * b`` and ``b * a`` merge.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import redfuser as rf
from redfuser.codegen.simt import GpuOptions, lower_to_simt
from redfuser.codegen.simt.run import simulate_program
from redfuser.codegen.simt.plan import choose_warps
from redfuser.ir import BinaryOp, Buffer, UnaryOp
from redfuser.ir.tile import nodes as t
from redfuser.ir.loop.interpreter import run_program
from redfuser.schedule import options_for, schedule_program
from redfuser.schedule.cleanup import merge_duplicates
from redfuser.schedule.builder import KernelBuilder
from redfuser.ir import types as T
from redfuser.ir.types import BufferType
from redfuser.testing import assert_close
from redfuser.workloads import layer_norm_stats, log_softmax, moe_routing, softmax, softmax_entropy
from helpers import as_tuple, ops_of

RNG = np.random.default_rng(11)


def gpu_tiles(fn, *args, **options) -> t.TileProgram:
    """The GPU schedule of `fn` for `args` (no device needed)."""
    return rf.kernel(fn, backend="simulate", sm="sm_90", **options).lower(*args).stages["tile"]


def awkward_rows(shape, dtype=np.float16) -> np.ndarray:
    """Normal rows, and rows that are all -inf, start with -inf, hold a NaN, or hold +inf."""
    x = (RNG.standard_normal(shape) * 3).astype(dtype)
    x[1] = -np.inf
    x[2, : shape[1] // 2] = -np.inf
    x[3, 5] = np.nan
    x[4, 7] = np.inf
    return x


# ---------------------------------------------------------------------------------------------
# whole-row tiles and their warps
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fn", [softmax, log_softmax])
def test_the_gpu_default_reads_a_row_once(fn):
    """[32768, 16384]: one row a tile, no loop left, one load of ``x``, 16 warps of 32 elements a thread."""
    x = rf.ShapeDtype((32768, 16384), np.float16)   # only its shape and dtype are read
    (kernel,) = gpu_tiles(fn, x).kernels
    assert kernel.grid == (32768,)
    assert not ops_of(kernel, t.For) and len(ops_of(kernel, t.Load)) == 1
    assert choose_warps(kernel, GpuOptions()) == 16
    assert choose_warps(kernel, GpuOptions(num_warps=8)) == 8          # the option is the option


def test_whole_row_tiles_stack_short_rows_and_keep_the_grid_full():
    """A tile holds `ONE_PASS_TILE` elements of rows, fewer while the grid has fewer tiles than SMs; with
    too few rows for half the SMs even at one a tile, the loop is chunked and split as before."""
    def grid(rows, cols):
        return [k.grid for k in gpu_tiles(softmax, np.zeros((rows, cols), np.float16)).kernels]

    assert grid(8192, 1024) == [(8192 // 16,)]         # 16 rows of 1024 a tile
    assert grid(1024, 2048) == [(1024 // 4,)]          # 8 a tile would be 128 tiles for 132 SMs: 4
    assert grid(64, 16384)[-1] != (64,)                # 64 tiles < 132 / 2: chunked and split
    assert len(grid(64, 16384)) == 3
    long_rows = gpu_tiles(softmax, rf.ShapeDtype((8192, 32768), np.float16)).kernels
    assert all(ops_of(k, t.For) for k in long_rows)        # over ONE_PASS_MAX: chunks


def test_a_tile_the_user_gives_and_the_cpu_default_are_kept():
    x = np.zeros((8192, 1024), np.float16)
    assert [k.grid for k in gpu_tiles(softmax, x, block_m=32).kernels] == [(8192 // 32,)]
    assert [k.grid for k in gpu_tiles(softmax, x, block_n=64).kernels] == [(8192 // 32,)]
    assert options_for("gpu").whole_rows and not options_for("cpu").whole_rows
    assert not options_for("gpu", {"block_n": 128}).whole_rows


def test_a_running_top_k_keeps_its_chunks():
    """A top-k sorts each chunk; whole rows would grow that network with the row. Routing's top-k (after the
    softmax's pass, which reads whole rows) and a running top-k in a fused loop both keep their chunks."""
    x = np.zeros((32768, 128), np.float32)
    softmax_pass, top_k = gpu_tiles(moe_routing, x).kernels[:2]
    assert not ops_of(softmax_pass, t.For) and not ops_of(softmax_pass, t.TopK)
    assert ops_of(top_k, t.For) and ops_of(top_k, t.TopK)

    def max_and_top2(x):
        vals, idx = rf.topk(x, 2)
        return rf.max(x, axis=-1), vals, idx

    (fused,) = gpu_tiles(max_and_top2, x).kernels
    assert ops_of(fused, t.For) and ops_of(fused, t.TopK)


def test_kernels_with_products_or_loops_keep_four_warps():
    """Attention (a ``dot``) and decoding's partial kernel (a loop over key chunks of a 64 x 128 tile,
    1.45x slower at 8 warps on an H200) keep `DEFAULT_WARPS`."""
    from redfuser.workloads import attention

    q = np.zeros((1, 2, 256, 64), np.float16)
    (kernel,) = gpu_tiles(attention, q, q, q).kernels
    assert choose_warps(kernel, GpuOptions()) == 4
    q, kv = np.zeros((4, 32, 1, 128), np.float16), rf.ShapeDtype((4, 32, 32768, 128), np.float16)
    partial = gpu_tiles(attention, q, kv, kv).kernels[0]
    assert ops_of(partial, t.For) and max(v.type.size for op in t.walk_ops(partial.body) for v in t.results(op)) > 4096
    assert choose_warps(partial, GpuOptions()) == 4


@pytest.mark.parametrize("fn", [softmax, log_softmax])
@pytest.mark.parametrize("shape", [(300, 1000), (2048, 512), (48, 4096)])
def test_default_gpu_tiles_equal_the_reference(fn, shape):
    """Whole rows (or the split fallback) on the simulator: numpy's values, NaN where numpy's are, on rows
    of -inf, NaN and +inf too."""
    x = awkward_rows(shape)
    out = rf.kernel(fn, backend="simulate", sm="sm_90")(x)
    with np.errstate(invalid="ignore"):
        expected = fn(x)
    assert_close(out, expected, np.float16, shape[1], any_nonfinite=True)


@given(rows=st.integers(1, 40), cols=st.sampled_from([1, 3, 16, 100, 257, 1024, 3000]),
       fn=st.sampled_from([softmax, log_softmax, softmax_entropy, layer_norm_stats]),
       dtype=st.sampled_from([np.float16, np.float32]), seed=st.integers(0, 2**16))
def test_whole_row_tiles_of_random_shapes_equal_numpy_on_the_simulator(rows, cols, fn, dtype, seed):
    """Whole-row tiles (scheduled for one worker, so that every shape takes them) of per-row cascades over
    random row counts and lengths, ragged and not, with -inf, NaN and +inf rows: the simulator gives
    numpy's values under the tolerance rule, NaN where numpy's are."""
    if fn is softmax_entropy and dtype is np.float16:
        dtype = np.float32   # numpy's f16 p underflows to 0 and 0 * log 0 is NaN; RedFuser computes in f32
    x = (np.random.default_rng(seed).standard_normal((rows, cols)) * 3).astype(dtype)
    for row, value in zip(range(1, rows, 3), (-np.inf, np.nan, np.inf)):
        x[row, seed % cols] = value
    if rows > 4:
        x[4] = -np.inf
    low = rf.kernel(fn, backend="interpret").lower(x)
    opts = options_for("gpu", {"workers": 1})
    tiled = schedule_program(low.program, opts)
    if rows > 1:   # (one row: its index folds to 0, the states are not per-row values, and chunks stay)
        assert not ops_of(tiled.kernels[0], t.For)
    simt = lower_to_simt(tiled, GpuOptions())
    with np.errstate(all="ignore"):
        expected = fn(x)
    expected = as_tuple(expected)
    # the entropy cancels terms of size |x - m| (log l against sum p (x - m)), the fused variance terms of
    # size x^2 (sum x^2 against n mean^2; the fusion notes the cancellation): those are their honest scales
    finite = float(np.abs(x[np.isfinite(x)]).max(initial=1.0))
    scale = {softmax_entropy: 2 * finite, layer_norm_stats: finite ** 2}.get(fn)
    for actual, e in zip(simulate_program(simt, [x]), expected):
        assert_close(actual, e, np.dtype(dtype), cols, fn.__name__, scale=scale, any_nonfinite=True)


# ---------------------------------------------------------------------------------------------
# after the loop, exponentials read the running max as the loop does
# ---------------------------------------------------------------------------------------------
def test_softmax_output_reads_the_max_safely_and_shares_the_exponential():
    x = np.zeros((64, 256), np.float16)
    low = rf.kernel(softmax, backend="simulate", sm="sm_90", block_m=1, block_n=256).lower(x)
    assert "exp(x[i0,i1] - where(m[i0] == -inf, 0.0, m[i0]))" in str(low.stages["fused"])
    (kernel,) = low.stages["tile"].kernels
    full = [op for op in ops_of(kernel, t.Unary) if op.op in (UnaryOp.EXP2, UnaryOp.EXP2_FTZ) and op.out.shape[-1] > 1]
    assert len(full) == 1                               # one exponential a row element, not two


def test_the_pass_changes_nothing_where_no_nan_guard_decides():
    """``m`` returned as it is, or read in an exponential whose NaN guard reaches the value only through
    ``**`` (``1 ** nan`` is 1) or a comparison: untouched."""
    def returns_max(x):
        m = rf.max(x, axis=-1, keepdims=True)
        e = rf.exp(x - m)
        return e / rf.sum(e, axis=-1, keepdims=True), m

    def guard_through_pow(x):
        m = rf.max(x, axis=-1, keepdims=True)
        l = rf.sum(rf.exp(x - m), axis=-1, keepdims=True)
        return rf.exp(x - m) * (l ** 0.0)

    def guard_through_compare(x):
        m = rf.max(x, axis=-1, keepdims=True)
        l = rf.sum(rf.exp(x - m), axis=-1, keepdims=True)
        return rf.where(l > 0.0, rf.exp(x - m), 0.0)

    x = awkward_rows((8, 64), np.float32)
    safe_reads = []
    for fn in (returns_max, guard_through_pow, guard_through_compare):
        fused = rf.kernel(fn, backend="interpret").lower(x).program
        names = {b.name for b in fused.outputs}
        outputs = [line for line in str(fused).splitlines()[1:] if line.lstrip().split(":")[0] in names]
        safe_reads.append(["== -inf, 0.0" in line for line in outputs])
        with np.errstate(invalid="ignore", divide="ignore"):
            expected = fn(x)
        expected = as_tuple(expected)
        for a, e in zip(run_program(fused, (x,)), expected):
            assert_close(a, e, np.float32, 64, any_nonfinite=True)
    assert safe_reads == [[True, False], [False], [False]]   # returns_max: its softmax output, not its m


# ---------------------------------------------------------------------------------------------
# a quotient rounded to a narrow float is a product by the divisor's reciprocal
# ---------------------------------------------------------------------------------------------
def row_normalize(x, s):
    return x / s


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_a_row_divisor_is_inverted_once_for_narrow_results(dtype):
    x = np.zeros((64, 256), dtype)
    s = np.zeros((64, 1), dtype)
    (kernel,) = gpu_tiles(row_normalize, x, s).kernels
    divides = [op for op in ops_of(kernel, t.Binary) if op.op is BinaryOp.DIV]
    ranks = [len(d.out.shape) for d in divides]
    assert ranks == ([1] if dtype is np.float16 else [2])  # f16: 1 / s once a row; f32 stays a division


@pytest.mark.parametrize("backend", ["cpu", "simulate"])
def test_the_reciprocal_gives_the_quotient_or_its_neighbour(backend):
    """Every f16 value over divisors that are ordinary, tiny, huge, zero, -0, infinite and NaN: numpy's
    f16 quotient, or the next f16 beside it; the same NaNs and infinities."""
    bits = np.arange(0, 1 << 16, dtype=np.uint16)
    bits = bits[(bits & 0x7C00) != 0x7C00]                      # finite values
    x = np.resize(bits.view(np.float16), (64, 1024))
    divisors = np.array([3.0, 0.1, 7e-8, 6.0e4, 0.0, -0.0, np.inf, np.nan, -2.5, 1.0] * 6 + [1.5] * 4,
                        np.float16).reshape(64, 1)
    out = rf.kernel(row_normalize, backend=backend, block_m=16, block_n=256)(x, divisors)
    with np.errstate(divide="ignore", invalid="ignore"):
        expected = x / divisors
    assert np.array_equal(np.isnan(out), np.isnan(expected))
    finite = ~np.isnan(expected)
    a = out[finite].view(np.uint16).astype(np.int32)
    e = expected[finite].view(np.uint16).astype(np.int32)
    same_sign = (a >> 15) == (e >> 15)
    zeros = (out[finite] == 0) & (expected[finite] == 0)
    assert np.all((same_sign & (np.abs(a - e) <= 1)) | zeros)
    assert np.mean(a == e) > 0.99                                # the neighbour is rare


# ---------------------------------------------------------------------------------------------
# commutative operands merge
# ---------------------------------------------------------------------------------------------
def test_commuted_products_merge_but_maxima_do_not():
    """``a * b`` and ``b * a`` are one product; ``maximum(a, b)`` and ``maximum(b, a)`` may differ on -0
    and +0, so both stay."""
    kb = KernelBuilder("k", T.int32)
    a, b = kb.const(1.5, T.float32), kb.const(-0.0, T.float32)
    results = [kb.binary(BinaryOp.MUL, a, b), kb.binary(BinaryOp.MUL, b, a),
               kb.binary(BinaryOp.MAX, a, b), kb.binary(BinaryOp.MAX, b, a)]
    for n, v in enumerate(results):
        kb.emit(t.Store(Buffer(f"out{n}", BufferType(T.float32, (1,))), kb.const(0, T.int32), v, None))
    merged = merge_duplicates(kb.finish((1,)))
    binaries = [op for op in merged.body if isinstance(op, t.Binary)]
    assert [op.op for op in binaries] == [BinaryOp.MUL, BinaryOp.MAX, BinaryOp.MAX]


@pytest.mark.parametrize("backend", ["cpu", "simulate"])
def test_a_narrow_quotient_by_a_subnormal_row_divisor_stays_finite(backend):
    """``x / max|x|`` of a row of tiny bf16 values: the row's divisor is below 2**-128, whose f32 reciprocal
    overflowed, so the quotients were inf and ``0 / d`` NaN where numpy's are finite; the divisor is now
    scaled by a power of two before its reciprocal, and the product back (exact)."""
    import ml_dtypes

    def normalize(x):
        return x / rf.max(rf.abs(x), axis=-1, keepdims=True)

    def by_tiny(x):
        return x / ml_dtypes.bfloat16(1e-40)

    tiny = np.array([[1e-39, -2e-39, 0.0, 5e-40]], np.float32).astype(ml_dtypes.bfloat16)
    mixed = np.array([[0.0, 1e-30, -3e-5, 2.5]], np.float32).astype(ml_dtypes.bfloat16)
    for body, x in ((normalize, tiny), (by_tiny, mixed)):
        with np.errstate(all="ignore"):
            want = body(x)
        got = rf.kernel(body, backend=backend)(x)
        np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))
