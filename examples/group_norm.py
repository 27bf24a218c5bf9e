"""Group normalization of an NCHW activation: the reshape that splits the channels into groups is a view, and
the group mean and variance are one centred pass."""
import numpy as np

from _check import run_and_check
from redfuser.workloads import group_norm  # the unfused program: read it there

rng = np.random.default_rng(0)
x = (rng.standard_normal((4, 64, 16, 16)) * 2 + 3).astype(np.float32)
w, b = rng.standard_normal(64).astype(np.float32), rng.standard_normal(64).astype(np.float32)
run_and_check(group_norm, (x, w, b), 2048)
