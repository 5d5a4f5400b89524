"""PyTorch reference for `cargo bench -p ferrite-cpu --bench conv_resnet50`: conv2d forward
and backward (input + weight gradients, no bias) over ResNet-50's 23 distinct convolution
shapes, f32 on the CPU, same batch (default 8), same thread count (default: all CPUs, as
rayon), median of 5 after a warm-up. Prints the same table.

Run: python3 scripts/conv_bench_torch.py [batch] [threads]
     python3 scripts/conv_bench_torch.py fashion-cnn [batch] [threads]
       (the 8 shapes of `ferrite train fashion-cnn`'s ResNet, batch 128 by default, as
       `cargo bench -p ferrite-cpu --bench conv_resnet50 -- fashion-cnn`)
"""
import os
import sys
import time

import torch

SHAPES = [  # name, cin, cout, k, stride, pad, hw (as crates/testing/src/bench_shapes.rs)
    ("stem 7x7/2", 3, 64, 7, 2, 3, 224),
    ("l1 1x1 64-64", 64, 64, 1, 1, 0, 56),
    ("l1 3x3 64-64", 64, 64, 3, 1, 1, 56),
    ("l1 1x1 64-256", 64, 256, 1, 1, 0, 56),
    ("l1 1x1 256-64", 256, 64, 1, 1, 0, 56),
    ("l2 1x1 256-128", 256, 128, 1, 1, 0, 56),
    ("l2 3x3/2 128", 128, 128, 3, 2, 1, 56),
    ("l2 1x1 128-512", 128, 512, 1, 1, 0, 28),
    ("l2 ds 1x1/2 256-512", 256, 512, 1, 2, 0, 56),
    ("l2 1x1 512-128", 512, 128, 1, 1, 0, 28),
    ("l2 3x3 128", 128, 128, 3, 1, 1, 28),
    ("l3 1x1 512-256", 512, 256, 1, 1, 0, 28),
    ("l3 3x3/2 256", 256, 256, 3, 2, 1, 28),
    ("l3 1x1 256-1024", 256, 1024, 1, 1, 0, 14),
    ("l3 ds 1x1/2 512-1024", 512, 1024, 1, 2, 0, 28),
    ("l3 1x1 1024-256", 1024, 256, 1, 1, 0, 14),
    ("l3 3x3 256", 256, 256, 3, 1, 1, 14),
    ("l4 1x1 1024-512", 1024, 512, 1, 1, 0, 14),
    ("l4 3x3/2 512", 512, 512, 3, 2, 1, 14),
    ("l4 1x1 512-2048", 512, 2048, 1, 1, 0, 7),
    ("l4 ds 1x1/2 1024-2048", 1024, 2048, 1, 2, 0, 14),
    ("l4 1x1 2048-512", 2048, 512, 1, 1, 0, 7),
    ("l4 3x3 512", 512, 512, 3, 1, 1, 7),
]

FASHION_CNN = [  # as FASHION_CNN_CONVS in crates/testing/src/bench_shapes.rs
    ("stem 3x3 1-24", 1, 24, 3, 1, 1, 28),
    ("l1 3x3 24", 24, 24, 3, 1, 1, 28),
    ("l2 3x3/2 24-48", 24, 48, 3, 2, 1, 28),
    ("l2 ds 1x1/2 24-48", 24, 48, 1, 2, 0, 28),
    ("l2 3x3 48", 48, 48, 3, 1, 1, 14),
    ("l3 3x3/2 48-96", 48, 96, 3, 2, 1, 14),
    ("l3 ds 1x1/2 48-96", 48, 96, 1, 2, 0, 14),
    ("l3 3x3 96", 96, 96, 3, 1, 1, 7),
]


def median(f, reps=5):
    f()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    ts.sort()
    return ts[len(ts) // 2]


def main():
    args = sys.argv[1:]
    shapes = SHAPES
    if args and args[0] == "fashion-cnn":
        shapes, args = FASHION_CNN, args[1:]
    batch = int(args[0]) if args else (128 if shapes is FASHION_CNN else 8)
    threads = int(args[1]) if len(args) > 1 else os.cpu_count()
    torch.set_num_threads(threads)
    print(f"torch {torch.__version__}, {threads} threads, mkldnn {torch.backends.mkldnn.is_available()}")
    print(f"conv2d f32, batch {batch}, median of 5 (ms)")
    print("| layer | fwd | bwd (input + weight) | fwd + bwd |")
    print("|---|---|---|---|")
    tf = tb = 0.0
    with torch.no_grad():
        for name, cin, cout, k, s, p, hw in shapes:
            x = torch.randn(batch, cin, hw, hw)
            w = torch.randn(cout, cin, k, k) * 0.05
            y = torch.nn.functional.conv2d(x, w, stride=s, padding=p)
            g = torch.randn_like(y)
            f = median(lambda: torch.nn.functional.conv2d(x, w, stride=s, padding=p))
            b = median(lambda: torch.ops.aten.convolution_backward(
                g, x, w, None, [s, s], [p, p], [1, 1], False, [0, 0], 1, [True, True, False]))
            tf += f
            tb += b
            print(f"| {name} | {f * 1e3:.2f} | {b * 1e3:.2f} | {(f + b) * 1e3:.2f} |")
    print(f"| total | {tf * 1e3:.1f} | {tb * 1e3:.1f} | {(tf + tb) * 1e3:.1f} |")


if __name__ == "__main__":
    main()
