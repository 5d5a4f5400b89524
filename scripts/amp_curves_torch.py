#!/usr/bin/env python3
"""PyTorch's own mixed-precision deltas on the model of `crates/train/tests/common/amp.rs`.

Trains the same small character-level transformer (token + position embeddings, two pre-norm
causal TransformerEncoder layers of width 32 with 4 heads, GELU, feed-forward 64, a final
LayerNorm, a linear head) on the same text, windows (16 characters, stride 8), batch (8),
optimizer (Adam 3e-3) and step count, in f32, bf16 autocast and fp16 autocast with
GradScaler, from the same initial weights per seed, and prints how far the low-precision loss
curves are from f32: the largest step-wise relative difference and the relative difference of
the mean of the last 10 losses. The bounds of the Rust tests (`mixed_precision.rs`, `gpu.rs`)
are chosen from these numbers (docs/training.md, "Mixed precision").

    python3 scripts/amp_curves_torch.py [--device cpu|cuda] [--seeds 5] [--steps 80]
"""

import argparse
import copy
import re

import torch
from torch import nn

CTX, WIDTH, HEADS, LAYERS, BATCH, LR = 16, 32, 4, 2, 8, 3e-3


def text():
    # The TEXT constant of crates/train/tests/common/amp.rs, read from the source so that the
    # two never drift apart.
    src = open(__file__.replace("scripts/amp_curves_torch.py", "crates/train/tests/common/amp.rs")).read()
    body = re.search(r'pub const TEXT: &str = "(.*?)";', src, re.S).group(1)
    return re.sub(r"\\\n", "", body)


class TinyGpt(nn.Module):
    def __init__(self, vocab):
        super().__init__()
        self.wte = nn.Embedding(vocab, WIDTH)
        self.wpe = nn.Embedding(CTX, WIDTH)
        layer = nn.TransformerEncoderLayer(
            WIDTH, HEADS, 2 * WIDTH, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, LAYERS, norm=nn.LayerNorm(WIDTH), enable_nested_tensor=False)
        self.head = nn.Linear(WIDTH, vocab)

    def forward(self, ids):
        t = ids.shape[1]
        h = self.wte(ids) + self.wpe(torch.arange(t, device=ids.device))
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=ids.device)
        return self.head(self.encoder(h, mask=mask, is_causal=True))


def batches(tokens, seed, steps, device):
    n = (len(tokens) - CTX - 1) // (CTX // 2) + 1
    starts = [i * (CTX // 2) for i in range(n)]
    g = torch.Generator().manual_seed(seed)
    out = []
    while len(out) < steps:
        perm = torch.randperm(n, generator=g).tolist()
        for b in range(n // BATCH):
            idx = [starts[i] for i in perm[b * BATCH:(b + 1) * BATCH]]
            x = torch.stack([tokens[s:s + CTX] for s in idx]).to(device)
            y = torch.stack([tokens[s + 1:s + CTX + 1] for s in idx]).to(device)
            out.append((x, y))
    return out[:steps]


def run(init, data, mode, device):
    model = copy.deepcopy(init).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    scaler = torch.amp.GradScaler(device, growth_interval=1000) if mode == "fp16" else None
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(mode)
    losses = []
    for x, y in data:
        opt.zero_grad()
        with torch.autocast(device, dtype=dtype or torch.float32, enabled=dtype is not None):
            logits = model(x)
            loss = nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
        if scaler:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        losses.append(loss.item())
    return losses


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=80)
    a = ap.parse_args()
    torch.set_num_threads(2)
    t = text()
    vocab = sorted(set(t))
    tokens = torch.tensor([vocab.index(c) for c in t])
    print(f"torch {torch.__version__}, {a.device}, {len(t)} characters, {len(vocab)} distinct, {a.steps} steps")
    worst = {"bf16": [0.0, 0.0], "fp16": [0.0, 0.0]}
    for seed in range(a.seeds):
        torch.manual_seed(seed)
        init = TinyGpt(len(vocab))
        data = batches(tokens, seed, a.steps, a.device)
        f32 = run(init, data, "f32", a.device)
        tail = lambda c: sum(c[-10:]) / 10
        line = [f"seed {seed}: f32 {f32[0]:.4f} -> {tail(f32):.4f}"]
        for mode in ("bf16", "fp16"):
            c = run(init, data, mode, a.device)
            step = max(abs(x - y) / y for x, y in zip(c, f32))
            end = abs(tail(c) - tail(f32)) / tail(f32)
            worst[mode] = [max(worst[mode][0], step), max(worst[mode][1], end)]
            line.append(f"{mode} step-wise {step:.2e} tail {end:.2e}")
        print("; ".join(line))
    for mode, (step, end) in worst.items():
        print(f"worst {mode}: step-wise {step:.2e}, mean of the last 10 {end:.2e}")


if __name__ == "__main__":
    main()
