"""PyTorch reference for crates/cuda/benches/conv_resnet50.rs: conv2d forward and backward
(input + weight gradients, no bias) over ResNet-50's 23 distinct convolution shapes, bf16 on
CUDA (cuDNN, torch.backends.cudnn.benchmark on), batch 64 by default. Timed like the Rust
bench: CUDA events around 10 repetitions after a warm-up, median of 5. Prints the same table.

Run: python3 scripts/gpu/torch_conv.py [batch]
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from conv_bench_torch import SHAPES  # noqa: E402  (scripts/conv_bench_torch.py)


def timed(f):
    f()
    torch.cuda.synchronize()
    samples = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(10):
            f()
        b.record()
        b.synchronize()
        samples.append(a.elapsed_time(b) / 10)
    samples.sort()
    return samples[2]


def main():
    batch = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    torch.backends.cudnn.benchmark = True
    dev, bf = "cuda", torch.bfloat16
    print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, {torch.cuda.get_device_name()}")
    print(f"torch conv2d bf16, batch {batch}, median of 5 (ms)")
    print("| layer | fwd | bwd (input + weight) | fwd + bwd |")
    print("|---|---|---|---|")
    tf = tb = 0.0
    with torch.no_grad():
        for name, cin, cout, k, s, p, hw in SHAPES:
            x = torch.randn(batch, cin, hw, hw, device=dev, dtype=bf)
            w = torch.randn(cout, cin, k, k, device=dev, dtype=bf) * 0.05
            y = torch.nn.functional.conv2d(x, w, stride=s, padding=p)
            g = torch.randn_like(y)
            f = timed(lambda: torch.nn.functional.conv2d(x, w, stride=s, padding=p))
            b = timed(lambda: torch.ops.aten.convolution_backward(
                g, x, w, None, [s, s], [p, p], [1, 1], False, [0, 0], 1, [True, True, False]))
            tf += f
            tb += b
            print(f"| {name} | {f:.3f} | {b:.3f} | {f + b:.3f} |")
    print(f"| total | {tf:.2f} | {tb:.2f} | {tf + tb:.2f} |")


if __name__ == "__main__":
    main()
