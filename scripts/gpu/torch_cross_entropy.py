"""PyTorch reference for crates/nn/benches/cross_entropy_gpu.rs: F.cross_entropy on
[8192, 50304] bf16 logits, forward + backward, CUDA events, same bandwidth accounting
(3 x N x C x 2 bytes: logits read twice, gradient written once)."""
import torch
import torch.nn.functional as F

n, c = 8192, 50304
x = (torch.randn(n, c, device="cuda") * 2).bfloat16().requires_grad_(True)
t = (torch.arange(n, device="cuda") * 7919) % c
for eps in (0.0, 0.1):
    for _ in range(3):
        F.cross_entropy(x, t, label_smoothing=eps).backward()
    torch.cuda.synchronize()
    reps = 20
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(reps):
        x.grad = None
        F.cross_entropy(x, t, label_smoothing=eps).backward()
    e.record()
    torch.cuda.synchronize()
    ms = s.elapsed_time(e) / reps
    b = 3 * n * c * 2
    tag = " smoothing 0.1" if eps else ""
    print(f"| torch cross_entropy loss + backward{tag} [{n}, {c}] bf16 | {ms:.3f} ms | {b / ms / 1e6:.0f} GB/s | {100 * b * 1e3 / ms / 3.1e12:.0f}% of 3.1 TB/s |")
