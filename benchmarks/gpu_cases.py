"""The cases `gpu_check.py` (and `compile_time.py`) run: shapes, work counts, the unfused torch programs,
float64 references and the checks. torch is imported only by the functions that use it.

Work counted (METHOD.md's two numbers): attention ``4·B·H·Nq·Nk·D`` FLOPs (half of it causal); the
FP8 GEMM ``2·M·N·K``; the memory-bound cases the bytes each input is read once and each output written
once (flash decoding is memory-bound: one query reads all of K and V).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

import redfuser as rf
from redfuser import workloads
from redfuser.testing.quantization import PERIOD, QuantizedReference

NUMPY_DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": rf.bfloat16,
                "float8_e4m3fn": rf.float8_e4m3fn}
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1}
SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float8_e4m3fn": "e4m3"}


@dataclass(frozen=True)
class Case:
    """One row group of the table: a workload at one shape and dtype, and its peers."""

    name: str
    workload: str                                       # a function of redfuser.workloads
    inputs: tuple[tuple[tuple[int, ...], str], ...]     # (shape, dtype name) per argument
    peers: tuple[str, ...]
    peak: str                                           # "bf16", "fp8" (TFLOP/s) or "hbm" (GB/s)
    work: float                                         # FLOPs, or bytes for "hbm"
    causal: bool = False
    options: dict = field(default_factory=dict, compare=False)

    @property
    def fn(self):
        return getattr(workloads, self.workload)

    @property
    def label(self) -> str:
        shape, dtype = self.inputs[0]
        return f"{self.name} {SHORT[dtype]} [{','.join(map(str, shape))}]"

    def compile_args(self) -> list[rf.ShapeDtype]:
        """The inputs' shapes and dtypes (dense): enough to compile, no memory."""
        return [rf.ShapeDtype(s, NUMPY_DTYPES[d]) for s, d in self.inputs]

    def input_bytes(self) -> int:
        return sum(math.prod(s) * ITEMSIZE[d] for s, d in self.inputs)


ATTENTION = ("attention", "causal_attention", "flash_attention_f16", "flash_attention_bf16", "gqa_attention_f16")
"""Workloads computing softmax attention (same peers, reference and torch program shape)."""

GQA = "gqa_attention_f16"
"""Grouped-query attention: q [B, Hq, N, D], k and v [B, Hkv, N, D], the result [B, Hkv, G, N, D]."""

ROUTING = {"moe_routing": 2, "moe_routing_top8": 8}
"""MoE routing workloads and the k of their top-k."""


def _attention(name, workload, b, h, n, d, dtype, causal=False, nq=None, peers=None, **options) -> Case:
    nq = n if nq is None else nq
    shapes = (((b, h, nq, d), dtype), ((b, h, n, d), dtype), ((b, h, n, d), dtype))
    peers = peers or (("sdpa", "torch", "triton", "torch.compile") if nq == 1 else
                      ("sdpa", "flex_attention", "torch", "triton", "torch.compile"))
    if nq == 1:   # decoding: bytes of q, k, v and the output
        return Case(name, workload, shapes, peers, "hbm", (2 * b * h * n * d + 2 * b * h * d) * ITEMSIZE[dtype])
    return Case(name, workload, shapes, peers, "bf16", 4 * b * h * nq * n * d / (2 if causal else 1), causal, options)


def _gqa(b, hq, hkv, n, d) -> Case:
    """Grouped-query attention in f16 (Llama 3 8B: 32 query heads, 8 key/value heads, head 128)."""
    shapes = (((b, hq, n, d), "float16"), ((b, hkv, n, d), "float16"), ((b, hkv, n, d), "float16"))
    return Case(f"gqa {hq}/{hkv}", GQA, shapes, ("sdpa", "flex_attention", "torch", "torch.compile"), "bf16",
                4 * b * hq * n * n * d)


def _rows(name, workload, t, c, dtype) -> Case:
    return Case(name, workload, (((t, c), dtype),), (f"torch.{workload}", "torch", "triton", "torch.compile"),
                "hbm", 2 * t * c * ITEMSIZE[dtype])


def _rms(t, c) -> Case:
    """RMSNorm of f16 rows (statistics in f32, as torch's ``rms_norm`` computes them) with f32 weights."""
    return Case("rms_norm", "rms_norm", (((t, c), "float16"), ((c,), "float32")),
                ("torch.rms_norm", "torch", "torch.compile"), "hbm", 2 * t * c * 2 + c * 4)


def _routing(name, workload, t, experts, k) -> Case:
    return Case(name, workload, (((t, experts), "float32"),),
                ("torch topk(softmax)", "triton fused routing", "torch.compile"), "hbm",
                t * experts * 4 + t * k * (4 + 8))


