"""NVPTX plumbing without a GPU: hand-built kernels -> PTX for sm_80/sm_90 -> assembled by nvJitLink.

Every PTX here is assembled (`check_ptx`), so a test fails with the assembler's log on invalid PTX.
"""
from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest
from llvmlite import ir

import nvptx_samples
from redfuser.codegen import nvptx, nvvm, nvvm_mma, ptx_check
from redfuser.codegen.nvvm import F16, F32, I16, I32, PTR
from redfuser.ir.errors import BackendError, InternalError
from redfuser.ir.simt import fragments

SMS = ("sm_80", "sm_90")


def compile_and_check(module: ir.Module, sm: str) -> tuple[str, dict[str, ptx_check.AssembleResult]]:
    """PTX of `module` for `sm`, assembled for every arch among sm_80/sm_90 that can run it."""
    ptx = nvptx.compile_to_ptx(module, sm)
    assert f".target {sm}" in ptx
    results = ptx_check.check_ptx(ptx)
    assert sm in results and all(r.cubin for r in results.values())
    return ptx, results


def assert_no_spills(ptx: str, sm: str) -> ptx_check.ResourceUsage:
    usage = ptx_check.resource_usage(ptx, sm)
    assert usage.registers > 0
    assert (usage.spill_store_bytes, usage.spill_load_bytes, usage.stack_bytes) == (0, 0, 0), usage
    return usage


# --- the hand-built kernels ------------------------------------------------------------------------

@pytest.mark.parametrize("sm", SMS)
def test_vector_add_masked_64bit(sm):
    ptx, results = compile_and_check(nvptx_samples.vector_add(), sm)
    assert ".visible .entry vector_add(" in ptx
    assert "mul.wide.u32" in ptx and "add.s64" in ptx          # 64-bit index: ctaid*ntid widened first
    assert "setp.ge.s64" in ptx                                 # the bounds mask, compared in 64 bits
    assert "ld.global.nc" in ptx                                # noalias inputs become read-only loads
    assert set(results) == ({"sm_80", "sm_90"} if sm == "sm_80" else {"sm_90"})
    assert_no_spills(ptx, sm)


@pytest.mark.parametrize("sm", SMS)
def test_vector_add_16_byte_vectors(sm):
    ptx, _ = compile_and_check(nvptx_samples.vector_add_v4(), sm)
    assert "ld.global.nc.v4.b32" in ptx or "ld.global.nc.v4.f32" in ptx
    assert "st.global.v4.b32" in ptx or "st.global.v4.f32" in ptx
    assert_no_spills(ptx, sm)


@pytest.mark.parametrize("sm", SMS)
def test_block_reduction_shuffles_shared_barrier(sm):
    ptx, _ = compile_and_check(nvptx_samples.block_sum(256), sm)
    assert ptx.count("shfl.sync.bfly.b32") == 10                # 5 butterflies per warp pass, two passes
    assert "bar.sync \t0" in ptx or "bar.sync 0" in ptx or "barrier.sync" in ptx
    assert ".shared .align 16 .b8 warp_partials[32]" in ptx     # 8 warps x f32
    assert "st.shared" in ptx and "ld.shared" in ptx
    assert ".maxntid 256" in ptx                                # launch bounds reached ptxas
    usage = assert_no_spills(ptx, sm)
    assert usage.shared_bytes == 32


@pytest.mark.parametrize("sm", SMS)
def test_dynamic_shared_memory(sm):
    ptx, _ = compile_and_check(nvptx_samples.reverse_in_block(), sm)
    assert ".extern .shared .align 16 .b8 redfuser_dynamic_smem[]" in ptx
    assert ptx_check.resource_usage(ptx, sm).shared_bytes == 0  # dynamic: not counted statically


@pytest.mark.parametrize("sm", SMS)
def test_mma_f16(sm):
    ptx, _ = compile_and_check(nvptx_samples.mma_tile("f16"), sm)
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in ptx
    assert_no_spills(ptx, sm)


@pytest.mark.parametrize("sm", SMS)
def test_mma_bf16(sm):
    ptx, _ = compile_and_check(nvptx_samples.mma_tile("bf16"), sm)
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx
    assert_no_spills(ptx, sm)


