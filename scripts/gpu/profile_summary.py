"""Summarizes an Nsight Compute CSV (one row per kernel launch and metric) of a `ferrite run`
decode: the launches between the 3rd and the last decode step's final kernel (the sampler's
or argmax's last kernel of a step), grouped by kernel name."""
import csv
import sys
from collections import OrderedDict, defaultdict

rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
head, rows = rows[0], rows[1:]
col = {n: i for i, n in enumerate(head)}
launch = OrderedDict()  # ID -> [name, {metric: value}]
for r in rows:
    lid = r[col["ID"]]
    name = r[col["Kernel Name"]].split("(")[0].split("<")[0]
    launch.setdefault(lid, [name, {}])[1][r[col["Metric Name"]]] = float(r[col["Metric Value"]].replace(",", ""))
seq = list(launch.values())
# A decode step ends with the step's last kernel; find it as the name that ends the run.
last = seq[-1][0]
ends = [i for i, (n, _) in enumerate(seq) if n == last]
if len(ends) < 4:
    sys.exit(f"profile_summary: only {len(ends)} steps ending in {last}")
lo, hi = ends[2] + 1, ends[-1] + 1
steps = len(ends) - 3
agg = defaultdict(lambda: [0, 0.0, 0.0])
for n, m in seq[lo:hi]:
    a = agg[n]
    a[0] += 1
    a[1] += m.get("gpu__time_duration.sum", 0.0)
    a[2] += m.get("dram__bytes_read.sum", 0.0) + m.get("dram__bytes_write.sum", 0.0)
tot_t = sum(a[1] for a in agg.values())
tot_b = sum(a[2] for a in agg.values())
print(f"decode steps profiled: {steps}; kernels per step: {(hi - lo) / steps:.0f}")
print(f"| kernel | launches/token | us/token | share | MB/token | GB/s |")
print(f"|---|---|---|---|---|---|")
for n, (c, t, b) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
    print(f"| {n} | {c / steps:.0f} | {t / steps / 1e3:.1f} | {100 * t / tot_t:.1f}% | {b / steps / 1e6:.2f} | {b / t if t else 0:.0f} |")
print(f"| total | {(hi - lo) / steps:.0f} | {tot_t / steps / 1e3:.1f} | 100% | {tot_b / steps / 1e6:.2f} | {tot_b / tot_t:.0f} |")
