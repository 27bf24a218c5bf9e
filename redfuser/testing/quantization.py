"""The check for per-token FP8 quantization + GEMM (`redfuser.workloads.fp8_quant_gemm`): one function,
used by the tests, ``python -m redfuser demo fp8_quant_gemm`` and the device check (benchmarks/gpu_cases.py).

Two bounds, both per output element ``(i, j)``; ``s_j`` is the channel's weight scale, ``a_i = max_k |x_ik|``
the token's absmax, ``q_ik = e4m3(x_ik * 448 / a_i)`` what the numpy body quantizes to.

1. **The quantization bound** (docs/fusion.md, "Quantization inside a cascade"), against the exact
   product ``x @ w * s`` in float64::

       |out - x@w*s| <= s_j * sum_k |w_kj| * (2^-4 |x_ik| + 2^-10 a_i / 448)

   Each element rounds to e4m3 with at most half an ulp (``2^-4`` relative) or half the smallest
   subnormal step (``2^-10`` of the scale), whatever absmax ``a' <= a_i`` it was quantized with, so this
   holds for the unfused program and for a fused loop that quantizes each chunk with the running absmax.
   It is a worst case: it grows like ``K`` while the rounding errors, of both signs, add up like
   ``sqrt(K)``. At ``K = 4096`` a correct kernel uses 3% of it, and an output scaled by 0.5 (76%), a
   quarter of ``K`` left out (84%) or a GEMM that never quantizes (0%) all stay inside it.

2. **The quantized reference**, on rows where every kernel quantizes exactly like the numpy body: when
   the row's absmax occurs in every aligned window of `period` elements along ``K``, each chunk a fused
   loop reads (a whole number of windows, chunks and split slices starting at multiples of the chunk)
   already holds ``a_i`` when it quantizes, so every ``q_ik`` is the body's, bit for bit (the scale
   ``448 / a`` and the product are correctly rounded f32 operations on both sides). What is left is the
   f32 accumulation of exact e4m3 products and two f32 roundings of the epilogue::

       |out - ref_q| <= (K * 2^-23 + 2^-13) * s_j * a_i/448 * sum_k |q_ik w_kj|  +  2^-22 |ref_q|

   with ``ref_q = (q @ w) * s * a / 448`` in float64. ``K * 2^-23`` is the worst case of summing ``K``
   terms in f32 in any order, with every addition allowed a whole ulp (truncating tensor-core adders
   included). ``2^-13`` (`E4M3_TENSOR_CORE`) is Hopper's FP8 tensor cores: a wgmma keeps only about 14
   significant bits of the sum it accumulates (DeepSeek-V3's report, section 3.3.2), so RedFuser restarts
   every chain of e4m3 wgmmas at 128 products and adds it to the f32 accumulator
   (`codegen/simt/wgmma.py`); each chain may then lose about 2^-14 of its own magnitude, at most 2^-13
   of the terms' magnitudes in all. Accumulating the whole K in the wgmma's C (no promotion) was measured
   at 1.46-1.71 times this check's allowance before the 2^-13 on an H200 (benchmarks/device_notes.md,
   run 9). A GEMM that skips the quantization differs from ``ref_q`` by the rounding errors themselves:
   2.9 times this allowance at ``K = 4096``, 44 times at ``K = 256``; an output scaled by 0.99 is 1.4 times
   over it at ``K = 4096`` (24 times at 256), one scaled by 0.5 or missing a quarter of ``K`` 72-78 times
   (over 1 000 at 256). A correct kernel (the CPU backend, quantizing chunk by chunk with the running
   absmax) uses 0.00x. `tests/test_benchmarks.py` plants each of these.

`check_quantized_gemm` reports both ratios; `assert_quantized_gemm` raises when either exceeds 1.
"""
from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

E4M3_REL = 2.0**-4
"""Half an e4m3 ulp, relative to the value (3 mantissa bits)."""

E4M3_SUBNORMAL = 2.0**-10
"""Half the smallest e4m3 subnormal step (``2^-9``), relative to the largest value 448."""

E4M3_TENSOR_CORE = 2.0**-13
"""What FP8 tensor-core accumulation may lose, relative to the sum of the terms' magnitudes (bound 2)."""

_TINY = float(np.finfo(np.float32).tiny)

PERIOD = 16
"""The window the device check's inputs repeat each row's absmax in: every GPU and CPU schedule reads ``K``
in chunks of a multiple of 16 elements (the smallest ``block_k``, an mma's k is 16 or 32)."""


def quantization_bound(x: np.ndarray, w: np.ndarray, w_scale: np.ndarray) -> np.ndarray:
    """Bound 1 of the module docstring, per output element (float64)."""
    xa = np.abs(x.astype(np.float64))
    a = xa.max(axis=-1, keepdims=True)
    per_element = E4M3_REL * xa + E4M3_SUBNORMAL * a / 448.0
    return (per_element @ np.abs(w.astype(np.float64))) * w_scale.astype(np.float64)


