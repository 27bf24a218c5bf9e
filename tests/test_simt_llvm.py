"""SIMT IR -> LLVM IR (nvptx64) -> PTX, assembled for sm_80 and sm_90 by nvJitLink; no GPU needed.

Every sample kernel of `simt_kernels` is compiled and assembled for each arch
that can run it; its resource usage (registers, spills, shared memory) is read
back and must show no spills.
"""
from __future__ import annotations

import re

import pytest

import simt_kernels as K
from helpers import run_on_host
from redfuser.codegen import ptx_check
from redfuser.codegen.simt_to_llvm import LlvmOptions, compile_simt, emit_module
from redfuser.ir.errors import BackendError
from redfuser.ir.simt.nodes import MmaShape, ShuffleKind
from redfuser.ir.types import bfloat16, float16

SAMPLES = {
    "elementwise": K.elementwise,
    "elementwise64": lambda: K.elementwise(index64=True),
    "vector_scale_f32": K.vector_scale,
    "vector_scale_f16": lambda: K.vector_scale(dtype=float16),
    "vector_scale_bf16": lambda: K.vector_scale(dtype=bfloat16),
    "block_sum": K.block_sum,
    "softmax_stats": K.softmax_stats,
    "mma_f16": K.mma_gemm,
    "mma_bf16": lambda: K.mma_gemm(MmaShape.M16N8K16_BF16),
    "mma_e4m3": lambda: K.mma_gemm(MmaShape.M16N8K32_E4M3),
    "all_ops": lambda: K.all_ops()[0],
    "fp8_roundtrip": K.fp8_roundtrip,
    "shfl_idx": lambda: K.shuffle_probe(ShuffleKind.IDX, 3, 8, by_register=True),
    "branchy": K.branchy,
}
SM89_ONLY = {"mma_e4m3", "fp8_roundtrip"}      # FP8 mma and f32 -> e4m3 conversion need sm_89+
CASES = [(name, sm) for name in SAMPLES for sm in ("sm_80", "sm_90") if not (sm == "sm_80" and name in SM89_ONLY)]


@pytest.mark.parametrize("name,sm", CASES)
def test_sample_compiles_assembles_without_spills(name, sm):
    kernel = SAMPLES[name]()
    artifact = compile_simt(kernel, sm)
    assert artifact.kernels == (kernel.name,) and f".target {sm}" in artifact.ptx
    assert f".maxntid {kernel.threads}" in artifact.ptx
    results = ptx_check.check_ptx(artifact.ptx)              # raises with the assembler's log on bad PTX
    assert set(results) == ({"sm_80", "sm_90"} if sm == "sm_80" else {"sm_90"})
    usage = ptx_check.resource_usage(artifact.ptx, sm)
    print(f"\n  {usage}")
    assert 0 < usage.registers <= 64
    assert (usage.spill_store_bytes, usage.spill_load_bytes, usage.stack_bytes) == (0, 0, 0), usage
    assert usage.shared_bytes == kernel.shared_bytes


def _ptx(name: str, sm: str = "sm_80", **options) -> str:
    return compile_simt(SAMPLES[name](), sm, LlvmOptions(**options)).ptx


def test_llvm_ir_is_readable_and_uses_opaque_pointers():
    text = str(emit_module(K.block_sum()))
    assert 'define ptx_kernel void @"block_sum"(ptr noalias %"x", ptr noalias %"out")' in text
    for needle in ('for1.header:', 'for1.body:', 'for1.exit:', 'if2.then:', '%"iv" = phi', '%"lane" = and i32',
                   'getelementptr float, ptr addrspace(3) @"smem_partials"', 'llvm.nvvm.barrier.cta.sync.aligned.all'):
        assert needle in text, needle
    assert "inttoptr" not in text and "ptrtoint" not in text and "float*" not in text


def test_block_reduction_ptx():
    ptx = _ptx("block_sum")
    assert ptx.count("shfl.sync.bfly.b32") == 10             # 5 butterflies per warp pass, two passes
    assert re.search(r"bar\.sync\s+0", ptx)
    assert ".shared .align 16 .b8 smem_partials[16]" in ptx
    assert "st.shared.b32" in ptx and "ld.shared.b32" in ptx


