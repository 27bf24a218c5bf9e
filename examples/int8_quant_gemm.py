"""Per-token int8 quantization (rint, clip) + GEMM: rounded with the running absmax inside the one pass."""
import numpy as np

import redfuser as rf
from redfuser.testing.quantization import int8_quantization_bound
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
bound = int8_quantization_bound(x, w, w_scale)   # half a grid step per term, plus f32 sums
print(f"max |fused - exact| / bound = {np.max(np.abs(out - exact) / bound):.3f}, "
      f"unfused: {np.max(np.abs(ref - exact) / bound):.3f}  (both must be <= 1)")
assert np.all(np.abs(out - exact) <= bound) and np.all(np.abs(ref - exact) <= bound)
print("within the quantization error bound: OK")