def int8_quantization_bound(x: np.ndarray, w: np.ndarray, w_scale: np.ndarray) -> np.ndarray:
    """The int8 analogue of bound 1 (`redfuser.workloads.int8_quant_gemm`, docs/fusion.md "The same rule for
    int8"), per output element: half a grid step ``a_i/127`` per term, and twice the f32 accumulation of the
    terms' magnitudes (``K`` ulps, any order)::

        |out - x@w*s| <= s_j * (sum_k |w_kj| * a_i/254  +  2 K 2^-23 * 127 * sum_k |w_kj| * a_i/127)
    """
    k = x.shape[-1]
    a = np.abs(x.astype(np.float64)).max(axis=-1, keepdims=True)
    wsum = np.abs(w.astype(np.float64)).sum(axis=0)
    return (wsum * a / 254.0 + 2 * k * 2.0**-23 * wsum * a) * w_scale


def quantize(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(q, a)``: the e4m3 values and absmax per row, computed as `fp8_quant_gemm`'s body does (f32)."""
    xf = x.astype(np.float32)
    a = np.max(np.abs(xf), axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        return (xf * (np.float32(448.0) / a)).astype(ml_dtypes.float8_e4m3fn), a


def absmax_in_every_window(x: np.ndarray, period: int = PERIOD) -> np.ndarray:
    """Per row: whether its absmax (nonzero) occurs in every aligned window of `period` elements (the last,
    possibly shorter, window included)."""
    xa = np.abs(x.astype(np.float32))
    a = xa.max(axis=-1, keepdims=True)
    k = xa.shape[-1]
    pad = -k % period
    hit = np.pad(xa == a, [(0, 0)] * (xa.ndim - 1) + [(0, pad)], constant_values=False)
    windows = hit.reshape(hit.shape[:-1] + (-1, period)).any(axis=-1)
    if pad:   # the padded tail belongs to the last window, which holds real elements
        windows[..., -1] = hit[..., k - (k % period):k].any(axis=-1)
    return windows.all(axis=-1) & (a[..., 0] > 0)


@dataclass(frozen=True)
class QuantizedCheck:
    """The outcome of a check: each ratio is the worst element's error over its bound (<= 1 passes)."""

    bound_ratio: float      # against the exact product and the quantization bound
    exact_ratio: float      # against the quantized reference, on `exact_rows` rows (nan when none)
    exact_rows: int
    rows: int               # rows with a nonzero absmax (the others must be NaN)
    relative: float         # ||out - exact|| / ||exact|| over those rows (Frobenius), for the record

    @property
    def passed(self) -> bool:
        return self.bound_ratio <= 1.0 and not self.exact_ratio > 1.0

    def __str__(self) -> str:
        exact = (f"{self.exact_ratio:.3g}x the accumulation bound against the quantized reference on "
                 f"{self.exact_rows} of {self.rows} rows" if self.exact_rows else "no row quantizes exactly")
        return f"{self.bound_ratio:.3g}x the quantization bound; {exact}"


class QuantizedReference:
    """What both bounds need from the inputs ``(x, w, w_scale)``, computed once (four float64 GEMMs):
    `check` then costs one pass over an output."""

    def __init__(self, x: np.ndarray, w: np.ndarray, w_scale: np.ndarray, *, period: int = PERIOD) -> None:
        x64, w64, s64 = x.astype(np.float64), w.astype(np.float64), w_scale.astype(np.float64)
        self.zero = np.abs(x64).max(axis=-1) == 0          # the reference's NaN rows (0 * 448 / 0)
        self.exact = (x64 @ w64) * s64
        # + the output's own f32 rounding, and a floor where a bound is 0 (a zero column of w)
        self.allowed = quantization_bound(x, w, w_scale) + 2.0**-22 * np.abs(self.exact) + _TINY
        self.rows = absmax_in_every_window(x, period) & ~self.zero
        self.ref_q = self.allowed_q = None
        if self.rows.any():
            q, a = quantize(x[self.rows])
            q64 = q.astype(np.float64)
            unit = s64 * a.astype(np.float64) / 448.0
            self.ref_q = (q64 @ w64) * unit
            self.allowed_q = ((x.shape[-1] * 2.0**-23 + E4M3_TENSOR_CORE) * (np.abs(q64) @ np.abs(w64)) * unit
                              + 2.0**-22 * np.abs(self.ref_q) + _TINY)

    def check(self, out: np.ndarray) -> QuantizedCheck:
        """Both bounds of the module docstring for a kernel's output `out`."""
        out = np.asarray(out, np.float64)
        if not np.array_equal(np.isnan(out), np.broadcast_to(self.zero[..., None], out.shape)):
            raise AssertionError("fp8_quant_gemm: NaN outputs differ from the reference's (its all-zero rows)")
        keep = ~self.zero
        with np.errstate(invalid="ignore", over="ignore"):
            bound_ratio = float(np.max((np.abs(out - self.exact) / self.allowed)[keep], initial=0.0))
            exact_ratio = float("nan")
            if self.ref_q is not None:
                exact_ratio = float(np.max(np.abs(out[self.rows] - self.ref_q) / self.allowed_q))
            diff = np.linalg.norm((out - self.exact)[keep])
            relative = float(diff / max(np.linalg.norm(self.exact[keep]), 1e-300))
        return QuantizedCheck(bound_ratio, exact_ratio, int(self.rows.sum()), int(keep.sum()), relative)


def check_quantized_gemm(out: np.ndarray, x: np.ndarray, w: np.ndarray, w_scale: np.ndarray, *,
                         period: int = PERIOD) -> QuantizedCheck:
    """Both bounds of the module docstring for a kernel's `out` of ``fp8_quant_gemm(x, w, w_scale)``.

    Rows whose absmax is zero are the reference's NaN and must be NaN in `out`; the ratios cover the rest.
    """
    return QuantizedReference(x, w, w_scale, period=period).check(out)


def assert_quantized_gemm(out: np.ndarray, x: np.ndarray, w: np.ndarray, w_scale: np.ndarray, *,
                          period: int = PERIOD) -> QuantizedCheck:
    """`check_quantized_gemm`, raising `AssertionError` when an element is outside either bound, or when `out`
    is not the body's shape and dtype (f32: the body's ``y * w_scale * (a / 448)``)."""
    want_shape = x.shape[:-1] + w.shape[-1:]
    if np.shape(out) != want_shape or np.asarray(out).dtype != np.float32:
        raise AssertionError(f"fp8_quant_gemm: output {np.asarray(out).dtype}{list(np.shape(out))}, the body's is "
                             f"float32{list(want_shape)}")
    result = check_quantized_gemm(out, x, w, w_scale, period=period)
    if not result.passed:
        raise AssertionError(f"fp8_quant_gemm: error {result}")
    return result


def spike_rows(x: np.ndarray, period: int = PERIOD) -> np.ndarray:
    """`x` with each row's absmax copied (with the element's sign) to every `period`-th element: inputs on
    which every kernel quantizes exactly like the numpy body (bound 2 of the module docstring)."""
    x = np.array(x, copy=True)
    a = np.max(np.abs(x), axis=-1, keepdims=True)
    head = x[..., ::period]
    x[..., ::period] = np.where(head < 0, -a, a)
    return x


def spike_half(x: np.ndarray, period: int = PERIOD) -> np.ndarray:
    """`x` with its first half of rows spiked (`spike_rows`) and the rest left as drawn: the inputs the demo,
    the examples and the CPU benchmark check on, so that bound 2 judges half the rows sharply (on random
    rows alone only bound 1 applies, and it passes a GEMM that never quantizes; found by a helper) while
    the other half still exercise a running absmax that changes from chunk to chunk."""
    half = x.shape[0] // 2 if x.ndim > 1 else 0
    out = np.array(x, copy=True)
    if half:
        out[:half] = spike_rows(x[:half], period)
    return out


def assert_int8_quantized_gemm(out: np.ndarray, x: np.ndarray, w: np.ndarray, w_scale: np.ndarray, *,
                               period: int = PERIOD) -> str:
    """A kernel's `out` of ``int8_quant_gemm(x, w, w_scale)`` (`redfuser.workloads`): every element within
    `int8_quantization_bound` of the exact product, and on the rows whose absmax occurs in every window of
    `period` (`absmax_in_every_window`), where every kernel rounds each element with the body's own scale,
    equal to the body under the tolerance rule (f32, reduction length K). Raises `AssertionError`; returns
    the ratios. The bound alone passes a GEMM that never rounds (found by a helper); the rows checked against
    the body do not."""
    from redfuser.workloads import int8_quant_gemm

    from .tolerance import assert_close

    want_shape = x.shape[:-1] + w.shape[-1:]
    if np.shape(out) != want_shape or np.asarray(out).dtype != np.float32:
        raise AssertionError(f"int8_quant_gemm: output {np.asarray(out).dtype}{list(np.shape(out))}, the body's "
                             f"is float32{list(want_shape)}")
    exact = (x.astype(np.float64) @ w.astype(np.float64)) * w_scale
    # (a bound of 0, a column of w all zeros, holds only an exact result: 0/0 was NaN, a right kernel refused)
    error, bound = np.abs(out - exact), int8_quantization_bound(x, w, w_scale)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = np.where(bound > 0, error / bound, np.where(error == 0, 0.0, np.inf))
    ratio = float(np.max(ratios)) if ratios.size else 0.0
    if not ratio <= 1.0:
        raise AssertionError(f"int8_quant_gemm: {ratio:.3g} times its quantization bound from the exact product")
    rows = absmax_in_every_window(x, period)
    if rows.any():
        with np.errstate(all="ignore"):
            body = int8_quant_gemm(x[rows], w, w_scale)
        assert_close(out[rows], body, np.float32, x.shape[-1], "int8_quant_gemm on rows every kernel rounds as "
                     "the body does")
    return f"{ratio:.3f} of the int8 quantization bound, {int(rows.sum())} rows equal to the body"
