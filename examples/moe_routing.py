"""MoE routing: softmax over 64 experts, top-2, renormalized by the kept sum; the softmax's max and sum fuse, the
top-k ranks after that pass (numpy's exact indices, docs/fusion.md "Top-k in a cascade")."""
import numpy as np

from _check import run_and_check
from redfuser.workloads import moe_routing

logits = (np.random.default_rng(0).standard_normal((4096, 64)) * 2).astype(np.float32)
weights, experts = run_and_check(moe_routing, (logits,), 64)
print("token 0 routes to experts", experts[0].tolist(), "with weights", np.round(weights[0], 4).tolist())
