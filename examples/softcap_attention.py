"""Attention with Gemma 2's logit soft-capping, ``50 * tanh(s / 50)``, fused into one pass over the keys."""
import numpy as np

from _check import run_and_check
from redfuser.workloads import softcap_attention  # the unfused program: read it there

rng = np.random.default_rng(0)
q, k, v = ((rng.standard_normal((2, 4, 256, 64)) * 6).astype(np.float32) for _ in range(3))
run_and_check(softcap_attention, (q, k, v), 256)
