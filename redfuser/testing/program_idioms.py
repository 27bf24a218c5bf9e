"""Idioms the fuzzer draws whole: the cascades and masks real kernels are made of, as plain nodes.

Each appends ordinary nodes (so the shrinker can take them apart) and returns
the name of its result, or None where numpy or the oracle refused a step:
softmax, log-sum-exp, layer-norm statistics, attention (with a causal or
sliding-window mask built from ``arange``; the window as ``(j <= i) * (j > i - w)``,
a product of bools), attention as written for low precision (the mask after
``exp``, probabilities rounded to f16/bf16 before the value GEMM), sums with a
bare constant term, central moments and entropies of data far from 0 or logits wide enough to underflow,
weighted moments, KL divergences and base-2 softmaxes (`weighted`), focal losses over masked logits,
exponentials of other values less a max and effective sample sizes (`losses`; attention now and then at sizes
the host's AMX tiles take, `tile_sized`, and bf16 matmuls of such sizes, `tile_matmul`), MoE
routing (softmax, top-k, renormalize; tied and non-finite logits), and per-row
absmax quantization to float8_e4m3fn (optionally followed by a GEMM); attention with RoPE's rotation
of q and k (slices and a concatenation) and group statistics over rows split by a reshape; products of
factors tempered by the row's max (the product law).
"""
from __future__ import annotations

from .program_grammar import ProgramBuilder


def softmax(b: ProgramBuilder, x: str, log: bool = False) -> str | None:
    m = b.add("max", [x], (-1, True))
    d = m and b.add("sub", [x, m])
    e = d and b.add("exp", [d])
    s = e and b.add("sum", [e], (-1, True))
    if not s:
        return None
    if log:
        ls = b.add("log", [s])
        return ls and b.add("sub", [d, ls])
    return b.add("div", [e, s])


def logsumexp(b: ProgramBuilder, x: str) -> str | None:
    m = b.add("max", [x], (-1, True))
    d = m and b.add("sub", [x, m])
    e = d and b.add("exp", [d])
    s = e and b.add("sum", [e], (-1, False))
    ls = s and b.add("log", [s])
    mm = ls and b.add("index", [m], ((Ellipsis, 0),))
    return mm and b.add("add", [mm, ls])


def layer_norm_stats(b: ProgramBuilder, x: str) -> str | None:
    n = b.shape(x)[-1]
    s = b.add("sum", [x], (-1, True))
    mu = s and b.add("div_c", [s], (float(n),))
    c = mu and b.add("sub", [x, mu])
    q = c and b.add("square", [c])
    v = q and b.add("sum", [q], (-1, True))
    return v and b.add("div_c", [v], (float(n),))


def causal_mask(b: ProgramBuilder, s: str) -> str | None:
    """``where(j <= i + K, s, -inf)`` or the sliding window ``where((j <= i) * (j > i - w), s, -inf)``."""
    keep = causal_keep(b, s)
    return keep and b.add("where_c", [keep, s], (float("-inf"),))


def causal_keep(b: ProgramBuilder, s: str) -> str | None:
    """The bool mask of `causal_mask`: ``j <= i + K`` or ``(j <= i) * (j > i - w)``."""
    d = b.draw
    if len(b.shape(s)) < 2:
        return None
    i = b.add("arange", [s], (-2,))
    j = b.add("arange", [s], (-1,))
    ic = i and b.add("index", [i], ((slice(None), None),))
    jr = j and b.add("index", [j], ((None, slice(None)),))
    if not (ic and jr):
        return None
    if d.chance(50):
        shifted = b.add("add_c", [ic], (d.pick((0, 0, 1, -1, 3)),))
        keep = shifted and b.add("le", [jr, shifted])
        b.labels.append("causal")
    else:
        width = d.pick((1, 2, 3, 8))
        low = b.add("add_c", [ic], (-width,))
        seen = b.add("le", [jr, ic])
        near = low and b.add("gt", [jr, low])
        keep = seen and near and b.add(d.pick(("mul", "mul", "and")), [seen, near])
        b.labels.append("window")
    return keep


