"""Greedy (top-1) MoE routing: softmax statistics and the top probability in one pass, numpy's argmax after it."""
import numpy as np

from _check import run_and_check
from redfuser.workloads import argmax_routing  # the unfused program: read it there

rng = np.random.default_rng(0)
logits = np.round(rng.standard_normal((512, 64)) * 4).astype(np.float32)   # whole numbers: ties are common
run_and_check(argmax_routing, (logits,), 64)