def _fp8(m, k, n) -> Case:
    return Case("fp8_gemm", "fp8_quant_gemm", (((m, k), "float16"), ((k, n), "float8_e4m3fn"), ((n,), "float32")),
                ("scaled_mm", "scaled_mm alone", "torch", "torch.compile"), "fp8", 2 * m * k * n)


def _gemm(m, k, n) -> Case:
    return Case("gemm", "gemm", (((m, k), "float16"), ((k, n), "float16")), ("torch.matmul",), "bf16", 2 * m * k * n)


ATTENTION_SHAPES = ((4, 16, 4096), (16, 16, 1024), (1, 16, 16384))
"""(batch, heads, sequence) of the attention cases: the reference shape, short sequences in a large batch,
one long sequence (FlashAttention's papers vary the same two)."""


def cases(size: str = "full") -> list[Case]:
    """The benchmark set: ``full`` (an H200: each workload at three shapes or more, about 8 minutes with
    every peer) or ``tiny`` (a CPU smoke run, one shape each)."""
    tiny = size == "tiny"
    attention_shapes = ((1, 2, 128),) if tiny else ATTENTION_SHAPES
    decode_shapes = (((1, 2), 1024),) if tiny else (((4, 32), 32768), ((64, 32), 4096), ((1, 32), 131072))
    row_shapes = ((64, 512),) if tiny else ((32768, 16384), (262144, 1024), (2048, 262144))
    fp8_shapes = ((64, 128, 64),) if tiny else ((4096, 4096, 4096), (16384, 4096, 4096), (1024, 8192, 8192))
    gemm_shapes = ((64, 128, 64),) if tiny else ((4096, 4096, 4096), (8192, 8192, 8192), (1024, 8192, 8192))
    routing = ((256, 64),) if tiny else ((262144, 128), (16384, 128))
    serving = ((64, 256),) if tiny else ((4096, 256), (65536, 256))
    b, h, n = attention_shapes[0]
    # The attention rows compared with SDPA are the bodies users write for f16 and bf16 (f32 statistics,
    # the probabilities rounded for the GEMM, as FlashAttention does); the body written by numpy's rules
    # (every intermediate in the input type, which the kernel computes in f32) is a row of its own.
    out = [_attention("attention", "flash_attention_f16", *shape, 64, "float16") for shape in attention_shapes]
    out += [_attention("attention", "flash_attention_bf16", *shape, 128, "bfloat16") for shape in attention_shapes]
    # head dimension 256 (Gemma's): the wgmma tiles of a 128-row block take dynamic shared memory on Hopper
    out.append(_attention("attention", "flash_attention_bf16", b, h, n, 256, "bfloat16"))
    out.append(_attention("attention_numpy_rules", "attention", b, h, n, 64, "float16", peers=("sdpa",)))
    out += [_gqa(b_, 4 if tiny else 32, 2 if tiny else 8, n_, 64 if tiny else 128) for b_, _, n_ in attention_shapes]
    out += [_attention("causal", "causal_attention", *shape, 128, "float16", causal=True, skip_masked=True)
            for shape in attention_shapes]
    out += [_attention("decode", "attention", *bh, keys, 128, "float16", nq=1) for bh, keys in decode_shapes]
    out += [_rows(name, name, *shape, "float16") for name in ("softmax", "log_softmax") for shape in row_shapes]
    out += [_rms(*shape) for shape in row_shapes]
    out += [_routing("moe_routing", "moe_routing", t, e, 2) for t, e in routing]
    out += [_routing("moe_routing_top8", "moe_routing_top8", t, e, 8) for t, e in serving]
    out += [_fp8(*shape) for shape in fp8_shapes]
    out += [_gemm(*shape) for shape in gemm_shapes]
    return out


CASES = cases()


# --- inputs, torch programs, references, checks ------------------------------------------------------

def make_inputs(case: Case, torch, device: str, seed: int) -> tuple:
    """Fresh random inputs (never zeros) for `case` on `device`.

    The FP8 GEMM's tokens repeat their absmax every `PERIOD` elements, so that every kernel quantizes each
    element exactly as the numpy body does and its output can be checked against the quantized reference
    (`redfuser.testing.quantization`), not only against the loose worst-case bound."""
    g = torch.Generator(device=device).manual_seed(seed)
    out = []
    for i, (shape, dtype) in enumerate(case.inputs):
        if case.workload == "fp8_quant_gemm" and i == 2:
            x = torch.rand(shape, generator=g, device=device) * 1.5 + 0.5          # per-channel scales
        else:
            x = torch.randn(shape, generator=g, device=device, dtype=torch.float32)
            if case.workload in ("softmax", "log_softmax", "moe_routing", "moe_routing_top8"):
                x = x * 3
            if case.workload == "fp8_quant_gemm" and i == 0:
                a = x.abs().amax(-1, keepdim=True)
                head = x[:, ::PERIOD]
                x[:, ::PERIOD] = torch.where(head < 0, -a, a)
        out.append(x.to(getattr(torch, dtype)))
    return tuple(out)


