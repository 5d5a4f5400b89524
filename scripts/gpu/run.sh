#!/usr/bin/env bash
# Runs the staged GPU binaries (scripts/gpu/build.sh) on a machine with an NVIDIA GPU and
# prints a summary. Usage: scripts/gpu/run.sh [tests|bench|all] [OUTDIR] [-- test filter]
set -uo pipefail
cd "$(dirname "$0")/../.."
mode=${1:-all}
out=${2:-/tmp/ferrite-gpu}
shift $(( $# < 2 ? $# : 2 ))
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/targets/x86_64-linux/lib:/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
export FERRITE_CACHE=${FERRITE_CACHE:-/tmp/ferrite-cache}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/device.txt"
status=0
if [ "$mode" = tests ] || [ "$mode" = all ]; then
  .device/bin/cuda-tests "$@" 2>&1 | tee "$out/tests.log"
  status=${PIPESTATUS[0]}
  .device/bin/llm-gpu-tests "$@" 2>&1 | tee "$out/llm-tests.log"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
  .device/bin/nn-gpu-tests "$@" 2>&1 | tee "$out/nn-tests.log"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
  .device/bin/train-gpu-tests "$@" 2>&1 | tee "$out/train-tests.log"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
  .device/bin/serve-gpu-tests "$@" 2>&1 | tee "$out/serve-tests.log"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi
if [ "$mode" = bench ] || [ "$mode" = all ]; then
  .device/bin/cuda-ops-bench 2>&1 | tee "$out/bench.log"
  python3 scripts/gpu/torch_ops.py 2>&1 | tee "$out/torch.log"
  .device/bin/mlp-bench 2>&1 | tee -a "$out/bench.log"
  python3 scripts/gpu/torch_mlp.py 2>&1 | tee -a "$out/torch.log"
  .device/bin/conv-bench 2>&1 | tee -a "$out/bench.log"
  python3 scripts/gpu/torch_conv.py 2>&1 | tee -a "$out/torch.log"
  .device/bin/ce-bench 2>&1 | tee -a "$out/bench.log"
  python3 scripts/gpu/torch_cross_entropy.py 2>&1 | tee -a "$out/torch.log"
  .device/bin/optim-bench 2>&1 | tee -a "$out/bench.log"
  python3 scripts/gpu/torch_optim_step.py 2>&1 | tee -a "$out/torch.log"
fi
echo "== summary"
grep -h "cuda tests:\|gpu tests:\|^failed:" "$out/tests.log" "$out/llm-tests.log" "$out/nn-tests.log" "$out/train-tests.log" "$out/serve-tests.log" 2>/dev/null
grep -h "^|" "$out/bench.log" "$out/torch.log" 2>/dev/null
exit "$status"
