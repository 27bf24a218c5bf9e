"""Idioms the fuzzer draws whole: the cascades and masks real kernels are made of, as plain nodes.

Each appends ordinary nodes (so the shrinker can take them apart) and returns
the name of its result, or None where numpy or the oracle refused a step:
softmax, log-sum-exp, layer-norm statistics, attention (with a causal or
sliding-window mask built from ``arange``; the window as ``(j <= i) * (j > i - w)``,
a product of bools), MoE routing (softmax, top-k, renormalize), and per-row
absmax quantization to float8_e4m3fn (optionally followed by a GEMM).
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
    return keep and b.add("where_c", [keep, s], (float("-inf"),))


def attention(b: ProgramBuilder, dtype: str) -> str | None:
    d = b.draw
    lead = d.pick(((), (1,), (2,), (2, 3)))
    n, m, k, dv = d.pick((1, 3, 8, 16)), d.pick((1, 5, 8, 17, 64)), d.pick((1, 4, 16)), d.pick((1, 2, 8))
    q = b.new_input(lead + (n, k), dtype)
    kk = b.new_input(lead + (m, k), dtype)
    v = b.new_input(lead + (m, dv), dtype)
    kt = b.add("mT", [kk])
    s = kt and b.add("matmul", [q, kt])
    if s and d.chance(60):
        s = b.add("mul_c", [s], (d.pick((0.25, 0.125, 1.0)),))
    if s and d.chance(50):
        s = causal_mask(b, s)
    p = s and softmax(b, s)
    return p and b.add("matmul", [p, v])


def routing(b: ProgramBuilder, x: str) -> str | None:
    p = softmax(b, x)
    if not p or not b.shape(p):
        return None
    k = b.draw.integer(1, min(b.shape(p)[-1], 3))
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


IDIOMS = ("softmax", "log_softmax", "logsumexp", "layer_norm", "attention", "routing", "quantize", "mask")


def idiom(b: ProgramBuilder, name: str, dtype: str) -> str | None:
    """Append idiom `name` on a fresh input of `dtype` (attention makes its own three)."""
    b.labels.append(name)
    if name == "attention":
        return attention(b, dtype)
    x = b.new_input(b.base_shape() or (b.draw.pick((3, 8)),), dtype)
    if name == "mask":
        if len(b.shape(x)) < 2:
            return None
        masked = causal_mask(b, x)
        return masked and softmax(b, masked)
    return {"softmax": softmax, "log_softmax": lambda b, x: softmax(b, x, log=True), "logsumexp": logsumexp,
            "layer_norm": layer_norm_stats, "routing": routing, "quantize": quantize}[name](b, x)