def test_mma_fp8_e4m3_on_sm90_and_refused_on_sm80():
    ptx, _ = compile_and_check(nvptx_samples.mma_tile("e4m3"), "sm_90")
    assert "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32" in ptx
    assert ".version 8.4" in ptx
    # LLVM would abort the whole process ("Cannot select"); we raise instead.
    with pytest.raises(BackendError, match=r"m16n8k32.*needs sm_89\+.*sm_80"):
        nvptx.compile_to_ptx(nvptx_samples.mma_tile("e4m3"), "sm_80")
    with pytest.raises(BackendError, match="PTX ISA 8.4"):
        nvptx.compile_to_ptx(nvptx_samples.mma_tile("e4m3"), "sm_90", ptx_version=80)


def _kernel(name: str, args: list[ir.Type]) -> tuple[ir.Module, ir.Function, ir.IRBuilder]:
    module = nvptx.new_module(name)
    fn = nvvm.define_kernel(module, name, args)
    return module, fn, ir.IRBuilder(fn.append_basic_block("entry"))


def test_fast_exp_and_shuffle_variants():
    module, fn, b = _kernel("fast_math", [PTR, I32])
    out, n = fn.args
    x = b.sitofp(n, F32)
    e = nvvm.exp_fast(b, x)
    e = b.fadd(e, nvvm.ex2_approx(b, x, ftz=False))
    i = nvvm.shfl_bfly(b, n, 1, width=16)                          # i32 shuffles too
    i = b.add(i, nvvm.shfl_idx(b, n, 0))
    e = b.fadd(e, nvvm.shfl_down(b, e, 2))
    b.store(b.fadd(e, b.sitofp(b.add(i, nvvm.lane_id(b)), F32)), out)
    b.ret_void()
    assert "i32 4127" in str(module)                               # width 16: ((32-16) << 8) | 31
    ptx, _ = compile_and_check(module, "sm_80")
    for needle in ("ex2.approx.ftz.f32", "ex2.approx.f32", "shfl.sync.bfly.b32", "shfl.sync.idx.b32",
                   "shfl.sync.down.b32", "%laneid"):
        assert needle in ptx, needle


def test_conversions_ldmatrix_cp_async_on_sm80():
    module, fn, b = _kernel("staging", [PTR, PTR])
    out, src = fn.args
    tile = nvvm.declare_shared(module, "tile", I16, 256)
    dst = nvvm.shared_gep(b, tile, I16, ir.Constant(I32, 0))
    nvvm_mma.cp_async_16(b, dst, src)
    nvvm_mma.cp_async_commit(b)
    nvvm_mma.cp_async_wait(b, 0)
    nvvm.barrier(b)
    frags = nvvm_mma.ldmatrix(b, nvvm.shared_gep(b, tile, I16, b.mul(nvvm.lane_id(b), ir.Constant(I32, 8))), 4)
    bits = nvvm_mma.f32_to_bf16_bits(b, b.bitcast(frags[0], F32))
    half = b.fptrunc(nvvm_mma.bf16_bits_to_f32(b, bits), F16)
    packed = b.bitcast(nvvm_mma.pack_half2(b, half, half), I32)
    total = b.add(b.add(packed, nvvm_mma.pack_i16x2(b, bits, bits)), frags[3])
    b.store(total, out)
    b.ret_void()
    ptx, _ = compile_and_check(module, "sm_80")
    for needle in ("cp.async.cg.shared.global", "cp.async.commit_group", "cp.async.wait_group",
                   "ldmatrix.sync.aligned.m8n8.x4.shared.b16", "cvt.rn.bf16.f32"):
        assert needle in ptx, needle


def test_fp8_conversion_on_sm90():
    module, fn, b = _kernel("quant", [PTR, F32, F32])
    out, lo, hi = fn.args
    b.store(nvvm_mma.f32x2_to_e4m3x2(b, lo, hi), out)
    b.ret_void()
    ptx, _ = compile_and_check(module, "sm_90")
    assert "cvt.rn.satfinite.e4m3x2.f32" in ptx


# --- errors: Python exceptions, never a crashed process ------------------------------------------------

