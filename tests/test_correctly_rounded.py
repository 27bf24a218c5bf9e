"""Division and square root without subroutines (`codegen/correctly_rounded.py`) are IEEE's, bit for bit.

The GPU emits that IR in kernels that issue wgmma, with the hardware's reciprocal estimates
(``rcp.approx.ftz.f64``, ``rsqrt.approx.ftz.f64``). Here the same IR runs on the CPU with estimates at
least as bad as any the scheme allows: the exact value, and the exact value with all but 8 significant
bits cut off or set (relative errors up to 2**-8 below and above). Every result must equal numpy's f32
division and square root, bit for bit, special values and signed zeros included. A 4-bit estimate (outside
the scheme's stated range) must fail the same comparison, which shows the comparison has teeth.
"""
from __future__ import annotations

import numpy as np
import pytest

import redfuser as rf
from redfuser.testing.tolerance import assert_close
from helpers import assemble_without_spills, native_elementwise, reciprocal_estimate
from redfuser.codegen import correctly_rounded

RNG = np.random.default_rng(11)


def _native(operation, estimate, lanes: int = 1):
    """`operation` (`correctly_rounded.divide` or `sqrt`) with `estimate`, compiled for this CPU on scalars or
    on vectors of `lanes` (the GPU emits it on a register's whole vector, the estimate element by element)."""
    operands = 2 if operation is correctly_rounded.divide else 1
    return native_elementwise(lambda b, *values: operation(b, *values, estimate), operands, lanes)


