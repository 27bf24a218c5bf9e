"""Batched causal attention [B, H, N, D]: scores, causal mask, safe softmax and the weighted sum, fused."""
import numpy as np

import redfuser as rf
from _check import run_and_check


def causal_attention(q, k, v):
    n, m = k.shape[-2], q.shape[-2]
    s = (q @ rf.swapaxes(k, -1, -2)) * (1.0 / q.shape[-1] ** 0.5)
    s = rf.where(rf.arange(n)[None, :] <= rf.arange(m)[:, None], s, -rf.inf)
    mx = rf.max(s, axis=-1, keepdims=True)
    p = rf.exp(s - mx)
    return (p / rf.sum(p, axis=-1, keepdims=True)) @ v


rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((2, 4, 256, 64)).astype(np.float32) for _ in range(3))
run_and_check(causal_attention, (q, k, v), 256)