def attention(b: ProgramBuilder, dtype: str) -> str | None:
    d = b.draw
    lead = d.pick(((), (1,), (2,), (2, 3)))
    n, m, k, dv = d.pick((1, 3, 8, 16)), d.pick((1, 5, 8, 17, 64)), d.pick((1, 4, 16)), d.pick((1, 2, 8))
    if d.chance(15):
        lead, n, m, k, dv = tile_sized(b)
    q = b.new_input(lead + (n, k), dtype)
    kk = b.new_input(lead + (m, k), dtype)
    v = b.new_input(lead + (m, dv), dtype)
    if k % 2 == 0 and d.chance(35):     # rotary embedding applied inside: x + c * rotate_half(x)
        q, kk = rotate_half(b, q), rotate_half(b, kk)
        if not (q and kk):
            return None
    kt = b.add("mT", [kk])
    s = kt and b.add("matmul", [q, kt])
    if s and d.chance(60):
        s = b.add("mul_c", [s], (d.pick((0.25, 0.125, 1.0)),))
    if s and d.chance(50):
        s = causal_mask(b, s)
    p = s and softmax(b, s)
    return p and b.add("matmul", [p, v])


def tile_sized(b: ProgramBuilder) -> tuple[tuple[int, ...], int, int, int, int]:
    """(batch, queries, keys, head dim, value dim) whose dots the host's AMX tiles take (16-row and 16-column
    tiles, 32-long contractions: `codegen/host/amx.py`), so that its run-time check and both of its paths
    meet the fuzzer's data; a key count that is no multiple of 32 keeps ``P @ V`` on the FMA path."""
    d = b.draw
    return d.pick(((), (1,))), d.pick((16, 32)), d.pick((32, 64, 48)), d.pick((32, 64)), d.pick((16, 32))


def rotate_half(b: ProgramBuilder, x: str) -> str | None:
    """``x + c * concatenate((-x[..., h:], x[..., :h]), -1)``: RoPE's rotation (slices and a join) without
    its tables."""
    h = b.shape(x)[-1] // 2
    hi = b.add("index", [x], ((Ellipsis, slice(h, None)),))
    lo = b.add("index", [x], ((Ellipsis, slice(None, h)),))
    rot = hi and lo and b.add("concatenate2", [b.add("neg", [hi]), lo], (-1,))
    scaled = rot and b.add("mul_c", [rot], (b.draw.pick((0.5, 1.0)),))
    return scaled and b.add("add", [x, scaled])


def flash_attention(b: ProgramBuilder, dtype: str) -> str | None:
    """Attention as users write it for low precision (issue 20): the mask applied after ``exp`` by a
    condition on the scores' positions only (``where(keep, exp(s - m), 0)``), and the probabilities
    rounded to f16/bf16 before the value GEMM, unnormalized or normalized."""
    d = b.draw
    lead = d.pick(((), (1,), (2,)))
    n, m, k, dv = d.pick((1, 3, 8)), d.pick((1, 5, 8, 17, 64)), d.pick((1, 4, 16)), d.pick((1, 2, 8))
    if d.chance(15):
        lead, n, m, k, dv = tile_sized(b)
    q, kk, v = b.new_input(lead + (n, k), dtype), b.new_input(lead + (m, k), dtype), b.new_input(lead + (m, dv), dtype)
    kt = b.add("mT", [kk])
    s = kt and b.add("matmul", [q, kt])
    s = s and (b.add("astype", [s], ("float32",)) if d.chance(50) else s)
    s = s and b.add("mul_c", [s], (d.pick((0.25, 0.125, 1.0)),))
    keep = s and causal_keep(b, s) if d.chance(70) else None
    scores = b.add("where_c", [keep, s], (float("-inf"),)) if keep and d.chance(50) else s
    mx = scores and b.add("max", [scores], (-1, True))
    e = mx and b.add("exp", [b.add("sub", [s, mx])])
    if e and keep:
        e = b.add("where_c", [keep, e], (0.0,))
    l = e and b.add("sum", [e], (-1, True))
    if not l:
        return None
    narrow = d.pick(("float16", "bfloat16", None))
    if narrow and d.chance(50):  # round the normalized probabilities: ((p / l).astype(bf16) @ v)
        pn = b.add("div", [e, l])
        pr = pn and b.add("astype", [pn], (narrow,))
        return pr and b.add("matmul", [pr, v])
    pr = b.add("astype", [e], (narrow,)) if narrow else e  # (p.astype(f16) @ v) / l
    o = pr and b.add("matmul", [pr, v])
    return o and b.add("div", [o, l])


