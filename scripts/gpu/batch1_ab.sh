#!/usr/bin/env bash
# Batch-1 speed of two ferrite builds side by side on a machine with an NVIDIA GPU:
# `ferrite bench --device cuda -p P -n N` (one sequence: pp from an empty cache, then tg from
# an empty cache, as llama-bench) of build A and build B, interleaved ROUNDS times per MODEL,
# one JSON line per run in OUTDIR/ab.jsonl and a table of means (B / A in the last columns).
# Usage: scripts/gpu/batch1_ab.sh OUTDIR BIN_A BIN_B MODEL...   [env: P=512 N=128 R=3 ROUNDS=2]
set -uo pipefail
cd "$(dirname "$0")/../.."
out=$1
a=$2
b=$3
shift 3
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/targets/x86_64-linux/lib:/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
export FERRITE_CACHE=${FERRITE_CACHE:-/tmp/ferrite-cache}
p=${P:-512}
n=${N:-128}
r=${R:-3}
: > "$out/ab.jsonl"
for model in "$@"; do
  for round in $(seq "${ROUNDS:-2}"); do
    for side in A B; do
      bin=$a
      [ "$side" = B ] && bin=$b
      "$bin" bench -m "$model" --device cuda -p "$p" -n "$n" -r "$r" --json \
        | python3 -c 'import json,sys; j=json.load(sys.stdin); j["side"]=sys.argv[1]; print(json.dumps(j))' "$side" \
        >> "$out/ab.jsonl"
    done
  done
done
python3 - "$out/ab.jsonl" <<'PY'
import json, sys
from collections import defaultdict
runs = defaultdict(list)
for line in open(sys.argv[1]):
    j = json.loads(line)
    for r in j["results"]:
        runs[(j.get("model_file", j["model"]), r["test"], j["side"])].append(r["tok_s_mean"])
keys = sorted({(m, t) for (m, t, _) in runs})
print("| model | test | A t/s (each round) | B t/s (each round) | B / A |")
print("| --- | --- | ---: | ---: | ---: |")
for m, t in keys:
    a, b = runs[(m, t, "A")], runs[(m, t, "B")]
    fa = " / ".join(f"{v:,.1f}" for v in a)
    fb = " / ".join(f"{v:,.1f}" for v in b)
    ratio = (sum(b) / len(b)) / (sum(a) / len(a)) if a and b else float("nan")
    print(f"| {m} | {t} | {fa} | {fb} | {ratio:.3f} |")
PY
