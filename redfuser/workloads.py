"""Reference kernels: the unfused programs RedFuser is demonstrated and measured on.

Each is a plain function over the ``redfuser`` op namespace, so it runs as
numpy (the reference) and compiles with ``rf.kernel``. `WORKLOADS` maps a name
to the function and a maker of example inputs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

import redfuser as rf


def attention(q, k, v):
    """Multi-head attention forward, unfused: scores, safe softmax, weighted sum of values."""
    s = (q @ rf.swapaxes(k, -1, -2)) * (1.0 / q.shape[-1] ** 0.5)
    m = rf.max(s, axis=-1, keepdims=True)
    p = rf.exp(s - m)
    l = rf.sum(p, axis=-1, keepdims=True)
    return (p / l) @ v


def causal_attention(q, k, v):
    """Attention where query i sees keys j <= i (the causal mask as a `where` over aranges)."""
    n, m_ = k.shape[-2], q.shape[-2]
    s = (q @ rf.swapaxes(k, -1, -2)) * (1.0 / q.shape[-1] ** 0.5)
    s = rf.where(rf.arange(n)[None, :] <= rf.arange(m_)[:, None], s, -rf.inf)
    m = rf.max(s, axis=-1, keepdims=True)
    p = rf.exp(s - m)
    l = rf.sum(p, axis=-1, keepdims=True)
    return (p / l) @ v


def softmax(x):
    """Safe softmax over the last axis."""
    m = rf.max(x, axis=-1, keepdims=True)
    e = rf.exp(x - m)
    return e / rf.sum(e, axis=-1, keepdims=True)


def log_softmax(x):
    """Log-softmax over the last axis."""
    m = rf.max(x, axis=-1, keepdims=True)
    l = rf.sum(rf.exp(x - m), axis=-1, keepdims=True)
    return x - m - rf.log(l)


def softmax_entropy(x):
    """Entropy of the softmax distribution of each row: a sum of separable terms."""
    m = rf.max(x, axis=-1, keepdims=True)
    e = rf.exp(x - m)
    l = rf.sum(e, axis=-1, keepdims=True)
    p = e / l
    return -rf.sum(p * rf.log(p), axis=-1)


def layer_norm_stats(x):
    """Mean, then the centered sum of squares (the variance) of each row."""
    n = x.shape[-1]
    mu = rf.sum(x, axis=-1, keepdims=True) / n
    var = rf.sum((x - mu) ** 2, axis=-1, keepdims=True) / n
    return mu, var


def mean_abs_deviation(x):
    """Mean, then the mean absolute deviation: abs(x - mu) does not factor (unfusable)."""
    n = x.shape[-1]
    mu = rf.sum(x, axis=-1, keepdims=True) / n
    return rf.sum(rf.abs(x - mu), axis=-1) / n


def route(logits, k: int):
    """MoE routing: softmax over experts, the top `k`, renormalized by their sum."""
    m = rf.max(logits, axis=-1, keepdims=True)
    e = rf.exp(logits - m)
    p = e / rf.sum(e, axis=-1, keepdims=True)
    weights, experts = rf.topk(p, k)
    return weights / rf.sum(weights, axis=-1, keepdims=True), experts


def moe_routing(logits):
    """MoE routing, top-2 (`route`)."""
    return route(logits, 2)


def moe_routing_top8(logits):
    """MoE routing at a serving model's width: top-8 of (256) experts (`route`)."""
    return route(logits, 8)


def gemm(x, w):
    """A plain GEMM, ``x @ w``: in f16 the baseline of the tensor-core path (f32 accumulation, as numpy's
    16-bit matmul and cuBLAS do, one rounding of the result)."""
    return x @ w


def fp8_quant_gemm(x, w, w_scale):
    """Per-token absmax quantization of `x` to float8_e4m3fn, GEMM with FP8 weights, per-channel scales."""
    xf = x.astype(rf.float32)
    a = rf.max(rf.abs(xf), axis=-1, keepdims=True)
    xq = (xf * (448.0 / a)).astype(rf.float8_e4m3fn)
    y = xq.astype(rf.float32) @ w.astype(rf.float32)
    return y * w_scale * (a / 448.0)