def test_invalid_ir_raises_internal_error_with_llvm_message():
    with pytest.raises(InternalError, match="LLVM could not parse") as info:
        nvptx.compile_to_ptx("define ptx_kernel void @k() {\n  %x = add i32 1\n  ret void\n}\n")
    assert "expected ','" in str(info.value) and ">   3" in str(info.value)  # the numbered source excerpt
    bad = ("define ptx_kernel void @k(i32 %a) {\nentry:\n  br label %b\nb:\n  %y = add i32 %z, 1\n"
           "  %z = add i32 %y, 1\n  ret void\n}\n")
    with pytest.raises(InternalError, match="does not dominate"):
        nvptx.compile_to_ptx(bad)


def test_intrinsic_with_wrong_signature_fails_verification():
    module, fn, b = _kernel("wrong", [PTR])
    nvvm.call_intrinsic(b, "llvm.nvvm.shfl.sync.bfly.f32", F32, [ir.Constant(I32, -1), ir.Constant(F32, 1.0)])
    b.ret_void()
    with pytest.raises(InternalError, match="LLVM verifier"):
        nvptx.compile_to_ptx(module)


def test_targets_and_kernels_are_checked():
    with pytest.raises(BackendError, match="unsupported GPU target 'sm_99'"):
        nvptx.compile_to_ptx(nvptx_samples.vector_add(), "sm_99")
    with pytest.raises(BackendError, match="sm_90a needs PTX ISA 8.0"):
        nvptx.compile_to_ptx(nvptx_samples.vector_add(), "sm_90a", ptx_version=78)
    with pytest.raises(BackendError, match="not one LLVM 22 knows"):
        nvptx.compile_to_ptx(nvptx_samples.vector_add(), "sm_90", ptx_version=99)
    with pytest.raises(InternalError, match="no kernel"):
        nvptx.compile_to_ptx("define void @f() {\n  ret void\n}\n")
    with pytest.raises(InternalError, match="x86_64"):
        nvptx.compile_to_ptx('target triple = "x86_64-unknown-linux-gnu"\ndefine ptx_kernel void @f() {\n'
                             '  ret void\n}\n')


def test_helpers_refuse_bad_operands():
    module, fn, b = _kernel("bad", [PTR])
    with pytest.raises(InternalError, match="only f32 and i32"):
        nvvm.shfl_bfly(b, ir.Constant(F16, 1.0), 1)
    with pytest.raises(InternalError, match="power of two"):
        nvvm.shfl_bfly(b, ir.Constant(F32, 1.0), 1, width=12)
    with pytest.raises(InternalError, match="wants 4 A, 2 B and 4 C"):
        nvvm_mma.mma_m16n8k16_f16_f32(b, [], [], [])
    with pytest.raises(InternalError, match="wants <2 x half>"):
        nvvm_mma.mma_m16n8k16_f16_f32(b, [ir.Constant(I32, 0)] * 4, [ir.Constant(I32, 0)] * 2,
                                      [ir.Constant(F32, 0)] * 4)
    nvvm.intrinsic(module, "llvm.nvvm.ex2.approx.f32", F32, [F32])
    with pytest.raises(InternalError, match="declared as"):
        nvvm.intrinsic(module, "llvm.nvvm.ex2.approx.f32", F16, [F16])


@pytest.mark.parametrize("sm", sorted(nvptx.SM_MIN_PTX))
def test_every_supported_sm_compiles_with_its_default_ptx(sm):
    artifact = nvptx.compile_module(nvptx_samples.vector_add(), sm)
    assert artifact.ptx_version == max(nvptx.SM_MIN_PTX[sm], nvptx.DEFAULT_PTX_FLOOR)
    assert f".version {artifact.ptx_version // 10}.{artifact.ptx_version % 10}" in artifact.ptx
    assert artifact.kernels == ("vector_add",) and "ptx_kernel" in artifact.llvm_ir


# --- the assembler ----------------------------------------------------------------------------------

def test_assembler_failure_carries_the_log():
    ptx = nvptx.compile_to_ptx(nvptx_samples.vector_add(), "sm_80").replace("add.rn.f32", "add.bogus.f32")
    with pytest.raises(InternalError, match="nvJitLink could not assemble") as info:
        ptx_check.assemble(ptx, "sm_80")
    assert "ptxas" in str(info.value) and "add.bogus" in str(info.value)
    good = nvptx.compile_to_ptx(nvptx_samples.vector_add(), "sm_90")
    with pytest.raises(InternalError, match="higher than default SM"):
        ptx_check.assemble(good, "sm_80")                      # sm_90 PTX cannot run on sm_80