def test_mma_ptx_per_dtype():
    # 2 n-tiles per k-step; LLVM may or may not unroll the 2-trip k loop
    assert _ptx("mma_f16").count("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32") in (2, 4)
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in _ptx("mma_bf16")
    assert "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32" in _ptx("mma_e4m3", "sm_90")
    for name in ("mma_f16", "mma_bf16"):
        ptx = _ptx(name)
        assert "ld.global.nc.v4.b32" in ptx and "st.shared.v4.b32" in ptx   # 16-byte staging copies
        assert "st.global.v2.b32" in ptx                                     # c0,c1 stored as one 8-byte vector
    with pytest.raises(BackendError, match=r"m16n8k32.*needs sm_89\+"):
        compile_simt(K.mma_gemm(MmaShape.M16N8K32_E4M3), "sm_80")


def test_vector_and_64_bit_global_access():
    for name in ("vector_scale_f32", "vector_scale_f16", "vector_scale_bf16"):
        ptx = _ptx(name)
        assert "ld.global.nc.v4" in ptx and "st.global.v4" in ptx, name
    ptx64 = _ptx("elementwise64")
    assert "mul.wide" in ptx64 or "cvt.u64.u32" in ptx64 or "cvt.s64.s32" in ptx64
    assert re.search(r"setp\.\w+\.s64", ptx64)                # the bounds check compares 64-bit indices


def test_transcendentals_and_conversions():
    ptx = _ptx("all_ops")
    for needle in ("ex2.approx.ftz.f32", "ex2.approx.f32", "lg2.approx.f32", "sqrt.rn.f32", "max.NaN.f32",
                   "min.NaN.f32", "div.rn.f32", "cvt.rn.f16.f32", "cvt.rn.bf16.f32", "cvt.rni.f32.f32",
                   "cvt.rzi.s32.f32", "shfl.sync.idx.b32", "shfl.sync.down.b32", "div.s32"):
        assert needle in ptx, needle
    assert "cvt.rn.satfinite.e4m3x2.f32" in _ptx("fp8_roundtrip", "sm_90")
    fast, accurate = (str(emit_module(K.softmax_stats(), LlvmOptions(fast_math=f))) for f in (True, False))
    call = "call float @\"llvm.nvvm.ex2.approx.ftz.f32\""
    assert fast.count(call) == accurate.count(call) > 0                           # one per exp either way
    assert fast.count("@\"llvm.fma") < accurate.count("@\"llvm.fma")              # no range reduction


# --- the emitted LLVM IR, run on the host CPU one thread at a time -------------------------------------
# Kernels without warp ops, barriers or f16/bf16 (whose host lowering needs libcalls) run on the CPU when the
# few NVVM intrinsics they use become host functions: the thread/block index read from globals, and the
# ex2/lg2 approximations replaced by the exact exp2/log2. This checks the emission's arithmetic, conversions,
# masks and control flow against the simulator without a GPU (`helpers.run_on_host`).

@pytest.mark.parametrize("lanes", [1, 4])
def test_emitted_arithmetic_matches_the_simulator_on_the_host(lanes):
    """Scalar registers, and 4-vectors (one LLVM vector instruction per op, shuffles for packs)."""
    import ml_dtypes
    import numpy as np

    from redfuser.codegen.simulator import simulate

    rng = np.random.default_rng(3)
    kernel, names = K.all_ops(portable=True, lanes=lanes)
    n = 32 * lanes
    f = (rng.standard_normal(n) * 30).astype(np.float32)
    f[:6] = [0.0, -0.0, np.inf, -np.inf, np.nan, -100.0]
    f[6:10] = [-87.5, 88.5, -103.5, 89.5]   # exp: both scale halves at their ends, subnormal, overflow
    f[10:12] = [-125.5, -130.0]             # exp2: normal; subnormal (exp2_ftz flushes it to 0)
    g = rng.uniform(0.01, 40, n).astype(np.float32)
    i = rng.integers(-10**6, 10**6, n).astype(np.int32)
    j = (rng.integers(1, 100, n) * rng.choice([-1, 1], n)).astype(np.int32)
    q = np.resize(np.arange(0, 256, 8, dtype=np.uint8), n).view(ml_dtypes.float8_e4m3fn)   # normals, subnormals, NaN
    args = [f, g, i, j, q, np.zeros(n * len(names))]
    host = run_on_host(kernel, args)["out"].reshape(len(names), n)
    sim = simulate(kernel, args)["out"].reshape(len(names), n)
    for name, h, s in zip(names, host, sim):
        if name in ("exp", "exp2", "exp2_ftz", "log", "log2", "f**"):   # libm vs numpy, range-reduced exp, pow: a few ulp
            np.testing.assert_allclose(h, s, rtol=3e-6 if name != "f**" else 3e-5, atol=1e-37, err_msg=name)
        else:
            np.testing.assert_array_equal(h, s, err_msg=name)
    if lanes > 1:   # the packs moved the right elements (the simulator's answer, checked independently)
        rows = {name: sim[k].reshape(32, lanes) for k, name in enumerate(names)}
        fv, gv = f.reshape(32, lanes), g.reshape(32, lanes)
        np.testing.assert_array_equal(rows["halves"], gv)
        half = lanes // 2
        np.testing.assert_array_equal(rows["mixed"], np.concatenate([gv[:, :half], fv[:, half:]], axis=1))
        np.testing.assert_array_equal(rows["part_first"], np.concatenate([fv[:, :half], gv[:, half:]], axis=1))