def constant_terms(b: ProgramBuilder, x: str) -> str | None:
    """Sums of a separable term and a bare constant: ``sum(exp(x - m) + c)``, ``sum((p - 1/N)**2)``,
    ``sum(x / s + c)`` (issue 20: the numeric check once crashed on them)."""
    d = b.draw
    n = b.shape(x)[-1] if b.shape(x) else 1
    kind = d.pick(("exp", "centred_p", "scaled"))
    if kind == "scaled":
        a = b.add("abs", [x])
        s = a and b.add("sum", [a], (-1, True))
        s1 = s and b.add("add_c", [s], (1.0,))
        t = s1 and b.add("div", [x, s1])
        return t and b.add("sum", [b.add("add_c", [t], (0.25,))], (-1, False))
    if kind == "exp":
        mx = b.add("max", [x], (-1, True))
        e = mx and b.add("exp", [b.add("sub", [x, mx])])
        return e and b.add("sum", [b.add("add_c", [e], (0.25,))], (-1, False))
    p = softmax(b, x)
    c = p and b.add("add_c", [p], (-1.0 / n,))
    sq = c and b.add("square", [c])
    return sq and b.add("sum", [sq], (-1, False))


def moments(b: ProgramBuilder, x: str) -> str | None:
    """Central moments (variance, the 4th) of data far from 0, and the entropy of a softmax over logits
    offset by 1e3: what a raw expansion of the fused sums cancels on (issue 20, shift-stable sums)."""
    d = b.draw
    if d.chance(40):
        p = softmax(b, x)
        lp = p and b.add("log", [p])
        t = lp and b.add("mul", [p, lp])
        h = t and b.add("sum", [t], (-1, True))
        return h and b.add("neg", [h])
    n = b.shape(x)[-1] if b.shape(x) else 1
    s = b.add("sum", [x], (-1, True))
    mu = s and b.add("div_c", [s], (float(n),))
    c = mu and b.add("sub", [x, mu])
    q = c and b.add("square", [c])
    if q and d.chance(40):
        q = b.add("square", [q])
    v = q and b.add("sum", [q], (-1, True))
    return v and b.add("div_c", [v], (float(n),))


def weighted(b: ProgramBuilder, x: str) -> str | None:
    """Statistics users write whose mean is one reduction over another or whose difference reads another
    cascade's result: the variance of ``x`` under ``softmax(x)`` (``mu = sum(p x) / sum(p)``), a variance
    with positive weights (``sum(w x) / sum(w)``), the KL divergence of two log-softmaxes, and a softmax in
    base 2 (``exp2(x log2(e) - m)``). The normal form once expanded the first three into sums that cancel
    and summed the last without numpy's rounding of ``x log2(e)`` (docs/fusion.md)."""
    d = b.draw
    kind = d.pick(("softmax_var", "weighted_var", "kl", "base2"))
    if kind == "base2":
        s = b.add("mul_c", [x], (1.4426950408889634,))
        m = s and b.add("max", [s], (-1, True))
        e = m and b.add("exp2", [b.add("sub", [s, m])])
        t = e and b.add("sum", [e], (-1, True))
        return t and b.add("div", [e, t])
    if kind == "kl":
        y = b.new_input(b.shape(x), b.dtype(x).name, d.pick(("offset", "far", "normal", "large")))
        la, lb = softmax(b, x, log=True), softmax(b, y, log=True)
        pa = la and lb and b.add("exp", [la])
        t = pa and b.add("mul", [pa, b.add("sub", [la, lb])])
        return t and b.add("sum", [t], (-1, False))
    if kind == "softmax_var":
        m = b.add("max", [x], (-1, True))
        w = m and b.add("exp", [b.add("sub", [x, m])])
    else:
        w = b.new_input(b.shape(x), "float32", "positive")
    sw = w and b.add("sum", [w], (-1, True))
    mu = sw and b.add("div", [b.add("sum", [b.add("mul", [w, x])], (-1, True)), sw])
    c = mu and b.add("sub", [x, mu])
    t = c and b.add("mul", [w, b.add("square", [c])])
    v = t and b.add("sum", [t], (-1, True))
    return v and b.add("div", [v, sw])