def test_check_ptx_picks_the_archs_a_ptx_can_run_on():
    ptx80 = nvptx.compile_to_ptx(nvptx_samples.vector_add(), "sm_80")
    assert set(ptx_check.check_ptx(ptx80)) == {"sm_80", "sm_90"}
    ptx90a = nvptx.compile_to_ptx(nvptx_samples.vector_add(), "sm_90a")
    assert set(ptx_check.check_ptx(ptx90a)) == {"sm_90a"}


def test_resource_usage_from_nvjitlink_when_ptxas_is_missing(monkeypatch):
    ptx = nvptx.compile_to_ptx(nvptx_samples.block_sum(), "sm_90")
    from_ptxas = ptx_check.resource_usage(ptx, "sm_90")
    monkeypatch.setattr(ptx_check.shutil, "which", lambda name: None)
    from_nvjitlink = ptx_check.resource_usage(ptx, "sm_90")
    assert from_nvjitlink.source == "nvjitlink" and from_nvjitlink.registers > 0
    assert (from_nvjitlink.shared_bytes, from_nvjitlink.spill_store_bytes) == (from_ptxas.shared_bytes, 0) == (32, 0)


def test_parse_usage_of_a_multi_kernel_log():
    log = (
        "ptxas info    : 0 bytes gmem\n"
        "ptxas info    : Compiling entry function 'a' for 'sm_90'\n"
        "ptxas info    : Function properties for a\n"
        "    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n"
        "ptxas info    : Used 40 registers, used 1 barriers, 2048 bytes smem, 368 bytes cmem[0]\n"
        "ptxas info    : Compiling entry function 'b' for 'sm_90'\n"
        "ptxas info    : Function properties for b\n"
        "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
        "ptxas info    : Used 7 registers, used 0 barriers, 368 bytes cmem[0]\n"
        "info    : Function properties for 'a':\n"
        "info    : used 99 registers, used 5 barriers, 8 stack, 0 bytes smem, 560 bytes cmem[0], 0 bytes lmem\n"
    )
    a, b = ptx_check.parse_usage(log, "sm_90", "nvjitlink")
    assert (a.kernel, a.registers, a.stack_bytes, a.spill_store_bytes, a.spill_load_bytes, a.shared_bytes,
            a.barriers) == ("a", 40, 8, 4, 12, 2048, 1)
    assert (b.kernel, b.registers, b.shared_bytes, b.spill_store_bytes) == ("b", 7, 0, 0)
    with pytest.raises(InternalError, match="name the kernel"):
        ptx_check.resource_usage(nvptx.compile_to_ptx(_two_kernels(), "sm_80"), "sm_80")


def _two_kernels() -> ir.Module:
    module = nvptx.new_module("two")
    for name in ("first", "second"):
        fn = nvvm.define_kernel(module, name, [PTR])
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        b.store(nvvm.thread_idx(b), fn.args[0])
        b.ret_void()
    return module


# --- mma fragment layouts (PTX ISA figures) ------------------------------------------------------------

@pytest.mark.parametrize("k", [16, 32])
def test_fragments_cover_each_element_once(k):
    a = [rc for lane in range(32) for reg in fragments.fragment_a(lane, k) for rc in reg]
    b = [rc for lane in range(32) for reg in fragments.fragment_b(lane, k) for rc in reg]
    c = [rc for lane in range(32) for rc in fragments.fragment_c(lane)]
    assert sorted(a) == list(itertools.product(range(16), range(k)))
    assert sorted(b) == list(itertools.product(range(k), range(8)))
    assert sorted(c) == list(itertools.product(range(16), range(8)))


def test_fragment_golden_values():
    # lane 5: groupID 1, threadID_in_group 1
    assert fragments.fragment_a(5, 16) == [[(1, 2), (1, 3)], [(9, 2), (9, 3)], [(1, 10), (1, 11)], [(9, 10), (9, 11)]]
    assert fragments.fragment_b(5, 16) == [[(2, 1), (3, 1)], [(10, 1), (11, 1)]]
    assert fragments.fragment_c(5) == [(1, 2), (1, 3), (9, 2), (9, 3)]
    assert fragments.fragment_a(5, 32)[2] == [(1, 20), (1, 21), (1, 22), (1, 23)]
    assert fragments.fragment_b(5, 32)[1] == [(20, 1), (21, 1), (22, 1), (23, 1)]


