"""Flash decoding: one query against a long key axis; the key axis is split across programs and merged."""
import numpy as np

from _check import run_and_check
from redfuser.workloads import attention

rng = np.random.default_rng(0)
q = rng.standard_normal((1, 8, 1, 64)).astype(np.float32)
k, v = (rng.standard_normal((1, 8, 32768, 64)).astype(np.float32) for _ in range(2))
run_and_check(attention, (q, k, v), 32768)
