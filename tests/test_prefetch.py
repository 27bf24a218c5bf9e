"""`prefetch_operands`: tensor-core operand tiles loaded one loop iteration ahead (schedule/prefetch.py).

The rewrite must compute exactly what the loop computed -- same loads, same order of arithmetic -- so the
Tile interpreter and the SIMT simulator give bit-identical results with and without it, at shapes with
masked tails and with a loop bound computed per program (causal attention's skipped key blocks). It must
also take only what it promises: 16/8-bit operand tiles of a product, within the register budget.
"""
from __future__ import annotations

import numpy as np
import pytest

import redfuser as rf
from redfuser.ir.tile import nodes as t
from redfuser.ir.simt.nodes import For, LoadGlobal, Mma, walk_stmts
from redfuser.ir.tile.interpreter import run_tile_program
from redfuser.schedule import options_for, schedule_program
from redfuser.schedule.prefetch import BUDGET_BYTES, prefetch_operands
from redfuser.workloads import attention, causal_attention, fp8_quant_gemm, softmax

RNG = np.random.default_rng(29)


def scheduled(fn, *args, **options) -> t.TileProgram:
    """The GPU schedule with 64-row tiles, which the budgets below are stated for (f16 attention at head
    64 defaults to 128 rows, `options.WIDE_ROWS`, whose accumulator alone fills the budget)."""
    options = {"block_m": 64, **options}
    return schedule_program(rf.kernel(fn, backend="interpret").lower(*args).program, options_for("gpu", options))


def carried(p: t.TileProgram) -> list[str]:
    """The loop-carried values of every loop, by name."""
    return [a.name for k in p.kernels for op in t.walk_ops(k.body) if isinstance(op, t.For) for a in op.body.args]


def qkv(n: int, head: int, dtype=np.float16):
    return tuple(RNG.standard_normal((1, 2, n, head)).astype(dtype) for _ in range(3))


@pytest.mark.parametrize("fn,n,options", [(attention, 256, {}), (attention, 200, {}),
                                          (causal_attention, 200, {"skip_masked": True}),
                                          (causal_attention, 256, {})])
def test_the_pipelined_loop_computes_bit_for_bit_what_the_loop_did(fn, n, options):
    args = qkv(n, 64)
    tile = scheduled(fn, *args, **options)
    ahead = prefetch_operands(tile, 128)
    assert carried(ahead) == carried(tile) + ["k_cur", "v_cur"]
    for a, b in zip(run_tile_program(tile, list(args)), run_tile_program(ahead, list(args))):
        np.testing.assert_array_equal(a, b)


def test_the_fp8_gemms_weight_tile_is_prefetched_and_its_result_unchanged():
    x = RNG.standard_normal((64, 200)).astype(np.float16)
    w = RNG.standard_normal((200, 64)).astype(rf.float8_e4m3fn)
    ws = RNG.uniform(0.5, 2.0, 64).astype(np.float32)
    tile = scheduled(fp8_quant_gemm, x, w, ws)
    ahead = prefetch_operands(tile, 128)
    assert [a for a in carried(ahead) if a not in carried(tile)] == ["w_cur"]   # x is quantized first: not a view
    for a, b in zip(run_tile_program(tile, [x, w, ws]), run_tile_program(ahead, [x, w, ws])):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("head,threads,expected", [(64, 128, ["k_cur", "v_cur"]), (128, 128, []),
                                                    (128, 256, ["k_cur", "v_cur"]), (64, 64, [])])
def test_tiles_are_taken_in_order_while_the_loops_tiles_fit_the_budget(head, threads, expected):
    """`BUDGET_BYTES` (256) a thread for the 2-d tiles a loop carries: the f32 accumulator, 64 x head, and
    the 64 x head f16 k and v tiles. At head 64 and 128 threads: 128 + 64 + 64 bytes; at head 128 the
    accumulator alone is 256; with 256 threads, 128 + 64 + 64 again; with 64 threads, 256 alone."""
    assert BUDGET_BYTES == 256
    tile = scheduled(attention, *qkv(128, head))            # two key blocks: a loop
    ahead = prefetch_operands(tile, threads)
    assert [a for a in carried(ahead) if a not in carried(tile)] == expected
    assert (ahead is tile) == (not expected)


def test_what_is_not_a_tensor_core_operand_is_left_alone():
    x = RNG.standard_normal((64, 1000)).astype(np.float16)
    tile = scheduled(softmax, x)                                   # a stream, no product
    assert prefetch_operands(tile, 128) is tile
    tile = scheduled(attention, *qkv(128, 32, np.float32))         # f32 products run as FMA loops
    assert prefetch_operands(tile, 128) is tile


def test_the_next_tiles_loads_are_issued_before_the_bodys_first_product():
    """With prefetch every global load of the key loop (the next k and v tiles) comes before its first mma;
    without, v's loads wait behind the scores' products."""
    q = qkv(256, 64)[0]

    def loads_before_first_mma(**options) -> tuple[int, int]:
        simt = rf.kernel(attention, backend="simulate", **options).lower(q, q, q).stages["simt"]
        loop = next(s for s in simt.kernels[0].body if isinstance(s, For))
        order = [isinstance(s, LoadGlobal) for s in walk_stmts(loop.body.stmts) if isinstance(s, LoadGlobal | Mma)]
        return sum(order[:order.index(False)]), sum(order)

    before, total = loads_before_first_mma(prefetch=True, block_m=64)   # 128 rows fill the budget
    assert before == total > 0
    before, total = loads_before_first_mma(block_m=64)         # off by default (docs/gpu-backend.md)
    assert 0 < before < total


@pytest.mark.parametrize("dtype", [np.float16, rf.bfloat16])
def test_attention_on_the_simulator_is_the_same_with_and_without_prefetch(dtype):
    q, k, v = qkv(200, 64, dtype)
    on = rf.kernel(causal_attention, backend="simulate", skip_masked=True, prefetch=True)(q, k, v)
    off = rf.kernel(causal_attention, backend="simulate", skip_masked=True)(q, k, v)
    np.testing.assert_array_equal(on, off)
