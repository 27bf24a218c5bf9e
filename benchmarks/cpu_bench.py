"""CPU benchmark: compiled ``cpu`` kernels against the unfused numpy body (and torch on the CPU if installed).

Run ``python benchmarks/cpu_bench.py`` (``--quick`` for small shapes). Prints the
hardware, one table of median times (of ``--repeats`` runs after a warm-up) with
the ratio numpy/compiled (> 1: the compiled kernel is faster), and the compile
time of each kernel cold (LLVM from scratch), warm (the in-memory cache) and from
disk (a fresh cache object reading the on-disk entry).

Rows: attention (prefill), causal attention (every key block, and with ``skip_masked=True``: only blocks on
or before the diagonal), softmax and log-softmax over large rows, flash decoding (one query, 32768 keys) with
the automatic split and unsplit (``split=1``), MoE routing (softmax + top-2 + renormalize, 4096 tokens x 64
experts), the per-token FP8 quantized GEMM (1024 x 4096 x 1024), attention with RoPE applied to q and k in
the kernel, group norm (8 groups of an NCHW activation) and cross-entropy over a 32000-word vocabulary (the
label's logit gathered). The peers are the same unfused programs run by numpy, and where torch is installed
``torch``'s own ops doing the same work: SDPA (after the same rotation, for RoPE), ``topk(softmax)``,
``group_norm``, ``cross_entropy``. The FP8 row's error column is in units of the quantization bound
(docs/fusion.md), since quantizing with the running absmax rounds other values than the unfused program.
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
from redfuser.workloads import (attention, causal_attention, cross_entropy, fp8_quant_gemm, group_norm, log_softmax,
                                moe_routing, rope_attention, rope_tables, softmax)
from bench_common import CacheFolder


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def median_time(fn, repeats: int) -> float:
    fn()  # warm-up (first-touch of outputs, thread start)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def torch_version(fn_name: str, args):
    try:
        import torch
    except Exception:
        return None
    tensors = [torch.from_numpy(np.ascontiguousarray(a)) for a in args if a.dtype.kind == "f" and a.itemsize >= 2]
    if fn_name in ("attention", "decode"):
        return lambda: torch.nn.functional.scaled_dot_product_attention(*tensors)
    if fn_name == "causal":
        return lambda: torch.nn.functional.scaled_dot_product_attention(*tensors, is_causal=True)
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
    if fn_name == "group_norm":
        return lambda: torch.nn.functional.group_norm(tensors[0], 8, tensors[1], tensors[2], eps=1e-5)
    if fn_name == "cross_entropy":
        labels = torch.from_numpy(args[1])
        return lambda: torch.nn.functional.cross_entropy(tensors[0], labels, reduction="none")
    if fn_name == "moe_routing":
        def route():
            w, i = torch.topk(torch.softmax(tensors[0], -1), 2)
            return w / w.sum(-1, keepdim=True), i
        return route
    return None  # fp8: torch has no CPU FP8 GEMM to compare with


def check(name: str, got, ref, args) -> str:
    """The error column: max |difference| from the reference (indices: exact match), or for FP8 the worst
    error in units of the quantization bound."""
    got = got if isinstance(got, tuple) else (got,)
    ref = ref if isinstance(ref, tuple) else (ref,)
    if name == "fp8_gemm":
        x, w, ws = (a.astype(np.float64) for a in args)
        bound = ((2.0**-4 * np.abs(x) + 2.0**-10 * np.abs(x).max(-1, keepdims=True) / 448) @ np.abs(w)) * ws
        return f"err/bound {float(np.max(np.abs(got[0] - (x @ w) * ws) / (bound + 1e-6))):.2f}"
    parts = []
    for a, b in zip(got, ref):
        if a.dtype.kind in "iu":
            parts.append("indices " + ("equal" if np.array_equal(a, b) else "DIFFER"))
        else:
            parts.append(f"max |err| {float(np.nanmax(np.abs(a - b))):.1e}")
    return ", ".join(parts)


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="small shapes (a smoke run)")
    opts = parser.parse_args()
    rng = np.random.default_rng(0)
    n1, n2, rows = (256, 512, (256, 4096)) if opts.quick else (1024, 4096, (4096, 16384))
    keys, tokens, (gm, gk, gn) = (4096, 512, (128, 512, 128)) if opts.quick else (32768, 4096, (1024, 4096, 1024))
    decode = ([rng.standard_normal((1, 8, 1, 128)).astype(np.float32)]
              + [rng.standard_normal((1, 8, keys, 128)).astype(np.float32) for _ in range(2)])
    gemm = [rng.standard_normal((gm, gk)).astype(np.float16), rng.standard_normal((gk, gn)).astype(rf.float8_e4m3fn),
            rng.uniform(0.5, 2.0, gn).astype(np.float32)]
    cases = [
        ("attention", attention, [rng.standard_normal((1, 8, n1, 64)).astype(np.float32) for _ in range(3)], {}),
        ("attention", attention, [rng.standard_normal((1, 8, n2, 64)).astype(np.float32) for _ in range(3)], {}),
        ("causal", causal_attention, [rng.standard_normal((1, 8, n2, 64)).astype(np.float32) for _ in range(3)], {}),
        ("causal", causal_attention, [rng.standard_normal((1, 8, n2, 64)).astype(np.float32) for _ in range(3)],
         {"skip_masked": True}),
        ("softmax", softmax, [rng.standard_normal(rows).astype(np.float32) * 3], {}),
        ("log_softmax", log_softmax, [rng.standard_normal(rows).astype(np.float32) * 3], {}),
        ("decode", attention, decode, {}),
        ("decode", attention, decode, {"split": 1}),
        ("moe_routing", moe_routing, [rng.standard_normal((tokens, 64)).astype(np.float32) * 3], {}),
        ("fp8_gemm", fp8_quant_gemm, gemm, {}),
        ("rope_attention", rope_attention, [rng.standard_normal((1, 8, n1, 64)).astype(np.float32) for _ in range(3)]
         + list(rope_tables(n1, 64)), {}),
        ("group_norm", group_norm, [(rng.standard_normal((8, 64, 32, 32) if not opts.quick else (2, 64, 16, 16)) * 2
                                     + 3).astype(np.float32), rng.standard_normal(64).astype(np.float32),
                                    rng.standard_normal(64).astype(np.float32)], {}),
        ("cross_entropy", cross_entropy, [(rng.standard_normal((tokens, 32000 if not opts.quick else 4000)) * 3)
                                          .astype(np.float32), rng.integers(0, 4000, tokens)], {}),
    ]
    print(f"CPU: {cpu_model()}; {os.cpu_count()} cores; numpy {np.__version__}; "
          f"median of {opts.repeats} runs after a warm-up")
    header = (f"{'kernel':<16} {'shape':<20} {'cpu (ms)':>9} {'numpy (ms)':>10} {'numpy/cpu':>9} {'torch (ms)':>10} "
              f"{'torch/cpu':>9} {'cold (s)':>8} {'warm (ms)':>9} {'disk (ms)':>9}")
    print(header)
    print("-" * len(header))
    for name, fn, args, options in cases:
        kernel = rf.kernel(fn, backend="cpu", **options)
        got = kernel(*args)
        with np.errstate(all="ignore"):
            ref = fn(*args)
        err = check(name, got, ref, args)
        t_cpu = median_time(lambda: kernel(*args), opts.repeats)
        t_np = median_time(lambda: fn(*args), opts.repeats)
        tv = torch_version(name, args)
        t_torch = median_time(tv, opts.repeats) if tv is not None else None
        cold, warm, disk = compile_times(fn, args, options)
        torch_cols = (f"{t_torch * 1e3:>10.1f} {t_torch / t_cpu:>9.2f}" if t_torch is not None
                      else f"{'-':>10} {'-':>9}")
        shape = "x".join(map(str, args[-1 if name == "decode" else 0].shape))
        label = name + (" skip" if options.get("skip_masked") else "")
        if name == "decode":  # how many slices the split used (1: unsplit), and whether it was chosen or given
            first = kernel.lower(*args).stages["tile"].kernels[0]
            label += (" auto:" if "split" not in options else " given:") + \
                f"{first.grid[-1] if first.name.endswith('_partial') else 1}"
        print(f"{label:<16} {shape:<20} {t_cpu * 1e3:>9.1f} {t_np * 1e3:>10.1f} {t_np / t_cpu:>9.2f} {torch_cols} "
              f"{cold:>8.2f} {warm * 1e3:>9.1f} {disk * 1e3:>9.1f}   ({err})")


if __name__ == "__main__":
    main()
