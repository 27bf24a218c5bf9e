"""The host code generator's GEMM core: register-blocked dots, blocked transposes, operands read in place,
and rows reduced as explicit vectors (codegen/host/gemm.py, transpose.py, reduce_rows.py,
`KernelEmitter.global_view`).

Each path is checked twice: that the kernel takes it (in the LLVM IR it emits, for the block this host's
vector registers give) and that its results are numpy's under the tolerance rule, including the shapes
each path declines (tails, other dtypes) and the values a reduction must propagate (NaN, infinities).
"""
from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest

import redfuser as rf
from redfuser.codegen.host.emitter import conflicting_rows
from redfuser.codegen.host.blocking import (IN_FLIGHT_FMAS, choose_block, micro_kernel_block, panel_columns,
                                            vector_registers)
from redfuser.testing.tolerance import assert_close
from redfuser.workloads import attention


def _llvm(kernel, *args) -> str:
    return str(kernel.lower(*args).stages["llvm"])


def matmul(a, b):
    return a @ b


def matmul_t(a, b):
    return a @ rf.swapaxes(b, -1, -2)


def row_max(x):
    return rf.max(x * 2.0, axis=-1), rf.sum(x * 2.0, axis=-1), rf.min(x * 2.0, axis=-1)


def _exact(body, *args) -> np.ndarray:
    """`body` on `args` widened to float64, in the dtype numpy's own `body(*args)` gives."""
    want = body(*args)
    return np.asarray(body(*(x.astype(np.float64) for x in args))).astype(want.dtype)


@pytest.mark.parametrize("a_dtype", [np.float32, np.int32])   # int32 @ float32 is an f64 dot (8-lane blocks)
@pytest.mark.parametrize("m,k,n", [(64, 64, 64), (96, 40, 128), (17, 33, 48), (100, 7, 5), (1, 64, 64),
                                   (300, 260, 200)])   # ragged 128 x 128 tiles, a ragged third chunk
def test_matmul_equals_numpy(a_dtype, m, k, n):
    rng = np.random.default_rng(m * 1000 + n)
    a = (rng.standard_normal((m, k)) * 100).astype(a_dtype)
    b = rng.standard_normal((k, n)).astype(np.float32)
    got = rf.kernel(matmul, backend="cpu")(a, b)
    assert_close(got, _exact(matmul, a, b), got.dtype, k)
    bt = np.ascontiguousarray(b.T)
    got_t = rf.kernel(matmul_t, backend="cpu")(a, bt)
    assert_close(got_t, _exact(matmul_t, a, bt), got.dtype, k)


def test_a_plain_matmul_takes_the_gemm_tile_and_halves_its_rows_for_idle_workers():
    """A matmul's nest on the cpu takes `ScheduleOptions.gemm_tile` (256 x 512 outputs, 512-long chunks:
    `nests.matmul_tile`, `options.GEMM_TILE`), batched too; rows are halved while a static grid would leave a
    worker idle; a ``block_m`` or ``block_n`` the user gives is the tile."""
    rng = np.random.default_rng(21)

    def grid(kernel, *args):
        return re.search(r"grid \(([^)]*)\)", str(kernel.lower(*args).stages["tile"])).group(1)

    a, b = rng.standard_normal((300, 520)).astype(np.float32), rng.standard_normal((520, 260)).astype(np.float32)
    k = rf.kernel(matmul, backend="cpu", num_threads=2)
    assert grid(k, a, b) == "2, 1"                                  # 300 rows in two of 256, 260 columns in one
    assert "step 512" in str(k.lower(a, b).stages["tile"])
    assert_close(k(a, b), _exact(matmul, a, b), np.float32, 520)
    few, narrow = rng.standard_normal((64, 520)).astype(np.float32), b[:, :100]   # one tile of 128 x 128
    kf = rf.kernel(matmul, backend="cpu", num_threads=2)
    assert grid(kf, few, narrow) == "2, 1"                          # 64 rows: one tile, halved to two of 32
    assert_close(kf(few, narrow), _exact(matmul, few, narrow), np.float32, 520)
    batched = rng.standard_normal((3, 130, 70)).astype(np.float32), rng.standard_normal((3, 70, 40)).astype(np.float32)
    kb = rf.kernel(matmul, backend="cpu", num_threads=2)
    assert grid(kb, *batched) == "3, 1, 1"
    assert_close(kb(*batched), _exact(matmul, *batched), np.float32, 70)
    assert grid(rf.kernel(matmul, backend="cpu", block_m=32), a, b) == "10, 5"
    text = _llvm(k, a, b)   # 520 = two chunks: the dot accumulates in the loop's carried slot (stmts.py)
    assert "out_dot.init" not in text and "out_dot.cp" not in text


