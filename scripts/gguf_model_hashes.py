#!/usr/bin/env python3
"""Records, for each reference model, the sha256 of every tensor dequantized to float32 by the
PyPI `gguf` package (gguf.quants.dequantize), little-endian, in GGUF element order.

    pip install gguf numpy
    python3 scripts/gguf_model_hashes.py SMOLLM2.gguf GEMMA3.gguf > crates/gguf/tests/fixtures/model_hashes.json

(the paths are what `ferrite_gguf::fetch` returns: $FERRITE_CACHE or ~/.cache/ferrite/models).
The Rust test real_models.rs compares its own dequantization against this file.
"""
import hashlib
import json
import os
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


def model_hashes(path):
    r = GGUFReader(path)
    out = {}
    for t in r.tensors:
        x = dequantize(t.data, t.tensor_type).astype("<f4", copy=False)
        x = np.ascontiguousarray(x)
        assert x.size == int(np.prod(t.shape)), t.name
        out[t.name] = {
            "type": t.tensor_type.name,
            "dims": [int(d) for d in t.shape],
            "sha256": hashlib.sha256(x.tobytes()).hexdigest(),
        }
    return out


def main():
    result = {}
    for path in sys.argv[1:]:
        result[os.path.basename(path)] = model_hashes(path)
        print(f"{path}: {len(result[os.path.basename(path)])} tensors", file=sys.stderr)
    json.dump(result, sys.stdout, indent=1, sort_keys=True)
    print()


if __name__ == "__main__":
    main()
