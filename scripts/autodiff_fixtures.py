"""Reference losses and gradients from PyTorch for ferrite-autodiff's end-to-end tests
(crates/autodiff/tests/torch_reference.rs).

Run: python3 scripts/autodiff_fixtures.py   (needs torch; CPU is enough)
Writes crates/testing/fixtures/torch_reference.json: the weights, inputs, loss and
the gradient of every weight, in float64, for
- mlp: loss = mean((gelu(x @ w1 + b1) @ w2 + b2 - target)^2);
- attention: a pre-norm causal attention block with grouped-query heads and RoPE (split
  halves): h = rms_norm(x, g); q, k, v = h @ wq, h @ wk, h @ wv; 4 query heads, 2 kv heads of
  width 4; RoPE on q and k; causal softmax attention; out = x + merge(heads) @ wo;
  loss = sum(out * r).
"""
import json
import math
import pathlib

import torch

torch.manual_seed(0)
D = torch.float64


def t(*shape):
    return (torch.rand(*shape, dtype=D) * 2 - 1).requires_grad_(True)


def flat(x):
    return x.detach().reshape(-1).tolist()


out = {}

# MLP
x = torch.rand(8, 6, dtype=D) * 2 - 1
target = torch.rand(8, 4, dtype=D) * 2 - 1
w1, b1, w2, b2 = t(6, 16), t(16), t(16, 4), t(4)
loss = ((torch.nn.functional.gelu(x @ w1 + b1) @ w2 + b2 - target) ** 2).mean()
loss.backward()
out["mlp"] = {
    "x": flat(x), "target": flat(target),
    "w1": flat(w1), "b1": flat(b1), "w2": flat(w2), "b2": flat(b2),
    "loss": loss.item(),
    "grads": {n: flat(p.grad) for n, p in [("w1", w1), ("b1", b1), ("w2", w2), ("b2", b2)]},
}

# Attention block
B, L, C, HQ, HKV, HD = 2, 5, 16, 4, 2, 4
x = t(B, L, C)
g, wq, wk, wv, wo = t(C), t(C, HQ * HD), t(C, HKV * HD), t(C, HKV * HD), t(HQ * HD, C)
r = torch.rand(B, L, C, dtype=D) * 2 - 1
inv = 1.0 / (10000 ** (torch.arange(0, HD // 2, dtype=D) / (HD // 2)))
ang = torch.arange(L, dtype=D)[:, None] * inv[None, :]
cos, sin = torch.cos(ang), torch.sin(ang)


def rope(z):  # z [B, H, L, HD], split halves
    a, b = z[..., : HD // 2], z[..., HD // 2:]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


h = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * g
q = (h @ wq).reshape(B, L, HQ, HD).transpose(1, 2)
k = (h @ wk).reshape(B, L, HKV, HD).transpose(1, 2)
v = (h @ wv).reshape(B, L, HKV, HD).transpose(1, 2)
q, k = rope(q), rope(k)
k2 = k.repeat_interleave(HQ // HKV, dim=1)
v2 = v.repeat_interleave(HQ // HKV, dim=1)
s = (q @ k2.transpose(-1, -2)) / math.sqrt(HD)
s = s.masked_fill(torch.triu(torch.ones(L, L, dtype=torch.bool), 1), float("-inf"))
a = torch.softmax(s, -1) @ v2
y = x + a.transpose(1, 2).reshape(B, L, HQ * HD) @ wo
loss = (y * r).sum()
loss.backward()
params = [("x", x), ("g", g), ("wq", wq), ("wk", wk), ("wv", wv), ("wo", wo)]
out["attention"] = {
    **{n: flat(p) for n, p in params},
    "r": flat(r), "cos": flat(cos), "sin": flat(sin),
    "loss": loss.item(),
    "grads": {n: flat(p.grad) for n, p in params},
}

path = pathlib.Path(__file__).resolve().parent.parent / "crates/testing/fixtures/torch_reference.json"
path.write_text(json.dumps(out))
print(f"wrote {path} (torch {torch.__version__})")