def test_a_dot_whose_tile_the_block_divides_is_register_blocked():
    a = np.ones((256, 256), np.float32)
    text = _llvm(rf.kernel(matmul, backend="cpu"), a, a)
    lanes = vector_registers()[0] // 4
    assert f"llvm.fmuladd.v{lanes}f32" in text and ".mb.header" in text


def test_choose_block_fits_the_register_file_and_divides_the_columns():
    width, registers = vector_registers()
    for m, n in [(32, 64), (64, 64), (16, 128), (12, 32), (7, 16)]:
        block = choose_block(m, n, 4)
        lanes = width // 4
        if n % lanes:
            assert block is None
            continue
        assert block is not None and block.rows <= m and n % block.cols == 0
        assert block.rows * block.vectors + block.vectors + 1 <= registers
        # the largest divisor of m the registers hold, unless under half of that or too few chains of FMAs
        # where the registers hold more (then a shorter last block)
        limit = min(m, 14, (registers - block.vectors - 1) // block.vectors)
        divisor = max(r for r in range(1, limit + 1) if m % r == 0)
        enough = divisor * block.vectors >= min(IN_FLIGHT_FMAS, limit * block.vectors)
        assert block.rows == (divisor if 2 * divisor > limit and enough else limit)
    assert choose_block(17, width // 4, 4).rows > 2      # 17 rows: not 17 blocks of one row
    assert choose_block(8, width // 4 + 1, 4) is None   # a row not a whole number of vectors keeps the loop nest


@pytest.mark.parametrize("registers,rows", [((32, 16), 6), ((64, 32), 8)], ids=["avx2", "avx512"])
def test_a_block_keeps_enough_fma_chains_in_flight(monkeypatch, registers, rows):
    """256 rows of an f32 GEMM tile: on AVX2's 16 registers the largest divisor the file holds, 4 (4 x 2 blocks:
    8 chains of dependent FMAs), left the FMA units waiting on their latency, 0.77-0.87x OpenBLAS; 6 x 2
    blocks (12 chains, and a last block of 4 rows) run at 0.97-1.10x. AVX-512's 32 registers keep 8 x 2."""
    from redfuser.codegen.host import blocking

    monkeypatch.setattr(blocking, "vector_registers", lambda: registers)
    block = blocking.choose_block(256, 128, 4)
    assert (block.rows, block.vectors) == (rows, 2)
    assert block.rows * block.vectors >= IN_FLIGHT_FMAS


def test_an_integer_dot_with_a_transposed_operand_is_exact():
    rng = np.random.default_rng(3)
    a = rng.integers(-1000, 1000, (64, 64)).astype(np.int32)
    b = rng.integers(-1000, 1000, (64, 64)).astype(np.int32)
    got = rf.kernel(matmul_t, backend="cpu")(a, b)
    want = matmul_t(a, b)
    assert got.dtype == want.dtype and np.array_equal(got, want)


@pytest.mark.parametrize("n", [64, 200, 1024])
def test_attention_takes_every_path_and_equals_numpy(n):
    rng = np.random.default_rng(n)
    q, k, v = (rng.standard_normal((1, 2, n, 64)).astype(np.float32) for _ in range(3))
    kern = rf.kernel(attention, backend="cpu")
    got = kern(q, k, v)
    assert_close(got, _exact(attention, q, k, v), np.float32, n)
    if n % 64 == 0 and vector_registers()[0] == 64:   # whole 64-key blocks: no masks, every path applies
        text = _llvm(kern, q, k, v)
        assert "k_t.tr.header" in text                # K^T transposed in registers
        assert ".rv.header" in text                   # the row max and sum as vectors
        assert "k_t.rows" not in text                 # K read in place, not copied first


def test_vector_row_reductions_propagate_nan_and_infinities():
    """Rows of 64 (a multiple of every vector's lanes) take the vector path; max and min keep NaN in a mask
    beside the values (reduce_rows.py), so a NaN in any lane of any vector, first or last, or a row of NaN,
    gives NaN, and infinities and all-``-inf`` rows come out as numpy's."""
    dtype = np.float32
    x = np.random.default_rng(5).standard_normal((12, 64)).astype(dtype)
    x[1, 40] = np.nan
    x[2, 3] = np.inf
    x[3, :] = -np.inf
    x[4, 10], x[4, 50] = np.inf, -np.inf
    x[5, 0] = np.nan                      # the first lane of the first vector
    x[6, 63] = np.nan                     # the last lane of the last vector
    x[7, :] = np.nan
    x[8, 7], x[8, 9] = np.nan, 100.0      # NaN beside a larger value in the next vector
    x[9, :] = np.inf
    kern = rf.kernel(row_max, backend="cpu")
    with np.errstate(invalid="ignore"):
        got, want = kern(x), row_max(x)
    for g, w in zip(got, want):
        assert np.array_equal(np.isnan(g), np.isnan(w))
        assert_close(g, w, dtype, 64)
    assert ".rv.header" in _llvm(kern, x)


def test_a_strided_argument_is_not_read_in_place_as_rows():
    """A view whose last dim steps by two elements: its loads are not one element apart, so the dot copies
    its operand (and the result is still numpy's)."""
    rng = np.random.default_rng(9)
    base = rng.standard_normal((64, 128)).astype(np.float32)
    a, b = base[:, ::2], rng.standard_normal((64, 64)).astype(np.float32)
    got = rf.kernel(matmul, backend="cpu")(a, b)
    assert_close(got, _exact(matmul, a, b), np.float32, 64)


def test_layer_norm_gemm_is_a_dot_centred_per_row():
    """``((x - mu) / s) @ w``: the running mean's count is kept per row (a count is the same at every
    index), so the centred term ``sum_j (x[i, j] - c[i]) w[j, n]`` is a dot; the carry's running sum of
    ``w`` is reduced once per chunk, not once per row (`cleanup.reduce_before_broadcast`), in a masked chunk
    too (a select of broadcasts is selected unrepeated)."""
    from redfuser.workloads import layer_norm_gemm

    rng = np.random.default_rng(11)
    kern = rf.kernel(layer_norm_gemm, backend="cpu")
    for k in (256, 200):           # whole chunks; masked chunks (w's sum selected and reduced unrepeated too)
        x = (rng.standard_normal((96, k)) * 2 + 3).astype(np.float32)
        w = rng.standard_normal((k, 72)).astype(np.float32)
        lowered = kern.lower(x, w)
        fused, tile = str(lowered.stages["fused"]), str(lowered.stages["tile"])
        assert "out_count" not in fused                    # no count per output element
        assert "= dot " in tile
        # no [rows, chunk, n] tile: ``w``'s chunk is summed as [1, chunk, n], masked or not
        assert not [d for d in re.findall(r"\[(\d+),\d+,\d+\]", tile) if int(d) > 1], tile
        assert_close(kern(x, w), _exact(layer_norm_gemm, x, w), np.float32, k)


def test_a_reduction_of_a_broadcast_is_reduced_once():
    """``sum(broadcast(y), axis)`` along a dim the broadcast did not repeat is the broadcast of y's sum."""
    from redfuser.ir.tile import nodes as t
    from redfuser.ir.types import float32
    from redfuser.ir import ReduceOp
    from redfuser.schedule.cleanup import reduce_before_broadcast

    y = t.Value("y", t.TileType(float32, (1, 8, 4)))
    big = t.Value("big", t.TileType(float32, (16, 8, 4)))
    r = t.Value("r", t.TileType(float32, (16, 4)))
    k = t.TileKernel("k", (1,), (), (t.Constant(y, 1.0), t.Broadcast(big, y), t.Reduce(r, big, 1, ReduceOp.SUM)))
    ops = reduce_before_broadcast(k).body
    assert [type(op).__name__ for op in ops] == ["Constant", "Broadcast", "Reduce", "Broadcast"]
    assert ops[2].x == y and ops[2].out.shape == (1, 4) and ops[3].out == r
    # along the repeated dim it stays as it is: the broadcast's copies are what the sum adds
    r0 = t.Value("r0", t.TileType(float32, (8, 4)))
    k0 = replace(k, body=(t.Constant(y, 1.0), t.Broadcast(big, y), t.Reduce(r0, big, 0, ReduceOp.SUM)))
    assert reduce_before_broadcast(k0).body == k0.body


def _sum_and_matmul(x, w):
    return rf.sum(x, axis=-1, keepdims=True) + x @ w


def _dots(kernel, *args) -> list:
    """The `Dot` ops of `kernel`'s tile program on `args`."""
    from redfuser.ir.tile import nodes as t

    def walk(ops):
        for op in ops:
            yield op
            if isinstance(op, t.For):
                yield from walk(op.body.ops)
    return [op for k in kernel.lower(*args).stages["tile"].kernels for op in walk(k.body) if isinstance(op, t.Dot)]


@pytest.mark.parametrize("n", [1024, 96])
def test_a_dots_right_operand_read_by_many_row_blocks_is_packed_in_panels(n):
    """A fused loop's ``w[j, n]`` chunk is the dot's right operand, read again by every row block: with 64
    rows (at least `PANEL_MIN_BLOCKS` blocks) it is copied into panels of the block's columns whatever its
    row stride, and the result is numpy's."""
    x = np.random.default_rng(6).standard_normal((64, 128)).astype(np.float32)
    w = np.random.default_rng(7).standard_normal((128, n)).astype(np.float32)
    k = rf.kernel(_sum_and_matmul, backend="cpu")
    (dot,) = _dots(k, x, w)
    block = micro_kernel_block(dot)
    if block is None:
        pytest.skip("no vector unit the micro-kernel blocks for")
    assert panel_columns(dot) == block.cols
    assert '"w.tile" = alloca' in _llvm(k, x, w)
    assert_close(k(x, w), _exact(_sum_and_matmul, x, w), np.float32, 128)


@pytest.mark.parametrize("n,copied", [(1024, True), (96, False)])
def test_a_few_rows_right_operand_at_a_set_conflicting_stride_is_copied(n, copied):
    """With 8 rows (fewer than `PANEL_MIN_BLOCKS` row blocks: a copy into panels would not pay) the right
    operand stays row-major, read in place unless its row stride is a multiple of 1 KiB (1024 f32 columns:
    4 KiB), where its rows would share a few L1 sets: then it is copied to the stack
    (`emitter.conflicting_rows`); at 384 bytes (96 columns) it is read in place."""
    x = np.random.default_rng(6).standard_normal((8, 64)).astype(np.float32)
    w = np.random.default_rng(7).standard_normal((64, n)).astype(np.float32)
    k = rf.kernel(_sum_and_matmul, backend="cpu", block_m=8, block_n=128)   # (a w block of 64 x 128: 32 KiB)
    (dot,) = _dots(k, x, w)
    assert panel_columns(dot) is None
    assert ('"w.tile" = alloca' in _llvm(k, x, w)) == copied
    assert_close(k(x, w), _exact(_sum_and_matmul, x, w), np.float32, 64)
    assert conflicting_rows((64, 64), (n, 1), 4) == copied
    assert not conflicting_rows((8, 64), (1024, 1), 4)       # no more rows than the cache's ways
    assert not conflicting_rows((512, 128), (32000, 1), 4)   # larger than L1 anyway: streamed in place


def test_a_gemm_operand_copied_into_panels_is_read_elsewhere_from_its_buffer():
    """Layer norm + GEMM sums each column of its ``w`` block (``mu * colsum(w)``) beside the dot that reads
    the block in panels: read from the panel copy, LLVM gathered every element (6.5% of the kernel on one
    thread); read from ``w`` itself, where its rows are contiguous, it is plain vector adds."""
    from redfuser.codegen.native import assembly
    from redfuser.workloads import layer_norm_gemm

    rng = np.random.default_rng(9)
    x = (rng.standard_normal((256, 256)) * 2 + 3).astype(np.float32)
    w = rng.standard_normal((256, 256)).astype(np.float32)
    kernel = rf.kernel(layer_norm_gemm, backend="cpu")
    assert "gather" not in assembly(str(kernel.lower(x, w).stages["llvm"]))
    want = layer_norm_gemm(x.astype(np.float64), w.astype(np.float64)).astype(np.float32)
    assert_close(kernel(x, w), want, np.float32, 256)