@pytest.mark.parametrize("kind", ["f16", "bf16", "e4m3"])
def test_pack_mma_operands_bit_layout(kind):
    k = 16 if kind != "e4m3" else 32
    rng = np.random.default_rng(0)
    a = rng.standard_normal((16, k)).astype(np.float32)
    b = rng.standard_normal((k, 8)).astype(np.float32)
    a_regs, b_regs = nvptx_samples.pack_mma_operands(kind, a, b)
    dtype = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "e4m3": ml_dtypes.float8_e4m3fn}[kind]
    width = 16 if kind != "e4m3" else 8
    lane, reg, j = 5, 2, 1                                      # element j of lane 5's register 2
    row, col = fragments.fragment_a(lane, k)[reg][j]
    bits = (int(a_regs[lane, reg]) >> (j * width)) & ((1 << width) - 1)
    assert bits == int(np.asarray(a[row, col], dtype=dtype).view(np.uint16 if width == 16 else np.uint8))
    d = np.arange(128, dtype=np.float32).reshape(16, 8)
    d_regs = np.array([[d[r, c] for r, c in fragments.fragment_c(lane)] for lane in range(32)], np.float32)
    assert np.array_equal(nvptx_samples.unpack_mma_result(d_regs), d)


def test_gpu_pipeline_options_are_set_for_the_compile_and_llvms_defaults_restored(monkeypatch):
    """The process-wide LLVM options change only around a GPU compile, also when the compile fails."""
    calls: list[str] = []
    real = nvptx.llvm.set_option
    monkeypatch.setattr(nvptx.llvm, "set_option", lambda name, option: (calls.append(option), real(name, option)))
    nvptx.compile_module(nvptx_samples.vector_add(), "sm_90")
    gpu = [f"-{k}={v[0]}" for k, v in nvptx.GPU_PIPELINE_OPTIONS.items()]
    defaults = [f"-{k}={v[1]}" for k, v in nvptx.GPU_PIPELINE_OPTIONS.items()]
    assert calls == gpu + defaults
    calls.clear()
    monkeypatch.setattr(nvptx.llvm, "create_pass_builder", lambda *a: (_ for _ in ()).throw(RuntimeError("boom")))
    with pytest.raises(RuntimeError, match="boom"):
        nvptx.compile_module(nvptx_samples.vector_add(), "sm_90")
    assert calls == gpu + defaults


def test_middle_end_choices_and_the_optimized_text_only_when_asked(monkeypatch):
    """By default the middle end is `GPU_PASSES`, in order; ``opt_level=1``/``3`` run LLVM's pipelines
    instead, ``0`` nothing. The optimized IR is printed only with ``keep_optimized=True``."""
    added: list[str] = []
    real = nvptx.llvm.create_new_module_pass_manager

    def recording():
        manager = real()
        for name in nvptx.GPU_PASSES:
            method = getattr(manager, f"add_{name}_pass")
            monkeypatch.setattr(manager, f"add_{name}_pass", lambda m=method, n=name: (added.append(n), m())[1],
                                raising=False)
        return manager

    monkeypatch.setattr(nvptx.llvm, "create_new_module_pass_manager", recording)
    art = nvptx.compile_module(nvptx_samples.vector_add(), "sm_90")
    assert added == list(nvptx.GPU_PASSES) and art.optimized_ir is None
    assert "ld.global.nc" in art.ptx          # the function attributes found the inputs read-only
    added.clear()
    for level in (1, 3):
        art = nvptx.compile_module(nvptx_samples.vector_add(), "sm_90", opt_level=level, keep_optimized=True)
        assert added == [] and "ld.global.nc" in art.ptx
        assert "readonly" in art.optimized_ir and "readonly" not in art.llvm_ir
    plain = nvptx.compile_module(nvptx_samples.vector_add(), "sm_90", opt_level=0, keep_optimized=True)
    assert "readonly" not in plain.optimized_ir and "ld.global.nc" not in plain.ptx
