"""PyTorch reference for crates/train/benches/optim_step.rs: the optimizer step alone over the
same f32 parameter shapes (GPT-2 124M with AdamW betas (0.9, 0.95), weight decay 0.1 and
clip_grad_norm_(1.0); the seed CNN with SGD and Adam; the MLP 784-512-512-10 with Adam), lr
1e-4, gradients set once. Modes: foreach (PyTorch's default on CUDA) and fused. Timed like the
Rust bench: 3 warm-up steps, then the median of 5 samples of N steps, synchronized at the end
of each sample. Prints one `|` line per workload and mode; the bandwidth uses the Rust bench's
byte count (p, g and state read, p and state written, g read once more for the norm)."""
import time
import torch

dev = "cuda"


def gpt2_shapes(layers=12):
    d, v, t = 768, 50257, 1024
    s = [(v, d), (t, d)]
    for _ in range(layers):
        s += [(d,), (d,), (d, 3 * d), (3 * d,), (d, d), (d,), (d,), (d,), (d, 4 * d), (4 * d,), (4 * d, d), (d,)]
    return s + [(d,), (d,)]


SEED_CNN = [(8, 3, 3, 3), (8,), (2, 8), (2,)]
MLP = [(512, 784), (512,), (512, 512), (512,), (10, 512), (10,)]


def run(name, shapes, make_opt, clip, iters, mode):
    g = torch.Generator(device=dev).manual_seed(0)
    ps = []
    for s in shapes:
        p = (torch.randn(s, device=dev, generator=g) * 0.02).requires_grad_()
        p.grad = torch.randn(s, device=dev, generator=g) * 1e-3
        ps.append(p)
    opt = make_opt(ps, mode)

    def step():
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(ps, clip, foreach=True)
        opt.step()

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    samples = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(iters):
            step()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - t0) * 1e3 / iters)
    samples.sort()
    ms = samples[2]
    n = sum(p.numel() for p in ps)
    nstate = len([v for v in opt.state[ps[0]].values() if torch.is_tensor(v) and v.shape == ps[0].shape])
    bytes_ = n * 4 * (4 + 2 * nstate)
    gbs = bytes_ / ms / 1e6
    print(f"| optim step {name} ({n} params, {len(shapes)} tensors) | torch {mode} | {ms:.3f} ms | "
          f"{gbs:.0f} GB/s = {gbs / 3000 * 100:.1f}% of 3 TB/s |", flush=True)


def adamw(ps, mode):
    return torch.optim.AdamW(ps, lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1, **{mode: True})


def adam(ps, mode):
    return torch.optim.Adam(ps, lr=1e-4, **{mode: True})


def sgd(ps, mode):
    return torch.optim.SGD(ps, lr=1e-4, **{mode: True})


def main():
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}")
    for mode in ["foreach", "fused"]:
        run("gpt2-124m adamw clip 1.0", gpt2_shapes(), adamw, 1.0, 20, mode)
        run("seed-cnn sgd", SEED_CNN, sgd, None, 200, mode)
        run("seed-cnn adam", SEED_CNN, adam, None, 200, mode)
        run("mlp 784-512-512-10 adam", MLP, adam, None, 200, mode)


if __name__ == "__main__":
    main()
