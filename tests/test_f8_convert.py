"""float8_e4m3fn without sm_89's ``cvt``: the software conversion in the SIMT IR (`codegen.simt.fp8_bits`) equals
ml_dtypes bit for bit -- every f16 value and a large f32 sample (random bit patterns, ties between e4m3 neighbours
and the floats next to them, the NaN/overflow edges) -- in the simulator and in the emitted LLVM code run on the
host; the decode (e4m3 -> f32) too, for all 256 codes. Storing f8 and the FP8 quantization work on sm_80."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from redfuser.codegen.ptx_check import check_ptx
from redfuser.codegen.simt.fp8_bits import f32_to_e4m3
from redfuser.codegen.simt.values import LoweringBuilder
from redfuser.codegen.simulator import simulate
from redfuser.ir import VerifyError
from redfuser.ir.simt.nodes import Bitcast, Reg, RegType
from redfuser.ir.simt.builder import SimtBuilder
from redfuser.ir.types import float8_e4m3fn, float32, float64, int32, int64
from helpers import run_on_host

import redfuser as rf

F8 = ml_dtypes.float8_e4m3fn
VEC, WARPS = 16, 4


def convert_kernel(n: int):
    """``q = e4m3(x)`` in software and ``d = f32(c)``, 16 elements per thread (f32 loads of 4, one f8 store of 16)."""
    b = LoweringBuilder("to_e4m3", warps=WARPS, grid=(n // (VEC * 32 * WARPS),))
    x, c = b.buffer("x", float32, (n,)), b.buffer("c", float8_e4m3fn, (n,))
    q, d = b.buffer("q", float8_e4m3fn, (n,)), b.buffer("d", float32, (n,))
    thread = b.add(b.mul(b.block_idx(), b.const(32 * WARPS, int32)), b.thread_idx())
    base = b.mul(thread, b.const(VEC, int32))
    at = [b.add(base, b.const(4 * i, int32)) for i in range(VEC // 4)]
    wide = b.pack([b.load_global(x, i, length=4) for i in at])
    b.store_global(q, base, f32_to_e4m3(b, wide))
    back = b.cast(b.load_global(c, base, length=VEC), float32)
    for n_, i in enumerate(at):
        b.store_global(d, i, b.extract(back, 4 * n_, 4))
    return b.build()


def inputs(rng) -> np.ndarray:
    """Every f16 value, then f32 bit patterns, ties between e4m3 neighbours and the floats just around them."""
    every_f16 = np.arange(2**16, dtype=np.uint16).view(np.float16).astype(np.float32)
    bits = rng.integers(0, 2**32, 2**15, dtype=np.uint64).astype(np.uint32).view(np.float32)
    grid = np.unique(np.abs(np.arange(256, dtype=np.uint8).view(F8).astype(np.float32)))
    grid = grid[np.isfinite(grid)]
    ties = np.concatenate([(grid[:-1] + grid[1:]) / 2, [464.0, 2.0**-10, 3 * 2.0**-10]]).astype(np.float32)
    near = np.concatenate([ties, np.nextafter(ties, np.float32(np.inf)), np.nextafter(ties, np.float32(0))])
    near = np.concatenate([near, -near, [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 448.0, 480.0, 1e-45, -1e-45]])
    scale = 2.0 ** rng.uniform(-14, 10, 2**14) * rng.choice([-1.0, 1.0], 2**14)
    x = np.concatenate([every_f16, bits, near.astype(np.float32), scale.astype(np.float32)])
    block = VEC * 32 * WARPS
    return np.concatenate([x, np.zeros(-len(x) % block, np.float32)])


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint8 if a.dtype == F8 else np.uint32)


@pytest.fixture(scope="module")
def case():
    x = inputs(np.random.default_rng(8))
    codes = np.resize(np.arange(256, dtype=np.uint8), x.size).view(F8)
    return convert_kernel(x.size), [x, codes, np.zeros(x.size, F8), np.zeros(x.size, np.float32)]


def test_software_conversion_is_ml_dtypes_bit_for_bit_in_the_simulator(case):
    kernel, args = case
    with np.errstate(invalid="ignore", over="ignore"):
        expected_q, expected_d = args[0].astype(F8), args[1].astype(np.float32)
    out = simulate(kernel, args)
    assert np.array_equal(_bits(out["q"]), _bits(expected_q))
    assert np.array_equal(_bits(out["d"]), _bits(expected_d))


def test_software_conversion_is_ml_dtypes_bit_for_bit_in_the_emitted_code(case):
    kernel, args = case
    with np.errstate(invalid="ignore", over="ignore"):
        expected_q, expected_d = args[0].astype(F8), args[1].astype(np.float32)
    out = run_on_host(kernel, args)
    assert np.array_equal(_bits(out["q"]), _bits(expected_q))
    assert np.array_equal(_bits(out["d"]), _bits(expected_d))


def test_bitcast_op_is_typed_printed_and_simulated():
    b = SimtBuilder("bits", warps=1, grid=(1,))
    out = b.buffer("out", int64, (32,))
    one = b.const(-1.5, float64)
    back = b.bitcast(b.bitcast(one, int64), float64)
    b.store_global(out, b.cast(b.thread_idx(), int64), b.bitcast(back, int64))
    kernel = b.build()
    assert "bitcast" in str(kernel)
    assert (simulate(kernel, [np.zeros(32, np.int64)])["out"] == np.float64(-1.5).view(np.int64)).all()
    for src, dst in ((float64, int32), (float32, float64), (int32, int64)):   # narrower, float-float, int-int
        bad = SimtBuilder("bad", warps=1, grid=(1,))
        reg = bad.const(1, src) if src.is_int else bad.const(1.0, src)
        bad.emit(Bitcast(Reg("oops", RegType(dst)), reg))
        with pytest.raises(VerifyError, match="bitcast"):
            bad.build()


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_storing_float8_on_sm80(dtype):
    x = np.concatenate([np.random.default_rng(1).standard_normal(997) * 200,
                        [0, -0.0, np.inf, -np.inf, np.nan, 448, 464, 470, -500, 2**-10]]).astype(dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        expected = x.astype(F8)
    kernel = rf.kernel(lambda a: a.astype(F8), backend="simulate", sm="sm_80", block_m=64)
    assert np.array_equal(_bits(kernel(x)), _bits(expected))
    ptx = rf.kernel(lambda a: a.astype(F8), backend="cuda", sm="sm_80").lower(x).stages["ptx"]
    assert "e4m3" not in str(ptx)                       # no sm_89 instruction
    for k in ptx.kernels:
        assert set(check_ptx(k.ptx)) == {"sm_80", "sm_90"}


def quantize_and_gemm(x, w, w_scale):
    """The FP8 quant GEMM that also returns its quantized activations (stored as float8_e4m3fn)."""
    xf = x.astype(rf.float32)
    a = rf.max(rf.abs(xf), axis=-1, keepdims=True)
    xq = (xf * (448.0 / a)).astype(rf.float8_e4m3fn)
    return xq, (xq.astype(rf.float32) @ w.astype(rf.float32)) * w_scale * (a / 448.0)


def test_fp8_quantization_stores_f8_on_sm80():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((20, 64)).astype(np.float16)
    w, ws = rng.standard_normal((64, 24)).astype(F8), rng.uniform(0.5, 2, 24).astype(np.float32)
    (xq, y), (xq_ref, y_ref) = (rf.kernel(quantize_and_gemm, backend="simulate", sm="sm_80", block_m=16)(x, w, ws),
                                quantize_and_gemm(x, w, ws))
    assert np.array_equal(_bits(xq), _bits(xq_ref))
    np.testing.assert_allclose(y, y_ref, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("sm", ["sm_80", "sm_90a"])
def test_nan_past_the_range_keeps_the_sign(sm):
    """ml_dtypes' NaN for |x| > 464, inf and NaN is ``S.1111.111``: negative inputs give 0xFF, on sm_90a (the
    ``cvt`` path) as on sm_80 (software); the quantize-dequantize keeps the sign of NaN and of zero too."""
    above = np.nextafter(np.float32(464), np.float32(np.inf))
    bad = np.array([above, 465, 480, 500, 1e5, 3.4e38, np.inf, np.nan], np.float32)
    payload_nan = np.uint32(0xFF812345).view(np.float32)   # negative, not the default NaN
    x = np.concatenate([bad, -bad, [payload_nan], [464, -464, -0.0, -1e-45, -2.0**-11, 0.0]]).astype(np.float32)
    assert np.signbit(x[len(bad):2 * len(bad) + 1]).all()
    with np.errstate(invalid="ignore", over="ignore"):
        expected = x.astype(F8)
    assert (_bits(expected[:len(bad)]) == 0x7F).all() and (_bits(expected[len(bad):2 * len(bad) + 1]) == 0xFF).all()
    store = rf.kernel(lambda a: a.astype(rf.float8_e4m3fn), backend="simulate", sm=sm)
    assert np.array_equal(_bits(store(x)), _bits(expected))
    round_trip = rf.kernel(lambda a: a.astype(rf.float8_e4m3fn).astype(rf.float32), backend="simulate", sm=sm)
    assert np.array_equal(_bits(round_trip(x)), _bits(expected.astype(np.float32)))
