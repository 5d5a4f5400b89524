#!/usr/bin/env bash
# Puts the reference model files into the model cache of a machine with an NVIDIA GPU that has
# no network, so the LLM GPU tests that need them (SmolLM2-135M-Instruct Q4_1, Gemma-3-270M
# Q4_K_M: transformers fixtures, default precision, engine vs CPU) run instead of reporting
# themselves skipped. The files come from the build machine's cache (`ferrite run` fetches
# them there), copied over whole or split (`split -b 50000000 -d -a 2 FILE FILE.`) where a
# transfer is size-limited. Each file is checked against its sha256 (../shared/data.md).
# Usage: scripts/gpu/models.sh DIR   (DIR holds FILE or FILE.00, FILE.01, ...; env FERRITE_CACHE,
# default /tmp/ferrite-cache, as scripts/gpu/run.sh)
set -euo pipefail
dir=$1
cache=${FERRITE_CACHE:-/tmp/ferrite-cache}
mkdir -p "$cache"
status=0
while read -r file sum; do
  dst=$cache/$file
  if [ -f "$dir/$file" ]; then
    cp "$dir/$file" "$dst.tmp"
  elif ls "$dir/$file".[0-9][0-9] >/dev/null 2>&1; then
    cat $(ls "$dir/$file".[0-9][0-9] | sort) > "$dst.tmp"
  else
    echo "$file: not in $dir (its GPU tests will report themselves skipped)"
    continue
  fi
  if [ "$(sha256sum "$dst.tmp" | cut -d' ' -f1)" = "$sum" ]; then
    mv "$dst.tmp" "$dst"
    echo "$file: in $cache"
  else
    rm -f "$dst.tmp"
    echo "$file: sha256 differs from $sum; not installed" >&2
    status=1
  fi
done <<'LIST'
SmolLM2-135M-Instruct.Q4_1.gguf b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
gemma-3-270m-q4_k_m.gguf a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
LIST
exit $status
