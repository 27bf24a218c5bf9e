"""bf16 dots on AMX tiles (`codegen/host/amx.py`): the tiles where the values allow, the FMA path where not.

These need a host whose LLVM features have AMX-BF16 and a Linux kernel that grants the tile state; elsewhere
they skip (the dots there run on the FMA micro-kernel, which every other test covers). Each special-value
test builds data on which the tiles' flushing of subnormals (DAZ/FTZ) gives a different answer from numpy,
so it fails if the run-time check lets such a dot onto the tiles.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import redfuser as rf
from redfuser.codegen.native import host_target
from redfuser.testing import assert_close

pytestmark = pytest.mark.skipif(not host_target().amx, reason="needs AMX-BF16 (and Linux's permission for it)")

BF16 = rf.bfloat16


def matmul(a, b):
    return a @ b


def matmul_transposed(a, bt):
    return a @ rf.swapaxes(bt, -1, -2)


def attention(q, k, v):
    s = (q @ rf.swapaxes(k, -1, -2)) * 0.125
    m = rf.max(s, axis=-1, keepdims=True)
    p = rf.exp(s - m)
    return (p / rf.sum(p, axis=-1, keepdims=True)) @ v


def _llvm(fn, *args) -> str:
    return str(rf.kernel(fn, backend="cpu").lower(*args).stages["llvm"])


@pytest.mark.parametrize("m, k, n", [(16, 32, 16), (64, 64, 48), (48, 96, 64), (128, 256, 128)])
def test_a_bf16_matmul_runs_on_the_tiles(m, k, n):
    rng = np.random.default_rng(m + k + n)
    a = rng.standard_normal((m, k)).astype(BF16)
    b = rng.standard_normal((k, n)).astype(BF16)
    assert "tdpbf16ps" in _llvm(matmul, a, b)
    got = rf.kernel(matmul, backend="cpu")(a, b)
    assert_close(got, matmul(a, b), np.float32, k)
    bt = np.ascontiguousarray(b.T)
    assert "tdpbf16ps" in _llvm(matmul_transposed, a, bt)
    assert_close(rf.kernel(matmul_transposed, backend="cpu")(a, bt), matmul(a, b), np.float32, k)


def test_a_contraction_the_tiles_do_not_cut_keeps_the_fma_path():
    a = np.random.default_rng(1).standard_normal((32, 40)).astype(BF16)    # k = 40: not whole 32-wide tile rows
    b = np.random.default_rng(2).standard_normal((40, 32)).astype(BF16)
    assert "tdpbf16ps" not in _llvm(matmul, a, b)
    assert_close(rf.kernel(matmul, backend="cpu")(a, b), matmul(a, b), np.float32, 40)


def test_an_f32_operand_beside_bf16_data_is_split_exactly():
    """``p @ v`` with an f32 ``p``: three bf16 parts of ``p`` on the tiles, every product exact, so the result
    is the f32 dot's within the one tolerance rule, over values spread across 40 binary orders."""
    rng = np.random.default_rng(3)
    p = (rng.standard_normal((64, 128)) * 2.0 ** rng.integers(-20, 20, (64, 128))).astype(np.float32)
    v = rng.standard_normal((128, 32)).astype(BF16)
    assert "tdpbf16ps" in _llvm(matmul, p, v)
    got = rf.kernel(matmul, backend="cpu")(p, v)
    exact = (p.astype(np.float64) @ v.astype(np.float64)).astype(np.float32)
    assert_close(got, exact, np.float32, 128, scale=float(np.abs(p).max() * np.abs(v.astype(np.float32)).max()))
    assert_close(got, matmul(p, v), np.float32, 128, scale=float(np.abs(p).max() * np.abs(v.astype(np.float32)).max()))


def test_bf16_attention_on_the_tiles_matches_numpy():
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((1, 2, 256, 64)).astype(BF16) for _ in range(3))
    assert "tdpbf16ps" in _llvm(attention, q, k, v)
    assert_close(rf.kernel(attention, backend="cpu")(q, k, v), attention(q, k, v), np.float32, 256)


def _exactly_numpy(fn, *args) -> None:
    got, want = rf.kernel(fn, backend="cpu")(*args), fn(*args)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_subnormal_bf16_operands_take_the_exact_path():
    """A subnormal bf16 (2^-130) times 2^100 is 2^-30; the tiles read the subnormal as 0."""
    a = np.zeros((16, 32), np.float32)
    a[:, 0] = 2.0 ** -130
    b = np.zeros((32, 16), np.float32)
    b[0, :] = 2.0 ** 100
    a, b = a.astype(BF16), b.astype(BF16)
    assert float(a[0, 0]) != 0.0
    _exactly_numpy(matmul, a, b)
    assert float(rf.kernel(matmul, backend="cpu")(a, b)[0, 0]) == 2.0 ** -30


