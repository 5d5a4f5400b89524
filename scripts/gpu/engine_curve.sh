#!/usr/bin/env bash
# The CUDA engine's batch curve on a machine with an NVIDIA GPU: for each MODEL, one sequence
# (`ferrite bench`, `Session::cuda`) and then the engine (`ferrite bench --batch B`), both the
# CUDA kernel set of the one model definition, at B = 1, 2, 4, ... 64, each
# sequence with a -p token prompt and -n generated tokens; one JSON line per run in
# OUTDIR/curve.jsonl and a table on stdout.
# Usage: scripts/gpu/engine_curve.sh OUTDIR MODEL... [env: P=512 N=128 R=2 BATCHES="1 2 4 8 16 32 64"]
set -uo pipefail
cd "$(dirname "$0")/../.."
out=$1
shift
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/targets/x86_64-linux/lib:/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
export FERRITE_CACHE=${FERRITE_CACHE:-/tmp/ferrite-cache}
bin=${FERRITE_BIN:-.device/bin/ferrite}
p=${P:-512}
n=${N:-128}
r=${R:-2}
: > "$out/curve.jsonl"
for model in "$@"; do
  "$bin" bench -m "$model" --device cuda -p "$p" -n "$n" -r "$r" --json \
    | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)))' >> "$out/curve.jsonl"
  for b in ${BATCHES:-1 2 4 8 16 32 64}; do
    "$bin" bench -m "$model" --device cuda --batch "$b" -p "$p" -n "$n" -r "$r" --json \
      | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)))' >> "$out/curve.jsonl"
  done
done
python3 - "$out/curve.jsonl" <<'PY'
import json, sys
print("| model | backend | batch | pp t/s | tg aggregate t/s | tg per sequence t/s |")
print("| --- | --- | ---: | ---: | ---: | ---: |")
for line in open(sys.argv[1]):
    j = json.loads(line)
    res = {r["test"][:2]: r for r in j["results"]}
    pp, tg = res.get("pp", {}), res.get("tg", {})
    b = j.get("batch", 1)
    name = j.get("model_file", j.get("model"))
    backend = j.get("backend") if "batch" in j else "session (" + j.get("mode", "") + ")"
    per = tg.get("per_sequence_tok_s_mean", tg.get("tok_s_mean", 0))
    print(f"| {name} | {backend} | {b} | {pp.get('tok_s_mean', 0):.0f} | {tg.get('tok_s_mean', 0):.1f} | {per:.1f} |")
PY
