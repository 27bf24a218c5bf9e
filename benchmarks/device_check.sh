#!/usr/bin/env bash
# The whole device check in one command, for a lent GPU machine (docs/gpu-backend.md, "The device check").
#
#     bash benchmarks/device_check.sh [BUDGET_S [GPU_CHECK_ARGS...]]   # from the repository root
#
# BUDGET_S (default 300) bounds gpu_check.py; further arguments go to it (`--only attention causal`).
#
# 1. installs the llvmlite wheel carried in .whl/ into /tmp/site (nothing can be fetched there) and makes
#    the tree importable as the package `redfuser` (a folder of links: pyproject.toml's package-dir mapping,
#    no build step), then checks gpu_check.py's arguments (`--check-args`): a typo in --only stops the
#    script here (exit 2), not after the gate and the tests;
# 2. a gate: one small kernel compiled, launched and checked on the device. If that fails, nothing after
#    it would tell more, so the script stops at once (exit 3) and the lease keeps its time for a rerun;
# 3. the gpu-marked tests (real driver, torch and cupy arrays and streams, every workload against its
#    numpy body);
# 4. benchmarks/gpu_check.py with the budget: the table, which ends the output.
# Logs go to $OUT (or ./device-out): pytest_gpu.log, gpu_check.log, gpu_check.txt, gpu_check.json.
set -u -o pipefail
budget=${1:-300}
shift $(( $# > 0 ? 1 : 0 ))
out=${OUT:-$PWD/device-out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site OUT="$out"

if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/site .whl/*.whl \
        || echo "llvmlite wheel not installed: the image's llvmlite is used"
fi
mkdir -p /tmp/site/redfuser
ln -sf "$PWD"/redfuser/* /tmp/site/redfuser/
ln -sf "$PWD/ir" "$PWD/codegen" "$PWD/runtime" /tmp/site/redfuser/

# gpu_check.py's arguments (a typo in --only, a budget of 0) are refused here, before the gate and the tests
# spend the lease's time, not at the end.
python3 -P benchmarks/gpu_check.py --check-args --budget "$budget" "$@" || exit 2

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv 2>&1
python3 -P - <<'EOF' || exit 3
import time, numpy as np, llvmlite, cuda.bindings, redfuser as rf
from redfuser.workloads import softmax
x = np.random.default_rng(0).standard_normal((64, 1000)).astype(np.float32)
start = time.perf_counter()
y = rf.kernel(softmax, backend="cuda")(x)
e = np.exp(x - x.max(-1, keepdims=True))
err = float(np.abs(y - e / e.sum(-1, keepdims=True)).max())
print(f"gate: llvmlite {llvmlite.__version__}, cuda-bindings {cuda.bindings.__version__}, softmax on the device "
      f"in {time.perf_counter() - start:.2f} s (compile included), max error {err:.2e}")
assert err < 1e-5, "the gate kernel is wrong"
EOF

timeout 150 python3 -P -m pytest -q -p no:cacheprovider -m gpu -rfEs --tb=short tests 2>&1 | tee "$out/pytest_gpu.log" | tail -40
timeout $((budget + 90)) python3 benchmarks/gpu_check.py --budget "$budget" "$@" 2>&1 | tee "$out/gpu_check.log"
