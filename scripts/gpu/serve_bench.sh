#!/usr/bin/env bash
# `ferrite serve` beside llama.cpp's `llama-server` on a machine with an NVIDIA GPU, one model,
# the same load tool (`ferrite bench-serve`: streaming /v1/completions, ~16-token prompt,
# 128 generated tokens per request with ignore_eos, N concurrent clients, 2N requests), each
# server warmed up first (64 then 1 short requests, not recorded).
# Usage: scripts/gpu/serve_bench.sh OUTDIR MODEL [LLAMA_SERVER_BIN]
#   env: CLIENTS="1 8 32 64" PARALLEL=64 CTX=512 (per sequence) FERRITE_BIN=.device/bin/ferrite
#        TEMP=0 (the requests' temperature; OpenAI's default is 1)
# llama-server runs with -np PARALLEL, a context of PARALLEL*CTX, flash attention, all layers
# on the GPU. One JSON line per run in OUTDIR/serve.jsonl and a table on stdout.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=$1
model=$2
llama=${3:-}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/targets/x86_64-linux/lib:/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
bin=${FERRITE_BIN:-.device/bin/ferrite}
par=${PARALLEL:-64}
ctx=${CTX:-512}
prompt="Write a long story about a lighthouse keeper who finds a message in a bottle."
: > "$out/serve.jsonl"

wait_healthy() { # port
  for _ in $(seq 1 600); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$1/health")" = 200 ] && return 0
    sleep 0.5
  done
  echo "serve_bench.sh: the server on port $1 did not become healthy" >&2
  return 1
}

bench() { # name port
  # warm-up, not recorded: kernel compilation and graph capture for every batch size happen
  # at first use (a cold first request waits for them)
  "$bin" bench-serve "http://127.0.0.1:$2" -c 64 -r 64 --max-tokens 16 --prompt "$prompt" \
    --json > /dev/null 2>&1
  "$bin" bench-serve "http://127.0.0.1:$2" -c 1 -r 2 --max-tokens 16 --prompt "$prompt" \
    --json > /dev/null 2>&1
  for n in ${CLIENTS:-1 8 32 64}; do
    "$bin" bench-serve "http://127.0.0.1:$2" -c "$n" -r $((2 * n)) --max-tokens 128 \
      --prompt "$prompt" --temp "${TEMP:-0}" --json \
      | python3 -c 'import json,sys; j=json.load(sys.stdin); j["server"]=sys.argv[1]; print(json.dumps(j))' "$1" \
      >> "$out/serve.jsonl"
  done
}

"$bin" serve -m "$model" --device cuda --parallel "$par" --ctx "$ctx" --port 8090 \
  > "$out/ferrite-serve.log" 2>&1 &
fpid=$!
wait_healthy 8090 && bench ferrite 8090
kill -TERM "$fpid"
wait "$fpid"

if [ -n "$llama" ]; then
  "$llama" -m "$model" -ngl 99 -np "$par" -c $((par * ctx)) -fa --port 8091 \
    > "$out/llama-server.log" 2>&1 &
  lpid=$!
  wait_healthy 8091 && bench llama-server 8091
  kill -TERM "$lpid"
  wait "$lpid"
fi

python3 - "$out/serve.jsonl" <<'PY'
import json, sys
print("| server | clients | requests ok | aggregate tok/s | TTFT p50 ms | TTFT p90 ms | inter-token p50 ms | p90 ms | p99 ms |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for line in open(sys.argv[1]):
    j = json.loads(line)
    t, i = j["ttft_seconds"], j["inter_token_seconds"]
    print(f"| {j['server']} | {j['clients']} | {j['requests_ok']}/{j['requests_ok'] + j['requests_failed']} "
          f"| {j['tokens_per_second']:.0f} | {t['p50']*1e3:.1f} | {t['p90']*1e3:.1f} "
          f"| {i['p50']*1e3:.2f} | {i['p90']*1e3:.2f} | {i['p99']*1e3:.2f} |")
PY