def _whole_vectors(*arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    """The arrays cut to a multiple of 8 elements."""
    n = arrays[0].size // 8 * 8
    return tuple(a[:n] for a in arrays)


def _bit_equal(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Elementwise: the same bits, or both NaN."""
    return (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))


SPECIALS = np.float32([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 2.0**-149, -(2.0**-149), 2.0**-126, 3 * 2.0**-149,
                       3.4028235e38, -3.4028235e38, 1.1754942e-38, 2.0, 0.5])


def _bits(n: int) -> np.ndarray:
    return RNG.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)


def _division_operands() -> tuple[np.ndarray, np.ndarray]:
    """Random bit patterns (every binade, subnormals, NaNs), ordinary values, quotients that land among the
    subnormals and next to the overflow threshold, every pair of special values, and the exact midpoints
    between subnormals (``k * 2**-149 / 2`` for odd ``k``: ties, broken to even)."""
    n = 400_000
    normal_a, normal_b = RNG.standard_normal(n).astype(np.float32), RNG.standard_normal(n).astype(np.float32)
    small = (RNG.integers(1, 2**23, n).astype(np.uint32)).view(np.float32)
    ties = np.arange(1, 4001, 2, dtype=np.uint32).view(np.float32)
    a_special, b_special = (grid.ravel() for grid in np.meshgrid(SPECIALS, SPECIALS))
    a = np.concatenate([_bits(n), normal_a, small, normal_a * np.float32(1e-30), normal_a * np.float32(3e38),
                        a_special, ties, -ties])
    b = np.concatenate([_bits(n), normal_b, normal_b, normal_b * np.float32(1e8), normal_b * np.float32(0.7),
                        b_special, np.full(2 * ties.size, 2, np.float32)])
    return a, b


def _sqrt_operands() -> np.ndarray:
    """Every 251st f32 bit pattern (17 M values: every binade, both signs, subnormals, NaNs), the specials, and
    the f32 values on both sides of the squares of midpoints (the hardest to round)."""
    sweep = np.arange(0, 2**32, 251, dtype=np.uint64).astype(np.uint32).view(np.float32)
    mids = (RNG.integers(2**23, 2**24, 200_000) * 2 + 1).astype(np.float64) * 2.0 ** RNG.integers(-100, 80, 200_000)
    squares = (mids * mids).astype(np.float32)
    near = np.concatenate([squares, np.nextafter(squares, np.float32(np.inf)), np.nextafter(squares, np.float32(0))])
    return np.concatenate([sweep, SPECIALS, near])


ESTIMATES = [(None, False, 1), (8, False, 1), (8, True, 1), (8, False, 8)]


@pytest.mark.parametrize("kept_bits,up,lanes", ESTIMATES)
def test_division_equals_numpys_bit_for_bit(kept_bits, up, lanes):
    divide = _native(correctly_rounded.divide, reciprocal_estimate("reciprocal", kept_bits, up), lanes)
    a, b = _whole_vectors(*_division_operands())
    with np.errstate(all="ignore"):
        want = a / b
    same = _bit_equal(divide(a, b), want)
    assert same.all(), list(zip(a[~same][:5], b[~same][:5]))


@pytest.mark.parametrize("kept_bits,up,lanes", ESTIMATES)
def test_sqrt_equals_numpys_bit_for_bit(kept_bits, up, lanes):
    root = _native(correctly_rounded.sqrt, reciprocal_estimate("reciprocal_sqrt", kept_bits, up), lanes)
    (x,) = _whole_vectors(_sqrt_operands())
    with np.errstate(all="ignore"):
        want = np.sqrt(x)
    got = root(x)
    same = _bit_equal(got, want)
    assert same.all(), x[~same][:5]
    assert np.array_equal(np.signbit(got[x == 0]), np.signbit(x[x == 0]))


def test_an_estimate_outside_the_schemes_range_is_caught():
    """The planted bug: a 4-bit reciprocal (two Newton steps leave 2**-16, the correction 2**-32: not enough)."""
    a, b = _division_operands()
    divide = _native(correctly_rounded.divide, reciprocal_estimate("reciprocal", 4))
    with np.errstate(all="ignore"):
        assert not _bit_equal(divide(a, b), a / b).all()
    root = _native(correctly_rounded.sqrt, reciprocal_estimate("reciprocal_sqrt", 4))
    x = _sqrt_operands()
    with np.errstate(all="ignore"):
        assert not _bit_equal(root(x), np.sqrt(x)).all()


def _normalized_product(a, b):
    """``a @ b`` over the norms of ``a``'s rows: one fused kernel, the dot on wgmma, then a root and a division."""
    wide = a.astype(rf.float32)
    return (a @ b).astype(rf.float32) / rf.sqrt(rf.sum(wide * wide, axis=-1, keepdims=True))


def test_a_wgmma_kernel_divides_and_takes_roots_without_subroutines():
    """On sm_90a the kernel that issues wgmma has neither ``div.rn.f32`` nor ``sqrt.rn.f32`` (both have a
    subroutine, which would make ptxas serialize the wgmmas) but the straight-line forms, and assembles
    without the serialization warning; the simulated result equals numpy's. On sm_90 (mma.sync) nothing
    serializes, and the kernel keeps the IEEE instructions."""
    a = RNG.standard_normal((128, 256)).astype(np.float16)
    b = RNG.standard_normal((256, 64)).astype(np.float16)
    on_wgmma = rf.kernel(_normalized_product, backend="simulate", sm="sm_90a")
    lowered = on_wgmma.lower(a, b)
    (kernel,) = lowered.stages["ptx"].kernels
    ptx = kernel.ptx
    assert "wgmma.mma_async" in ptx
    assert "div.rn.f32" not in ptx and "sqrt.rn.f32" not in ptx
    assert "rcp.approx.ftz.f64" in ptx and "rsqrt.approx.ftz.f64" in ptx
    assemble_without_spills(lowered)
    assert_close(on_wgmma(a, b), _normalized_product(a, b), np.float16, 256)
    on_mma = rf.kernel(_normalized_product, backend="simulate", sm="sm_90").lower(a, b)
    mma_ptx = "\n".join(k.ptx for k in on_mma.stages["ptx"].kernels)
    assert "div.rn.f32" in mma_ptx and "sqrt.rn.f32" in mma_ptx


def _softcapped_attention_f32(q, k, v):
    """Soft-capping written on f32 scores: ``tanh`` in f32 (`wide_math`, evaluated in f64) in the key loop."""
    s = (q @ rf.swapaxes(k, -1, -2)).astype(rf.float32) * (1.0 / q.shape[-1] ** 0.5)
    s = 50.0 * rf.tanh(s / 50.0)
    p = rf.exp(s - rf.max(s, axis=-1, keepdims=True))
    return (p / rf.sum(p, axis=-1, keepdims=True)).astype(rf.float16) @ v


def test_f32_tanh_in_a_wgmma_loop_divides_without_a_subroutine():
    """``tanh``'s f64 division (``div.rn.f64`` has a subroutine too) takes `quotient_f64` in the wgmma kernel:
    it assembles without the serialization warning, and the simulated result equals numpy's (three roundings
    to f16: the scores, P and the output)."""
    q, k, v = (RNG.standard_normal((1, 2, 128, 64)).astype(np.float16) for _ in range(3))
    kernel = rf.kernel(_softcapped_attention_f32, backend="simulate", sm="sm_90a")
    lowered = kernel.lower(q, k, v)
    (compiled,) = lowered.stages["ptx"].kernels
    assert "wgmma.mma_async" in compiled.ptx and "div.rn" not in compiled.ptx
    assemble_without_spills(lowered)
    assert_close(kernel(q, k, v), _softcapped_attention_f32(q, k, v), np.float16, 128, roundings=3)
