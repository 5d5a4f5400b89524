"""PyTorch reference for crates/cuda/benches/mlp_bf16.rs: forward + backward of
h = relu(x W1 + b1), y = h W2 + b2, loss = mean((y - t)^2), batch 256, width 4096, bf16
parameters and data (no autocast), eager. Timed like the Rust bench: wall clock over 100
steps after a warm-up, median of 5, synchronized at the end of each sample."""
import time
import torch

def main():
    dev = "cuda"
    b, n = 256, 4096
    s = 1 / n ** 0.5
    w1 = ((torch.rand(n, n, device=dev) * 2 - 1) * s).bfloat16().requires_grad_()
    b1 = torch.zeros(n, device=dev, dtype=torch.bfloat16, requires_grad=True)
    w2 = ((torch.rand(n, n, device=dev) * 2 - 1) * s).bfloat16().requires_grad_()
    b2 = torch.zeros(n, device=dev, dtype=torch.bfloat16, requires_grad=True)
    x = torch.randn(b, n, device=dev, dtype=torch.bfloat16)
    t = torch.randn(b, n, device=dev, dtype=torch.bfloat16)
    params = [w1, b1, w2, b2]

    def step():
        for p in params:
            p.grad = None
        h = torch.relu(x @ w1 + b1)
        y = h @ w2 + b2
        loss = ((y - t) ** 2).mean()
        loss.backward()
        return loss

    for _ in range(10):
        step()
    torch.cuda.synchronize()
    samples = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(100):
            step()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - t0) * 1e3 / 100)
    samples.sort()
    ms = samples[2]
    flops = 6 * 2 * b * n * n
    print(f"| mlp 4096-4096-4096 b256 bf16 fwd+bwd | PyTorch {torch.__version__} {ms:.3f} ms/step ({flops / ms / 1e9:.0f} TFLOP/s) |")

if __name__ == "__main__":
    main()
