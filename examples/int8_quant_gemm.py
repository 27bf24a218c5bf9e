"""Per-token int8 quantization (rint, clip) + GEMM: rounded with the running absmax inside the one pass."""
import numpy as np

import redfuser as rf
from redfuser.workloads import int8_quant_gemm

rng = np.random.default_rng(0)
x = rng.standard_normal((256, 1024)).astype(np.float32)
w = rng.integers(-127, 128, (1024, 256)).astype(np.float32)      # int8 weights, held as f32
w_scale = rng.uniform(0.001, 0.01, 256).astype(np.float32)
k = rf.kernel(int8_quant_gemm)
lowered = k.lower(x, w, w_scale)
print(f"backend: {lowered.backend}")
for g in lowered.groups:
    print(f"cascade {', '.join(g.reductions)}: fused={g.fused}")
out, ref = k(x, w, w_scale), int8_quant_gemm(x, w, w_scale)
exact = (x.astype(np.float64) @ w.astype(np.float64)) * w_scale
a = np.abs(x.astype(np.float64)).max(-1, keepdims=True)
f32_sums = 1024 * 2.0**-23 * (127.0 * np.ones_like(x, np.float64) @ np.abs(w.astype(np.float64))) * (a / 127)
bound = (np.abs(w.astype(np.float64)).sum(0) * a / 127 / 2 + 2 * f32_sums) * w_scale   # half a grid step each
print(f"max |fused - exact| / bound = {np.max(np.abs(out - exact) / bound):.3f}, "
      f"unfused: {np.max(np.abs(ref - exact) / bound):.3f}  (both must be <= 1)")
assert np.all(np.abs(out - exact) <= bound) and np.all(np.abs(ref - exact) <= bound)
print("within the quantization error bound: OK")
