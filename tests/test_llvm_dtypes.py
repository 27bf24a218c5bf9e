"""The one LLVM dtype layer of both emitters (`codegen.llvm_dtypes`), JIT-compiled and run on the host.

`cast` is numpy's ``astype`` on every target: every (source, destination) pair of the IR's dtypes, f64
included (no kernel argument can be f64, so the kernels of `test_conformance` reach it only inside), on
each dtype's edge values: NaN, +-0, +-inf, subnormals, the largest finite values, ties of rounding and
integer extremes. Run with the host's capabilities for every pair, and with the GPU's for every pair
whose steps are plain LLVM the host can run too (not the NVVM e4m3 conversion, bf16's ``fptrunc`` or a
wide source narrowed directly, which the host lowers to library calls): so both emitters' ladders are
checked against numpy, not just against each other. Float to int saturates and gives 0 for NaN, where
numpy's value is undefined (a C cast): the value PTX's ``cvt.rzi`` and LLVM's ``fptosi.sat`` give.
"""
from __future__ import annotations

import ctypes

import llvmlite.binding as llvm
import llvmlite.ir as ir
import ml_dtypes
import numpy as np
import pytest

from redfuser.codegen.llvm_dtypes import HOST, NVPTX, cast, constant, from_memory, memory_type, to_memory
from redfuser.codegen.llvm_utils import I64, PTR, VOID, counted_loop, initialize_native
from redfuser.ir.types import ALL_DTYPES, DType, float32, float64, int32

_FLOAT_EDGES = [np.nan, -np.nan, 0.0, -0.0, np.inf, -np.inf, 1.0, -1.0, 0.5, 1.5, 2.5, -2.5, 7.5, 1e-3, 3.0e38, -3.4e38,
                65504.0, 65520.0, -65536.0, 448.0, 464.0, 480.0, -1000.0, 2.0 ** -6, 2.0 ** -9, 2.0 ** -10, 3 * 2.0 ** -11,
                2.0 ** -24, 2.0 ** -25, 2.0 ** -126, 2.0 ** -133, 2.0 ** -149, 1e-300, 1e300,
                1 + 2.0 ** -8 + 2.0 ** -30, 1 + 2.0 ** -11 + 2.0 ** -40, 2.0 ** 31, -2.0 ** 31, 2.0 ** 31 - 128,
                2.0 ** 63, -2.0 ** 63, 123456.789, -0.75, 0.9999999]


def edge_values(d: DType) -> np.ndarray:
    """The edge values of `d`, in `d` (each float edge rounded to `d`, duplicates kept)."""
    if d.is_bool:
        return np.array([True, False, True], np.bool_)
    if d.is_int:
        info = np.iinfo(d.numpy)
        return np.array([info.min, info.max, info.min + 1, info.max - 1, 0, 1, -1, 2, 3, -7, 100, 2**24 + 1,
                         -(2**24) - 3, 65519, 65521, 449], np.int64).astype(d.numpy)
    x = np.array(_FLOAT_EDGES, np.float64)
    if d.name == "f8e4m3":
        x = x[np.abs(np.nan_to_num(x)) < 1e10]   # no infinities in e4m3fn (inf would be NaN: kept by NaN above)
    with np.errstate(all="ignore"):
        return x.astype(d.numpy)


def expected(x: np.ndarray, src: DType, dst: DType) -> np.ndarray:
    """numpy's ``astype``, with the defined value where numpy's is undefined (float to int out of range)."""
    with np.errstate(all="ignore"):
        if src.is_float and dst.is_int:
            info, wide = np.iinfo(dst.numpy), np.trunc(x.astype(np.float64))
            limit = float(info.max) + 1.0
            inside = np.where(np.isnan(wide) | (wide >= limit) | (wide < -limit), 0, wide).astype(dst.numpy)
            return np.where(np.isnan(wide), 0, np.where(wide >= limit, info.max,
                                                         np.where(wide < -limit, info.min, inside))).astype(dst.numpy)
        if src.is_int and dst.storage_only:   # one rounding from the (f64) value, as the emitters give
            return x.astype(np.float64).astype(dst.numpy)
        return x.astype(dst.numpy)


def _module(src: DType, dst: DType, caps) -> str:
    """``void convert(ptr in, ptr out, i64 n)``: ``out[i] = cast(in[i])``."""
    module = ir.Module("casts")
    module.triple = llvm.get_process_triple()
    fn = ir.Function(module, ir.FunctionType(VOID, [PTR, PTR, I64]), "convert")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    src_ptr, dst_ptr, n = fn.args
    with counted_loop(b, ir.Constant(I64, 0), n) as i:
        x = from_memory(b, b.load(b.gep(src_ptr, [i], source_etype=memory_type(src)), typ=memory_type(src)), src)
        y = to_memory(b, cast(b, x, src, dst, caps), dst)
        b.store(y, b.gep(dst_ptr, [i], source_etype=memory_type(dst)))
    b.ret_void()
    return str(module)


