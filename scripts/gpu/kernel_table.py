"""Per-kernel time table of an Nsight Compute CSV (`ncu --metrics gpu__time_duration.sum --csv`):
the profiled launches grouped by kernel name, with launches and milliseconds per step.

Usage: python3 kernel_table.py PROFILE.csv STEPS [TOP]
STEPS is how many training (or decode) steps the profiled launches cover, e.g. the
`--launch-count` given to ncu divided by the launches per step that the benchmark prints."""
import csv
import sys
from collections import defaultdict

path, steps = sys.argv[1], float(sys.argv[2])
top = int(sys.argv[3]) if len(sys.argv) > 3 else 30
rows = list(csv.reader(line for line in open(path) if line.startswith('"')))
head, rows = rows[0], rows[1:]
col = {n: i for i, n in enumerate(head)}
agg = defaultdict(lambda: [0, 0.0])
for r in rows:
    if r[col["Metric Name"]] != "gpu__time_duration.sum":
        continue
    name = r[col["Kernel Name"]].split("(")[0].split("<")[0]
    ns = float(r[col["Metric Value"]].replace(",", ""))
    if r[col["Metric Unit"]] in ("usecond", "us"):
        ns *= 1e3
    elif r[col["Metric Unit"]] in ("msecond", "ms"):
        ns *= 1e6
    agg[name][0] += 1
    agg[name][1] += ns
total = sum(v[1] for v in agg.values())
print(f"{len(rows)} launches, {total / steps / 1e6:.3f} ms of kernel time per step over {steps:g} steps")
print("| kernel | launches/step | ms/step | share |")
print("|---|---:|---:|---:|")
for name, (n, ns) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:top]:
    print(f"| {name} | {n / steps:.1f} | {ns / steps / 1e6:.3f} | {100 * ns / total:.1f}% |")
