"""Per-token FP8 quantization + GEMM: the running absmax scales the quantization inside the one pass."""
import numpy as np

import redfuser as rf
from redfuser.workloads import fp8_quant_gemm

rng = np.random.default_rng(0)
x = rng.standard_normal((256, 1024)).astype(np.float16)
w = rng.standard_normal((1024, 256)).astype(rf.float8_e4m3fn)
w_scale = rng.uniform(0.5, 2.0, 256).astype(np.float32)
k = rf.kernel(fp8_quant_gemm)
lowered = k.lower(x, w, w_scale)
print(f"backend: {lowered.backend}")
for g in lowered.groups:
    print(f"cascade {', '.join(g.reductions)}: fused={g.fused}")
out, ref = k(x, w, w_scale), fp8_quant_gemm(x, w, w_scale)
exact = (x.astype(np.float64) @ w.astype(np.float64)) * w_scale
bound = ((2.0**-4 * np.abs(x.astype(np.float64)) + 2.0**-10 * np.abs(x).max(-1, keepdims=True) / 448.0)
         @ np.abs(w.astype(np.float64))) * w_scale
print(f"max |fused - exact| / bound = {np.max(np.abs(out - exact) / bound):.3f}, "
      f"unfused: {np.max(np.abs(ref - exact) / bound):.3f}  (both must be <= 1)")
assert np.all(np.abs(out - exact) <= bound) and np.all(np.abs(ref - exact) <= bound)
print("within the quantization error bound: OK")