def losses(b: ProgramBuilder, x: str) -> str | None:
    """Losses and statistics whose exponent, infinity or range the fused loop once got wrong (trying the
    project as a new user, docs/fusion.md): a focal loss ``Σ (1 - p)² log p`` over logits with masked (-inf)
    classes; ``Σ exp(y - max x)`` of other values less a max (unbounded in the loop); an effective sample
    size ``1 / Σ (w / Σw)²`` of weights far from 1 (a deferred division by a squared sum)."""
    d = b.draw
    kind = d.pick(("focal", "other_max", "ess"))
    if kind == "focal":
        y = b.new_input(b.shape(x), "float32", "normal")
        keep = b.add("gt_c", [y], (-1.0,))
        masked = keep and b.add("where_c", [keep, x], (float("-inf"),))
        lp = masked and softmax(b, masked, log=True)
        q = lp and b.add("rsub_c", [b.add("exp", [lp])], (1.0,))
        t = q and b.add("mul", [b.add("square", [q]), lp])
        return t and b.add("sum", [t], (-1, d.chance(50)))
    if kind == "other_max":
        y = b.new_input(b.shape(x), b.dtype(x).name, d.pick(("large", "wide", "far")))
        m = b.add("max", [x], (-1, True))
        e = m and b.add("exp", [b.add("sub", [y, m])])
        return e and b.add("sum", [e], (-1, False))
    w = b.new_input(b.shape(x), "float32", "positive")
    w = b.add("mul_c", [w], (d.pick((1e-25, 1e19, 1.0)),))
    p = w and b.add("div", [w, b.add("sum", [w], (-1, True))])
    t = p and b.add("sum", [b.add("mul", [p, p])], (-1, False))
    return t and b.add("recip", [t])


def tempered_product(b: ProgramBuilder, x: str) -> str | None:
    """``prod(exp(c (x - m)))`` or ``prod((x*x + 1) exp(c (x - m)))`` with ``m = max(x)``: a product whose
    factors read the running max, carried by the product law (issue 24, docs/fusion.md "prod")."""
    d = b.draw
    mx = b.add("max", [x], (-1, True))
    dx = mx and b.add("sub", [x, mx])
    t = dx and b.add("mul_c", [dx], (d.pick((0.05, 0.5, 1.0)),))
    e = t and b.add("exp", [t])
    if e and d.chance(50):
        sq = b.add("square", [x])
        g = sq and b.add("add_c", [sq], (1.0,))
        e = g and b.add("mul", [g, e])
    return e and b.add("prod", [e], (-1, d.chance(30)))


def routing(b: ProgramBuilder, x: str) -> str | None:
    """Softmax, top-k, renormalize. Its indices are judged exactly where the ranking is robust
    (`program_ranking`): the logits are often small integers, so ties are frequent and structural."""
    p = softmax(b, x)
    if not p or not b.shape(p):
        return None
    n = b.shape(p)[-1]
    k = b.draw.pick((1, 2, 3, min(n, 8), n)) if b.draw.chance(50) else b.draw.integer(1, min(n, 3))
    k = max(1, min(k, n))
    w = b.add("topk", [p], (k,), outs=2)
    s = w and b.add("sum", [w], (-1, True))
    return s and b.add("div", [w, s])