def test_products_below_the_normal_range_take_the_exact_path():
    """2^-70 squared is 2^-140, an f32 subnormal the tiles flush to 0."""
    a = np.full((16, 32), 2.0 ** -70, np.float32).astype(BF16)
    b = np.full((32, 16), 2.0 ** -70, np.float32).astype(BF16)
    _exactly_numpy(matmul, a, b)
    assert float(rf.kernel(matmul, backend="cpu")(a, b)[0, 0]) == 32 * 2.0 ** -140


def test_a_subnormal_accumulator_takes_the_exact_path():
    """Over 256 columns the dot runs in two chunks: the first leaves 128 * 2^-140 = 2^-133 (subnormal) in the
    accumulator, the second adds only zeros, which the tiles would do flushing the accumulator to 0."""
    a = np.zeros((16, 256), np.float32)
    a[:, :128] = 2.0 ** -70
    b = np.full((256, 16), 2.0 ** -70, np.float32)
    a, b = a.astype(BF16), b.astype(BF16)
    _exactly_numpy(matmul, a, b)
    assert float(rf.kernel(matmul, backend="cpu")(a, b)[0, 0]) == 2.0 ** -133


def test_tiny_values_of_a_split_operand_take_the_exact_path():
    """An f32 of 2^-110 (1 + 2^-23) splits into parts down to 2^-133: bf16 subnormals the tiles would drop."""
    p = np.full((16, 32), np.float32(2.0 ** -110) * np.float32(1 + 2.0 ** -23), np.float32)
    v = np.ones((32, 16), np.float32).astype(BF16)
    got = rf.kernel(matmul, backend="cpu")(p, v)
    assert float(got[0, 0]) == float(np.float32(32 * p[0, 0]))


def test_infinities_and_nans_take_the_exact_path():
    rng = np.random.default_rng(5)
    a = rng.standard_normal((32, 64)).astype(np.float32)
    a[3, 5], a[7, 9] = np.inf, np.nan
    b = rng.standard_normal((64, 32)).astype(np.float32)
    b[11, 2] = -np.inf
    a, b = a.astype(BF16), b.astype(BF16)
    got, want = rf.kernel(matmul, backend="cpu")(a, b), matmul(a, b)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(got[np.isinf(want)], want[np.isinf(want)])
    finite = np.isfinite(want)
    assert_close(np.where(finite, got, 0), np.where(finite, want, 0), np.float32, 64)


def _values(data: st.DataObject, shape: tuple[int, ...], dtype: object) -> np.ndarray:
    """Signed values whose binary exponents are spread over a drawn range (down to bf16's subnormals), some
    zeros, and now and then an infinity or NaN."""
    lo, hi = data.draw(st.sampled_from([(-3, 3), (-40, 40), (-140, 60), (-75, -60)]), label="exponents")
    seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
    rng = np.random.default_rng(seed)
    x = rng.uniform(1.0, 2.0, shape) * 2.0 ** rng.integers(lo, hi + 1, shape) * rng.choice([-1.0, 1.0], shape)
    x[rng.random(shape) < 0.1] = 0.0
    if data.draw(st.booleans(), label="specials"):
        flat = x.reshape(-1)
        flat[rng.integers(0, flat.size)] = rng.choice([np.inf, -np.inf, np.nan])
    return x.astype(np.float32).astype(dtype)


@given(st.data(), st.sampled_from([(16, 32, 16), (32, 64, 32), (48, 96, 16), (16, 256, 32)]),
       st.sampled_from([BF16, np.float32]))
def test_tiles_or_fma_path_the_dot_is_numpys(data, shape, a_dtype):
    """Every element within ``8 eps (1 + log2 k) sum|a b|`` of the exact dot (float64 of the same values),
    plus ``k`` halves of f32's smallest subnormal: far tighter, near 0, than a flushed subnormal."""
    m, k, n = shape
    a = _values(data, (m, k), a_dtype)
    b = _values(data, (k, n), BF16)
    if data.draw(st.booleans(), label="b given transposed"):    # packed from its source, as attention's K
        got = rf.kernel(matmul_transposed, backend="cpu")(a, np.ascontiguousarray(b.T))
    else:
        got = rf.kernel(matmul, backend="cpu")(a, b)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        exact = a64 @ b64
        terms = np.abs(a64) @ np.abs(b64)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(exact))
    np.testing.assert_array_equal(np.isinf(got) & (got > 0), np.isinf(exact) & (exact > 0))
    finite = np.isfinite(exact)
    allowed = 8 * np.finfo(np.float32).eps * (1 + np.log2(k)) * np.where(finite, terms, 0) + k * 2.0 ** -150
    err = np.abs(np.where(finite, got.astype(np.float64) - exact, 0))
    assert (err <= allowed).all(), f"worst {err.max()} at {np.unravel_index(np.argmax(err - allowed), err.shape)}"
