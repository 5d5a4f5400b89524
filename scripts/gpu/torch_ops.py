"""PyTorch references for crates/cuda/benches/cuda_ops.rs, measured the same way (CUDA events
around `reps` calls after a warm-up, median of 5 samples). Run on the machine with the GPU."""
import torch

def timed(f, reps):
    for _ in range(3):
        f()
    torch.cuda.synchronize()
    out = []
    for _ in range(5):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(reps):
            f()
        e.record()
        e.synchronize()
        out.append(s.elapsed_time(e) / reps)
    out.sort()
    return out[len(out) // 2]

def main():
    dev = torch.device("cuda")
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}")
    n = 64 << 20
    a = torch.rand(n, device=dev) * 2 - 1
    b = torch.rand(n, device=dev) * 2 - 1
    rows = []
    ms = timed(lambda: a.clone(), 20)
    rows.append(("copy 64M f32 (clone)", f"{2 * 4 * n / ms / 1e6:.0f} GB/s"))
    ms = timed(lambda: a + b, 20)
    rows.append(("add 64M f32", f"{3 * 4 * n / ms / 1e6:.0f} GB/s"))
    ms = timed(lambda: a.sum(), 20)
    rows.append(("sum 64M f32", f"{4 * n / ms / 1e6:.0f} GB/s"))
    x = torch.rand(8192, 4096, device=dev) * 6 - 3
    w = torch.rand(4096, device=dev) + 0.5
    ms = timed(lambda: torch.softmax(x, -1), 20)
    rows.append(("softmax 8192x4096 f32", f"{2 * 4 * 8192 * 4096 / ms / 1e6:.0f} GB/s"))
    ms = timed(lambda: torch.nn.functional.rms_norm(x, (4096,), w, 1e-5), 20)
    rows.append(("rms_norm 8192x4096 f32", f"{2 * 4 * 8192 * 4096 / ms / 1e6:.0f} GB/s"))
    m = 8192
    # Uniform in [-1, 1) like the Rust bench: the data's sign pattern changes the power draw
    # (and so the clocks) of a long GEMM by a few percent.
    p = (torch.rand(m, m, device=dev) * 2 - 1).bfloat16()
    q = (torch.rand(m, m, device=dev) * 2 - 1).bfloat16()
    ms = timed(lambda: p @ q, 5)
    rows.append(("matmul bf16 8192^3", f"{2 * m ** 3 / ms / 1e9:.0f} TFLOP/s"))
    print("\n| benchmark | PyTorch |\n|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} |")

if __name__ == "__main__":
    main()