def flash_attention_f16(q, k, v):
    """Attention as an f16 FlashAttention kernel computes it, written as users write it: scores and softmax
    statistics in f32, the probabilities rounded to f16 for the GEMM with V, one division by l at the end,
    the output in f16. The cast fuses with the rounding moved (docs/fusion.md, "Narrowing casts")."""
    s = q.astype(rf.float32) @ rf.swapaxes(k.astype(rf.float32), -1, -2) * (1.0 / q.shape[-1] ** 0.5)
    m = rf.max(s, axis=-1, keepdims=True)
    p = rf.exp(s - m)
    l = rf.sum(p, axis=-1, keepdims=True)
    return ((p.astype(rf.float16) @ v) / l).astype(rf.float16)


def flash_attention_bf16(q, k, v):
    """The bf16 way: f32 scores and statistics, the normalized probabilities rounded to bf16 for the GEMM
    (accumulated in f32), the output in bf16."""
    s = q.astype(rf.float32) @ rf.swapaxes(k.astype(rf.float32), -1, -2) * (1.0 / q.shape[-1] ** 0.5)
    m = rf.max(s, axis=-1, keepdims=True)
    p = rf.exp(s - m)
    l = rf.sum(p, axis=-1, keepdims=True)
    return ((p / l).astype(rf.bfloat16) @ v.astype(rf.float32)).astype(rf.bfloat16)


def softcap_attention(q, k, v):
    """Attention with logit soft-capping (Gemma 2: ``cap * tanh(s / cap)``, cap 50) before the safe softmax.

    The cap is elementwise in the scores, so the softmax and the value GEMM still fuse into one pass."""
    s = (q @ rf.swapaxes(k, -1, -2)) * (1.0 / q.shape[-1] ** 0.5)
    s = 50.0 * rf.tanh(s / 50.0)
    m = rf.max(s, axis=-1, keepdims=True)
    p = rf.exp(s - m)
    l = rf.sum(p, axis=-1, keepdims=True)
    return (p / l) @ v


def gelu_mlp(x, w1, w2):
    """A GELU MLP block (exact GELU, ``x Phi(x)`` with ``erf``) and the RMS of its output rows: the GEMM's
    epilogue is elementwise, the mean of squares a reduction over the second GEMM's rows."""
    h = x @ w1
    g = 0.5 * h * (1.0 + rf.erf(h * (1.0 / 2.0 ** 0.5)))
    y = g @ w2
    return y, rf.sqrt(rf.mean(y * y, axis=-1))


def int8_quant_gemm(x, w, w_scale):
    """Per-token symmetric int8 quantization (round to nearest even, clipped to +-127) and a GEMM with int8
    weights held as f32, rescaled by both scales: fused like the FP8 case, with the running absmax."""
    s = rf.max(rf.abs(x), axis=-1, keepdims=True) / 127.0
    q = rf.clip(rf.rint(x / s), -127.0, 127.0)
    return (q @ w) * s * w_scale


def argmax_routing(logits):
    """Greedy (top-1) MoE routing: the softmax's largest probability and its expert (numpy's first index on
    ties): the softmax statistics and the max of the probabilities in one pass, the argmax after it, on the
    probabilities as the kernel computes them (two logits a few ulps apart may merge into one probability in
    numpy and not here, or the reverse, as the row sums differ by an ulp: docs/fusion.md, "Top-k in a
    cascade: MoE routing")."""
    m = rf.max(logits, axis=-1, keepdims=True)
    p = rf.exp(logits - m)
    probs = p / rf.sum(p, axis=-1, keepdims=True)
    return rf.argmax(probs, axis=-1), rf.max(probs, axis=-1)


@dataclass(frozen=True)
class Workload:
    """A reference kernel and example inputs for it."""

    fn: Callable
    make_inputs: Callable[[np.random.Generator], tuple[np.ndarray, ...]]


def _qkv(shape: tuple[int, ...]) -> Callable[[np.random.Generator], tuple[np.ndarray, ...]]:
    return lambda rng: tuple(rng.standard_normal(shape).astype(np.float32) for _ in range(3))


def _rows(shape: tuple[int, ...]) -> Callable[[np.random.Generator], tuple[np.ndarray, ...]]:
    return lambda rng: (rng.standard_normal(shape).astype(np.float32) * 3,)


