"""Flash decoding: one query against a long key axis, in one pass. Where the heads leave the machine idle
(8 heads on a GPU's 132 SMs) the key axis is split across programs and the slices merged; on a CPU the 8
heads already occupy its cores, and each program walks its head's keys alone (docs/cpu-backend.md,
"Split reductions")."""
import numpy as np

from _check import run_and_check
from redfuser.workloads import attention

rng = np.random.default_rng(0)
q = rng.standard_normal((1, 8, 1, 64)).astype(np.float32)
k, v = (rng.standard_normal((1, 8, 32768, 64)).astype(np.float32) for _ in range(2))
run_and_check(attention, (q, k, v), 32768)
