"""The device check: every RedFuser workload compiled, checked against torch on the device, and timed
against the peers a user would pick instead. One command, one table.

    python3 benchmarks/gpu_check.py              # on a CUDA machine with torch (and Triton)
    python3 benchmarks/gpu_check.py --dry-run    # anywhere: compile every case to PTX, print the skeleton
    python3 benchmarks/gpu_check.py --smoke-cpu  # where torch is installed: the whole script on the CPU,
                                                 # tiny shapes, the cpu backend (a test of the script itself)

Cases (``gpu_cases.cases``), each workload at three shapes (large batch, short sequences in a larger
one, one long sequence or wide rows): attention f16/bf16 ``[B,H,N,D]`` with D=64/128 written as users
write it for those types (``redfuser.workloads.flash_attention_f16``/``_bf16``: f32 scores and statistics,
probabilities rounded for the GEMM), the same attention written by numpy's rules
(``attention_numpy_rules``, against SDPA, one shape), causal, flash decoding (one query), softmax /
log-softmax rows, MoE routing (softmax + top-2 + renormalize, and top-8 of 256 experts at the serving
shape, 4096 tokens), per-token FP8 quantization + GEMM, and a plain f16 GEMM (the tensor-core baseline).
Peers: ``torch.nn.functional.scaled_dot_product_attention``, FlexAttention (``flex_attention`` under
``torch.compile``, the causal block mask built once), the unfused torch program (the workload's body
written in torch ops), ``torch.compile`` of it, a Triton kernel with a hand-written online softmax
(``benchmarks/triton_peers.py``; skipped with a note without Triton), ``torch.softmax``,
``torch.topk(torch.softmax(...))`` and a one-pass Triton routing kernel for routing, ``torch._scaled_mm``
with row-wise scales for the FP8 GEMM (timed with the per-token quantization, the user's pipeline, and
alone on pre-quantized tokens) and ``torch.matmul`` (cuBLAS) for the GEMM.

Method (docs/gpu-backend.md): each implementation is first checked on fresh random inputs against a
float64 torch reference on the device (relative Frobenius error; indices exactly; RedFuser's FP8 GEMM
element by element against its quantization bound and the quantized reference, redfuser.testing.quantization),
then timed with CUDA events per call after a warm-up: the median of many
calls, cycling through input sets that together are several times the L2 (50 MB on an H200). A case
or peer that fails prints FAILED with the error and the script goes on; a global time budget
(``--budget``, default 400 s) skips what is left (``torch.compile``, the slowest peer, runs last).
The table and a JSON of every number go to ``$OUT`` when set (`redfuser.config.results_dir`).
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent))   # triton_peers, gpu_cases beside this file

import redfuser as rf                                         # noqa: E402
from redfuser import config                                   # noqa: E402
from gpu_cases import ATTENTION, GQA, ROUTING, Case, cases, check, make_inputs, reference, torch_program  # noqa: E402
from bench_common import check_names, description, positive_seconds, sm_target      # noqa: E402

# Peaks the "% peak" column divides by, and where each number comes from.
PEAKS = {
    "H200": {"bf16": 790e12, "fp8": 1580e12, "hbm": 4.8e12, "source": (
        "bf16 dense 790 TFLOP/s: an 8192^3 bf16 product through torch measured on an H200 of this workplace "
        "(device README, KINDS.md; datasheet 989); fp8 dense 1580 TFLOP/s: twice that, the datasheet's "
        "fp8:bf16 ratio (1979:989); HBM3e 4.8 TB/s: the vendor datasheet (a device-to-device copy "
        "measured ~4.3 TB/s here)")},
}
UNITS = {"bf16": ("TFLOP/s", 1e12), "fp8": ("TFLOP/s", 1e12), "hbm": ("GB/s", 1e9)}


@dataclass
class Row:
    """One implementation of one case: its check and its time."""

    case: str
    impl: str
    status: str = "ok"               # ok, WRONG, FAILED, skipped, no device
    check: str = ""
    ms: float | None = None
    spread_ms: float | None = None   # p90 - p10 of the timed calls
    wall_ms: float | None = None     # wall time per call back to back: launch overhead included
    rate: float | None = None        # in the case's unit
    unit: str = ""
    fraction_of_peak: float | None = None
    redfuser_speedup: float | None = None   # this implementation's time / RedFuser's (> 1: RedFuser faster)
    first_call_s: float | None = None       # compile (RedFuser: lower; peers: first call, JIT included)
    error: str = ""
    details: dict = field(default_factory=dict)


class Budget:
    """The global time budget: what is left of it, in seconds."""

    def __init__(self, seconds: float) -> None:
        self.start, self.seconds = time.perf_counter(), seconds

    def spent(self) -> float:
        return time.perf_counter() - self.start

    def left(self) -> float:
        return self.seconds - self.spent()


# --- the device -------------------------------------------------------------------------------------

class Device:
    """torch on the GPU (CUDA events) or, for ``--smoke-cpu``, on the CPU (host clock)."""

    def __init__(self, smoke: bool) -> None:
        import torch

        self.torch, self.smoke = torch, smoke
        self.name = "cpu" if smoke else "cuda"
        if not smoke and not torch.cuda.is_available():
            raise SystemExit("gpu_check: torch sees no CUDA device (use --dry-run to compile only)")
        self.backend = "cpu" if smoke else "cuda"
        torch.backends.cuda.matmul.allow_tf32 = False          # references stay float64 anyway

    def sync(self) -> None:
        if not self.smoke:
            self.torch.cuda.synchronize()

    def hardware(self) -> dict:
        torch = self.torch
        info = {"python": platform.python_version(), "torch": torch.__version__, "redfuser": rf.__version__}
        try:
            import triton
            info["triton"] = triton.__version__
        except Exception as exc:  # Triton missing or broken: its peers are skipped with this note
            info["triton"] = f"not available ({type(exc).__name__})"
        if self.smoke:
            info.update(device="cpu (--smoke-cpu)", sm_count=0, l2_bytes=32 << 20)
            return info
        props = torch.cuda.get_device_properties(0)
        info.update(device=props.name, sm_count=props.multi_processor_count, memory_gib=props.total_memory / 2**30,
                    l2_bytes=getattr(props, "L2_cache_size", 50 << 20), cuda=torch.version.cuda,
                    capability=f"{props.major}.{props.minor}")
        try:
            from redfuser.runtime.device import device_info
            driver = device_info(0).driver_version
            info["driver_api"] = f"{driver // 1000}.{driver % 1000 // 10}"
        except Exception as exc:  # the RedFuser driver wrapper itself failing is worth seeing in the header
            info["driver_api"] = f"unknown ({exc})"
        try:
            import subprocess
            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.max.sm,clocks.max.mem",
                                  "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
            info["nvidia_smi"] = out.stdout.strip()
        except Exception:  # no nvidia-smi: the header just lacks the line
            pass
        return info

    def time(self, fn, sets: list, budget_s: float = 0.25, max_calls: int = 200, warmup: int = 3) -> dict:
        """Time `fn(*set)` over the rotating `sets` after `warmup` calls.

        ``ms``: the median device time per call, measured with the queue kept ahead of the device (a
        leading ``torch.cuda._sleep`` while the calls are queued), so it is the kernels' time alone;
        ``spread_ms``: p90 - p10 of those; ``wall_ms``: wall time per call of the same calls run back to
        back, the host's launch overhead included; ``host_bound``: queueing outlasted the sleep.
        """
        for i in range(warmup):
            fn(*sets[i % len(sets)])
        self.sync()
        probe = self._times(fn, sets[:1], 1)[0][0]
        calls = int(max(10, min(max_calls, budget_s * 1e3 / max(probe, 1e-3))))
        times, queued_s, sleep_ms = self._times(fn, sets, calls)
        times.sort()
        self.sync()
        start = time.perf_counter()
        for i in range(calls):
            fn(*sets[i % len(sets)])
        self.sync()
        wall_ms = (time.perf_counter() - start) * 1e3 / calls
        return {"ms": statistics.median(times), "spread_ms": times[int(0.9 * (calls - 1))] - times[int(0.1 * (calls - 1))],
                "wall_ms": wall_ms, "calls": calls, "host_bound": queued_s * 1e3 > sleep_ms}

    def _times(self, fn, sets: list, calls: int) -> tuple[list[float], float, float]:
        """Per-call milliseconds, the seconds spent queueing them and the sleep queued ahead of them."""
        if self.smoke:
            out = []
            for i in range(calls):
                start = time.perf_counter()
                fn(*sets[i % len(sets)])
                out.append((time.perf_counter() - start) * 1e3)
            return out, 0.0, 0.0
        torch = self.torch
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(calls)]
        sleep_ms = min(200.0, max(20.0, 0.5 * calls))
        sleep = getattr(torch.cuda, "_sleep", None)
        if sleep is not None and calls > 1:
            sleep(int(sleep_ms * 2e6))            # ~2 GHz: cycles for sleep_ms; the device waits, the host queues
        else:
            sleep_ms = 0.0
        start = time.perf_counter()
        for i, (begin, end) in enumerate(events):
            begin.record()
            fn(*sets[i % len(sets)])
            end.record()
        queued_s = time.perf_counter() - start
        torch.cuda.synchronize()
        return [begin.elapsed_time(end) for begin, end in events], queued_s, sleep_ms

    def ceilings(self) -> dict:
        """A device-to-device copy's bandwidth and a bf16 8192^3 product's rate, measured now."""
        if self.smoke:
            return {}
        torch = self.torch
        a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda").random_()
        b = torch.empty_like(a)
        copy_ms = self.time(lambda x: b.copy_(x), [(a,)], budget_s=0.1)["ms"]
        x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        mm_ms = self.time(lambda m: m @ m, [(x,)], budget_s=0.2)["ms"]
        return {"copy_bytes_per_s": 2 * a.numel() / (copy_ms * 1e-3), "bf16_flops_per_s": 2 * 8192**3 / (mm_ms * 1e-3)}


# --- peers ------------------------------------------------------------------------------------------

class Skip(Exception):
    """A peer that does not apply here (Triton missing, a CPU smoke run...): a note, not a failure."""


def peer(name: str, case: Case, dev: Device, hardware: dict):
    """The callable for peer `name` of `case` (same arguments as the RedFuser kernel)."""
    torch = dev.torch
    F = torch.nn.functional
    if name == "sdpa" and case.workload == GQA:   # SDPA's own grouping; its [B, Hq, N, D] viewed as ours
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True).view(
            q.shape[0], k.shape[1], q.shape[1] // k.shape[1], *q.shape[2:])
    if name == "sdpa":
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=case.causal)
    if name == "flex_attention":
        if dev.smoke:
            raise Skip("not in a --smoke-cpu run (FlexAttention needs torch.compile)")
        return _flex_attention(case, dev)
    if name == "torch.matmul":
        return lambda x, w: x @ w
    if name == "triton fused routing":
        triton_peers = _triton_peers(dev)
        k = ROUTING[case.workload]
        return lambda logits: triton_peers.moe_routing(logits, k)
    if name == "scaled_mm alone":
        return lambda xq, w_colmajor, scale_a, w_scale: torch._scaled_mm(
            xq, w_colmajor, scale_a=scale_a, scale_b=w_scale.view(1, -1), out_dtype=torch.bfloat16)
    if name in ("torch", "torch topk(softmax)"):
        return torch_program(case.workload, torch)
    if name == "torch.compile":
        if dev.smoke:
            raise Skip("not in a --smoke-cpu run")
        return torch.compile(torch_program(case.workload, torch), dynamic=False)
    if name == "torch.rms_norm":   # torch's own kernel, in the input's dtype (its statistics in f32)
        return lambda x, w: F.rms_norm(x, x.shape[-1:], w.to(x.dtype), eps=1e-6)
    if name == "torch.softmax":
        return lambda x: torch.softmax(x, -1)
    if name == "torch.log_softmax":
        return lambda x: torch.log_softmax(x, -1)
    if name == "triton":
        triton_peers = _triton_peers(dev)
        if case.name == "decode":
            return lambda q, k, v: triton_peers.decode(q, k, v, sm_count=hardware.get("sm_count") or 132)
        if case.workload in ATTENTION:
            return lambda q, k, v: triton_peers.attention(q, k, v, causal=case.causal)
        return getattr(triton_peers, case.workload)
    if name == "scaled_mm":
        def scaled(x, w_colmajor, w_scale):
            a = x.float().abs().amax(-1, keepdim=True)
            xq = (x.float() * (448.0 / a)).to(torch.float8_e4m3fn)
            return torch._scaled_mm(xq, w_colmajor, scale_a=a / 448.0, scale_b=w_scale.view(1, -1),
                                    out_dtype=torch.bfloat16)
        return scaled
    raise KeyError(name)


def _triton_peers(dev: Device):
    """The module of Triton peer kernels, or `Skip` where they cannot run (a CPU smoke run, no Triton)."""
    if dev.smoke:
        raise Skip("not in a --smoke-cpu run")
    try:
        import triton_peers
    except Exception as exc:
        raise Skip(f"Triton is not installed ({type(exc).__name__}: {exc})") from None
    return triton_peers


def _flex_attention(case: Case, dev: Device):
    """``flex_attention`` compiled as its documentation says to use it, the causal block mask built once
    (outside the timed call, as a user builds it once per shape)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    torch = dev.torch
    flex = torch.compile(flex_attention, dynamic=False)
    if case.workload == GQA:
        return lambda q, k, v: flex(q, k, v, enable_gqa=True).view(
            q.shape[0], k.shape[1], q.shape[1] // k.shape[1], *q.shape[2:])
    if not case.causal:
        return lambda q, k, v: flex(q, k, v)
    (_, _, nq, _), (_, _, nk, _) = case.inputs[0][0], case.inputs[1][0]
    mask = create_block_mask(lambda b, h, q_idx, kv_idx: q_idx >= kv_idx, None, None, nq, nk, device=dev.name)
    return lambda q, k, v: flex(q, k, v, block_mask=mask)


def peer_inputs(name: str, sets: list, torch) -> list:
    """The input sets as `name` takes them: ``torch._scaled_mm`` wants the weights column-major, which a
    user prepares once (outside the timed call); ``scaled_mm alone`` also gets the tokens quantized
    per row beforehand, so that only the FP8 GEMM is timed."""
    if name == "scaled_mm":
        return [(x, w.t().contiguous().t(), s) for x, w, s in sets]
    if name == "scaled_mm alone":
        out = []
        for x, w, s in sets:
            a = x.float().abs().amax(-1, keepdim=True)
            xq = (x.float() * (448.0 / a)).to(torch.float8_e4m3fn)
            out.append((xq, w.t().contiguous().t(), a / 448.0, s))
        return out
    return sets


# --- running a case ---------------------------------------------------------------------------------

def _rate(case: Case, ms: float, peaks: dict) -> tuple[float, str, float | None]:
    unit, scale = UNITS[case.peak]
    per_s = case.work / (ms * 1e-3)
    peak = peaks.get(case.peak)
    return per_s / scale, unit, (per_s / peak if peak else None)


def _failed(row: Row, exc: BaseException) -> Row:
    row.status = "FAILED"
    row.error = f"{type(exc).__name__}: {exc}".strip().replace("\n", " ")
    row.details["traceback"] = traceback.format_exc(limit=6)
    return row


def measure(impl: str, fn, case: Case, sets: list, ref: tuple, dev: Device, peaks: dict, budget: Budget) -> Row:
    """Check `fn` on the first input set, then time it over all of them."""
    row = Row(case.label, impl)
    if budget.left() <= 0:
        row.status, row.check = "skipped", "time budget spent"
        return row
    try:
        start = time.perf_counter()
        out = fn(*sets[0])
        dev.sync()
        row.first_call_s = time.perf_counter() - start
        passed, row.check = check(case, impl, out, ref, dev.torch)
        del out
        if not passed:
            row.status = "WRONG"
        timing = dev.time(fn, sets)
        row.ms, row.spread_ms, row.wall_ms = timing["ms"], timing["spread_ms"], timing["wall_ms"]
        row.details.update(calls=timing["calls"], host_bound=timing["host_bound"])
        row.rate, row.unit, row.fraction_of_peak = _rate(case, row.ms, peaks)
    except Skip as note:
        row.status, row.check = "skipped", str(note)
    except Exception as exc:  # a failing implementation is a row, not the end of the check
        _failed(row, exc)
    return row


def input_sets(case: Case, dev: Device, l2_bytes: int) -> list:
    """Enough fresh input sets that cycling through them streams several times the L2 (and at least 2)."""
    count = max(2, min(16, math.ceil(4 * l2_bytes / max(1, case.input_bytes()))))
    return [make_inputs(case, dev.torch, dev.name, seed) for seed in range(count)]


# RedFuser built another way, timed beside the default on the cases named (a key matches the start of a
# case's label), for choices that rest on static counts until a device times them (predictions in
# benchmarks/device_notes.md):
# - rows: a softmax row in chunks of 64 (two reads of the row; the default before whole-row tiles), and
#   8 warps against the 16 a whole-row tile gets;
# - tensor-core kernels: the same kernel on ``mma.sync`` (``sm="sm_90"``), the default on Hopper until
#   run 10 made ``sm_90a``'s wgmma the device's target (runtime/device.py), with the wgmma plan's own
#   defaults (`codegen.simt.plan.WGMMA_TILE_ROWS`, `codegen.simt.kernel.WGMMA_BLOCKS_PER_SM`); and the same
#   kernel with its operand tiles staged by the threads (``tma=False``), the default until run 14 measured
#   the copy engine's (`codegen/simt/tma.py`).
# (Timed on H200s and dropped from this list, all slower or equal. On mma.sync, 2026-11-29: LLVM's O1
# middle end; head dimension chunks of 32; 64-row softmax, log-softmax and MoE tiles; for attention,
# causal attention and the FP8 GEMM `prefetch` alone, 8 warps with and without it, 128 rows with 8 warps;
# for attention 4 blocks an SM, `prefetch` at 3, 64 rows, and 128 rows with key blocks of 32; for causal
# attention 128 rows with key blocks of 32, 3 blocks an SM; for the FP8 GEMM 128 rows, 4 blocks an SM with
# and without `prefetch`. On wgmma, 2026-12-04 (runs 9-10): one warpgroup for 128-row tiles; two
# warpgroups with `prefetch`; two warpgroups of 128-row tiles at head 128; run 12, `prefetch` within 1%;
# run 13, at head 256: the head tiled in 4 grid programs of 64 columns, whole on mma.sync, 128 rows.)
_ROW_VARIANTS = (("redfuser warps=8", {"num_warps": 8}), ("redfuser chunks of 64", {"block_n": 64}))
_MMA_SYNC = ("redfuser mma.sync (sm_90)", {"sm": "sm_90"})
_STAGED = ("redfuser threads' staging", {"tma": False})
_ONE_STAGE = ("redfuser one TMA stage", {"tma_stages": 1})
_FAST_EXP = ("redfuser fast_exp (FlashAttention's exp)", {"fast_exp": True})
_ACCURATE_EXP = ("redfuser accurate exp (shifted_exp=False)", {"shifted_exp": False})
VARIANTS: dict[str, tuple[tuple[str, dict], ...]] = {
    "attention f16": (_MMA_SYNC, _STAGED, _ONE_STAGE, ("redfuser 4 TMA stages", {"tma_stages": 4}), _FAST_EXP,
                      _ACCURATE_EXP),
    "attention bf16": (_MMA_SYNC, _STAGED, _ONE_STAGE, ("redfuser 2 blocks/SM, K and V rings", {"min_blocks_per_sm": 2}),
                       _FAST_EXP, _ACCURATE_EXP),
    "causal": (_MMA_SYNC, _STAGED, _ONE_STAGE),
    "fp8_gemm": (_MMA_SYNC, _STAGED, ("redfuser 64x128 tiles", {"block_n": 128}),
                 ("redfuser 128x128 tiles", {"block_m": 128, "block_n": 128})),
    "gemm": (_MMA_SYNC, _STAGED, _ONE_STAGE),
    "softmax": _ROW_VARIANTS,
    "log_softmax": _ROW_VARIANTS,
}


def variants(case: Case) -> list[tuple[str, dict]]:
    """`VARIANTS` of `case` (the first key its label starts with): (row name, kernel options) pairs."""
    return next((list(v) for key, v in VARIANTS.items() if case.label.startswith(key)), [])


def run_redfuser(case: Case, sets: list, ref: tuple, dev: Device, peaks: dict, budget: Budget,
                 name: str = "redfuser", extra: dict | None = None) -> Row:
    """Compile the workload (timed; `extra` kernel options on top of the case's), then check and time it
    like any peer."""
    try:
        kernel = rf.kernel(case.fn, backend=dev.backend, **{**case.options, **(extra or {})})
        start = time.perf_counter()
        kernel.lower(*sets[0])
        compile_s = time.perf_counter() - start
    except Exception as exc:  # a workload the GPU backend cannot compile yet: FAILED, the peers still run
        return _failed(Row(case.label, name), exc)
    row = measure(name, kernel, case, sets, ref, dev, peaks, budget)
    row.details["compile_s"] = compile_s
    row.first_call_s = None if row.first_call_s is None else row.first_call_s + compile_s
    return row


def run_case(case: Case, dev: Device, peaks: dict, budget: Budget, hardware: dict, later: list) -> list[Row]:
    """RedFuser and every peer but ``torch.compile`` (appended to `later`) for `case`."""
    try:
        check_set = make_inputs(case, dev.torch, dev.name, 1000)
        ref = reference(case, check_set, dev.torch)
        sets = [check_set] + input_sets(case, dev, hardware.get("l2_bytes", 50 << 20))
    except Exception as exc:  # out of memory making inputs, say: the whole case is one FAILED row
        return [_failed(Row(case.label, "redfuser"), exc)]
    rows = [run_redfuser(case, sets, ref, dev, peaks, budget)]
    rows += [run_redfuser(case, sets, ref, dev, peaks, budget, name, extra)
             for name, extra in variants(case)]
    for name in case.peers:
        if name == "torch.compile":
            later.append((case, sets, ref))
            continue
        try:
            fn = peer(name, case, dev, hardware)
        except Skip as note:
            rows.append(Row(case.label, name, status="skipped", check=str(note)))
            continue
        rows.append(measure(name, fn, case, peer_inputs(name, sets, dev.torch), ref, dev, peaks, budget))
    return rows


def run_compiled(case: Case, sets: list, ref: tuple, dev: Device, peaks: dict, budget: Budget,
                 hardware: dict) -> Row:
    """The ``torch.compile`` peer (compiling takes seconds to a minute: run last, only with budget left)."""
    if budget.left() < 60:
        return Row(case.label, "torch.compile", status="skipped", check="time budget spent")
    try:
        fn = peer("torch.compile", case, dev, hardware)
    except Skip as note:
        return Row(case.label, "torch.compile", status="skipped", check=str(note))
    return measure("torch.compile", fn, case, sets, ref, dev, peaks, budget)


# --- the table --------------------------------------------------------------------------------------

def speedups(rows: list[Row]) -> None:
    """Fill each peer's ``redfuser_speedup``: its time over RedFuser's in the same case."""
    ours = {r.case: r.ms for r in rows if r.impl == "redfuser" and r.status in ("ok", "WRONG") and r.ms}
    for r in rows:
        if r.impl != "redfuser" and r.ms and r.case in ours:
            r.redfuser_speedup = r.ms / ours[r.case]


def _cell(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def table(rows: list[Row], header: list[str]) -> str:
    """The one table: a line per implementation of each case."""
    head = ["case", "impl", "status", "check", "ms", "wall ms", "rate", "% peak", "x RF", "first call s"]
    lines = []
    for r in rows:
        rate = "-" if r.rate is None else f"{r.rate:,.1f} {r.unit}"
        note = r.check if r.status != "FAILED" else r.error[:110]
        wall = _cell(r.wall_ms, ".3f") + ("*" if r.details.get("host_bound") else "")
        lines.append([r.case, r.impl, r.status, note, _cell(r.ms, ".3f"), wall, rate,
                      _cell(None if r.fraction_of_peak is None else 100 * r.fraction_of_peak, ".1f"),
                      _cell(r.redfuser_speedup, ".2f"), _cell(r.first_call_s, ".2f")])
    widths = [max(len(str(x)) for x in col) for col in zip(head, *lines)]
    fmt = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()   # noqa: E731
    out = header + ["", fmt(head), fmt(["-" * w for w in widths])]
    previous = None
    for cells in lines:
        out.append(fmt([cells[0] if cells[0] != previous else ""] + cells[1:]))
        previous = cells[0]
    out += ["", "ms: median device time per call (CUDA events, calls queued ahead of the device: the kernels "
            "alone); wall ms: wall time per call back to back, launch overhead included (* the host could not "
            "keep ahead of the device: ms includes host gaps); rate: FLOP/s (attention, FP8 GEMM) or bytes read "
            "once + written once per second, from ms; x RF: the implementation's ms / RedFuser's (above 1: "
            "RedFuser is faster); first call s: RedFuser's compile + first call, a peer's first call (JIT "
            "included)."]
    return "\n".join(out)


def write_results(text: str, payload: dict) -> None:
    folder = config.results_dir()
    if folder is None:
        return
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "gpu_check.txt").write_text(text + "\n")
    (folder / "gpu_check.json").write_text(json.dumps(payload, indent=1, default=str) + "\n")


# --- dry run: compile everything, no device ----------------------------------------------------------

def dry_run(all_cases: list[Case], sm: str) -> tuple[list[Row], list[str]]:
    """Compile every case to PTX for `sm` (no GPU needed) and give the table's rows with "no device"."""
    rows = []
    for case in all_cases:
        row = Row(case.label, "redfuser", status="no device")
        try:
            start = time.perf_counter()
            lowered = rf.kernel(case.fn, backend="cuda", sm=sm, **case.options).lower(*case.compile_args())
            row.first_call_s = time.perf_counter() - start
            ptx = lowered.stages["ptx"]
            mma = sum(k.ptx.count("mma.sync") for k in ptx.kernels)
            wgmma = sum(k.ptx.count("wgmma.mma_async") for k in ptx.kernels)
            row.check = f"PTX for {ptx.sm}: {len(ptx.kernels)} kernel(s), {mma} mma.sync, {wgmma} wgmma"
        except Exception as exc:  # the table shows what does not compile yet
            _failed(row, exc)
        rows.append(row)
        rows.extend(Row(case.label, name, status="no device") for name, _ in variants(case))
        rows.extend(Row(case.label, name, status="no device") for name in case.peers)
    return rows, [f"gpu_check --dry-run: compiled for {sm}; no device, so nothing ran or was timed"]


# --- main -------------------------------------------------------------------------------------------

def selected_cases(parser: argparse.ArgumentParser, only: list[str] | None, size: str) -> list[Case]:
    """The cases of `size` that ``--only`` names (by name or label; all without it). An unknown name is an
    argparse error listing the valid ones, checked before any device is touched: device_check.sh passes
    ``--only`` through, and a typo used to run an empty table on a lent GPU and exit 0."""
    chosen = cases(size)
    if not only:
        return chosen
    names = [c.name for c in chosen]
    labels = [c.label for c in chosen]
    hints: dict[str, str] = {}
    other = "tiny" if size == "full" else "full"
    for c in cases(other):   # a case of the other shapes: say which flag gives those
        for key in (c.name, c.label):
            hints[key] = f"a case of the {other} shapes only: " + ("--tiny or --smoke-cpu" if other == "tiny" else
                                                                    "without --tiny and --smoke-cpu")
    for workload in dict.fromkeys(c.workload for c in chosen):   # a workload's name: the cases running it
        if workload not in names:
            cases_of = list(dict.fromkeys(c.name for c in chosen if c.workload == workload))
            hints[workload] = f"the workload of {', '.join(cases_of)}"
    unknown = [name for name in only if name not in names + labels]
    if unknown:   # the labels listed in full where one was meant (it has a shape), else one as an example
        if any("[" in name for name in unknown):
            more = "; or a label, quoted as one argument: " + ", ".join(repr(label) for label in labels)
        else:
            more = "; or a case's label as the table prints it (--dry-run lists them), e.g. " + repr(labels[0])
        check_names(parser, "--only", unknown, names, hints=hints, more=more)
    return [c for c in chosen if c.name in only or c.label in only]


def main(argv: list[str] | None = None) -> int:
    full_names, tiny_names = (list(dict.fromkeys(c.name for c in cases(size))) for size in ("full", "tiny"))
    parser = argparse.ArgumentParser(description=description(__doc__))
    parser.add_argument("--dry-run", action="store_true", help="compile every case to PTX; no device needed")
    parser.add_argument("--smoke-cpu", action="store_true", help="run the script on the CPU, tiny shapes")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (implied by --smoke-cpu)")
    parser.add_argument("--sm", type=sm_target, default="sm_90",
                        help="the target of --dry-run (default sm_90, an H100/H200)")
    parser.add_argument("--budget", type=positive_seconds, default=400.0,
                        help="seconds (above 0; default 400); past it the rest is skipped")
    parser.add_argument("--only", nargs="*", default=None,
                        help=f"case names or labels to run (default all): {', '.join(full_names)} "
                             f"({', '.join(n for n in tiny_names if n not in full_names)} at the tiny shapes)")
    parser.add_argument("--check-args", action="store_true",
                        help="check the arguments and exit (device_check.sh does so before the device's gate and "
                             "tests, so that a typo costs no device time)")
    args = parser.parse_args(argv)
    all_cases = selected_cases(parser, args.only, "tiny" if args.smoke_cpu or args.tiny else "full")
    if args.check_args:
        print(f"gpu_check: arguments ok, {len(all_cases)} case(s) selected")
        return 0
    budget = Budget(args.budget)
    if args.dry_run:
        rows, header = dry_run(all_cases, args.sm)
        payload = {"mode": "dry-run", "rows": [asdict(r) for r in rows]}
    else:
        dev = Device(args.smoke_cpu)
        hardware = dev.hardware()
        name = hardware["device"]
        peaks = next((dict(p) for key, p in PEAKS.items() if key in name), {})
        print(f"gpu_check on {name}: {hardware}", flush=True)
        measured = dev.ceilings()
        if not peaks and measured:     # an unknown device: its measured ceilings are the peaks
            peaks = {"bf16": measured["bf16_flops_per_s"], "fp8": 2 * measured["bf16_flops_per_s"],
                     "hbm": measured["copy_bytes_per_s"], "source": "measured in this run (unknown device)"}
        rows, later = [], []
        for case in all_cases:
            rows += run_case(case, dev, peaks, budget, hardware, later)
            print(f"  {case.label}: done at {budget.spent():.0f} s", flush=True)
        # The table so far goes to $OUT before the torch.compile peers, whose compiles can outrun a lease:
        # a run killed among them still leaves every other row behind.
        write_results(table(rows, [f"{name}: torch.compile peers still to run"]),
                      {"mode": "device, before torch.compile", "hardware": hardware, "rows": [asdict(r) for r in rows]})
        for case, sets, ref in later:
            compiled = run_compiled(case, sets, ref, dev, peaks, budget, hardware)
            at = max(i for i, r in enumerate(rows) if r.case == case.label)
            rows.insert(at + 1, compiled)
            print(f"  {case.label} torch.compile: done at {budget.spent():.0f} s", flush=True)
        speedups(rows)
        header = [f"hardware: {name}, {hardware.get('sm_count')} SMs, capability {hardware.get('capability')}, "
                  f"CUDA driver API {hardware.get('driver_api')}, nvidia-smi [{hardware.get('nvidia_smi', '')}], "
                  f"torch {hardware['torch']}, triton {hardware['triton']}",
                  f"peaks for % peak: {peaks.get('source', 'none known')}"]
        if measured:
            header.append(f"measured now: device-to-device copy {measured['copy_bytes_per_s'] / 1e12:.2f} TB/s, "
                          f"bf16 8192^3 product {measured['bf16_flops_per_s'] / 1e12:.0f} TFLOP/s")
        header.append(f"total time {budget.spent():.0f} s (budget {args.budget:.0f} s)")
        payload = {"mode": "smoke-cpu" if args.smoke_cpu else "device", "hardware": hardware,
                   "peaks": peaks, "measured": measured, "rows": [asdict(r) for r in rows]}
    text = table(rows, header)
    print(text, flush=True)
    payload["elapsed_s"] = budget.spent()
    write_results(text, payload)
    return 0


if __name__ == "__main__":
    sys.exit(main())