def quantize(b: ProgramBuilder, x: str) -> str | None:
    """Per-row absmax to float8_e4m3fn and back (``x * (448 / a)``), optionally followed by a GEMM."""
    d = b.draw
    xf = b.add("astype", [x], ("float32",))
    ab = xf and b.add("abs", [xf])
    a = ab and b.add("max", [ab], (-1, True))
    inv = a and b.add("recip", [a])
    scale = inv and b.add("mul_c", [inv], (448.0,))
    xs = scale and b.add("mul", [xf, scale])
    q = xs and b.add("astype", [xs], ("float8_e4m3fn",))
    back = q and b.add("astype", [q], ("float32",))
    if not back:
        return None
    if d.chance(50) and b.shape(back):
        w = b.new_input((b.shape(back)[-1], d.pick((1, 3, 8))), "float8_e4m3fn" if d.chance(30) else "float32",
                        "normal")
        wf = b.add("astype", [w], ("float32",))
        back = wf and b.add("matmul", [back, wf])
    ad = back and b.add("div_c", [a], (448.0,))
    return ad and b.add("mul", [back, ad])


def tile_matmul(b: ProgramBuilder) -> str | None:
    """A matmul of `tile_sized` operands: bf16 by bf16, or f32 by bf16 (the f32 side split into three bf16
    parts on AMX tiles), then now and then the softmax of its rows (one fused pass with the dot)."""
    d = b.draw
    lead, n, m, k, _ = tile_sized(b)
    x = b.new_input(lead + (n, k), d.pick(("bfloat16", "bfloat16", "float32")))
    w = b.new_input(lead + (k, m), "bfloat16")
    y = b.add("matmul", [x, w])
    return softmax(b, y) if y and d.chance(50) else y


IDIOMS = ("softmax", "log_softmax", "logsumexp", "layer_norm", "attention", "routing", "quantize", "mask",
          "flash_attention", "constant_terms", "moments", "tempered_product", "tile_matmul", "weighted", "losses")


def idiom(b: ProgramBuilder, name: str, dtype: str) -> str | None:
    """Append idiom `name` on a fresh input of `dtype` (attention makes its own three)."""
    b.labels.append(name)
    if name == "attention":
        return attention(b, dtype)
    if name == "flash_attention":
        return flash_attention(b, dtype)
    if name == "tile_matmul":
        return tile_matmul(b)
    if name in ("moments", "weighted", "losses"):     # (large: logits whose probabilities underflow)
        shape = b.base_shape() or (b.draw.pick((3, 8)),)
        x = b.new_input(shape, dtype, b.draw.pick(("offset", "far", "normal", "large")))
        return {"moments": moments, "weighted": weighted, "losses": losses}[name](b, x)
    if name == "routing" and b.draw.chance(60):  # router logits: tokens x experts, ties on purpose
        d = b.draw
        shape = (d.pick((1, 3, 7)), d.pick((5, 8, 16, 64, 256)))
        x = b.new_input(shape, dtype, d.pick(("ints", "ints", "normal", "wide")))
        return routing(b, x)
    x = b.new_input(b.base_shape() or (b.draw.pick((3, 8)),), dtype)
    shape = b.shape(x)
    if name in ("layer_norm", "softmax") and shape[-1] % 2 == 0 and shape[-1] > 2 and b.draw.chance(30):
        x = b.add("reshape", [x], (shape[:-1] + (2, -1),)) or x      # group statistics: rows split in two
    if name == "mask":
        if len(b.shape(x)) < 2:
            return None
        masked = causal_mask(b, x)
        return masked and softmax(b, masked)
    return {"softmax": softmax, "log_softmax": lambda b, x: softmax(b, x, log=True), "logsumexp": logsumexp,
            "layer_norm": layer_norm_stats, "routing": routing, "quantize": quantize,
            "constant_terms": constant_terms, "tempered_product": tempered_product}[name](b, x)