def rope_attention(q, k, v, cos, sin):
    """Attention with rotary position embeddings applied to q and k inside the kernel, in the rotate-half form
    (Llama's): the rotation is elementwise over the head dim the score GEMM contracts, so the pass stays one."""
    half = q.shape[-1] // 2

    def rotate_half(x):
        return rf.concatenate((-x[..., half:], x[..., :half]), axis=-1)

    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    s = (q @ rf.swapaxes(k, -1, -2)) * (1.0 / q.shape[-1] ** 0.5)
    m = rf.max(s, axis=-1, keepdims=True)
    p = rf.exp(s - m)
    l = rf.sum(p, axis=-1, keepdims=True)
    return (p / l) @ v


def rope_tables(positions: int, dim: int, base: float = 10000.0) -> tuple[np.ndarray, np.ndarray]:
    """The cos and sin tables of rotary embeddings (rotate-half layout: each frequency twice), f32."""
    inverse = base ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)
    angle = np.arange(positions, dtype=np.float64)[:, None] * inverse[None, :]
    angle = np.concatenate([angle, angle], axis=-1)
    return np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)


def group_norm(x, w, b):
    """Group normalization (8 groups) of an NCHW activation: the channels split into groups and merged with the
    pixels by a reshape (a view: computed positions), the group statistics one centred pass, then scaled per
    channel."""
    n, c, h, wd = x.shape
    g = x.reshape(n, 8, -1)
    mu = rf.mean(g, axis=-1, keepdims=True)
    var = rf.var(g, axis=-1, keepdims=True)
    y = ((g - mu) / rf.sqrt(var + 1e-5)).reshape(n, c, h, wd)
    return y * w[:, None, None] + b[:, None, None]


def cross_entropy(logits, labels):
    """Cross-entropy per row: the log-sum-exp in one pass, minus the label's logit gathered by
    ``take_along_axis`` (a read per row, not an O(V) one-hot)."""
    m = rf.max(logits, axis=-1, keepdims=True)
    lse = m[:, 0] + rf.log(rf.sum(rf.exp(logits - m), axis=-1))
    return lse - rf.take_along_axis(logits, labels[:, None], axis=-1)[:, 0]


def layer_norm_gemm(x, w):
    """Layer normalization (no affine) then a GEMM: the row statistics in one centred pass, and ``y @ w`` with
    ``y = (x - mu) / sqrt(var + eps)`` a separable term of the same pass (``(x @ w - mu * colsum(w)) / s``)."""
    mu = rf.mean(x, axis=-1, keepdims=True)
    var = rf.var(x, axis=-1, keepdims=True)
    return ((x - mu) / rf.sqrt(var + 1e-5)) @ w


def linear_cross_entropy(h, w, labels):
    """Cross-entropy of a linear layer's logits (``h @ w``, a vocabulary of V columns) without materializing
    them: per row, the log-sum-exp over V and the label's logit gathered."""
    return cross_entropy(h @ w, labels)


