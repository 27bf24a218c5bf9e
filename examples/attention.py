"""Batched causal attention [B, H, N, D]: scores, causal mask, safe softmax and the weighted sum, fused."""
import numpy as np

from _check import run_and_check
from redfuser.workloads import causal_attention  # the unfused program: read it there

rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((2, 4, 256, 64)).astype(np.float32) for _ in range(3))
run_and_check(causal_attention, (q, k, v), 256)
