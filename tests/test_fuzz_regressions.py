"""Bugs the whole-compiler fuzzer found, each kept as the shrunk program it printed (docs/testing.md, "The fuzzer")."""
from __future__ import annotations

import numpy as np
import pytest

import redfuser as rf
from helpers import run_backend

BACKENDS = ("interpret", "cpu", "simulate")


def topk_values(x):
    v, i = rf.topk(x, 2)
    return v


def topk_indices(x):
    return rf.topk(x, 3)[1]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("body", [topk_values, topk_indices])
def test_topk_with_one_of_its_results_unused(body, backend):
    """A lone top-k kernel stored both results; the unused one was no buffer of the program (VerifyError)."""
    x = np.array([[-1.0, 0.0, -2.0, 3.0], [5.0, 4.0, 3.0, 2.0]], np.float32)
    got, want = rf.kernel(body, backend=backend)(x), body(x)
    assert got.dtype == want.dtype and np.array_equal(got, want)


def _near_midpoints() -> tuple[np.ndarray, np.ndarray]:
    """int32 and f32 parts whose float64 sum lies just beside a midpoint of f16, bf16 or e4m3 (or on one, or
    is a special value): there a conversion through f32 by nearest rounds twice."""
    ints, fracs = [], []
    for scale, half in ((2 ** 20, 2 ** 12), (2 ** 10, 0.5), (256, 16)):      # bf16, f16, e4m3 around `scale`
        for k in range(4):
            mid = scale + (2 * k + 1) * half
            for eps in (0.0, 2.0 ** -20, -(2.0 ** -20), 2.0 ** -40):
                whole = int(mid // 1)
                ints.append(whole)
                fracs.append(np.float32(mid - whole + eps) if mid - whole + eps >= 0 else np.float32(mid - whole) + eps)
    rng = np.random.default_rng(0)
    ints += list(rng.integers(-70000, 70000, 64))
    fracs += list(rng.standard_normal(64).astype(np.float32) * np.float32(3.0))
    ints += [2 ** 25 + 2 ** 17 + 1, -(2 ** 25 + 2 ** 17 + 1), 0, 0, 0, 1]
    fracs += [0.0, 0.0, np.inf, -np.inf, np.nan, -1.0]
    return np.array(ints, np.int32), np.array(fracs, np.float32)


def cast_sum(i, f, dtype):
    return (i + f).astype(dtype), i.astype(dtype)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float8_e4m3fn"])
def test_float64_and_int32_cast_to_a_narrow_float_round_once(backend, dtype):
    """numpy rounds a float64 (here int32 + float32) or an int32 to f16/bf16/e4m3 once; the kernels went through
    f32 by nearest (twice: 1 + 2**-8 + 2**-30 became bf16 1.0, not 1.0078125), and on cpu f64 -> f16 called
    __truncdfhf2, which the JIT cannot resolve: the process died."""
    i, f = _near_midpoints()
    body = lambda i, f: cast_sum(i, f, getattr(rf, dtype))  # noqa: E731
    got, want = rf.kernel(body, backend=backend)(i, f), body(i, f)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        assert np.array_equal(g.view(np.uint8), w.view(np.uint8)) or np.array_equal(
            np.asarray(g, np.float64), np.asarray(w, np.float64), equal_nan=True), (g, w)


def top1_of_a_sum_then_divided(x, y):
    s = rf.sum(rf.exp(x), axis=-1, keepdims=True)
    return rf.topk(s, 1)[0] / (rf.abs(y) + 1.0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_fixed_read_of_a_top1_list_after_a_fused_loop(backend):
    """The fused loop keeps a top-1 list's rank as a tile dim; a later nest reading the list at index 0 joined
    the kernel as if the rank were a fixed 0 (InternalError "fused read ... does not line up with its tile")."""
    x = np.array([-3.0, 0.0, 4.0, -2.0], np.float32).reshape(2, 2, 1)
    y = np.array([-1.0, -1.0, 1.0, -4.0], np.float32).reshape(2, 2, 1)
    got, want = rf.kernel(top1_of_a_sum_then_divided, backend=backend)(x, y), top1_of_a_sum_then_divided(x, y)
    assert got.dtype == want.dtype and np.allclose(got, want, rtol=1e-6)


def sum_of_a_shifted_max(x):
    m = rf.max(x, axis=-1, keepdims=True)
    return (m + 448.0).sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fusion_checks_a_body_of_constants_over_a_length_one_axis(backend):
    """Over an axis of length 1 the body ``max(x) + 448`` reads no point of the check: the numeric check's
    two sides were scalars, indexed with a mask of points (a bare IndexError from the compiler)."""
    x = np.full((3, 1), -2.0, np.float32)
    got, want = rf.kernel(sum_of_a_shifted_max, backend=backend)(x), sum_of_a_shifted_max(x)
    assert got.dtype == want.dtype and np.array_equal(got, want)


def sum_of_refused_topk_indices(x):
    m = rf.max(x, axis=-1)
    i = rf.topk(m / x, 1)[1]
    return rf.sum(i, axis=-1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_reduction_of_a_refused_topks_indices_is_not_fused(backend):
    """Over a length-1 axis the three reductions are one cascade; the top-k is refused, and the sum of its
    indices was fused all the same, reading them before they exist (VerifyError after fuse_cascade)."""
    x = np.array([3.0], np.float32)
    got, want = rf.kernel(sum_of_refused_topk_indices, backend=backend)(x), sum_of_refused_topk_indices(x)
    assert got.dtype == want.dtype and np.array_equal(got, want)



def judged(program, backend: str) -> list:
    """The fuzzer's verdict on `program` (a `redfuser.testing.program.Program`) run on `backend`: its failures."""
    from redfuser.testing.program_judge import run
    from redfuser.testing.program_oracle import reference

    return run(program, backend, [reference(program, c, backend) for c in range(len(program.calls))]).failures


@pytest.mark.parametrize("backend", ["cpu", "simulate"])
def test_the_oracle_allows_a_narrow_step_that_underflows_in_numpy(backend):
    """Long campaign (seed 1), example 3094, shrunk to ``np.float32(0.5) * rf.exp2(rf.minimum(x0, 4.0))`` on f16
    ``x0 = -39.59375``: numpy's f16 ``exp2`` underflows to 0 before the f32 product; a kernel computes f16 steps
    in f32 (the oracle's rule (1)) and keeps 6e-13. The oracle's bound had no absolute part, allowed 0 there
    and judged the kernel wrong; a rounding's bound now adds one subnormal step of its dtype
    (`program_bounds.underflow_step`). (Written out: the grammar's example 3094 is another program now.)"""
    from redfuser.testing.program import Arg, Node, Program
    from redfuser.testing.program_data import ArrayData

    x0 = Arg(ArrayData("float16", (1,), values=(-39.59375,)))
    program = Program(("x0",), (Node(("v0",), "exp2_safe", ("x0",)),
                                Node(("v1",), "rmul_c", ("v0",), (np.float32(0.5),))), ("v1",), ((x0,),))
    assert judged(program, backend) == []


def where_squared(c, a, b):
    return rf.where(c, a, b) ** 2


def ellipsis_squared(x):
    return x[0, ...] ** 2


def element_squared(x):
    return x[0] ** 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_0d_array_from_where_or_an_ellipsis_keeps_numpys_array_power(backend):
    """Long campaign (seed 1), example 5352: ``rf.where`` of 0-d bools returns a 0-d ndarray in numpy, whose
    ``** 2`` is int8 (an array shortcut; RedFuser has no int8, so the kernel must refuse); the tracer took every
    0-d result for a numpy scalar (``** 2`` int64) and returned int64. ``x[0, ...]`` is a 0-d array too; ``x[0]``
    is a scalar and stays int64."""
    c, a, b = np.array(True), np.array(True), np.array(False)
    assert where_squared(c, a, b).dtype == np.int8
    with pytest.raises(rf.DTypeError, match="int8"):
        rf.kernel(where_squared, backend=backend)(c, a, b)
    x = np.array([True, False])
    with pytest.raises(rf.DTypeError, match="int8"):
        rf.kernel(ellipsis_squared, backend=backend)(x)
    got, want = rf.kernel(element_squared, backend=backend)(x), element_squared(x)
    assert got.dtype == want.dtype == np.int64 and got == want


def row_of_a_sum_times(x0, x4):
    v1 = rf.exp(rf.minimum(rf.sum(x0, axis=-1, keepdims=True), 4.0))
    return v1[..., -7, :, -1, None] @ x4


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_reduction_reading_another_row_of_an_earlier_result_is_not_fused(backend):
    """Long campaign (seed 1), example 7550: a GEMM over a length-1 axis read row 6 of a sum over another
    length-1 axis; the cascade analysis put both in one pass, whose kernel cannot read another program's row
    (InternalError 'out is read at a fixed position' on cpu and simulate). A result read at a fixed position
    other than 0 of a length-1 dim now keeps the reader out of the pass."""
    x0 = np.arange(-6, 7, dtype=np.int32).reshape((13, 1, 1))
    x4 = np.array([[-3.0]], np.float32)
    kernel = rf.kernel(row_of_a_sum_times, backend=backend)
    got, want = kernel(x0, x4), row_of_a_sum_times(x0, x4)
    assert got.dtype == want.dtype and np.allclose(got, want, rtol=1e-6)
    assert not any(g.fused for g in kernel.lower(x0, x4).groups)


def divide_or_zero(x0, s0, x2):
    return rf.where(x0, x0 / s0, x2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_static_minus_zero_is_not_merged_with_a_zero_constant(backend):
    """Long campaign (seed 1), example 10694: ``x / -0.0`` next to ``x != 0.0`` (the ``where`` condition);
    the Tile IR clean-up merged the two constants (``-0.0 == 0.0``) and cpu and simulate gave +inf for
    numpy's -inf."""
    x0 = np.array([[1.68, -2.5, 0.0]], np.float32)
    x2 = np.array([[False, True, True]])
    got, want = rf.kernel(divide_or_zero, backend=backend)(x0, -0.0, x2), divide_or_zero(x0, -0.0, x2)
    assert np.array_equal(got, want) and np.array_equal(np.signbit(got), np.signbit(want))


CAUSAL_BF16_MAXIMUM = '''
import numpy as np
import redfuser as rf


def program(x0, x1):
    s = (x0 @ x1.mT) * 0.25
    i = rf.arange(s.shape[-2])[:, None]
    j = rf.arange(s.shape[-1])
    masked = rf.where(j <= i + 3, s, -rf.inf)
    m = rf.max(masked, axis=-1, keepdims=True)
    l = rf.sum(rf.exp(masked - m), axis=-1, keepdims=True)
    return rf.maximum(l, masked)


x0 = np.array([412.0, -1488.0, -1112.0, 2256.0, -346.0, 296.0, 928.0, -2032.0]).astype(rf.bfloat16).reshape((1, 8, 1))
x1 = np.array([0.70703125, -0.3671875, 0.48828125, 1.34375, 0.62890625, 0.1455078125, -0.78125, -1.71875,
               0.66015625, 0.6640625, -0.86328125, -1.8359375, -1.2109375, -0.9375, -0.79296875, -0.267578125,
               0.3359375]).astype(rf.bfloat16).reshape((1, 17, 1))
with np.errstate(all="ignore"):
    got, want = rf.kernel(program, backend="cpu", block_m=4, prefetch=True)(x0, x1), program(x0, x1)
assert got.dtype == want.dtype and np.array_equal(got, want, equal_nan=True), (got, want)
print("ok")
'''


def test_llvm_making_invalid_ir_falls_back_instead_of_aborting(tmp_path):
    """Long campaign (seed 1), example 13862: LLVM 22.1's O3 (SLP vectorizer) turned this cpu kernel into IR
    whose uses its definitions do not dominate, and emitting it aborted the process (an assertion in
    SelectionDAGBuilder). The optimized module is now verified and re-optimized without SLP where invalid.
    Run in a subprocess, so that a regression fails this test instead of killing the test run."""
    import os
    import subprocess
    import sys

    script = tmp_path / "repro.py"
    script.write_text(CAUSAL_BF16_MAXIMUM)
    env = {**os.environ, "REDFUSER_CACHE": "0"}
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-2000:]


def matvec_beside_a_max(x0, x3):
    return x0 @ x3, rf.max(x0, axis=-1, keepdims=True)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("chunk", [1, 2])
def test_a_fused_f16_matmul_keeps_its_running_sum_in_f32(backend, chunk):
    """Long campaign (seed 1), example 16474: an f16 ``x @ w`` fused with a max over the same axis. numpy sums
    the products in f32 (-541 452, rounded once: -inf); the interpreter's fused loop rounded each chunk's
    running sum to f16 (+inf after the first product, then inf - inf = NaN). Its running states of 16-bit
    floats are now f32, as in the compiled kernels."""
    x0 = np.array([[1251.0, -2624.0]], np.float16)
    x3 = np.array([993.5, 680.0], np.float16)
    options = {"interpret_chunk": chunk} if backend == "interpret" else {"block_n": chunk}
    with np.errstate(all="ignore"):
        got, want = rf.kernel(matvec_beside_a_max, backend=backend, **options)(x0, x3), matvec_beside_a_max(x0, x3)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and np.array_equal(g, w, equal_nan=True), (g, w)


def centred_on_its_own_mean(x, w, v):
    r0 = rf.sum(x, axis=-1, keepdims=True)
    return ((x - r0) * w) @ v


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_compilers_own_centre_of_bf16_values_is_summed_in_the_results_dtype(backend):
    """Long campaign at aff8577 (seed 1), example 7: ``((x - sum x) * w) @ v`` on bf16 data, an f32 result kept
    centred on the compiler's own running mean of x; the mean's running sum read bf16 x into an f32 state
    (VerifyError on every backend). x is now cast to the state's dtype."""
    rng = np.random.default_rng(389336784)
    x, w = (rng.standard_normal((2, 251)).astype(rf.bfloat16) for _ in range(2))
    v = rng.standard_normal((251, 2)).astype(rf.bfloat16)
    kernel = rf.kernel(centred_on_its_own_mean, backend=backend)
    (group,) = kernel.lower(x, w, v).groups
    assert group.fused
    got = kernel(x, w, v)
    x64, w64, v64 = (a.astype(np.float64) for a in (x, w, v))
    r0 = x.astype(np.float32).sum(axis=-1, keepdims=True).astype(rf.bfloat16).astype(np.float64)
    exact = ((x64 - r0) * w64) @ v64
    assert got.dtype == np.float32 and np.allclose(got, exact, rtol=1e-3, atol=1e-3 * np.abs(exact).max())


def _one_lane_store_module(src: str, dst: str, lane: int) -> str:
    """A host function storing lane `lane` of ``trunc <4 x src> (load q) to <4 x dst>`` through a one-lane
    constant mask: what LLVM's loop vectorizer emits for the last element of a 13-element tile row."""
    mask = ", ".join("i1 true" if i == lane else "i1 false" for i in range(4))
    return f"""
declare void @llvm.masked.store.v4{dst}.p0(<4 x {dst}>, ptr, <4 x i1>)
define void @store_one(ptr %p, ptr %q) {{
  %w = load <4 x {src}>, ptr %q
  %v = trunc <4 x {src}> %w to <4 x {dst}>
  call void @llvm.masked.store.v4{dst}.p0(<4 x {dst}> %v, ptr align 1 %p, <4 x i1> <{mask}>)
  ret void
}}"""


@pytest.mark.parametrize("src,dst,ctype", [("i32", "i8", np.uint8), ("i32", "i16", np.uint16),
                                           ("i64", "i32", np.uint32)])
@pytest.mark.parametrize("lane", [0, 2])
def test_a_one_lane_masked_store_of_a_truncated_vector_writes_one_element(src, dst, ctype, lane):
    """Long campaign at 3b9237e (seed 1), example 2469: LLVM 22.1's x86 back end stored the untruncated
    element of a one-lane masked store (4 bytes for one f8e4m3), overwriting the next tile's first elements
    (a wrong result whenever that tile's thread had written them first). Such stores are now written as
    scalar stores (codegen/one_lane_stores.py); here the compiled function writes exactly its one element."""
    import ctypes

    from redfuser.codegen.native import compile_object
    from redfuser.runtime.cpu_jit import JitLibrary

    library = JitLibrary(compile_object(_one_lane_store_module(src, dst, lane)))
    store_one = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)(library.address("store_one"))
    buffer = np.full(8, np.iinfo(ctype).max, ctype)
    values = np.arange(1, 5, dtype=np.int64 if src == "i64" else np.int32)
    store_one(buffer.ctypes.data, values.ctypes.data)
    want = np.full(8, np.iinfo(ctype).max, ctype)
    want[lane] = lane + 1
    assert np.array_equal(buffer, want), buffer


def int_quotient_to_e4m3(x):
    return (x / 1.0).astype(rf.float8_e4m3fn)   # f64 -> e4m3: the conversion ends in a vector trunc


def test_program_instances_write_only_their_own_tiles(monkeypatch):
    """The same bug end to end, deterministic: the cpu kernel's program instances run one at a time from the
    last to the first, so an instance writing past its tile (13-element rows, one masked element at the end
    of each) would overwrite its successor's first elements after they were written."""
    from redfuser.runtime import cpu_jit

    ran = []

    def backwards(self, fn, args, n, max_parts=None, caller_helps=False):
        ran.append(n)
        for i in reversed(range(n)):
            fn(*args, i, i + 1)

    monkeypatch.setattr(cpu_jit.GridPool, "run", backwards)
    # (small work runs on the caller, in order, without the pool: make every kernel take the pool)
    monkeypatch.setattr(cpu_jit, "INLINE_WORK_BYTES", -1)
    monkeypatch.setattr(cpu_jit, "INLINE_STREAM_BYTES", -1)
    x = np.arange(-97, 98, dtype=np.int32).reshape(3, 5, 13) * 1000
    with np.errstate(all="ignore"):
        got = rf.kernel(int_quotient_to_e4m3, backend="cpu", fuse=False, dynamic=False)(x)
        want = int_quotient_to_e4m3(x)
    assert ran and max(ran) > 1, ran        # (the instances did run backwards)
    assert np.array_equal(got.astype(np.float32), want.astype(np.float32), equal_nan=True)


def squared_softmax_deviation(x0):
    v0 = rf.max(x0, axis=-1, keepdims=True)
    v2 = rf.exp(x0 - v0)
    v4 = v2 / rf.sum(v2, axis=-1, keepdims=True)
    return rf.sum((v4 + -0.5) ** 2, axis=-1)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("chunk", [1, 2])
def test_a_fused_term_of_f16_values_is_computed_in_f32(backend, chunk):
    """Long campaign (seed 1), example 14646: ``sum((softmax(x) - 0.5)**2)`` over an f16 row [65504, 1]. The
    fusion expands the square into three accumulated terms, one of them ``exp(2*x - 2*m)``, which numpy never
    computes; the interpreter evaluated it in f16, where ``2 * 65504`` is inf and inf - inf is NaN (numpy:
    0.5). Its fused terms of 16-bit values are now computed in f32, as in the compiled kernels."""
    x0 = np.array([[65504.0, 1.0], [2.0, 1.0]], np.float16)
    options = {"interpret_chunk": chunk} if backend == "interpret" else {"block_n": chunk}
    with np.errstate(all="ignore"):
        got, want = rf.kernel(squared_softmax_deviation, backend=backend, **options)(x0), squared_softmax_deviation(x0)
    assert got.dtype == want.dtype and got[0] == want[0] == 0.5, (got, want)
    assert abs(float(got[1]) - float(want[1])) <= 4e-3, (got, want)


def centred_beside_another_term(x, w, v):
    r0 = rf.max(x * w, axis=-1, keepdims=True)
    return ((x - r0) * w + x * r0) @ v


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_widened_sum_of_bf16_terms_is_split_before_centring(backend):
    """Long campaign at bfab432 (seed 1), example 16839: ``((x - r0) * w + x * r0) @ v`` on bf16 data fuses in
    f32 (the term multiplying out ``x - r0`` is centred on the compiler's own mean of x, ``x * r0`` summed as
    usual) but was refused in bf16: there the sum is rounded to bf16 and widened, ``f32(a + b) * f32(v)``, and
    the split into additive terms stopped at the cast. Widening casts are now distributed over sums."""
    rng = np.random.default_rng(7)
    x = (300.0 + rng.standard_normal((3, 251))).astype(rf.bfloat16)
    w = rng.standard_normal((3, 251)).astype(rf.bfloat16)
    v = rng.standard_normal((251, 2)).astype(rf.bfloat16)
    kernel = rf.kernel(centred_beside_another_term, backend=backend)
    (group,) = kernel.lower(x, w, v).groups
    assert group.fused, group.reason
    got = kernel(x, w, v)
    x64, w64, v64 = (a.astype(np.float64) for a in (x, w, v))
    r0 = (x * w).max(axis=-1, keepdims=True).astype(np.float64)
    exact = ((x64 - r0) * w64 + x64 * r0) @ v64
    # the reference rounds each element's two products and their sum to bf16 (2^-9 of their magnitudes)
    scale = (np.abs((x64 - r0) * w64) + np.abs(x64 * r0)) @ np.abs(v64)
    assert got.dtype == np.float32 and np.all(np.abs(got - exact) <= 2.0 ** -8 * scale), np.abs(got - exact).max()


@pytest.mark.parametrize("example", [27144, 31114])
def test_the_oracle_does_not_judge_what_follows_a_16_bit_step_that_overflows_only_in_numpy(example):
    """Long campaign at 88db831 (seed 1), examples 27144 (``x0 / (x2 @ (x1 @ x0))``, f16, ``65504 * 16``) and
    31114 (``x1 / (|x0 * x2| + 1)``, ``x0 * x2 = 65504 * 2`` in f16): numpy's f16 step overflows to inf and
    what follows is 0; a kernel keeps the step in f32 (finite) and gives 3e-5. The oracle compared the class
    of the twin rounded to f16 (inf, like numpy's), so the step was not unsure and the result was judged
    wrong; it now also compares the unrounded twin, and everything computed from such a step is unsure."""
    from redfuser.testing.fuzz_tasks import Config, run_example

    result = run_example(Config(1, ("cpu", "simulate")), example)
    assert result.failures == [], result.failures


def test_the_oracle_takes_a_bitwise_not_a_later_scalar_makes_as_a_user_error():
    """Fuzz seed 16, example 180 (the grammar of 5236c05): ``v = b + s0; ~v`` on a bool ``b`` with the static
    ``s0`` run ``False, True, 0``: at ``0`` the sum is int64 and numpy's ``~`` is a bitwise not, outside
    RedFuser's op subset (``~`` is logical not), refused with a DTypeError that says so. The oracle judged
    the refusal a failure; such a call is now marked unsupported, like numpy-only dtypes. (Written out: the
    grammar's example 180 is another program now.)"""
    from redfuser.testing.program import Arg, Node, Program
    from redfuser.testing.program_data import ArrayData
    from redfuser.testing.program_oracle import reference

    b = Arg(ArrayData("bool", (3,), values=(True, False, True)))
    calls = tuple((b, Arg(scalar=s)) for s in (False, True, 0))
    program = Program(("x0", "s0"), (Node(("v0",), "add", ("x0", "s0")), Node(("v1",), "not", ("v0",))),
                      ("v1",), calls)
    assert "bitwise not" in reference(program, 2).unsupported
    assert judged(program, "cpu") == []


def test_a_bf16_cascade_is_judged_against_the_float64_body():
    """Long campaign at 49e8393 (seed 1), example 49087: ``r1 = sum((x - max x)^2)`` over 4096 bf16 values,
    then ``sum(where(x > r1 / 4096, x, 0))``. numpy adds bf16 one term at a time in bf16 and stagnates
    (9472 instead of 27114 on the shrunk row), so its threshold kept elements no correct evaluation keeps
    (25.1 against the kernel's exact 0). bf16 cascades are now judged against the float64 body rounded
    once (`cascade_check.reference`), the reference docs/testing.md prescribes for bf16 reductions."""
    from redfuser.testing.fuzz_tasks import Config, run_example

    result = run_example(Config(1, ("interpret",)), 49087)
    assert result.description.startswith("bfloat16") and "r2=sum[where(x > G, x, 0)]" in result.description
    assert result.failures == [], result.failures


def batched_matmul_beside_a_row_sum(x0, x1):
    v2 = rf.sum(x0, axis=-1, keepdims=False)
    v3 = x0 @ x1
    return v3, v2


def test_a_row_sum_beside_a_matmul_of_the_same_rows_fits_in_shared_memory():
    """Long campaign at 49e8393 (seed 1), example 48483: ``x0 @ x1`` (int32 by float32: f64) and
    ``sum(x0, -1)`` fuse into one loop over the contraction axis. Their states shared no axis (only a loaded
    input joins them), so the kernel had no grid and the simulate backend refused the [8, 32, 4, 8] f64
    product tile: SharedMemoryExceeded, 67584 bytes of shared memory."""
    x0 = np.random.default_rng(1297414798).integers(-8, 9, (17, 3, 5)).astype(np.int32)
    x1 = np.random.default_rng(1942635349).integers(-4, 5, (17, 5, 5)).astype(np.float32)
    got = rf.kernel(batched_matmul_beside_a_row_sum, backend="simulate")(x0, x1)
    want = batched_matmul_beside_a_row_sum(x0, x1)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and np.array_equal(g, w)   # small integers: every sum is exact


def _int64_product(a, b):
    return a @ b


def test_an_int64_product_fits_in_shared_memory_with_shallower_tiles():
    """(Found by a helper.) An int64 ``a @ b`` of 64x64x64 or more failed on simulate with the default tiles:
    its operand tiles go through shared memory at 8 bytes an element (512 KiB; 128 KiB with the smaller
    tiles tried, `compiler.SMALLER_TILES`); 16-deep tiles fit."""
    rng = np.random.default_rng(3)
    for m, k, n in ((64, 64, 64), (130, 257, 33)):
        a = rng.integers(-128, 128, (m, k)).astype(np.int64)
        b = rng.integers(-128, 128, (k, n)).astype(np.int64)
        got = rf.kernel(_int64_product, backend="simulate")(a, b)
        assert got.dtype == np.int64 and np.array_equal(got, a @ b)


def max_of_log_softmax_over_one_element(x0):
    v0 = rf.max(x0, axis=-1, keepdims=True)
    v1 = x0 - v0
    v3 = rf.sum(rf.exp(v1), axis=-1, keepdims=True)
    return rf.max(v1 - v3, axis=0, keepdims=False)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("x", [np.array([1e8], np.float32), np.array([65504.0], np.float16)])
def test_an_additive_max_is_finished_in_the_bodys_own_association(backend, x):
    """Fuzz seed 7, example 203 (main after 2098be2): ``max(x - m - l)`` with ``m = max x`` was finished as
    ``acc + (-m - l)``; against m = 1e8 (f32) or 65504 (f16, on the interpreter, which rounds each step to
    f16) ``-m - l`` rounds l away and the result was 0 for numpy's -1. It is now ``(acc - m) - l``, the
    body with the accumulator in place of x."""
    got = rf.kernel(max_of_log_softmax_over_one_element, backend=backend)(x)
    assert got == max_of_log_softmax_over_one_element(x) == -1.0


def normalized_columns_times(x1, x2):
    v0 = x1.mT
    return (v0 / rf.sum(v0, axis=-1, keepdims=True)) @ x2


def test_a_prefetched_first_tile_of_a_loop_that_may_not_run_is_not_read():
    """Long campaign at 93bda34 (seed 1), example 7350: the second call's lengths made the kernel
    shape-polymorphic; its contraction runs a loop over the full 64-key chunks of a run-time length (none of
    3 keys) and a tail. Prefetch loaded the main loop's first f16 tile in front of it anyway, reading x2
    past its end (the simulator's out-of-bounds check). The first tile is now loaded only where the loop
    runs."""
    x1 = np.array([-2.0], np.float32).reshape(1, 1, 1)
    x2 = np.array([4.0, 3.0], np.float16).reshape(1, 1, 2)
    x1_later = np.array([-2.0, -3.0, 1.0, -2.0, 4.0, -2.0], np.float32).reshape(1, 3, 2)
    x2_later = np.array([4, 3, 2, 3, 4, -2, 3, -1, -1], np.float16).reshape(1, 3, 3)
    k = rf.kernel(normalized_columns_times, backend="simulate", prefetch=True)
    k(x1, x2)
    got = k(x1_later, x2_later)
    assert k.cache_info().currsize == 2 and k.polymorphism == {}   # the second is the symbolic class
    want = rf.kernel(normalized_columns_times, backend="simulate", prefetch=True, dynamic=False)(x1_later, x2_later)
    np.testing.assert_array_equal(got, want)


def test_the_oracle_takes_a_bitwise_and_a_later_scalar_makes_as_a_user_error():
    """Long campaign at 4aeccef (seed 1), example 13216: ``x & s0`` style steps on bools with the static ``s0``
    run ``False`` then ``0``: at ``0`` numpy's ``&`` is a bitwise and of integers, outside RedFuser's subset
    (``&`` is logical and), refused with a DTypeError. The oracle judged the refusal a failure, as it did
    for ``~`` (5236c05); such a call is now marked unsupported."""
    from redfuser.testing.program import Arg, Node, Program
    from redfuser.testing.program_data import ArrayData
    from redfuser.testing.program_oracle import reference

    b = Arg(ArrayData("bool", (3,), values=(True, False, True)))
    calls = tuple((b, Arg(scalar=s)) for s in (False, True, 0))
    program = Program(("x0", "s0"), (Node(("v0",), "and", ("x0", "s0")),), ("v0",), calls)
    assert "(bitwise)" in reference(program, 2).unsupported and not reference(program, 0).unsupported
    assert judged(program, "cpu") == []


def test_the_oracle_takes_a_float_remainder_a_later_scalar_makes_as_a_user_error():
    """Long campaign at e8c19a3 (seed 1), examples 3355, 7642, 9090, 13225: ``(x0 + s0) % 2`` with the static
    ``s0`` run ``2`` then ``2.0``: the operand becomes float64 and numpy's float ``%`` is outside the subset
    (refused with an UnsupportedError that says so); such a call is unsupported, not a failure."""
    from redfuser.testing.program import Arg, Node, Program
    from redfuser.testing.program_data import ArrayData
    from redfuser.testing.program_oracle import reference

    x = Arg(ArrayData("int32", (4,), values=(5, -7, 0, 3)))
    calls = tuple((x, Arg(scalar=s)) for s in (2, 2.0))
    program = Program(("x0", "s0"), (Node(("v0",), "add", ("x0", "s0")), Node(("v1",), "mod_c", ("v0",), (2,)),
                                     Node(("v2",), "floordiv_c", ("v0",), (-3,))), ("v1", "v2"), calls)
    assert not reference(program, 0).unsupported and "(floats)" in reference(program, 1).unsupported
    assert judged(program, "cpu") == []


def _std_of_squared_deviations(x0):
    v0 = rf.sum(x0, axis=-1, keepdims=True)
    v3 = (x0 - v0 / 2.0) ** 2
    return rf.std(v3, axis=-3, keepdims=False, ddof=1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_sum_of_reduced_values_only_is_not_expanded_inside_a_product(backend):
    """Seed 21, example 211 (the grammar's first std): the variance of ``(x - v0/2)**2``, ``v0`` computed per
    chunk, expanded ``(x - v0/2)**4`` into ``x**4 - 2 v0 x**3 + ...``; with every x near 300 the f32 terms
    (8e9) cancelled to a negative variance and the std was NaN (numpy: 1.29). A sum reading only the reduced
    values is now one factor (`FusionContext.reduced_only_sum`)."""
    x0 = np.array([301.48334, 298.58795, 300.51828, 298.8289, 299.86334, 300.8995, 301.35013, 298.276],
                  np.float32).reshape(2, 2, 2)
    kernel = rf.kernel(_std_of_squared_deviations, backend=backend)
    assert "x0[j,i0,i1] ** 3" not in str(kernel.lower(x0).stages["fused"])   # no expanded x**3 term
    want = _std_of_squared_deviations(x0)
    rf.testing.assert_close(kernel(x0), want, np.float32, 2)


def _std_over_one_element(x0):
    return rf.std(rf.exp(rf.minimum(x0, 4.0)), axis=-3, keepdims=True, ddof=0)


def _std_of_a_ratio_to_itself(x0):
    return rf.std(x0 / x0, axis=0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("body, x", [
    (_std_over_one_element, np.array([-2.0], np.float32).reshape(1, 1, 1)),
    (_std_of_a_ratio_to_itself, np.array([1.0, 2.0, -4.0], np.float32).astype(rf.bfloat16).reshape(3, 1)),
], ids=["one element", "x / x"])
def test_a_body_constant_along_the_axis_is_not_expanded(body, x, backend):
    """Seed 1, examples 734 and 2004 at 17e4aa1: a variance whose body reads no value varying along the axis
    (one element read at index 0; ``x / x``, which the algebra makes 1) was expanded into ``c² - 2c·mean +
    mean²``: -1e-9 for numpy's 0, a NaN std. Such a body is computed after the pass as written."""
    k = rf.kernel(body, backend=backend)
    got, want = k(x), body(x)
    assert np.array_equal(np.asarray(got, np.float64), np.asarray(want, np.float64))
    assert "was expanded into" not in k.explain(x)     # computed as written, or centred: never expanded


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_overflow_guard_state_has_its_terms_type(backend):
    """Seed 1, example 2080 at 17e4aa1 (there over one element): ``int32 @ (p * log p)`` with ``p = exp(x - max
    x)``: the centred product's guard state (the farthest reduced value, a running min) took the f64 result's
    type for an f32 term (VerifyError after fuse_cascade)."""
    def body(x0, x3):
        p = rf.exp(x0 - rf.max(x0, axis=-1, keepdims=True))
        return x3 @ (p * rf.log(p))

    x0, x3 = np.array([-4.0, -1.0, 2.5], np.float32), np.array([[2, -1, 3]], np.int32)
    got, want = rf.kernel(body, backend=backend)(x0, x3), body(x0, x3)
    assert got.dtype == want.dtype and np.allclose(got, want, rtol=1e-6, atol=1e-12)


def _std_of_reciprocals(x0):
    return rf.std(1.0 / x0, axis=-1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_variance_of_a_reciprocal_is_not_left_expanded(backend):
    """Seed 1, example 2136 at 17e4aa1: ``std(1 / x)`` on a constant row was expanded in powers of ``x``
    (``x**-2 - 2 mean x**-1 + mean**2``), -1e-9 for numpy's 0: a NaN std. ``1/x`` is now one atom of the
    multiplied sum (`FusionContext.reduced_only_term`), so the cancelling pair is seen: no stable form, second
    pass, numpy's value."""
    x0 = np.array([[3.0] * 7, [7.0] * 7, [0.3] * 7, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]], np.float32)
    k = rf.kernel(_std_of_reciprocals, backend=backend)
    got, want = k(x0), _std_of_reciprocals(x0)
    assert not np.isnan(got).any()
    rf.testing.assert_close(got, want, np.float32, 7)


def _std_of_exp(x0):
    return rf.std(rf.exp(rf.minimum(x0, 4.0)), axis=-1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_variance_of_an_exponential_is_centred_on_its_own_atom(backend):
    """Seed 1, example 3621 at fea91e6: ``std(exp(minimum(x, 4)))`` raised AttributeError from
    `centred.change_variables`: ``exp(...)``, kept whole as one atom of the body, has no linear form of its
    own. The centre's value is that atom."""
    x0 = np.array([[2.0, -3.0], [1.0, 1.0], [0.5, -0.25]], np.float32)
    got, want = rf.kernel(_std_of_exp, backend=backend)(x0), _std_of_exp(x0)
    assert not np.isnan(got).any()
    rf.testing.assert_close(got, want, np.float32, 2)


def _matmul_then_row_variance(x0, x1, x2, s0):
    v1 = rf.var(x0 @ x1, axis=-1, keepdims=False, ddof=1)
    return x2 * v1 - s0


@pytest.mark.parametrize("rows", [1 << 20, None])
def test_a_one_pass_row_tile_counts_a_local_contractions_chunk(rows):
    """Long campaign at 6a1ff44, example 14499: rows of 2 elements (the variance of ``x0 @ x1`` with 2 columns)
    took 8192 rows a GPU tile, and the local matmul's operand tile was 8192 rows by its 64-long contraction
    chunk: half a million unrolled shared-memory stores, a 30-minute compile on simulate. A whole-rows tile
    now counts the widest local chunk per row. Checked on the schedule (a static and a symbolic row count)."""
    from redfuser.ir.tile import nodes as t
    from redfuser.schedule import schedule_program
    from redfuser.schedule.options import ONE_PASS_TILE, options_for

    args = (np.zeros((rows or 27, 6), np.float32), np.zeros((6, 2), np.float32), np.zeros(rows or 27, np.float32), 3)
    kernel = rf.kernel(_matmul_then_row_variance, backend="interpret", dynamic=rows is None)
    if rows is None:       # a second length: the row count becomes symbolic
        kernel(*args)
        args = (np.zeros((33, 6), np.float32), args[1], np.zeros(33, np.float32), 3)
    program = kernel.lower(*args).program
    tile = schedule_program(program, options_for("gpu"))
    loads = [op for k in tile.kernels for op in t.walk_ops(k.body) if isinstance(op, t.Load)]
    assert loads and all(int(np.prod(op.out.shape)) <= ONE_PASS_TILE for op in loads)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_variance_over_an_empty_slice_is_not_centred(backend):
    """Long campaign at 55ed019 (seed 1), example 48713: ``var(x[None, 0, None, 3:-21, :, None], axis=2,
    ddof=1)`` of a (1, 1, 1) array reduces an empty slice; finding the running mean to centre the squares on
    divided by the axis length, 0 (ZeroDivisionError out of the fusion engine). numpy's value is NaN."""
    def body(x):
        return rf.var(x[None, 0, None, 3:-21, :, None], axis=2, keepdims=True, ddof=1)

    x = np.array([-2.0], np.float32).reshape(1, 1, 1)
    with np.errstate(all="ignore"), pytest.warns(RuntimeWarning):
        want = body(x)
    got = rf.kernel(body, backend=backend)(x)
    assert got.shape == want.shape and got.dtype == want.dtype and np.isnan(got).all() and np.isnan(want).all()


def test_the_oracle_reads_a_gathers_bounds_at_its_indices():
    """Long campaign at 55ed019 (seed 1), example 48254: ``take_along_axis(v, topk(x, 1)[1])`` of an inexact
    ``v`` [1, 8]: the oracle broadcast v's per-element bounds to the gather's [1, 1] result (numpy's
    ValueError), took that for numpy refusing the program, and judged the kernel's result a failure. A
    gather's (and a join's) bounds and unsure elements are now the op itself run on them."""
    from redfuser.testing.program import Arg, Node, Program
    from redfuser.testing.program_data import ArrayData
    from redfuser.testing.program_oracle import reference

    x = Arg(ArrayData("float32", (1, 8), values=(-1.0, 2.0, 3.5, 0.5, -2.0, 1.0, 0.0, 2.5)))
    nodes = (Node(("v0",), "exp", ("x0",)), Node(("v1",), "topk_indices", ("x0",), (1,)),
             Node(("v2",), "take_along_axis", ("v0", "v1")), Node(("v3",), "concatenate2", ("v0", "v2"), (1,)))
    program = Program(("x0",), nodes, ("v2", "v3"), ((x,),))
    ref = reference(program, 0)
    assert ref.error is None, ref.error
    gathered, joined = ref.outputs
    assert gathered.err.shape == (1, 1) and gathered.err[0, 0] > 0 and joined.err.shape == (1, 9)
    assert judged(program, "cpu") == []


def test_the_oracle_does_not_judge_f64_math_of_a_value_beyond_f32s_range_on_gpus():
    """Long campaign at 55ed019 (seed 1), example 27138: ``cos`` of an f64 value of 1e55 (a product of int32
    sums; here int32 times f32, 6e47); the GPU backends compute f64 ``cos`` in f32 (docs/gpu-backend.md, "Numerics"), where 1e55 is inf
    and its cosine NaN. The oracle marked only results beyond f32's range unsure, not operands."""
    from redfuser.testing.program import Arg, Node, Program
    from redfuser.testing.program_data import ArrayData
    from redfuser.testing.program_oracle import reference

    n = Arg(ArrayData("int32", (2,), values=(2_000_000_000, 1)))
    x = Arg(ArrayData("float32", (2,), values=(3e38, 0.5)))
    program = Program(("x0", "x1"), (Node(("v0",), "mul", ("x0", "x1")), Node(("v1",), "cos", ("v0",))), ("v1",),
                      ((n, x),))
    (out,) = reference(program, 0, "simulate").outputs
    assert out.ref.dtype == np.float64 and np.isfinite(out.ref).all()
    assert out.unsure.tolist() == [True, False]
    assert judged(program, "simulate") == []


def _shifted_max(x):
    m = rf.max(x, axis=-1, keepdims=True)
    return rf.max(x - m + 2.0, axis=-1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_constant_term_of_an_additive_max_stays_out_of_g(backend):
    """Long campaign at fbc0792 (seed 1), example 68642: ``max(x - m + 2)`` with ``m = max(x)`` put the 2 into
    G, ``(max x + 2) - m``, which rounds to 2 - 2**-23 where numpy's ``(x - m) + 2`` is exactly 2 at the
    maximum. A bare constant is H's: the body as written, ``(max x - m) + 2``."""
    x = np.array([-0.2944970428943634, -0.3409476578235626, 0.6466463804244995, -0.8507760167121887,
                  0.9823898077011108, -0.39902737736701965, 1.6270619630813599, 0.4117336869239807],
                 np.float32).reshape(2, 2, 2)
    got = rf.kernel(_shifted_max, backend=backend)(x)
    assert np.array_equal(got, _shifted_max(x)) and np.all(got == 2.0)



def test_an_additive_max_is_finished_as_written_only_where_its_atom_is_written(tmp_path):
    """Long campaign at 50b4a5f (seed 1), example 24819: ``0.5 + f32(x - v)`` on f16 data, with the constant now
    in H (68642's fix), had a one-atom G, ``f32(x)``, that appears only in the normal form, not in the body as
    written, so finishing the body as written left a load of x after the loop (`VerifyError`). Run as the
    fuzzer's shrunk reproducer, a script of its own."""
    import subprocess
    import sys

    script = tmp_path / "repro_24819.py"
    script.write_text(
        "import numpy as np\nimport redfuser as rf\n\n\ndef program(x0, s0):\n"
        "    v0 = rf.sum(x0, axis=-1, keepdims=True)\n    v2 = x0 - v0\n    v4 = s0 + v2\n"
        "    v5 = rf.max(v4, axis=-1, keepdims=False)\n    return v5\n\n\n"
        "x0 = np.array([-2.0, -4.0]).astype(np.float16).reshape((2,))\n"
        "for backend in ('interpret', 'cpu', 'simulate'):\n"
        "    got, want = rf.kernel(program, backend=backend)(x0, np.float32(0.5)), program(x0, np.float32(0.5))\n"
        "    assert got.dtype == want.dtype and np.array_equal(got, want), (backend, got, want)\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]


def _variance_of_twice_a_quotient(x, y):
    return rf.var(x / y * 2.0, axis=-1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_constant_multiple_of_a_quotient_is_centred_on_its_running_mean(backend):
    """Seed 54, example 1107 at 570a151: ``var(x / y * 2)`` split ``x / y * 2`` into ``2 x y**-1`` while
    ``var(x / y)`` kept ``x / y`` one atom. So no centre was found and the cancelling pair ``x² y⁻² - x y⁻¹
    mean`` went unseen: the variance was expanded into three sums. Rows near 3000 gave 4.0 and 12.0 for
    numpy's 3.98 and 4.03 (a silent wrong answer), and y = 1e-30 made ``y**2`` underflow to a NaN variance
    for numpy's 0. A constant multiple of a term kept whole is now that atom times the constant."""
    k = rf.kernel(_variance_of_twice_a_quotient, backend=backend)
    rows = (3000.0 + np.random.default_rng(0).standard_normal((2, 4096))).astype(np.float32)
    ones = np.ones((2, 1), np.float32)
    got, want = k(rows, ones), _variance_of_twice_a_quotient(rows, ones)
    assert np.allclose(got, want, rtol=1e-4), (got, want)
    assert "centred on the running mean" in k.explain(rows, ones)

    tiny = np.full((1, 4), 1e-30, np.float32), np.full((1, 1), 1e-30, np.float32)
    with np.errstate(all="ignore"):
        got, want = k(*tiny), _variance_of_twice_a_quotient(*tiny)
    assert got[0] == want[0] == 0.0


def _matmul(x0, x1):
    return x0 @ x1


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_infinity_beside_a_split_operand_stays_infinite(backend):
    """Seed 60, example 84 (the `tile_matmul` idiom): ``f32 @ bf16`` with -inf in the bf16 operand. The f32
    side is split into three bf16 parts for the tensor cores, and ``1.0`` splits into ``1, 0, 0``: the zero
    parts met the -inf, 0 * -inf = NaN where numpy gives -inf. Rows 1-4 are the other edges: a second part
    of the other sign (``1 + 3 * 2**-9`` rounds up to ``1 + 2**-7``), an infinite P against an infinity
    (P's infinity has to be the part that meets it), a P beyond bf16's largest, and P = 0 (NaN, as numpy).
    (On the cpu with AMX the run-time check sends a dot with an infinite operand to the FMA path.)"""
    x0 = np.ones((16, 32), np.float32)
    x0[1], x0[2, 3], x0[3, 0], x0[4, 3] = 1 + 3 * 2.0 ** -9, -np.inf, np.finfo(np.float32).max * 0.999, 0.0
    x1 = np.ones((32, 16), np.float32)
    x1[3, 5], x1[3, 6] = -np.inf, np.inf
    x1[3, 7] = 0.0
    x1 = x1.astype(rf.bfloat16)
    with np.errstate(all="ignore"):
        got, want = rf.kernel(_matmul, backend=backend)(x0, x1), _matmul(x0, x1)
    assert want[0, 5] == -np.inf and want[1, 6] == np.inf and np.isnan(want[4, 5]) and np.isnan(want[2, 7])
    np.testing.assert_array_equal(got, want)


def _squares_about_a_mean_of_other_data(x, y):
    return rf.sum((x - rf.sum(y, axis=-1, keepdims=True) / 3.0) ** 2, axis=-1)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float16, rf.bfloat16])
def test_a_centre_of_the_compilers_own_divides_as_the_body_does(backend, dtype):
    """A sum of squares about ``sum(y) / 3`` (not a running statistic of ``x``: the compiler centres it on a
    running mean of its own, docs/fusion.md) wrote ``sum(y) / 3`` as ``0.333 * sum(y)``: in bf16 that is
    ``0.33398 * 3 = 1.0020`` for numpy's ``3 / 3 = 1``, and a row equal to the mean gave 1.1e-5 for 0."""
    x = np.ones((2, 3), np.float32).astype(dtype)
    y = np.ones((2, 3), np.float32).astype(dtype)
    k = rf.kernel(_squares_about_a_mean_of_other_data, backend=backend)
    assert "on its own running mean" in k.explain(x, y)
    got, want = k(x, y), _squares_about_a_mean_of_other_data(x, y)
    assert got.dtype == want.dtype and np.array_equal(got, want) and (want == 0).all()


def _scaled_min_of_shifted(x0):
    v0 = rf.max(x0, axis=-1, keepdims=True)
    return rf.min((x0 - v0) * 0.05, axis=-1), rf.max((v0 - x0) * -3.0, axis=-1), rf.min((x0 - v0) * -0.5, axis=-1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_additive_min_of_a_scaled_value_is_the_body_at_the_extreme(backend):
    """Seed 75, example 1 (pre-existing at f52c865): ``min((x - m) * 0.05)`` was finished as ``0.05 min(x) -
    0.05 m``, an ulp from numpy's ``(x_min - m) * 0.05``, which the oracle holds exact (a min is one of the
    values). The accumulator now keeps the atom's extreme (the other one for a negative factor) and the
    body is evaluated at it as written."""
    x0 = np.array([-1.5569467544555664, -4.923617362976074, -8.24763298034668, 0.644263744354248],
                  np.float32).reshape((2, 2))
    x1 = np.random.default_rng(5).standard_normal((3, 37)).astype(np.float32) * 7
    k = rf.kernel(_scaled_min_of_shifted, backend=backend)
    for x in (x0, x1):
        for got, want in zip(k(x), _scaled_min_of_shifted(x)):
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("backend", ["interpret", "cpu", "simulate"])
def test_a_separable_max_of_a_base_2_exponential_is_taken_as_written(backend):
    """Fuzz seed 80, example 342: ``max(exp2(x log2(e) - max(x log2(e))))`` read as ``exp(x - 0.693 m)``
    skipped numpy's rounding of ``x log2(e)``: 1.00006 for numpy's exact 1 on rows near 1000. A separable
    max keeps the body as written where the normal form rounds differently, as a one-term sum does."""
    def program(x0):
        v0 = x0 * 1.4426950408889634
        v2 = v0 - rf.max(v0, axis=-1, keepdims=True)
        return rf.max(rf.exp2(v2), axis=-1, keepdims=False)

    x0 = np.array([999.8497314453125, 1001.9498291015625, 1000.7438354492188, 998.7208862304688],
                  np.float32).reshape((4, 1))
    np.testing.assert_array_equal(rf.kernel(program, backend=backend)(x0), program(x0))


@pytest.mark.parametrize("backend", ["interpret", "cpu", "simulate"])
def test_a_weighted_square_about_a_weighted_mean_is_a_second_pass(backend):
    """Fuzz seed 81, example 605 (pre-existing at 31b1f3a): ``Σ w (x - Σwx / Σw)**2`` was centred on the plain
    running mean of ``x``, far from the weighted mean where the weights are skewed (-2 and 65504), and the
    weighted sums around it cancelled: -2.00098 for numpy's -2.00006. Such a sum is a second pass, as written."""
    def program(x0, x1):
        v3 = rf.sum(x1 * x0, axis=-1, keepdims=True) / rf.sum(x1, axis=-1, keepdims=True)
        return rf.sum(x1 * (x0 - v3) ** 2, axis=-1, keepdims=True)

    x0 = np.array([[-4.0, -3.0]], np.float32)
    x1 = np.array([[-2.0, 65504.0]], np.float32)
    np.testing.assert_allclose(rf.kernel(program, backend=backend)(x0, x1), program(x0, x1), rtol=2e-6)


def test_the_oracle_does_not_judge_an_uncertain_zero_times_an_infinity_inside_a_matmul():
    """Campaign seed 87, example 1161: ``var(log(|exp(x - x)| + 1)) @ [-inf]``. numpy's pairwise sum of sixteen
    ``log 2`` is exact, so its variance is 0 and the product NaN; the kernels sum in another order, get a variance
    of 1e-14 (well inside its bound) and -inf. The oracle left an uncertain zero times an infinity unjudged for
    ``*`` (rule (2)), not inside the inner sum of ``@``."""
    from redfuser.testing.program import Arg, Node, Program
    from redfuser.testing.program_data import ArrayData
    from redfuser.testing.program_oracle import reference

    x = Arg(ArrayData("float32", (16, 1), values=(-2.0, 3.0, 3.0, 4.0, 2.0, -3.0, -4.0, 3.0, -1.0, -3.0, -4.0,
                                                   -1.0, 2.0, 1.0, 3.0, -4.0)))
    w = Arg(ArrayData("float32", (1, 2), values=(-np.inf, 2.0)))
    nodes = (Node(("v0",), "sub", ("x0", "x0")), Node(("v1",), "exp", ("v0",)), Node(("v2",), "abs", ("v1",)),
             Node(("v3",), "add_c", ("v2",), (1.0,)), Node(("v4",), "log", ("v3",)),
             Node(("v5",), "var", ("v4",), (None, True, 0)), Node(("v6",), "matmul", ("v5", "x1")))
    program = Program(("x0", "x1"), nodes, ("v6",), ((x, w),))
    (out,) = reference(program, 0, "cpu").outputs
    assert np.isnan(out.ref[0, 0]) and out.ref[0, 1] == 0.0
    assert out.unsure.tolist() == [[True, False]]      # the finite column stays judged
    for backend in BACKENDS:
        assert judged(program, backend) == []


def _merged_like_terms(x, w):
    r0 = rf.min(x * w, axis=-1, keepdims=True)
    return rf.sum((x - r0) ** 2 + x * r0, axis=-1, keepdims=True)


def test_like_terms_that_merge_without_cancelling_do_not_refuse_fusion():
    """Campaign seed 88, example 463 (cascade completeness): ``(x - r0)**2 + x r0`` expands to ``x**2 - 2 x r0 +
    r0**2 + x r0``, whose ``x r0`` terms merge into ``-x r0``; the new check for cancelled atoms (1c6f470) took
    any merge of opposite signs for a cancellation and refused a cascade that is separable by construction.
    Only terms that cancel to nothing are noted."""
    rng = np.random.default_rng(0)
    x, w = (rng.standard_normal((3, 5)).astype(np.float32) for _ in range(2))
    kernel = rf.kernel(_merged_like_terms, backend="interpret", interpret_chunk=1)
    (group,) = kernel.lower(x, w).groups
    assert set(group.fused_members) == {"r0", "sum"}, group.reason
    np.testing.assert_allclose(kernel(x, w), _merged_like_terms(x, w), rtol=1e-5, atol=1e-5)


def _probabilities_by_log_sum_exp_times(x, mask, w):
    y = rf.where(mask, x, -rf.inf)
    y = y - rf.max(y, axis=-1, keepdims=True)
    return rf.exp(y - rf.log(rf.sum(rf.exp(y), axis=-1, keepdims=True))) @ w


@pytest.mark.parametrize("options", [{}, {"split": 3}, {"block_n": 16}])
@pytest.mark.parametrize("backend", ["interpret", "cpu", "simulate"])
def test_a_softmax_by_its_log_sum_exp_over_a_row_masked_at_first(backend, options):
    """Seed 111, example 1432: ``exp(y - log(sum(exp(y)))) @ w`` of a row whose first chunk (or a split's
    slice) is all masked: the running sum was 0 there, the term ``exp(-inf - log 0)`` NaN, and the state NaN
    for good (every backend in some schedule; a left-padded prompt's attention written so). The log of a
    running sum of exponentials reads as 0 while the sum is 0 (`nan_guard.read_logs_safely`)."""
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((4, 40)).astype(np.float32), rng.standard_normal((40, 8)).astype(np.float32)
    mask = np.ones((4, 40), bool)
    mask[:, :20] = False          # the first chunks masked
    mask[1, 30:] = False          # and the last slice of a split
    (got,), (want,) = run_backend(backend, _probabilities_by_log_sum_exp_times, x, mask, w, **options)
    assert not np.isnan(got).any()
    rf.testing.assert_close(got, want, np.float32, 40)


def _exp2_of_scaled_logits(x0, x3):
    v0 = x0 * 1.4426950408889634
    v1 = rf.max(v0, axis=-1, keepdims=True)
    return (rf.exp2(v0 - v1) - x3).sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_exponent_reads_a_scaled_value_as_numpy_rounds_it(backend):
    """Seed 118, example 1122 (pre-existing at 7568356): ``v = x * log2(e); exp2(v - max(v))`` was folded to
    ``exp(x - ln2 m)``, never rounding ``v``: at the max the term was ``exp(x - ln2 f32(x log2 e))``, not
    numpy's ``exp2(0) = 1``, and with logits near 2000 the row sum was 3.00012 for 3. A computed value meeting an
    earlier result inside an exponent is now one rounded atom (`own_centre.rounded_exponents`), still fused."""
    x0 = np.array([-380.68417, 1069.6587, 802.17883, -214.72012, 2154.103, -381.28397, 926.82397, 236.13332,
                   1486.6194, -522.77087, 247.18573, 388.96841], np.float32).reshape((2, 3, 2))
    x3 = np.array([1.0, -3.0], np.float32)
    k = rf.kernel(_exp2_of_scaled_logits, backend=backend)
    assert "in one pass" in k.explain(x0, x3)
    got, want = k(x0, x3), _exp2_of_scaled_logits(x0, x3)
    np.testing.assert_allclose(got, want, rtol=2e-6)