def gqa_attention_f16(q, k, v):
    """Grouped-query attention (Llama 3, Mistral: each key/value head serves ``G = Hq / Hkv`` query heads) as
    an f16 FlashAttention kernel computes it: ``q`` [B, Hq, N, D], ``k`` and ``v`` [B, Hkv, N, D], query
    head ``h`` attending with key head ``h // G``. Written with numpy's broadcasting: the query heads seen as
    [B, Hkv, G, N, D] (a view) against ``k`` and ``v`` with a length-1 group axis, so no key or value is
    repeated. The result is [B, Hkv, G, N, D]; ``.reshape(B, Hq, N, D)`` of it outside the kernel is a free
    view (inside the kernel a reshape of a result is a second kernel that copies it)."""
    b, hq, n, d = q.shape
    hkv = k.shape[1]
    return flash_attention_f16(q.reshape(b, hkv, hq // hkv, n, d), k[:, :, None], v[:, :, None])


def rms_norm(x, w):
    """RMSNorm (Llama, T5): each row over its root mean square, scaled per feature by ``w``, computed in f32
    whatever ``x`` is (as torch's ``rms_norm`` does) and returned in ``x``'s dtype. One reduction and the nest
    that reads its row again: a fused loop of one whose sweep is that nest, so one kernel (docs/fusion.md,
    ``find_candidates``)."""
    xf = x.astype(rf.float32)
    return (xf / rf.sqrt(rf.mean(xf * xf, axis=-1, keepdims=True) + 1e-6) * w).astype(x.dtype)



def _spike_half(x: np.ndarray) -> np.ndarray:
    """Half the rows with their absmax in every window, so that the quantized GEMMs' checks judge them exactly
    (`redfuser.testing.quantization.spike_half`)."""
    from .testing.quantization import spike_half

    return spike_half(x)


WORKLOADS: dict[str, Workload] = {
    "attention": Workload(attention, _qkv((2, 4, 128, 64))),
    "causal_attention": Workload(causal_attention, _qkv((2, 4, 128, 64))),
    "softcap_attention": Workload(softcap_attention, lambda rng: tuple(
        (rng.standard_normal((2, 4, 128, 64)) * 6).astype(np.float32) for _ in range(3))),
    "rope_attention": Workload(rope_attention, lambda rng: tuple(
        rng.standard_normal((2, 4, 128, 64)).astype(np.float32) for _ in range(3)) + rope_tables(128, 64)),
    "cross_entropy": Workload(cross_entropy, lambda rng: (
        (rng.standard_normal((64, 1000)) * 3).astype(np.float32), rng.integers(0, 1000, 64))),
    "layer_norm_gemm": Workload(layer_norm_gemm, lambda rng: (
        (rng.standard_normal((64, 256)) * 2 + 3).astype(np.float32), rng.standard_normal((256, 128)).astype(np.float32))),
    "linear_cross_entropy": Workload(linear_cross_entropy, lambda rng: (
        rng.standard_normal((64, 128)).astype(np.float32), rng.standard_normal((128, 1000)).astype(np.float32),
        rng.integers(0, 1000, 64))),
    "group_norm": Workload(group_norm, lambda rng: (
        (rng.standard_normal((2, 32, 8, 8)) * 2 + 3).astype(np.float32),
        rng.standard_normal(32).astype(np.float32), rng.standard_normal(32).astype(np.float32))),
    "int8_quant_gemm": Workload(int8_quant_gemm, lambda rng: (
        _spike_half(rng.standard_normal((64, 256)).astype(np.float32)),
        rng.integers(-127, 128, (256, 128)).astype(np.float32),
        rng.uniform(0.001, 0.01, 128).astype(np.float32))),
    "argmax_routing": Workload(argmax_routing, lambda rng: (
        np.round(rng.standard_normal((64, 256)) * 4).astype(np.float32),)),    # whole logits: ties are common
    "gelu_mlp": Workload(gelu_mlp, lambda rng: (rng.standard_normal((64, 96)).astype(np.float32),
                                                (rng.standard_normal((96, 160)) / 10).astype(np.float32),
                                                (rng.standard_normal((160, 48)) / 12).astype(np.float32))),
    "rms_norm": Workload(rms_norm, lambda rng: (rng.standard_normal((64, 1000)).astype(np.float32) * 3,
                                                rng.uniform(0.5, 1.5, 1000).astype(np.float32))),
    "softmax": Workload(softmax, _rows((64, 1000))),
    "log_softmax": Workload(log_softmax, _rows((64, 1000))),
    "softmax_entropy": Workload(softmax_entropy, _rows((64, 1000))),
    "layer_norm_stats": Workload(layer_norm_stats, _rows((64, 1000))),
    "mean_abs_deviation": Workload(mean_abs_deviation, _rows((64, 1000))),
    "moe_routing": Workload(moe_routing, _rows((256, 64))),
    "moe_routing_top8": Workload(moe_routing_top8, _rows((64, 256))),
    "gemm": Workload(gemm, lambda rng: (rng.standard_normal((96, 200)).astype(np.float16),
                                        rng.standard_normal((200, 72)).astype(np.float16))),
    "fp8_quant_gemm": Workload(fp8_quant_gemm, lambda rng: (
        _spike_half(rng.standard_normal((64, 256)).astype(np.float32)).astype(np.float16),
        rng.standard_normal((256, 128)).astype(rf.float8_e4m3fn),
        rng.uniform(0.5, 2.0, 128).astype(np.float32))),
}