def host_arrays(tensors: tuple, torch) -> tuple[np.ndarray, ...]:
    """numpy copies of torch tensors (float8 through their bytes: numpy has no torch float8 conversion)."""
    out = []
    for t in tensors:
        if t.dtype == torch.float8_e4m3fn:
            out.append(t.view(torch.uint8).cpu().numpy().view(rf.float8_e4m3fn))
        else:
            out.append(t.cpu().numpy())
    return tuple(out)


def torch_program(workload: str, torch):
    """The workload's body written in torch ops, unfused, as a user would (the "torch" peer)."""
    if workload == GQA:
        flash16 = torch_program("flash_attention_f16", torch)

        def gqa(q, k, v):
            b, hq, n, d = q.shape
            return flash16(q.view(b, k.shape[1], hq // k.shape[1], n, d), k[:, :, None], v[:, :, None])
        return gqa
    if workload in ("flash_attention_f16", "flash_attention_bf16"):
        def flash(q, k, v):
            s = (q.float() @ k.float().transpose(-1, -2)) * (1.0 / q.shape[-1] ** 0.5)
            p = torch.exp(s - s.amax(-1, keepdim=True))
            l = p.sum(-1, keepdim=True)
            if workload == "flash_attention_f16":
                return ((p.half() @ v) / l).half()
            return ((p / l).bfloat16().float() @ v.float()).bfloat16()
        return flash
    if workload in ATTENTION:
        def attention(q, k, v):
            s = (q @ k.transpose(-1, -2)) * (1.0 / q.shape[-1] ** 0.5)
            if workload == "causal_attention":
                n, m_ = k.shape[-2], q.shape[-2]
                keep = torch.arange(n, device=q.device)[None, :] <= torch.arange(m_, device=q.device)[:, None]
                s = s.masked_fill(~keep, float("-inf"))
            p = torch.exp(s - s.amax(-1, keepdim=True))
            return (p / p.sum(-1, keepdim=True)) @ v
        return attention
    if workload in ("softmax", "log_softmax"):
        def rows(x):
            m = x.amax(-1, keepdim=True)
            if workload == "softmax":
                e = torch.exp(x - m)
                return e / e.sum(-1, keepdim=True)
            return x - m - torch.log(torch.exp(x - m).sum(-1, keepdim=True))
        return rows
    if workload == "rms_norm":
        def rms(x, w):
            xf = x.float()
            return (xf * torch.rsqrt((xf * xf).mean(-1, keepdim=True) + 1e-6) * w).to(x.dtype)
        return rms
    if workload in ROUTING:
        def route(logits):
            w, i = torch.topk(torch.softmax(logits, -1), ROUTING[workload])
            return w / w.sum(-1, keepdim=True), i
        return route
    if workload == "gemm":
        return lambda x, w: x @ w
    if workload == "fp8_quant_gemm":
        def fp8(x, w, w_scale):
            xf = x.float()
            a = xf.abs().amax(-1, keepdim=True)
            xq = (xf * (448.0 / a)).to(torch.float8_e4m3fn)
            return (xq.float() @ w.float()) * w_scale * (a / 448.0)
        return fp8
    raise KeyError(workload)


def reference(case: Case, inputs: tuple, torch) -> tuple:
    """float64 reference outputs (attention by batch, to bound the memory of the scores)."""
    if case.workload in ATTENTION:
        q, k, v = (t.double() for t in inputs)
        if case.workload == GQA:   # the query heads grouped by their key head, k and v broadcast over a group
            b, hq, n, d = q.shape
            q, k, v = q.view(b, k.shape[1], hq // k.shape[1], n, d), k[:, :, None], v[:, :, None]
        out = []
        for b in range(q.shape[0]):
            s = q[b] @ k[b].transpose(-1, -2) / math.sqrt(q.shape[-1])
            if case.causal:
                n, m_ = k.shape[-2], q.shape[-2]
                keep = torch.arange(n, device=s.device)[None, :] <= torch.arange(m_, device=s.device)[:, None]
                s = s.masked_fill(~keep, float("-inf"))
            out.append(torch.softmax(s, -1) @ v[b])
        return (torch.stack(out),)
    if case.workload == "softmax":
        return (torch.softmax(inputs[0].double(), -1),)
    if case.workload == "rms_norm":
        x, w = (t.double() for t in inputs)
        return (x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w,)
    if case.workload == "log_softmax":
        return (torch.log_softmax(inputs[0].double(), -1),)
    if case.workload in ROUTING:
        k = ROUTING[case.workload]
        p = torch.softmax(inputs[0].double(), -1)
        w, i = torch.topk(p, k + 1)
        return (w[:, :k] / w[:, :k].sum(-1, keepdim=True), i[:, :k], w)
    if case.workload == "gemm":
        return (inputs[0].double() @ inputs[1].double(),)
    return (QuantizedReference(*host_arrays(inputs, torch)),)


TOLERANCE_DTYPES = {"torch.float32": np.float32, "torch.float16": np.float16, "torch.bfloat16": ml_dtypes.bfloat16}
"""The dtype whose tolerance (`redfuser.testing.tolerance`, the project's rule) judges an output of each torch
dtype, element by element. One relative norm over the whole output (1e-3 f32, 1e-2 f16, 2e-2 bf16, before)
passed an f16 softmax 0.8% too large, f32 MoE weights 0.09% too large and an attention output with one query
row never written (found by a helper)."""


def fp8_check(impl: str, out: np.ndarray, ref: QuantizedReference) -> tuple[bool, str]:
    """(passed, what was measured) for an FP8 GEMM output (numpy, on the host).

    RedFuser (and its variants) must keep every element within the quantization bound and, the inputs
    repeating each token's absmax (`make_inputs`), within f32 accumulation of the quantized reference
    (`redfuser.testing.quantization`). Peers round their output to bf16 and quantize their own way: they
    are held to the relative error of the quantization itself."""
    result = ref.check(out)
    if not impl.startswith("redfuser"):
        return result.relative <= 0.08, f"rel {result.relative:.1e}"
    every_row = result.exact_rows == result.rows
    return result.passed and every_row, f"rel {result.relative:.1e}, {result}"


def _relative(out, ref, torch) -> float:
    diff = out.double() - ref
    if not torch.isfinite(out.double()).all():
        return math.inf
    return float(diff.norm() / ref.norm().clamp_min(1e-300))


RELATIVE = ("softmax", "moe_routing", "moe_routing_top8")
"""Workloads whose every output element is a quotient of positive terms (probabilities, routing weights): no
cancellation, so each element is also held to the rule's relative tolerance alone. The global rule's
absolute part, relative to the largest probability, let every small probability be 0.8% off."""


def _within_tolerance(out, ref, length: int, torch, relative: bool = False) -> tuple[bool, str]:
    """(passed, the relative norm and the verdict) for one output against its float64 reference: the
    project's tolerance rule per element, for the output's dtype and the longest reduction `length`; with
    `relative`, each element within the rule's relative tolerance of itself too (below the dtype's smallest
    normal, its absolute step)."""
    from redfuser.testing.tolerance import assert_close, tolerance

    dtype = TOLERANCE_DTYPES.get(str(out.dtype), np.float32)
    rel = _relative(out, ref, torch)
    a, e = out.double().cpu().numpy(), ref.double().cpu().numpy()
    try:
        assert_close(a, e, dtype, length)
    except AssertionError as err:
        return False, f"rel {rel:.1e}, {str(err).splitlines()[0][:160]}"
    if relative:
        rtol = tolerance(dtype, length, 1.0)[0]
        with np.errstate(invalid="ignore"):
            over = np.abs(a - e) > rtol * np.abs(e) + float(ml_dtypes.finfo(dtype).smallest_normal)
        if over.any():
            return False, f"rel {rel:.1e}, {int(over.sum())} elements beyond {rtol:.2g} of themselves"
    return True, f"rel {rel:.1e}"


def check(case: Case, impl: str, got, ref: tuple, torch) -> tuple[bool, str]:
    """(passed, what was measured) for outputs `got` of `impl` against `reference`'s `ref`: every element under
    the project's tolerance rule (`_within_tolerance`), the reduction length the longest axis of an input's
    last two (keys, a GEMM's K, a row)."""
    length = max(max(shape[-2:], default=1) for shape, _ in case.inputs)
    got = got if isinstance(got, (tuple, list)) else (got,)
    if case.workload == "fp8_quant_gemm":
        return fp8_check(impl, got[0].float().cpu().numpy(), ref[0])
    if case.workload in ROUTING:
        weights, experts, top = ref
        k = ROUTING[case.workload]
        same = got[1].long() == experts
        # (a row whose k-th and (k+1)-th probabilities are too close to order may keep either)
        tie = (top[:, k - 1] - top[:, k]).abs() < 1e-6
        wrong_rows = int((~same.all(-1) & ~tie).sum())
        passed, measured = _within_tolerance(got[0], weights, length, torch, relative=True)
        return passed and wrong_rows == 0, f"{measured}, {wrong_rows} rows' experts differ"
    return _within_tolerance(got[0], ref[0], length, torch, relative=case.workload in RELATIVE)
