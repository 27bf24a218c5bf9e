"""Triton peers of the RedFuser workloads, written for this project (benchmarks only; never imported by RedFuser).

- `attention(q, k, v, causal)`: FlashAttention-2 style forward over ``[B, H, N, D]``: one program per
  ``BLOCK_M`` query rows of one head; the keys in ``BLOCK_N`` chunks with a hand-written online softmax
  (running max ``m``, running sum ``l``, the accumulator rescaled by ``exp2(m_old - m_new)``, divided by
  ``l`` once at the end). Causal masks keys after the query (top-left aligned, like the workload).
- `decode(q, k, v)`: one query per head against a long key axis, split across programs (each writes its
  partial ``m, l, acc``), then a combine kernel merges the partials.
- `softmax(x)`, `log_softmax(x)`: one program per row; an online pass keeps a running max and sum per
  lane, a second pass writes the result.

`kernel_specs` gives each peer's kernels with a signature and constants for `compile_to_ptx`, which
compiles them for a GPU target without a GPU (used by ``benchmarks/compile_time.py``). The wrappers take torch tensors;
set ``triton.knobs.runtime.interpret = True`` before importing this module to run them on the CPU.
"""
from __future__ import annotations

import math

import triton
import triton.language as tl

LOG2E = 1.4426950408889634


