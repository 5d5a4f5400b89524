#!/usr/bin/env bash
# Per-kernel profile of GPU decode with Nsight Compute, on a machine with an NVIDIA GPU: runs
# `ferrite run` greedy on MODEL with kernels launched one by one (FERRITE_GPU_EAGER=1; each
# kernel is then timed alone, without the overlap PDL gives inside the replayed graph) and
# prints, per kernel, launches per token, time per token, DRAM bytes per token and achieved
# DRAM bandwidth, averaged over the decode steps after the first two.
# Usage: scripts/gpu/profile_decode.sh MODEL [OUTDIR] [extra `ferrite run` flags...]
set -euo pipefail
cd "$(dirname "$0")/../.."
model=$1
out=${2:-/tmp/ferrite-profile}
shift $(( $# < 2 ? $# : 2 ))
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/targets/x86_64-linux/lib:/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
bin=${FERRITE_BIN:-.device/bin/ferrite}
FERRITE_GPU_EAGER=1 "$ncu" --clock-control none --csv --print-units base --log-file "$out/ncu.csv" \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
  "$bin" run -m "$model" --device cuda --temp 0 -n 6 "$@" hello >"$out/run.out" 2>"$out/run.err"
python3 scripts/gpu/profile_summary.py "$out/ncu.csv" | tee "$out/profile.txt"
