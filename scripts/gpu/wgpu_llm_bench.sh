#!/usr/bin/env bash
# The LLM engine on wgpu (Vulkan on the NVIDIA driver) beside ferrite's own CUDA figures on the
# same GPU, for each MODEL: `ferrite bench` on CUDA (a session, decode chained), the CUDA
# engine at batch 1, `ferrite bench --device vulkan` (a session on the wgpu kernel set, decode
# chained; again with FERRITE_WGPU_CHAIN=0), and the wgpu engine at each of WGPU_BATCHES;
# one JSON line per run in OUTDIR/wgpu-llm.jsonl and a table with the wgpu/CUDA ratio (the
# issue's bars: SmolLM2 decode >= 50% of CUDA, the 8B-shaped Q4_0 >= 60%).
# Usage: scripts/gpu/wgpu_llm_bench.sh OUTDIR MODEL...
#   [env: P=512 N=128 R=2 WGPU_BATCHES="8" FERRITE_BIN=.device/bin/ferrite PROFILE=1]
# PROFILE=1 adds, per model, one wgpu run at batch 1 with FERRITE_WGPU_PROFILE=1: each
# kernel's GPU milliseconds per step in OUTDIR/profile-MODEL.txt (that run waits for the
# device after every step, so its tok/s is not one of the figures).
# The 8B-shaped model: `ferrite synth --preset llama3-8b --quant q4_0 -o llama3-8b-q4_0.gguf`.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=$1
shift
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/targets/x86_64-linux/lib:/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
export FERRITE_CACHE=${FERRITE_CACHE:-/tmp/ferrite-cache}
# Vulkan: Debian's loader from .device/debs (scripts/gpu/build.sh) beside NVIDIA's ICD.
root=.device/vk
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
bin=${FERRITE_BIN:-.device/bin/ferrite}
p=${P:-512}
n=${N:-128}
r=${R:-2}
log=$out/wgpu-llm.jsonl
: > "$log"
one() {
  "$bin" bench "$@" -p "$p" -n "$n" -r "$r" --json 2> >(tee -a "$out/wgpu-llm.err" >&2) \
    | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)))' >> "$log"
}
"$bin" devices | tee "$out/devices.txt"
for model in "$@"; do
  one -m "$model" --device cuda
  one -m "$model" --device cuda --batch 1
  one -m "$model" --device vulkan
  FERRITE_WGPU_CHAIN=0 one -m "$model" --device vulkan
  for b in ${WGPU_BATCHES:-8}; do
    one -m "$model" --device vulkan --batch "$b"
  done
  if [ "${PROFILE:-0}" = 1 ]; then
    FERRITE_WGPU_PROFILE=1 "$bin" bench -m "$model" --device vulkan -p "$p" -n "$n" -r 1 \
      > /dev/null 2> "$out/profile-$(basename "$model").txt"
    cat "$out/profile-$(basename "$model").txt"
  fi
done
python3 - "$log" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("| model | backend | batch | pp t/s | tg t/s | tg / CUDA best (batch 1) |")
print("| --- | --- | ---: | ---: | ---: | ---: |")
best = {}
for j in rows:
    name = j.get("model_file", j.get("model"))
    res = {r["test"][:2]: r for r in j["results"]}
    if "cuda" in j.get("backend", "").lower() and j.get("batch", 1) == 1:
        best[name] = max(best.get(name, 0), res.get("tg", {}).get("tok_s_mean", 0))
for j in rows:
    name = j.get("model_file", j.get("model"))
    res = {r["test"][:2]: r for r in j["results"]}
    pp, tg = res.get("pp", {}).get("tok_s_mean", 0), res.get("tg", {}).get("tok_s_mean", 0)
    b = j.get("batch", 1)
    ratio = f"{tg / best[name]:.0%}" if best.get(name) and b == 1 else "-"
    mode = f", {j['mode']}" if j.get("mode") else ""
    if j.get("pick_read_us"):
        mode += f", {j['pick_read_us']:.0f} us/token waiting for picks"
    print(f"| {name} | {j.get('backend')} ({j.get('device', '')}{mode}) | {b} | {pp:.0f} | {tg:.1f} | {ratio} |")
PY
