#!/usr/bin/env python3
"""Register, spill and instruction report of ferrite's LLM CUDA kernels, on a machine without a GPU.

Compiles one kernel source of crates/cuda/src (its files concatenated as the crate's
`KernelSource` does: common.cuh, then the listed files) with NVRTC for an architecture,
with `ptxas -v`, and prints each matching kernel's registers, stack and spills. With
`--only`, every other `extern "C"` kernel of one line and every `*_KERNELS(...)` instantiation
is dropped first and the named instantiations are compiled alone (a second instead of
minutes for matvec.cu). With `--sass`, the cubin goes through cuobjdump (it needs nvdisasm
on PATH) and the instruction mix around each matching kernel's first to last `IMMA` (its
unit loop) is counted.

NVRTC comes from a CUDA install or PyPI (`pip install nvidia-cuda-nvrtc`); cuobjdump and
nvdisasm from PyPI too (`nvidia-cuda-cuobjdump`, `nvidia-cuda-nvdisasm`). Point
LD_LIBRARY_PATH at the folder holding libnvrtc.so and libnvrtc-builtins.so.

Examples:
  scripts/gpu/kernel_report.py matvec.cu --match mmq2_q4_1
  scripts/gpu/kernel_report.py matvec.cu --sass --only \\
      'extern "C" __global__ void __launch_bounds__(MQ_W * 32) k(const MvArgs a) { mmq_run<FMT_Q4_1, 2, true>(a); }'
"""
import argparse
import collections
import ctypes
import ctypes.util
import glob
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
LLM = os.path.join(ROOT, "crates", "cuda", "src", "llm")
CUDA = os.path.join(ROOT, "crates", "cuda", "src")
COMMON = os.path.join(CUDA, "common.cuh")
# As crates/cuda/build.rs: each source's files after common.cuh (quant.cuh and matvec.cu in
# crates/cuda/src, the fused LLM kernels in crates/cuda/src/llm).
SOURCES = {
    "matvec.cu": ["quant.cuh", "matvec.cu"],
    "decode.cu": ["quant.cuh", "decode.cu"],
    "prefill.cu": ["quant.cuh", "decode.cu", "prefill.cu"],
    "sample.cu": ["quant.cuh", "sample.cu"],
    "paged.cu": ["quant.cuh", "decode.cu", "paged.cu"],
}


def nvrtc():
    for name in ["libnvrtc.so"] + sorted(glob.glob("/usr/local/cuda/lib64/libnvrtc.so*")):
        try:
            return ctypes.CDLL(name)
        except OSError:
            pass
    for d in os.environ.get("LD_LIBRARY_PATH", "").split(":"):
        for f in sorted(glob.glob(os.path.join(d, "libnvrtc.so*"))):
            return ctypes.CDLL(f)
    sys.exit("kernel_report: libnvrtc.so not found (set LD_LIBRARY_PATH)")


def compile_src(src, arch):
    lib = nvrtc()
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"k.cu", 0, None, None):
        sys.exit("kernel_report: nvrtcCreateProgram failed")
    # the options of crates/cuda/src/kernel_key.rs, then the report
    opts = [b"--std=c++17", b"-default-device", f"--gpu-architecture={arch}".encode(),
            b"--ptxas-options=-v"]
    rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    n = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetProgramLog(prog, log)
    log = log.value.decode(errors="replace")
    if rc:
        sys.exit(f"kernel_report: compile failed ({rc}):\n{log}")
    lib.nvrtcGetCUBINSize(prog, ctypes.byref(n))
    cubin = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetCUBIN(prog, cubin)
    return log, cubin.raw


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("source", choices=sorted(SOURCES))
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--match", default="", help="regex on kernel names to report")
    ap.add_argument("--only", action="append", default=[],
                    help="compile only these kernel definitions (one line each)")
    ap.add_argument("--sass", action="store_true", help="instruction mix of the IMMA loop")
    a = ap.parse_args()
    where = lambda f: CUDA if f in ("quant.cuh", "matvec.cu") else LLM
    parts = [open(COMMON).read()] + [
        open(os.path.join(where(f), f)).read() for f in SOURCES[a.source]
    ]
    if a.only:
        last = parts[-1].split("\n")
        keep = [l for l in last if not re.match(r"^[A-Z0-9_]+_KERNELS\(", l)
                and not (l.startswith('extern "C" __global__') and l.rstrip().endswith("}"))]
        parts[-1] = "\n".join(keep + a.only)
    log, cubin = compile_src("".join(parts), a.arch)
    pat = re.compile(a.match)
    cur = None
    for line in log.splitlines():
        m = re.search(r"(?:Compiling entry function|Function properties for) '?(\w+)'?", line)
        if m:
            cur = m.group(1)
        if cur and pat.search(cur) and re.search(r"Used|spill|stack frame", line):
            print(f"{cur}: {line.split(':', 1)[-1].strip()}")
    if a.sass:
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(cubin)
            f.flush()
            sass = subprocess.run(["cuobjdump", "-sass", f.name], capture_output=True,
                                  text=True).stdout.splitlines()
        # per kernel: "Function : name" starts each one's listing
        funcs, name = {}, None
        for l in sass:
            m = re.search(r"Function : (\w+)", l)
            if m:
                name = m.group(1)
                funcs[name] = []
            elif name:
                funcs[name].append(l)
        for name, body in funcs.items():
            imma = [i for i, l in enumerate(body) if "IMMA" in l]
            if not pat.search(name) or not imma:
                continue
            ops = collections.Counter()
            for l in body[imma[0]:imma[-1] + 1]:
                m = re.match(r"\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)", l)
                if m:
                    ops[m.group(1)] += 1
            print(f"{name}: first to last IMMA: {sum(ops.values())} instructions")
            print("  " + "  ".join(f"{k} {v}" for k, v in ops.most_common(16)))

if __name__ == "__main__":
    main()
