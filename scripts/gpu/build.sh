#!/usr/bin/env bash
# Builds the GPU test and benchmark binaries on the build machine (which has no GPU) and
# stages them, stripped of debug info, in .device/bin/ for a machine with an NVIDIA GPU (which
# has no Rust toolchain). Copy the repository with .device/ there and run scripts/gpu/run.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
# The kernels are compiled here, ahead of time, for the GPU machine's architecture (H100,
# H200: sm_90a, compute capability 9.0 with its arch-specific instructions; FERRITE_CUDA_ARCHS overrides, empty for none) and embedded in the binaries, so runs
# there start without compiling. That needs NVRTC here: from the library path, else from the
# nvidia-cuda-nvrtc Python wheel when it is installed.
export FERRITE_CUDA_ARCHS="${FERRITE_CUDA_ARCHS-sm_90a}"
if ! ldconfig -p 2>/dev/null | grep -q 'libnvrtc\.so'; then
  wheel=$(python3 -c 'import importlib.util, os
s = importlib.util.find_spec("nvidia")
print(next((os.path.join(p, "cu13", "lib") for p in (s.submodule_search_locations if s else [])
            if os.path.isdir(os.path.join(p, "cu13", "lib"))), ""))' 2>/dev/null || true)
  [ -n "$wheel" ] && export LD_LIBRARY_PATH="$wheel${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
# The NVRTC release shapes the kernels' code, and their speed by a few percent either way
# (paged_attn's decode: docs/benchmarks.md, "NVRTC's release"): the figures there since
# 2026-12-04 are of kernels compiled by NVRTC 13.5 (`pip install nvidia-cuda-nvrtc==13.5.37`);
# `ferrite bench --json` reports the release as "kernels".
want=13.5
have=$(python3 -c 'import ctypes
l = ctypes.CDLL("libnvrtc.so.13"); a, b = ctypes.c_int(), ctypes.c_int()
l.nvrtcVersion(ctypes.byref(a), ctypes.byref(b)); print(f"{a.value}.{b.value}")' 2>/dev/null || echo none)
if [ "$have" != "$want" ]; then
  echo "build.sh: NVRTC $have here, not $want: the kernels' speed may differ from docs/benchmarks.md" >&2
fi
out=.device/bin
rm -rf "$out"
mkdir -p "$out"

# name-in-.device  cargo-args
stage() {
  local name=$1; shift
  local exe
  exe=$(cargo "$@" --message-format=json 2>/dev/null | python3 -c '
import json, sys
exes = [m["executable"] for m in map(json.loads, sys.stdin)
        if m.get("reason") == "compiler-artifact" and m.get("executable")]
print(exes[-1] if exes else "")')
  if [ -z "$exe" ]; then echo "build.sh: no executable from: cargo $*" >&2; exit 1; fi
  strip --strip-debug -o "$out/$name" "$exe"
  echo "staged $out/$name ($(du -h "$out/$name" | cut -f1))"
}

stage cuda-tests test -p ferrite-cuda --test cuda --no-run
stage llm-gpu-tests test -p ferrite-llm --test gpu --no-run
stage train-gpu-tests test -p ferrite-train --test gpu --no-run
stage serve-gpu-tests test -p ferrite-serve --test gpu --no-run
stage cuda-ops-bench bench -p ferrite-cuda --bench cuda_ops --no-run
stage mlp-bench bench -p ferrite-cuda --bench mlp_bf16 --no-run
stage conv-bench bench -p ferrite-cuda --bench conv_resnet50 --no-run
stage nn-gpu-tests test -p ferrite-nn --test gpu --no-run
stage ce-bench bench -p ferrite-nn --bench cross_entropy_gpu --no-run
stage optim-bench bench -p ferrite-train --bench optim_step --no-run
stage attn-bench bench -p ferrite-cuda --bench attention --no-run
stage train-bench bench -p ferrite-train --bench train_step --no-run
stage wgpu-tests test -p ferrite-wgpu --test wgpu --no-run
stage wgpu-bench bench -p ferrite-wgpu --bench bandwidth --no-run
stage llm-wgpu-tests test -p ferrite-llm --test wgpu --no-run
stage serve-wgpu-tests test -p ferrite-serve --test wgpu --no-run
# The GPU machine has NVIDIA's Vulkan driver (ICD) but no Vulkan loader: carry Debian's loader
# (and the EGL/GLVND libraries the ICD links) as .debs; run.sh unpacks them there.
mkdir -p .device/debs
(cd .device/debs && apt-get download libvulkan1 libegl1 libglvnd0 >/dev/null 2>&1) \
  || echo "build.sh: apt-get download of the Vulkan loader failed; wgpu runs will be skipped" >&2
if [ "${1:-}" != "--no-cli" ]; then
  cargo build --release -p ferrite
  strip --strip-debug -o "$out/ferrite" target/release/ferrite
  echo "staged $out/ferrite"
fi
du -sh .device