def test_emitted_control_flow_and_vectors_match_the_simulator_on_the_host():
    import numpy as np

    from redfuser.codegen.simulator import simulate

    assert list(run_on_host(K.branchy(), [np.zeros(64)])["out"]) == K.branchy_reference()
    x = np.random.default_rng(4).standard_normal(1001).astype(np.float32)
    kernel = K.vector_scale(1001)
    assert np.array_equal(run_on_host(kernel, [x, np.zeros(1001), 1.5])["out"],
                          simulate(kernel, [x, np.zeros(1001), 1.5])["out"])


def test_mma_chains_pass_accumulators_as_scalars_and_share_a_fragments():
    """Down a k loop each mma's result is the next one's accumulator: it passes as four floats, and only
    a chain's ends are vectors (not an extract and insert per mma); an A fragment serves every n-tile of
    its k-step after one conversion to registers. (The PTX is the same either way: this is emission.)"""
    import numpy as np

    import redfuser as rf
    from redfuser.workloads import attention

    q = np.zeros((1, 2, 128, 64), np.float16)
    text = str(rf.kernel(attention, backend="cuda", sm="sm_90").lower(q, q, q).stages["llvm"])
    mmas = text.count('call {float, float, float, float} @"llvm.nvvm.mma')
    assert mmas >= 32
    assert text.count("insertelement <4 x float>") <= 2 * mmas        # 4 per mma without chaining
    assert text.count("extractelement <4 x float>") <= 2 * mmas
    assert text.count("bitcast <8 x half>") <= mmas // 4                # one per mma without sharing


def test_the_text_builder_keeps_names_unique_and_parses():
    """Values, arguments and blocks share one namespace per function: repeats get ``.N`` suffixes (LLVM would
    reject the module otherwise), renaming later stays unique, and the printed module parses and verifies."""
    import llvmlite.binding as llvm
    from llvmlite import ir

    from redfuser.codegen import nvvm
    from redfuser.codegen.llvm_text import TextBuilder, TextModule

    module = TextModule("names")
    fn = nvvm.define_kernel(module, "names", [nvvm.PTR, nvvm.I32])
    fn.args[0].name, fn.args[1].name = "x", "x"
    entry = fn.append_basic_block("x")
    b = TextBuilder(entry)
    a = b.add(fn.args[1], ir.Constant(nvvm.I32, 1), name="x")
    c = b.mul(a, a)
    c.name = "x"
    smem = nvvm.declare_shared(module, "smem_x", nvvm.F32, 4)
    b.store(b.sitofp(c, nvvm.F32), nvvm.shared_gep(b, smem, nvvm.F32, c), align=4)
    b.ret_void()
    nvvm.set_launch_bounds(fn, 64)
    text = str(module)
    names = [fn.args[0].name, fn.args[1].name, entry.name, a.name, c.name]
    assert len(set(names)) == len(names) and fn.args[0].name == "x"
    llvm.parse_assembly(text).verify()
    assert '!"maxntidx", i32 64' in text and "internal addrspace(3) global [4 x float] undef, align 16" in text


