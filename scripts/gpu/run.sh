#!/usr/bin/env bash
# Runs the staged GPU binaries (scripts/gpu/build.sh) on a machine with an NVIDIA GPU and
# prints a summary. Usage: scripts/gpu/run.sh [tests|bench|all|wgpu] [OUTDIR] [-- test filter]
# `wgpu` runs only the wgpu backend's tests, the LLM engine's and the server's wgpu tests and the bandwidth
# bench through Vulkan (the Vulkan loader comes from the .debs build.sh staged; the NVIDIA ICD
# is the machine's own). The LLM engine's wgpu-vs-CUDA figures: scripts/gpu/wgpu_llm_bench.sh.
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
# Vulkan for the wgpu backend: Debian's loader unpacked from .device/debs beside NVIDIA's ICD.
setup_vulkan() {
  local root=.device/vk
  if [ -d .device/debs ] && [ ! -d "$root" ]; then
    mkdir -p "$root"
    for deb in .device/debs/*.deb; do dpkg -x "$deb" "$root"; done
  fi
  export LD_LIBRARY_PATH=$PWD/$root/usr/lib/x86_64-linux-gnu:$LD_LIBRARY_PATH
  if [ -z "${VK_DRIVER_FILES:-}" ]; then
    for icd in /usr/share/vulkan/icd.d/nvidia_icd.json /etc/vulkan/icd.d/nvidia_icd.json \
               /usr/local/nvidia/icd.d/nvidia_icd.json; do
      if [ -f "$icd" ]; then export VK_DRIVER_FILES=$icd; break; fi
    done
  fi
  echo "vulkan: loader $(ls $root/usr/lib/x86_64-linux-gnu/libvulkan.so.1 2>/dev/null || echo missing), ICD ${VK_DRIVER_FILES:-not found}"
}
run_wgpu() {
  setup_vulkan
  .device/bin/wgpu-tests "$@" 2>&1 | tee "$out/wgpu-tests.log"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
  .device/bin/llm-wgpu-tests "$@" 2>&1 | tee "$out/llm-wgpu-tests.log"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
  .device/bin/serve-wgpu-tests "$@" 2>&1 | tee "$out/serve-wgpu-tests.log"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
  .device/bin/wgpu-bench 2>&1 | tee "$out/wgpu-bench.log"
}
if [ "$mode" = wgpu ]; then
  run_wgpu "$@"
  echo "== summary"
  grep -h "wgpu tests:\|^failed:\|^adapter:" "$out/wgpu-tests.log" "$out/llm-wgpu-tests.log" \
    "$out/serve-wgpu-tests.log" 2>/dev/null
  grep -h "^|" "$out/wgpu-bench.log" 2>/dev/null
  exit "$status"
fi
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
  .device/bin/attn-bench 2>&1 | tee -a "$out/bench.log"
  python3 scripts/gpu/torch_attention.py 2>&1 | tee -a "$out/torch.log"
  # Training steps/s of the reference workloads (seed CNN, MLP, char-GPT, GPT-2 124M) beside
  # torch_train.py and gpt2_train.py, from ../shared/reference or a copy in .device/reference.
  .device/bin/train-bench seed-cnn mlp char-gpt gpt2 2>&1 | tee -a "$out/bench.log"
  for dir in ../shared/reference shared/reference .device/reference; do
    if [ -f "$dir/torch_train.py" ]; then
      python3 "$dir/torch_train.py" 2>&1 | tee -a "$out/torch.log"
      python3 "$dir/gpt2_train.py" 16 1024 20 2>&1 | tee -a "$out/torch.log"
      break
    fi
  done
  # char-GPT alone in its process per mode (its peak memory its own), the whole-step graph
  # included.
  for m in eager compile graph; do
    python3 scripts/gpu/torch_char_gpt.py "$m" 2>&1 | tee -a "$out/torch.log"
  done
fi
echo "== summary"
grep -h "cuda tests:\|gpu tests:\|^failed:" "$out/tests.log" "$out/llm-tests.log" "$out/nn-tests.log" "$out/train-tests.log" "$out/serve-tests.log" 2>/dev/null
grep -h "^|" "$out/bench.log" "$out/torch.log" 2>/dev/null
grep -h "\"workload\"\|^anchor gpt2" "$out/bench.log" "$out/torch.log" 2>/dev/null
exit "$status"
