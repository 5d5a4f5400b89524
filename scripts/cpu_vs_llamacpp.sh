#!/usr/bin/env bash
# CPU decode and prefill of ferrite beside llama.cpp's CPU build, on the same GGUF file, in one
# run (figures for docs/benchmarks.md). Builds llama.cpp's `llama-bench` (CPU only) from the
# reference tarball into dev/out/llama.cpp (ignored) the first time; then alternates the two
# programs REPS times so that load changes hit both alike.
#
# Usage: scripts/cpu_vs_llamacpp.sh [-m FILE] [-t THREADS] [-p N_PROMPT] [-n N_GEN] [-r REPS]
#          [--precision P]
# Defaults: the default model (SmolLM2-135M-Instruct Q4_1, fetched by ferrite), -t 2, -p 128,
# -n 64, -r 3, ferrite's default precision. Environment: LLAMA_TGZ (the tarball),
# FERRITE (the ferrite binary; default: built here with cargo build --release), JOBS (build
# parallelism, default 1: the build machine is shared), LLAMA_CMAKE_FLAGS (extra cmake flags,
# e.g. "-DGGML_NATIVE=OFF" for a portable build; the default is a native build, which uses
# AVX-512 where the CPU has it; set LLAMA_OUT to keep builds with different flags apart).
set -euo pipefail
cd "$(dirname "$0")/.."
model="" threads=2 np=128 ng=64 reps=3 precision=()
while [ $# -gt 0 ]; do
    case "$1" in
        -m) model="$2"; shift 2 ;;
        -t) threads="$2"; shift 2 ;;
        -p) np="$2"; shift 2 ;;
        -n) ng="$2"; shift 2 ;;
        -r) reps="$2"; shift 2 ;;
        --precision) precision=(--precision "$2"); shift 2 ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
done
tgz="${LLAMA_TGZ:-/work/shared/reference/llama.cpp-2025-02-20.tgz}"
out="${LLAMA_OUT:-dev/out/llama.cpp}"
bench="$out/build/bin/llama-bench"
if [ ! -x "$bench" ]; then
    command -v cmake >/dev/null || { echo "cmake is needed (apt-get install -y cmake)" >&2; exit 1; }
    mkdir -p "$out"
    [ -f "$out/src/CMakeLists.txt" ] || { mkdir -p "$out/src"; tar xzf "$tgz" -C "$out/src" --strip-components=1; }
    cmake -S "$out/src" -B "$out/build" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=OFF \
        -DGGML_METAL=OFF -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_SERVER=OFF ${LLAMA_CMAKE_FLAGS:-} >"$out/build.log" 2>&1
    cmake --build "$out/build" --target llama-bench -j "${JOBS:-1}" >>"$out/build.log" 2>&1 \
        || { echo "llama.cpp build failed; see $out/build.log" >&2; exit 1; }
fi
ferrite="${FERRITE:-}"
if [ -z "$ferrite" ]; then
    cargo build --release --quiet
    ferrite="${CARGO_TARGET_DIR:-target}/release/ferrite"
fi
if [ -z "$model" ]; then
    # Fetches the default model on first use and prints its path.
    model=$("$ferrite" run -n 1 --temp 0 "x" 2>&1 >/dev/null | sed -n 's/^model: \(.*\) (default)$/\1/p')
fi
[ -f "$model" ] || { echo "model file not found: $model" >&2; exit 1; }
echo "model: $model; threads $threads; pp$np tg$ng; $reps alternating runs; $(date -u +%FT%TZ)"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
for i in $(seq "$reps"); do
    echo "== run $i: llama.cpp"
    "$bench" -m "$model" -t "$threads" -p "$np" -n "$ng" -r 3 -o md | grep -E '^\|'
    echo "== run $i: ferrite ${precision[*]}"
    FERRITE_THREADS="$threads" "$ferrite" bench -m "$model" -p "$np" -n "$ng" -r 3 "${precision[@]}" | grep -E '^\|'
done
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
