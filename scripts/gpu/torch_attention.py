"""PyTorch reference for crates/cuda/benches/attention.rs: causal bf16
scaled_dot_product_attention (FlashAttention backend) forward and backward at the training
workloads' shapes, q, k, v as views of one [b, l, 3, h, d] projection, timed the same way
(CUDA events around `reps` calls after a warm-up, median of 5 samples). Run on the machine
with the GPU, in the same session as the Rust bench."""
import torch
import torch.nn.functional as F

from torch_ops import timed  # CUDA events, median of 5 samples, as the Rust benches time


def main():
    dev = torch.device("cuda")
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}")
    print("\n| shape (causal, bf16) | forward | backward |\n|---|---|---|")
    for name, b, h, l, d in [("GPT-2 b16 h12 l1024 d64", 16, 12, 1024, 64),
                             ("char-GPT b64 h6 l256 d64", 64, 6, 256, 64)]:
        qkv = (torch.rand(b, l, 3, h, d, device=dev) * 2 - 1).bfloat16().requires_grad_()
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
        g = (torch.rand(b, h, l, d, device=dev) * 2 - 1).bfloat16()
        product = b * h * l * l * d
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
            with torch.no_grad():
                fwd = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), 10)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            # Forward + backward, less the forward alone: the backward's time.
            both = timed(lambda: torch.autograd.grad(
                F.scaled_dot_product_attention(q, k, v, is_causal=True), qkv, g), 10)
            del o
        bwd = both - fwd
        print(f"| {name} | {fwd:.3f} ms, {2 * product / fwd / 1e9:.0f} TFLOP/s "
              f"| {bwd:.3f} ms, {5 * product / bwd / 1e9:.0f} TFLOP/s |")


if __name__ == "__main__":
    main()
