"""Per-token FP8 quantization + GEMM: the running absmax scales the quantization inside the one pass.

The fused loop quantizes each chunk with the absmax seen so far, so it rounds other values than the unfused
program: it is checked against the bounds both meet (`redfuser.testing.quantization`; docs/fusion.md, FP8
section). Half the rows repeat their absmax every 16 elements, where every kernel quantizes exactly as the
numpy body does, and those rows are held to the quantized reference (bound 2), which a kernel that skips
the quantization or scales its output by 1% fails."""
import numpy as np

import redfuser as rf
from redfuser.testing.quantization import assert_quantized_gemm, spike_half
from redfuser.workloads import fp8_quant_gemm

rng = np.random.default_rng(0)
x = spike_half(rng.standard_normal((256, 1024)).astype(np.float32)).astype(np.float16)
w = rng.standard_normal((1024, 256)).astype(rf.float8_e4m3fn)
w_scale = rng.uniform(0.5, 2.0, 256).astype(np.float32)
k = rf.kernel(fp8_quant_gemm)
lowered = k.lower(x, w, w_scale)
print(f"backend: {lowered.backend}")
for g in lowered.groups:
    print(f"cascade {', '.join(g.reductions)}: fused={g.fused}")
print(f"fused:   {assert_quantized_gemm(k(x, w, w_scale), x, w, w_scale)}")
print(f"unfused: {assert_quantized_gemm(fp8_quant_gemm(x, w, w_scale), x, w, w_scale)}")
print("within both bounds: OK")