def test_a_reserved_slot_prints_what_was_put_there_in_place_or_nothing():
    """`TextBuilder.reserve` keeps a place; instructions built `at` it later print there, before what was
    appended after the reservation (so they dominate it), and an unused slot prints nothing."""
    from llvmlite import ir

    from redfuser.codegen import nvvm
    from redfuser.codegen.llvm_text import TextBuilder, TextModule

    module = TextModule("slots")
    fn = nvvm.define_kernel(module, "slots", [nvvm.I32])
    b = TextBuilder(fn.append_basic_block("entry"))
    used, unused = b.reserve(), b.reserve()
    later = b.add(fn.args[0], ir.Constant(nvvm.I32, 2), name="later")
    with b.at(used):
        early = b.mul(fn.args[0], ir.Constant(nvvm.I32, 3), name="early")
    assert b.block is fn.blocks[0]                        # back where it was
    b.add(later, early, name="sum")
    b.ret_void()
    text = str(module)
    body = [line.strip() for line in text.splitlines() if line.startswith("  ")]
    assert [line.split(" = ")[0] for line in body[:3]] == ['%"early"', '%"later"', '%"sum"']
    assert "\n\n" not in text[text.index("{"):text.index("}")]        # the unused slot left no blank line
    assert unused.instructions == []


def test_a_value_an_instruction_read_keeps_its_name():
    """Instruction text is made when the instruction is built, so a value read by one can no longer be
    renamed (the reader's text names it already): the builder refuses, and `Emitter.set` leaves such a
    value its name instead of giving it the register's."""
    from llvmlite import ir

    from redfuser.codegen import nvvm
    from redfuser.codegen.llvm_text import TextBuilder, TextModule
    from redfuser.codegen.simt_to_llvm.emitter import Emitter
    from redfuser.ir.errors import InternalError

    module = TextModule("reads")
    fn = nvvm.define_kernel(module, "reads", [nvvm.I32])
    b = TextBuilder(fn.append_basic_block("entry"))
    a = b.add(fn.args[0], ir.Constant(nvvm.I32, 1))
    a.name = "a"                                          # not read yet: fine
    square = b.mul(a, a)
    with pytest.raises(InternalError, match="after an instruction read it"):
        a.name = "b"
    unnamed = b.add(square, a)                            # named ".N", then read
    total = b.add(unnamed, unnamed)
    kernel = K.elementwise()
    first, second = kernel.body[0].out, kernel.body[1].out   # two i32 registers to bind
    emitter = Emitter(kernel, b, {}, LlvmOptions())
    emitter.set(first, unnamed)                           # read already: keeps its name
    emitter.set(second, total)                            # unread and unnamed: takes the register's name
    b.ret_void()
    assert unnamed.name.startswith(".") and total.name == second.name
    text = str(module)
    assert 'mul i32 %"a", %"a"' in text and f'%"{second.name}" = add i32 %"{unnamed.name}"' in text


def test_emitting_leaves_no_cyclic_garbage():
    """`emit_text` empties its module and emitter once printed, so what the emission built is freed by
    reference counting when it returns; the cyclic collector, paused during a compile
    (`compiler._gc_paused`), has nothing of it to walk afterwards (about 10 000 objects for a small
    attention kernel before)."""
    import gc

    import numpy as np

    import redfuser as rf
    from redfuser import workloads
    from redfuser.codegen.simt_to_llvm.kernel import emit_text

    q = np.zeros((1, 1, 64, 64), np.float16)
    kernel = rf.kernel(workloads.attention, backend="simulate").lower(q, q, q).stages["simt"].kernels[0]
    emit_text(kernel)                                     # first emission: one-time caches (types, intrinsics)
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        text = emit_text(kernel)
        assert gc.collect() == 0
    finally:
        if enabled:
            gc.enable()
    assert "mma.sync" in text or "llvm.nvvm.mma" in text