@triton.jit
def attention_kernel(Q, K, V, O, scale_log2, n_q, n_k, heads,
                     s_qb, s_qh, s_qm, s_kb, s_kh, s_kn, s_vb, s_vh, s_vn, s_ob, s_oh, s_om,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_D: tl.constexpr, CAUSAL: tl.constexpr):
    start_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // heads).to(tl.int64)
    h = (bh % heads).to(tl.int64)
    rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    d = tl.arange(0, HEAD_D)
    q = tl.load(Q + b * s_qb + h * s_qh + rows[:, None] * s_qm + d[None, :], mask=rows[:, None] < n_q, other=0.0)
    k_base = K + b * s_kb + h * s_kh
    v_base = V + b * s_vb + h * s_vh
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_D], tl.float32)
    end = n_k
    if CAUSAL:
        end = (start_m + 1) * BLOCK_M                       # later keys are masked for every row here
    for start_n in range(0, end, BLOCK_N):
        keys = start_n + tl.arange(0, BLOCK_N)
        kt = tl.load(k_base + keys[None, :] * s_kn + d[:, None], mask=keys[None, :] < n_k, other=0.0)
        s = tl.dot(q, kt) * scale_log2                     # scores in log2 units: exp2 below
        valid = keys[None, :] < n_k
        if CAUSAL:
            valid = valid & (keys[None, :] <= rows[:, None])
        s = tl.where(valid, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)   # rows with no key yet: no NaN from -inf - -inf
        alpha = tl.exp2(m_i - m_ref)
        p = tl.exp2(s - m_ref[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + keys[:, None] * s_vn + d[None, :], mask=keys[:, None] < n_k, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(O + b * s_ob + h * s_oh + rows[:, None] * s_om + d[None, :], out.to(O.dtype.element_ty),
             mask=rows[:, None] < n_q)


@triton.jit
def decode_partial_kernel(Q, K, V, M_part, L_part, ACC_part, scale_log2, n_k, heads, chunk,
                          s_qb, s_qh, s_kb, s_kh, s_kn, s_vb, s_vh, s_vn,
                          BLOCK_N: tl.constexpr, HEAD_D: tl.constexpr):
    bh = tl.program_id(0)
    split = tl.program_id(1)
    b = (bh // heads).to(tl.int64)
    h = (bh % heads).to(tl.int64)
    d = tl.arange(0, HEAD_D)
    q = tl.load(Q + b * s_qb + h * s_qh + d).to(tl.float32) * scale_log2
    k_base = K + b * s_kb + h * s_kh
    v_base = V + b * s_vb + h * s_vh
    lo = split * chunk
    m_i = tl.max(tl.full([BLOCK_N], float("-inf"), tl.float32), 0)
    l_i = tl.sum(tl.zeros([BLOCK_N], tl.float32), 0)
    acc = tl.zeros([HEAD_D], tl.float32)
    for start in range(lo, lo + chunk, BLOCK_N):           # chunk: a multiple of BLOCK_N
        keys = start + tl.arange(0, BLOCK_N)
        inside = keys < n_k
        kk = tl.load(k_base + keys[:, None].to(tl.int64) * s_kn + d[None, :], mask=inside[:, None], other=0.0)
        s = tl.where(inside, tl.sum(kk.to(tl.float32) * q[None, :], 1), float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 0))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_ref)
        p = tl.exp2(s - m_ref)
        vv = tl.load(v_base + keys[:, None].to(tl.int64) * s_vn + d[None, :], mask=inside[:, None], other=0.0)
        l_i = l_i * alpha + tl.sum(p, 0)
        acc = acc * alpha + tl.sum(p[:, None] * vv.to(tl.float32), 0)
        m_i = m_new
    slot = bh * tl.num_programs(1) + split
    tl.store(M_part + slot, m_i)
    tl.store(L_part + slot, l_i)
    tl.store(ACC_part + slot * HEAD_D + d, acc)


@triton.jit
def decode_combine_kernel(M_part, L_part, ACC_part, O, splits, heads, s_ob, s_oh,
                          SPLITS: tl.constexpr, HEAD_D: tl.constexpr):
    bh = tl.program_id(0)
    b = (bh // heads).to(tl.int64)
    h = (bh % heads).to(tl.int64)
    part = tl.arange(0, SPLITS)
    used = part < splits
    d = tl.arange(0, HEAD_D)
    m = tl.load(M_part + bh * splits + part, mask=used, other=float("-inf"))
    l = tl.load(L_part + bh * splits + part, mask=used, other=0.0)
    top = tl.max(m, 0)
    w = tl.where(m == float("-inf"), 0.0, tl.exp2(m - top))   # the merge: rescale each partial to the max
    acc = tl.load(ACC_part + (bh * splits + part)[:, None] * HEAD_D + d[None, :], mask=used[:, None], other=0.0)
    out = tl.sum(w[:, None] * acc, 0) / tl.sum(w * l, 0)
    tl.store(O + b * s_ob + h * s_oh + d, out.to(O.dtype.element_ty))


@triton.jit
def softmax_kernel(X, Y, n_cols, s_x, s_y, BLOCK: tl.constexpr, LOG: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m_vec = tl.full([BLOCK], float("-inf"), tl.float32)
    l_vec = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_cols, BLOCK):                   # online: running max and sum per lane
        x = tl.load(X + row * s_x + start + cols, mask=start + cols < n_cols, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m_vec, x)
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        l_vec = l_vec * tl.exp(m_vec - m_ref) + tl.exp(x - m_ref)
        m_vec = m_new
    m = tl.max(m_vec, 0)
    l = tl.sum(tl.where(m_vec == float("-inf"), 0.0, l_vec * tl.exp(m_vec - m)), 0)
    for start in range(0, n_cols, BLOCK):
        mask = start + cols < n_cols
        x = tl.load(X + row * s_x + start + cols, mask=mask, other=0.0).to(tl.float32)
        if LOG:
            y = x - m - tl.log(l)
        else:
            y = tl.exp(x - m) / l
        tl.store(Y + row * s_y + start + cols, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def routing_kernel(X, W, I, n_rows, n_experts, s_x, s_w, s_i, ROWS: tl.constexpr, BLOCK: tl.constexpr,
                   K: tl.constexpr):
    """MoE routing in one pass over the logits: ROWS tokens a program, each token's experts in registers;
    softmax, then K rounds of (largest probability, lowest expert index among equals) with the winner
    masked out, then the K weights renormalized by their sum. Ties order by index, as torch.topk's
    stable selection does on distinct values."""
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)[:, None]
    cols = tl.arange(0, BLOCK)[None, :]
    inside = (rows < n_rows) & (cols < n_experts)
    x = tl.load(X + rows * s_x + cols, mask=inside, other=float("-inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, 1)[:, None])
    p = e / tl.sum(e, 1)[:, None]
    p = tl.where(cols < n_experts, p, -1.0)
    kpos = tl.arange(0, K)[None, :]
    weights = tl.zeros([ROWS, K], tl.float32)
    experts = tl.zeros([ROWS, K], tl.int64)
    for j in tl.static_range(K):
        best = tl.max(p, 1)[:, None]
        index = tl.min(tl.where(p == best, cols, BLOCK), 1)[:, None]
        weights = tl.where(kpos == j, best, weights)
        experts = tl.where(kpos == j, index.to(tl.int64), experts)
        p = tl.where(cols == index, -1.0, p)
    weights = weights / tl.sum(weights, 1)[:, None]
    keep = rows < n_rows
    tl.store(W + rows * s_w + kpos, weights, mask=keep)
    tl.store(I + rows * s_i + kpos, experts, mask=keep)


# --- launchers (torch tensors) ------------------------------------------------------------------------

def attention(q, k, v, causal: bool = False, block_m: int = 128, block_n: int = 64, num_stages: int = 3):
    """Attention forward over contiguous ``[B, H, N, D]`` tensors (see the module docstring)."""
    import torch

    batch, heads, n_q, dim = q.shape
    n_k = k.shape[2]
    o = torch.empty_like(q)
    grid = (triton.cdiv(n_q, block_m), batch * heads)
    attention_kernel[grid](q, k, v, o, LOG2E / math.sqrt(dim), n_q, n_k, heads,
                           *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3],
                           BLOCK_M=block_m, BLOCK_N=block_n, HEAD_D=dim, CAUSAL=causal,
                           num_warps=8 if dim >= 128 else 4, num_stages=num_stages)
    return o


def decode(q, k, v, splits: int | None = None, sm_count: int = 132, block_n: int = 64):
    """One query per head (``q [B, H, 1, D]``) against ``k, v [B, H, N, D]``: split keys, then combine."""
    import torch

    batch, heads, n_q, dim = q.shape
    assert n_q == 1, "decode takes one query per head"
    n_k = k.shape[2]
    if splits is None:
        splits = max(1, min(128, (4 * sm_count) // (batch * heads)))
    chunk = triton.cdiv(triton.cdiv(n_k, splits), block_n) * block_n
    splits = triton.cdiv(n_k, chunk)
    m_part = torch.empty(batch * heads * splits, device=q.device, dtype=torch.float32)
    l_part = torch.empty_like(m_part)
    acc_part = torch.empty(batch * heads * splits * dim, device=q.device, dtype=torch.float32)
    decode_partial_kernel[(batch * heads, splits)](q, k, v, m_part, l_part, acc_part, LOG2E / math.sqrt(dim),
                                                  n_k, heads, chunk, q.stride(0), q.stride(1),
                                                  *k.stride()[:3], *v.stride()[:3],
                                                  BLOCK_N=block_n, HEAD_D=dim, num_warps=4)
    o = torch.empty_like(q)
    decode_combine_kernel[(batch * heads,)](m_part, l_part, acc_part, o, splits, heads, o.stride(0), o.stride(1),
                                           SPLITS=triton.next_power_of_2(splits), HEAD_D=dim, num_warps=4)
    return o


def _rows(x, log: bool):
    import torch

    y = torch.empty_like(x)
    n_cols = x.shape[-1]
    block = min(triton.next_power_of_2(n_cols), 8192)
    softmax_kernel[(x.numel() // n_cols,)](x, y, n_cols, x.stride(-2), y.stride(-2), BLOCK=block, LOG=log,
                                           num_warps=16 if block >= 4096 else 4)
    return y


def softmax(x):
    """Softmax over the last axis of a contiguous 2-d tensor."""
    return _rows(x, False)


def log_softmax(x):
    """Log-softmax over the last axis of a contiguous 2-d tensor."""
    return _rows(x, True)


def moe_routing(logits, k: int):
    """(renormalized top-`k` softmax weights, their expert indices) of each row of a contiguous 2-d f32
    tensor, in one kernel."""
    import torch

    n_rows, n_experts = logits.shape
    weights = torch.empty((n_rows, k), dtype=torch.float32, device=logits.device)
    experts = torch.empty((n_rows, k), dtype=torch.int64, device=logits.device)
    block = triton.next_power_of_2(n_experts)
    rows = max(1, min(16, 4096 // block))
    routing_kernel[(triton.cdiv(n_rows, rows),)](logits, weights, experts, n_rows, n_experts, logits.stride(0),
                                                  weights.stride(0), experts.stride(0), ROWS=rows, BLOCK=block,
                                                  K=k, num_warps=4)
    return weights, experts


# --- compiling without a GPU (benchmarks/compile_time.py) ---------------------------------------------

TRITON_TYPES = {"float16": "*fp16", "bfloat16": "*bf16", "float32": "*fp32"}


def _attention_spec(ptr: str, head_d: int, causal: bool) -> tuple:
    signature = {name: ptr for name in ("Q", "K", "V", "O")} | {"scale_log2": "fp32", "n_q": "i32", "n_k": "i32",
                                                                "heads": "i32"}
    signature |= {f"s_{t}{a}": "i32" for t in "qkvo" for a in ("b", "h", "m" if t in "qo" else "n")}
    signature |= {n: "constexpr" for n in ("BLOCK_M", "BLOCK_N", "HEAD_D", "CAUSAL")}
    constants = {"BLOCK_M": 128, "BLOCK_N": 64, "HEAD_D": head_d, "CAUSAL": causal}
    return attention_kernel, signature, constants, {"num_warps": 8 if head_d >= 128 else 4, "num_stages": 3}


def _decode_specs(ptr: str, head_d: int) -> list[tuple]:
    partial = {"Q": ptr, "K": ptr, "V": ptr, "M_part": "*fp32", "L_part": "*fp32", "ACC_part": "*fp32",
               "scale_log2": "fp32", "n_k": "i32", "heads": "i32", "chunk": "i32"}
    partial |= {name: "i32" for name in ("s_qb", "s_qh", "s_kb", "s_kh", "s_kn", "s_vb", "s_vh", "s_vn")}
    partial |= {"BLOCK_N": "constexpr", "HEAD_D": "constexpr"}
    combine = {"M_part": "*fp32", "L_part": "*fp32", "ACC_part": "*fp32", "O": ptr, "splits": "i32", "heads": "i32",
               "s_ob": "i32", "s_oh": "i32", "SPLITS": "constexpr", "HEAD_D": "constexpr"}
    return [(decode_partial_kernel, partial, {"BLOCK_N": 64, "HEAD_D": head_d}, {"num_warps": 4}),
            (decode_combine_kernel, combine, {"SPLITS": 8, "HEAD_D": head_d}, {"num_warps": 4})]


def kernel_specs(case_name: str, dtype: str, head_d: int = 64, cols: int = 1024) -> list[tuple]:
    """``(jit function, signature, constants, options)`` of each Triton kernel the peer of a
    ``gpu_cases`` case launches, specialized like the peer would be at run time."""
    ptr = TRITON_TYPES[dtype]
    if case_name in ("attention", "attention_numpy_rules", "causal"):
        return [_attention_spec(ptr, head_d, case_name == "causal")]
    if case_name == "decode":
        return _decode_specs(ptr, head_d)
    if case_name in ("softmax", "log_softmax"):
        block = min(triton.next_power_of_2(cols), 8192)
        signature = {"X": ptr, "Y": ptr, "n_cols": "i32", "s_x": "i32", "s_y": "i32", "BLOCK": "constexpr",
                     "LOG": "constexpr"}
        return [(softmax_kernel, signature, {"BLOCK": block, "LOG": case_name == "log_softmax"},
                 {"num_warps": 16 if block >= 4096 else 4})]
    if case_name in ("moe_routing", "moe_routing_top8"):
        block = triton.next_power_of_2(cols)
        signature = {"X": "*fp32", "W": "*fp32", "I": "*i64", "n_rows": "i32", "n_experts": "i32", "s_x": "i32",
                     "s_w": "i32", "s_i": "i32", "ROWS": "constexpr", "BLOCK": "constexpr", "K": "constexpr"}
        constants = {"ROWS": max(1, min(16, 4096 // block)), "BLOCK": block, "K": 8 if case_name.endswith("8") else 2}
        return [(routing_kernel, signature, constants, {"num_warps": 4})]
    raise KeyError(case_name)


def compile_to_ptx(spec: tuple, arch: int = 90, cache_dir: str | None = None) -> dict:
    """Compile one `kernel_specs` entry for ``sm_<arch>`` without a GPU; returns microseconds per stage
    (``ir_initialization``, ``ttir``, ``ttgir``, ``llir``, ``ptx``, ``cubin``) and the PTX (``ptx_text``)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn, signature, constants, options = spec
    record: dict = {}

    def listen(*, src, metadata, metadata_group, times, cache_hit: bool) -> None:
        record["times"], record["hit"] = times, cache_hit

    previous_listener, previous_dir = triton.knobs.compilation.listener, triton.knobs.cache.dir
    triton.knobs.compilation.listener = listen
    if cache_dir is not None:
        triton.knobs.cache.dir = cache_dir
    try:
        compiled = triton.compile(ASTSource(fn, signature, constants), target=GPUTarget("cuda", arch, 32),
                                  options=options)
    finally:
        triton.knobs.compilation.listener = previous_listener
        triton.knobs.cache.dir = previous_dir
    if record.get("hit"):
        raise RuntimeError(f"triton served {fn.__name__} from its cache: not a cold compile")
    times: dict = {"ir_initialization": record["times"].ir_initialization}
    times.update(dict(record["times"].lowering_stages))
    times["ptx_text"] = compiled.asm["ptx"]
    return times
