#!/usr/bin/env python3
"""Writes the quantization fixtures of ferrite-gguf, from the reference PyPI `gguf` package.

    pip install gguf numpy && python3 scripts/gguf_fixtures.py

Into crates/gguf/tests/fixtures/quant/ (all little-endian, no headers):
  <TYPE>.blocks  random valid blocks (finite f16 scales)      -> <TYPE>.deq.f32  = gguf.quants.dequantize
  <TYPE>.src.f32 random floats (types gguf can quantize)       -> <TYPE>.quant    = gguf.quants.quantize
and crates/gguf/tests/fixtures/pywriter.gguf, a file written by gguf.GGUFWriter with every
metadata value type and a few tensors, to check that files from the reference writer read back.
Deterministic (fixed seed); the Rust tests compare against these files without Python.
"""
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "crates", "gguf", "tests", "fixtures")
OUT = os.path.join(ROOT, "quant")

rng = np.random.default_rng(20260522)

# Byte offsets of the f16 fields (scales, mins) in each block layout (ggml-common.h).
F16_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
}
DEQUANT_TYPES = [T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0,
                 T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K]
QUANT_TYPES = [T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]


def random_f16(n):
    """Finite f16 values of mixed sign spanning several binades, with a few zeros."""
    v = rng.standard_normal(n).astype(np.float32) * np.float32(2.0) ** rng.integers(-12, 4, n)
    v[rng.random(n) < 0.05] = 0
    return v.astype(np.float16)


def random_blocks(qtype, n_blocks):
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    if qtype == T.F16:
        return random_f16(n_blocks * block_size).view(np.uint8)
    if qtype == T.BF16:
        bits = rng.integers(0, 1 << 16, n_blocks * block_size, dtype=np.uint32).astype(np.uint16)
        exp = (bits >> 7) & 0xFF
        bits[exp == 0xFF] &= 0xBFFF  # no inf/NaN: clear the exponent's top bit
        return bits.view(np.uint8)
    raw = rng.integers(0, 256, (n_blocks, type_size), dtype=np.uint8)
    for off in F16_FIELDS[qtype]:
        raw[:, off:off + 2] = random_f16(n_blocks).view(np.uint8).reshape(n_blocks, 2)
    return raw.reshape(-1)


def main():
    os.makedirs(OUT, exist_ok=True)
    for qtype in DEQUANT_TYPES:
        block_size, _ = GGML_QUANT_SIZES[qtype]
        n_blocks = 1024 // block_size if block_size == 1 else (12 if block_size == 256 else 48)
        blocks = random_blocks(qtype, n_blocks)
        deq = gguf.quants.dequantize(blocks, qtype).astype(np.float32).reshape(-1)
        assert deq.size == n_blocks * block_size and np.isfinite(deq).all(), qtype.name
        blocks.tofile(os.path.join(OUT, f"{qtype.name}.blocks"))
        deq.astype("<f4").tofile(os.path.join(OUT, f"{qtype.name}.deq.f32"))
    for qtype in QUANT_TYPES:
        src = (rng.standard_normal(32 * 40) * rng.choice([1e-3, 0.1, 1.0, 30.0], 32 * 40)).astype(np.float32)
        src[:32] = 0.0  # an all-zero block
        src[32:64] = np.linspace(-1, 1, 32, dtype=np.float32)  # ties in rounding
        q = gguf.quants.quantize(src.reshape(-1, 32 * 40), qtype)
        src.astype("<f4").tofile(os.path.join(OUT, f"{qtype.name}.src.f32"))
        np.ascontiguousarray(q).view(np.uint8).reshape(-1).tofile(os.path.join(OUT, f"{qtype.name}.quant"))
    write_pywriter(os.path.join(ROOT, "pywriter.gguf"))
    total = sum(os.path.getsize(os.path.join(d, f)) for d in (OUT,) for f in os.listdir(d))
    print(f"wrote {OUT} ({total} bytes) and pywriter.gguf", file=sys.stderr)


def write_pywriter(path):
    w = gguf.GGUFWriter(path, arch="llama")
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4000000000)
    w.add_int32("t.i32", -2000000000)
    w.add_float32("t.f32", 0.15625)
    w.add_uint64("t.u64", 18000000000000000000)
    w.add_int64("t.i64", -9000000000000000000)
    w.add_float64("t.f64", -2.5e-300)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo ✓")
    w.add_array("t.arr_i32", [1, -2, 3])
    w.add_array("t.arr_str", ["a", "", "ü"])
    w.add_array("t.arr_f32", [0.5, -1.25])
    w.add_array("t.nested", [[1, 2], [3]])
    x = (np.arange(64 * 3, dtype=np.float32) - 96) / 16
    w.add_tensor("f32", x.reshape(3, 64))
    w.add_tensor("f16", x.astype(np.float16).reshape(3, 64))
    q = gguf.quants.quantize(x.reshape(3, 64), T.Q8_0)
    w.add_tensor("q8_0", q, raw_shape=q.shape, raw_dtype=T.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