@pytest.mark.parametrize("name", ["attention_f16", "attention_f32", "softmax", "fp8_quant_gemm"])
def test_the_emitted_module_holds_no_dead_instruction(name):
    """Plumbing the mma path reads around (a fragment's ``ldmatrix`` words gathered into a vector, packs
    and slices of it) is emitted only when something reads it (`Emitter.defer`): LLVM's aggressive dead
    code elimination finds nothing to remove. (A fifth of attention's module was dead before.)"""
    import llvmlite.binding as llvm

    import redfuser as rf
    from redfuser.codegen import nvptx
    from helpers import CORPUS

    def instructions(module) -> int:
        return sum(1 for f in module.functions for block in f.blocks for _ in block.instructions)

    fn, args = CORPUS[name]
    for kernel in rf.kernel(fn, backend="cuda", sm="sm_90").lower(*args).stages["ptx"].kernels:
        module = nvptx.parse_and_verify(kernel.llvm_ir)
        emitted = instructions(module)
        machine = nvptx.target_machine("sm_90", nvptx.default_ptx_version("sm_90"))
        manager = llvm.create_new_module_pass_manager()
        manager.add_aggressive_dce_pass()
        manager.run(module, llvm.create_pass_builder(machine, llvm.create_pipeline_tuning_options()))
        assert instructions(module) == emitted, f"{kernel.name}: {emitted - instructions(module)} dead"


def _transpose_through_shared(shift: int) -> K.SimtKernel:
    """Each thread stores 4 floats at ``(tid << shift) + 0..3`` of a shared array and reads them back (the
    structure is what is checked: with shift < 2 neighbouring threads overlap)."""
    b = K.SimtBuilder("through_shared", warps=1, grid=(1,))
    x, out = b.buffer("x", K.float32, (128,)), b.buffer("out", K.float32, (128,))
    smem = b.shared("buf", K.float32, ((31 << shift) + 4,))
    tid = b.thread_idx()
    base = b.int_op(K.IntOp.SHL, tid, K._c(b, shift))
    four = b.mul(tid, K._c(b, 4))
    values = [b.load_global(x, b.add(four, K._c(b, i))) for i in range(4)]
    b.barrier()
    for i, v in enumerate(values):
        b.store_shared(smem, b.add(base, K._c(b, i)), v)
    b.barrier()
    for i in range(4):
        b.store_global(out, b.add(four, K._c(b, i)), b.load_shared(smem, b.add(base, K._c(b, i))))
    return b.build()


@pytest.mark.parametrize("shift, align, vector", [(2, 16, True), (3, 16, True), (1, 8, False), (0, 4, False)])
def test_shared_accesses_state_the_alignment_their_index_has(shift, align, vector):
    """``(tid << 2) + i`` is 16-byte aligned for i = 0 (8 for i = 2): said in the IR, the code generator's
    load/store vectorizer joins the four scalar accesses into one ``.v4`` (no middle-end pass needed)."""
    kernel = _transpose_through_shared(shift)
    text = str(emit_module(kernel))
    shared = [line for line in text.splitlines() if "ptr addrspace(3)" in line and ("load" in line or "store" in line)]
    assert len(shared) == 8
    first_store = next(line for line in shared if "store" in line)
    assert first_store.endswith(f"align {align}"), first_store
    ptx = compile_simt(kernel).ptx
    assert ("ld.shared.v4" in ptx and "st.shared.v4" in ptx) is vector


@pytest.mark.parametrize("count", [1, 2, 4])
@pytest.mark.parametrize("trans", [False, True])
def test_ldmatrix_is_one_instruction(count, trans):
    ptx = compile_simt(K.ldmatrix_probe(count, trans)).ptx
    assert ptx.count(f"ldmatrix.sync.aligned.m8n8.x{count}{'.trans' if trans else ''}.shared.b16") == 1
    assert "ld.shared" not in ptx


def test_local_names_stay_unique_with_many_of_one_base_name():
    """A function with thousands of blocks of one name (a masked store per element) gave each the first free
    suffix by trying every one from 1: quadratic, and a fuzz example's module took minutes to name. The names are
    the same as before: the base, then ``.1``, ``.2`` ..., skipping any already taken."""
    from redfuser.codegen.llvm_text import _Scope

    scope = _Scope()
    assert scope.fresh("x.2") == "x.2"
    names = [scope.fresh("x") for _ in range(5000)]
    assert names[:4] == ["x", "x.1", "x.3", "x.4"] and len(set(names)) == 5000 and "x.2" not in names
    assert [scope.fresh(""), scope.fresh("")] == [".1", ".2"]
