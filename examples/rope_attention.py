"""Attention with rotary position embeddings applied to q and k inside the kernel (rotate-half, as Llama's):
the slices and the concatenation are views and one select, and the whole body fuses into one pass."""
import numpy as np

from _check import run_and_check
from redfuser.workloads import rope_attention, rope_tables  # the unfused program: read it there

rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((2, 4, 256, 64)).astype(np.float32) for _ in range(3))
cos, sin = rope_tables(256, 64)
run_and_check(rope_attention, (q, k, v, cos, sin), 256)