def _run(text: str, x: np.ndarray, dst: DType) -> np.ndarray:
    initialize_native()
    ref = llvm.parse_assembly(text)
    ref.verify()
    machine = llvm.Target.from_default_triple().create_target_machine(   # this CPU's features: F16C for half
        cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), jit=True)
    engine = llvm.create_mcjit_compiler(ref, machine)
    engine.finalize_object()
    out = np.zeros(len(x), dst.numpy)
    x = np.ascontiguousarray(x)
    fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(engine.get_function_address("convert"))
    fn(x.ctypes.data, out.ctypes.data, len(x))
    return out


def _same(actual: np.ndarray, want: np.ndarray) -> np.ndarray:
    if want.dtype.kind in "biu":
        return actual == want
    a, w = actual.astype(np.float64), want.astype(np.float64)
    return ((a == w) & (np.signbit(a) == np.signbit(w))) | (np.isnan(a) & np.isnan(w))


def _host_runs(text: str, src: DType, dst: DType) -> bool:
    """Whether the host can run the GPU ladder's code for this pair (no NVVM intrinsic, no library call)."""
    wide_to_narrow = dst.storage_only and (src == float64 or src.is_int)
    return "llvm.nvvm" not in text and "bfloat" not in text and not wide_to_narrow


PAIRS = [(s, d) for s in ALL_DTYPES for d in ALL_DTYPES if s != d]
CASES = [(s, d, HOST) for s, d in PAIRS] + [(s, d, NVPTX) for s, d in PAIRS if _host_runs(_module(s, d, NVPTX), s, d)]


@pytest.mark.parametrize("src,dst,caps", CASES, ids=[f"{s}-{d}-{c.name}" for s, d, c in CASES])
def test_cast_is_numpys_astype_on_edge_values(src, dst, caps):
    x = edge_values(src)
    actual, want = _run(_module(src, dst, caps), x, dst), expected(x, src, dst)
    wrong = ~_same(actual, want)
    assert not wrong.any(), (f"{src} -> {dst} ({caps.name}): {x[wrong][:6].astype(np.float64)} gave "
                             f"{actual[wrong][:6]}, numpy {want[wrong][:6]}")


def test_every_e4m3_and_bf16_code_decodes_exactly():
    """The one decode both targets use: all 256 e4m3 codes, and the bf16 codes of every sign and exponent."""
    e4m3 = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn)
    bf16 = (np.arange(0, 65536, 7, dtype=np.uint32).astype(np.uint16)).view(ml_dtypes.bfloat16)
    for codes in (e4m3, bf16):
        src = next(d for d in ALL_DTYPES if d.numpy == codes.dtype)
        for caps in (HOST, NVPTX):
            actual = _run(_module(src, float32, caps), codes, float32)
            assert _same(actual, codes.astype(np.float32)).all(), (src, caps.name)


def test_the_targets_differ_only_where_their_capabilities_say():
    """f32 -> bf16 / e4m3 is one instruction on the GPU and integer code on the host; a wide source narrows
    through f32 rounded to odd on the host only; f16 -> int widens first on the host only."""
    bf16, e4m3, f16 = (next(d for d in ALL_DTYPES if d.name == n) for n in ("bf16", "f8e4m3", "f16"))
    assert "fptrunc float" in _module(float32, bf16, NVPTX) and "bfloat" not in _module(float32, bf16, HOST)
    assert "llvm.nvvm.ff.to.e4m3x2.rn" in _module(float32, e4m3, NVPTX)
    assert "llvm.nvvm" not in _module(float32, e4m3, HOST)
    assert "llvm.fabs.f64" in _module(float64, f16, HOST) and "llvm.fabs.f64" not in _module(float64, f16, NVPTX)
    assert "fptosi.sat.i32.f16" in _module(f16, int32, NVPTX) and "fptosi.sat.i32.f32" in _module(f16, int32, HOST)


def test_constants_are_rounded_to_their_dtype_first():
    f16 = next(d for d in ALL_DTYPES if d.name == "f16")
    assert str(constant(f16, 1e6)) == str(constant(f16, np.inf))      # numpy's rounding: too big is inf
    assert constant(float32, 0.1).constant == float(np.float32(0.1))
    bf16 = next(d for d in ALL_DTYPES if d.name == "bf16")
    assert constant(bf16, 1.0).constant == 0x3F80                      # the bit pattern
