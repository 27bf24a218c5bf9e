"""Per-token int8 quantization (rint, clip) + GEMM: rounded with the running absmax inside the one pass.

Checked as the demo checks it (`redfuser.testing.quantization.assert_int8_quantized_gemm`): within half a
grid step per term of the exact product, and equal to the numpy body on the half of the rows that repeat
their absmax every 16 elements, where every kernel rounds as the body does."""
import numpy as np

import redfuser as rf
from redfuser.testing.quantization import assert_int8_quantized_gemm, spike_half
from redfuser.workloads import int8_quant_gemm

rng = np.random.default_rng(0)
x = spike_half(rng.standard_normal((256, 1024)).astype(np.float32))
w = rng.integers(-127, 128, (1024, 256)).astype(np.float32)      # int8 weights, held as f32
w_scale = rng.uniform(0.001, 0.01, 256).astype(np.float32)
k = rf.kernel(int8_quant_gemm)
lowered = k.lower(x, w, w_scale)
print(f"backend: {lowered.backend}")
for g in lowered.groups:
    print(f"cascade {', '.join(g.reductions)}: fused={g.fused}")
print(f"fused:   {assert_int8_quantized_gemm(k(x, w, w_scale), x, w, w_scale)}")
print(f"unfused: {assert_int8_quantized_gemm(int8_quant_gemm(x, w, w_scale), x, w, w_scale)}")
print("within the quantization bound, and the body's result where the rounding is the body's: OK")
