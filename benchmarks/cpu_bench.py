"""CPU benchmark: compiled ``cpu`` kernels against the unfused numpy body (and torch on the CPU if installed).

Run ``python benchmarks/cpu_bench.py`` (``--quick`` for small shapes). Prints the
hardware, one table of median times (``ROUNDS`` rounds of ``--repeats`` runs after a warm-up, the contenders
in turns: `median_times`) with
the ratio numpy/compiled (> 1: the compiled kernel is faster), and the compile
time of each kernel cold (LLVM from scratch), warm (the in-memory cache) and from
disk (a fresh cache object reading the on-disk entry).

Rows, each workload at three sizes (``--quick``: small ones; ``--only a,b`` picks rows by name, `ROWS`): attention
(prefill) in f32 and in bf16 (its dots on AMX tiles where the host has them, `codegen/host/amx.py`; numpy's
bf16 ``@`` gives f32, so the result is f32 where torch's bf16 SDPA returns bf16 and rounds ``P`` to bf16
for its second GEMM: it does less exact work), a bf16 GEMM (f32 result; torch's ``matmul`` returns bf16),
causal attention (the default, which skips the key blocks past the diagonal where a scan shows
that exact; ``skip_masked=True``, which always skips; ``skip_masked=False``, which never does), softmax and
log-softmax over large rows, flash decoding (one query) with the automatic split and unsplit (``split=1``),
MoE routing (softmax + top-2 + renormalize over 64 experts), the per-token FP8 quantized GEMM, layer norm
+ GEMM, a linear layer's cross-entropy (the logits never stored), attention with RoPE applied to q and k in
the kernel, group norm (8 groups of an NCHW activation) and cross-entropy over a 32000-word vocabulary (the
label's logit gathered). The peers are the same unfused programs run by numpy, and where torch is installed
``torch``'s own ops doing the same work: SDPA (after the same rotation, for RoPE), ``topk(softmax)``,
``layer_norm`` then ``@``, ``cross_entropy`` (of ``h @ w`` for the linear one), ``group_norm``.

The check column judges every kernel's result by the project's tolerance rule against the body in
float64 (indices exactly; the FP8 GEMM by `redfuser.testing.quantization`'s two bounds, docs/fusion.md,
since quantizing with the running absmax rounds other values than the unfused program: half its input rows
repeat their absmax every 16 elements, where every kernel quantizes as the body does and the sharp bound 2
applies). ``--plant`` perturbs each result by one part in a thousand (indices by one) before its check:
every row must then say WRONG, which shows the checks can fail. The header names the CPU, its vector features as LLVM sees them (the host code
generator's blocks follow them) and the peers' versions.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time

import numpy as np

import redfuser as rf
from redfuser.testing.quantization import check_quantized_gemm, spike_half
from redfuser.testing.tolerance import assert_close, wide_reference
from redfuser.workloads import (attention, causal_attention, cross_entropy, fp8_quant_gemm, gemm, group_norm,
                                layer_norm_gemm, linear_cross_entropy, log_softmax, moe_routing, rms_norm,
                                rope_attention, rope_tables, softmax)
from bench_common import CacheFolder, check_names, positive_int


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


SETTLE_S = 0.5
"""Pause before each contender's block of calls. numpy's OpenBLAS (and torch's OpenMP) keep their worker
threads spinning for a while after a call: on a 2-core machine the next 100-300 ms of anyone's work (the kernel
right after torch) ran 1.5-2.5x slower. After the pause every contender starts with idle pools."""

ROUNDS = 3
"""Blocks of calls each contender gets, in turns (`median_times`)."""

SLOW_S = 2.0
"""A contender whose warm-up call takes longer than this is timed by that call alone: torch's bf16
``matmul`` on a host without bf16 instructions (AVX2) took 3.1 s at 1024^3 and would take minutes a run at
4096^3, an hour for its row's 15 runs. Its time is still measured, and tens of times the kernel's either way."""

WARM_S = 0.1
"""Untimed calls at the start of each block, for at least this long: after the pause, every contender's first
calls ran slower and sped up over 30-60 ms (attention [1,8,1024,64]: 9.0, 8.6, 8.2, 7.9 then 7.0-7.6 ms for
the kernel, 10.4, 9.2, 8.9 then 7.7-7.9 for torch): clocks, caches and thread pools waking up."""


def median_times(fns: list, repeats: int) -> list[float]:
    """The median time of each of `fns` over `ROUNDS` rounds: in each round every contender in turn, after
    `SETTLE_S`, makes untimed calls for `WARM_S` and then `repeats` timed ones back to back. One contender after the
    other, a slow spell of this shared 2-core machine (20-30% for seconds at a time) fell on whichever ran
    then: the same kernel's median moved from 7.8 to 9.9 ms between two runs while torch's did not. In turns,
    every contender sees the same spells."""
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(ROUNDS):
        for fn, out in zip(fns, times):
            if out and out[0] > SLOW_S:
                continue        # (timed once: `SLOW_S`)
            time.sleep(SETTLE_S)
            warm = time.perf_counter()
            fn()
            if time.perf_counter() - warm > SLOW_S:
                out.append(time.perf_counter() - warm)
                continue
            while time.perf_counter() - warm < WARM_S:
                fn()
            for _ in range(repeats):
                start = time.perf_counter()
                fn()
                out.append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]


def torch_version(fn_name: str, args):
    try:
        import torch
    except Exception:
        return None
    tensors = [_to_torch(torch, a) for a in args
               if a.dtype == rf.bfloat16 or (a.dtype.kind == "f" and a.itemsize >= 2)]
    if fn_name in ("attention", "decode", "attention_bf16"):
        return lambda: torch.nn.functional.scaled_dot_product_attention(*tensors)
    if fn_name == "causal":
        return lambda: torch.nn.functional.scaled_dot_product_attention(*tensors, is_causal=True)
    if fn_name == "gemm_bf16":
        return lambda: torch.matmul(*tensors)
    if fn_name == "softmax":
        return lambda: torch.softmax(tensors[0], -1)
    if fn_name == "log_softmax":
        return lambda: torch.log_softmax(tensors[0], -1)
    if fn_name == "rope_attention":
        q, k, v, cos, sin = tensors

        def rope():
            def rotate(x):
                half = x.shape[-1] // 2
                return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
            sdpa = torch.nn.functional.scaled_dot_product_attention
            return sdpa(q * cos + rotate(q) * sin, k * cos + rotate(k) * sin, v)
        return rope
    if fn_name == "rms_norm":
        return lambda: torch.nn.functional.rms_norm(tensors[0], tensors[0].shape[-1:], tensors[1], eps=1e-6)
    if fn_name == "group_norm":
        return lambda: torch.nn.functional.group_norm(tensors[0], 8, tensors[1], tensors[2], eps=1e-5)
    if fn_name == "cross_entropy":
        labels = torch.from_numpy(args[1])
        return lambda: torch.nn.functional.cross_entropy(tensors[0], labels, reduction="none")
    if fn_name == "layer_norm_gemm":
        return lambda: torch.nn.functional.layer_norm(tensors[0], tensors[0].shape[-1:], eps=1e-5) @ tensors[1]
    if fn_name == "linear_cross_entropy":
        labels = torch.from_numpy(args[2])
        return lambda: torch.nn.functional.cross_entropy(tensors[0] @ tensors[1], labels, reduction="none")
    if fn_name == "moe_routing":
        def route():
            w, i = torch.topk(torch.softmax(tensors[0], -1), 2)
            return w / w.sum(-1, keepdim=True), i
        return route
    return None  # fp8: torch has no CPU FP8 GEMM to compare with


def _to_torch(torch, a: np.ndarray):
    """`a` as a torch tensor (a bf16 array through its bits: torch does not read ml_dtypes' bfloat16)."""
    a = np.ascontiguousarray(a)
    if a.dtype == rf.bfloat16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def check(name: str, got, args, fn, length: int, plant: bool = False) -> str:
    """The check column: ``ok`` or ``WRONG`` under the tolerance rule against the body in float64 (the
    project's reference, docs/testing.md), with the worst error; indices must be equal; the FP8 GEMM is
    judged by both quantization bounds (docs/fusion.md), each at most 1. `plant` perturbs the kernel's
    result first (floats by one part in a thousand, indices by one): every row must then say WRONG."""
    got = got if isinstance(got, tuple) else (got,)
    if plant:
        got = tuple(a + 1 if a.dtype.kind in "iu" else a * np.float32(1.001) + np.float32(1e-3) for a in got)
    if name == "fp8_gemm":    # (half its rows repeat their absmax: bound 2 judges those exactly)
        result = check_quantized_gemm(got[0], *args)
        return f"{'ok' if result.passed else 'WRONG'} (err/bound {result.bound_ratio:.2f}, " \
               f"{result.exact_ratio:.2f} of bound 2)"
    ref = wide_reference(fn, *args)
    ref = ref if isinstance(ref, tuple) else (ref,)
    parts, fine = [], True
    for a, b in zip(got, ref):
        if a.dtype.kind in "iu":
            same = np.array_equal(a, b)
            fine &= same
            parts.append("indices " + ("equal" if same else "differ"))
            continue
        try:
            assert_close(a, b, a.dtype, length)
        except AssertionError:
            fine = False
        parts.append(f"max |err| {float(np.nanmax(np.abs(a.astype(np.float64) - b))):.1e}")
    return f"{'ok' if fine else 'WRONG'} ({', '.join(parts)})"


def features() -> str:
    """The vector features of this CPU that LLVM sees (the host code generator's choices depend on them)."""
    from redfuser.codegen.native import host_target

    wanted = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512bf16", "avx512fp16", "amx-tile", "amx-bf16")
    have = set(host_target().features.split(","))
    named = " ".join(f for f in wanted if f"+{f}" in have) or "none of AVX2/AVX-512/AMX"
    return named + (" (512-bit loops)" if "-prefer-256-bit" in have else "")


def compile_times(fn, args, options: dict) -> tuple[float, float, float]:
    """(cold, warm from memory, from disk) seconds to get a callable kernel, in a private cache folder."""
    from redfuser.runtime.cache import reset_default_cache

    with tempfile.TemporaryDirectory() as folder, CacheFolder(folder):
        out = []
        for fresh_cache in (False, False, True):
            if fresh_cache:
                reset_default_cache()
            start = time.perf_counter()
            rf.kernel(fn, backend="cpu", **options).lower(*args)
            k = rf.kernel(fn, backend="cpu", **options)
            k._compiled(tuple(args), {})  # noqa: SLF001 - trace, schedule, codegen and load, without running
            out.append(time.perf_counter() - start)
        return out[0], out[1], out[2]


ROWS = {"attention": attention, "attention_bf16": attention, "causal": causal_attention, "softmax": softmax,
        "log_softmax": log_softmax, "rms_norm": rms_norm, "decode": attention, "moe_routing": moe_routing,
        "fp8_gemm": fp8_quant_gemm, "gemm_bf16": gemm, "layer_norm_gemm": layer_norm_gemm,
        "linear_cross_entropy": linear_cross_entropy, "rope_attention": rope_attention, "group_norm": group_norm,
        "cross_entropy": cross_entropy}
"""Each row name of `cases` and the workload it runs, in the table's order: what ``--only`` accepts, known
without making the rows (their arrays at full size are gigabytes). A test checks that `cases` agrees."""


def workload_hints() -> dict[str, str]:
    """For each workload name (as ``python -m redfuser demo`` lists it) that is not a row name, which rows run
    it: ``causal_attention`` is the rows ``causal``. ``--only`` takes row names alone (one spelling a row, as
    the table and docs/cpu-backend.md print them); a workload name is refused with this hint."""
    rows_of: dict[str, list[str]] = {}
    for row, fn in ROWS.items():
        rows_of.setdefault(fn.__name__, []).append(row)
    return {name: "the workload of row" + ("s " if len(rows) > 1 else " ") + ", ".join(rows)
            for name, rows in rows_of.items() if name not in ROWS}


def only_rows(parser: argparse.ArgumentParser, text: str) -> set[str]:
    """The row names ``--only`` picks; an unknown name is an argparse error listing the valid ones (where it
    used to run no row and exit 0), with the rows a workload's name means."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    check_names(parser, "--only", names, ROWS, hints=workload_hints())
    return set(names)


def cases(quick: bool, rng: np.random.Generator) -> list[tuple]:
    """(name, body, arguments, options, reduction length) for every row: each workload at three sizes."""
    def f32(*shape, scale=1.0, shift=0.0):
        return (rng.standard_normal(shape) * scale + shift).astype(np.float32)

    def qkv(n, d=64):
        return [f32(1, 8, n, d) for _ in range(3)]

    sizes = (lambda small, full: small if quick else full)
    out = []
    for n in sizes((128, 256, 512), (1024, 2048, 4096)):
        out.append(("attention", attention, qkv(n), {}, n))
    for n in sizes((128, 256, 512), (1024, 2048, 4096)):
        out.append(("attention_bf16", attention, [a.astype(rf.bfloat16) for a in qkv(n)], {}, n))
    for n in sizes((128, 256, 512), (1024, 2048, 4096)):
        out.append(("causal", causal_attention, qkv(n), {}, n))
    n = sizes(512, 4096)
    out.append(("causal", causal_attention, qkv(n), {"skip_masked": True}, n))
    out.append(("causal", causal_attention, qkv(n), {"skip_masked": False}, n))
    for rows in sizes(((256, 1024), (512, 2048), (256, 4096)), ((1024, 16384), (4096, 4096), (4096, 16384))):
        out.append(("softmax", softmax, [f32(*rows, scale=3)], {}, rows[1]))
        out.append(("log_softmax", log_softmax, [f32(*rows, scale=3)], {}, rows[1]))
    for rows in sizes(((256, 1024), (512, 2048), (256, 4096)), ((1024, 16384), (4096, 4096), (16384, 1024))):
        out.append(("rms_norm", rms_norm, [f32(*rows, scale=3), f32(rows[1])], {}, rows[1]))
    for keys in sizes((1024, 2048, 4096), (8192, 16384, 32768)):
        decode = [f32(1, 8, 1, 128), f32(1, 8, keys, 128), f32(1, 8, keys, 128)]
        out.append(("decode", attention, decode, {}, keys))
        if keys == sizes(4096, 32768):
            out.append(("decode", attention, decode, {"split": 1}, keys))
    for tokens in sizes((256, 512, 1024), (1024, 4096, 16384)):
        out.append(("moe_routing", moe_routing, [f32(tokens, 64, scale=3)], {}, 64))
    for gm, gk, gn in sizes(((64, 256, 64), (128, 512, 128), (256, 512, 256)),
                            ((256, 4096, 1024), (1024, 4096, 1024), (2048, 4096, 1024))):
        fp8 = [spike_half(rng.standard_normal((gm, gk)).astype(np.float32)).astype(np.float16),
               rng.standard_normal((gk, gn)).astype(rf.float8_e4m3fn), rng.uniform(0.5, 2.0, gn).astype(np.float32)]
        out.append(("fp8_gemm", fp8_quant_gemm, fp8, {}, gk))
    for size in sizes((128, 256, 512), (1024, 2048, 4096)):
        out.append(("gemm_bf16", gemm, [f32(size, size).astype(rf.bfloat16), f32(size, size).astype(rf.bfloat16)], {},
                    size))
    for rows, dim in sizes(((256, 256), (512, 256), (512, 512)), ((1024, 1024), (4096, 1024), (4096, 4096))):
        out.append(("layer_norm_gemm", layer_norm_gemm, [f32(rows, dim, scale=2, shift=3), f32(dim, 1024 if not quick
                                                                                            else 128)], {}, dim))
    for tokens, vocab in sizes(((128, 1000), (256, 2000), (512, 2000)), ((512, 16000), (1024, 16000), (1024, 32000))):
        out.append(("linear_cross_entropy", linear_cross_entropy, [f32(tokens, 512 if not quick else 64),
                                                                   f32(512 if not quick else 64, vocab, scale=0.05),
                                                                   rng.integers(0, vocab, tokens)], {}, vocab))
    for n in sizes((128, 256, 512), (512, 1024, 2048)):
        out.append(("rope_attention", rope_attention, qkv(n) + list(rope_tables(n, 64)), {}, n))
    for batch in sizes((1, 2, 4), (2, 4, 8)):
        shape = (batch, 64, 32, 32) if not quick else (batch, 64, 16, 16)
        out.append(("group_norm", group_norm, [f32(*shape, scale=2, shift=3), f32(64), f32(64)], {},
                    shape[2] * shape[3] * 8))
    for tokens in sizes((256, 512, 1024), (1024, 2048, 4096)):
        vocab = 32000 if not quick else 4000
        out.append(("cross_entropy", cross_entropy, [f32(tokens, vocab, scale=3), rng.integers(0, vocab, tokens)], {},
                    vocab))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=positive_int, default=5,
                        help="timed runs of each contender per round (at least 1; default 5)")
    parser.add_argument("--quick", action="store_true", help="small shapes (a smoke run)")
    parser.add_argument("--only", default="",
                        help="comma-separated row names to run (default: all): " + ", ".join(ROWS) + "; rows, "
                        "not workloads: " + "; ".join(f"{w} is {h}" for w, h in workload_hints().items()))
    parser.add_argument("--plant", action="store_true",
                        help="perturb every kernel's result before its check (each row must say WRONG)")
    parser.add_argument("--no-compile-times", action="store_true", help="skip the compile-time columns")
    opts = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    only = only_rows(parser, opts.only)
    print(f"CPU: {cpu_model()}; {os.cpu_count()} cores; vector features: {features()}; numpy {np.__version__}; "
          f"torch {torch_release()}; median of {ROUNDS} rounds of {opts.repeats} runs, contenders in turns")
    header = (f"{'kernel':<22} {'shape':<20} {'cpu (ms)':>9} {'numpy (ms)':>10} {'numpy/cpu':>9} {'torch (ms)':>10} "
              f"{'torch/cpu':>9} {'cold (s)':>8} {'warm (ms)':>9} {'disk (ms)':>9}  check")
    print(header)
    print("-" * len(header))
    for name, fn, args, options, length in cases(opts.quick, rng):
        if only and name not in only:
            continue
        kernel = rf.kernel(fn, backend="cpu", **options)
        result = check(name, kernel(*args), args, fn, length, plant=opts.plant)
        tv = torch_version(name, args)

        def body():
            with np.errstate(all="ignore"):
                fn(*args)
        t_cpu, t_np, *t_rest = median_times([lambda: kernel(*args), body] + ([tv] if tv is not None else []),
                                            opts.repeats)
        t_torch = t_rest[0] if t_rest else None
        if opts.no_compile_times:   # not measured: "-", as the torch columns where torch has no peer
            compile_cols = f"{'-':>8} {'-':>9} {'-':>9}"
        else:
            cold, warm, disk = compile_times(fn, args, options)
            compile_cols = f"{cold:>8.2f} {warm * 1e3:>9.1f} {disk * 1e3:>9.1f}"
        torch_cols = (f"{t_torch * 1e3:>10.1f} {t_torch / t_cpu:>9.2f}" if t_torch is not None
                      else f"{'-':>10} {'-':>9}")
        shape = "x".join(map(str, args[-1 if name == "decode" else 0].shape))
        if name in ("layer_norm_gemm", "linear_cross_entropy", "fp8_gemm", "gemm_bf16"):   # [m, k] @ [k, n]: n too
            shape += f"@{args[1].shape[1]}"
        label = name + "".join(f" {k}={v}" for k, v in options.items() if k != "split")
        if name == "decode":  # how many slices the split used (1: unsplit), and whether it was chosen or given
            first = kernel.lower(*args).stages["tile"].kernels[0]
            label += (" auto:" if "split" not in options else " given:") + \
                f"{first.grid[-1] if first.name.endswith('_partial') else 1}"
        print(f"{label:<22} {shape:<20} {t_cpu * 1e3:>9.1f} {t_np * 1e3:>10.1f} {t_np / t_cpu:>9.2f} {torch_cols} "
              f"{compile_cols}  {result}", flush=True)


def torch_release() -> str:
    try:
        import torch
    except Exception:
        return "not installed"
    return f"{torch.__version__} ({torch.get_num_threads()} threads)"


if __name__ == "__main__":
    main()
