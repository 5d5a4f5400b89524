"""Reference timings for `cargo bench -p ferrite-cpu --bench cpu_ops` (which runs this script
in the same run): NumPy (OpenBLAS) sgemm 1024^3 and elementwise add over 16M f32.
Prints one line of JSON: median seconds per op."""
import json
import time

import numpy as np


def median_time(f, reps):
    f()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    ts.sort()
    return ts[len(ts) // 2]


rng = np.random.default_rng(0)
a = rng.standard_normal((1024, 1024), dtype=np.float32)
b = rng.standard_normal((1024, 1024), dtype=np.float32)
x = rng.standard_normal(16 << 20, dtype=np.float32)
y = rng.standard_normal(16 << 20, dtype=np.float32)
print(json.dumps({
    "numpy": np.__version__,
    "sgemm_1024": median_time(lambda: a @ b, 20),
    "add_16m": median_time(lambda: x + y, 20),
}))
