"""PyTorch reference for `ferrite train fashion-cnn` (examples/fashion_cnn.rs): the same small
ResNet (torchvision's BasicBlock, a 3x3 stem without max pooling, stages of 24, 48 and 96
channels, one block each), the same normalization, cross-entropy, Adam at 1e-3 with a cosine
schedule over the epochs, batch 128, on Fashion-MNIST from Debian's dataset-fashion-mnist, each
training image flipped left-right with probability 0.5 (done on the whole batch at once, the
fastest way in PyTorch). `--augment`, `--widths` and `--smoothing` try other recipes (the
search that chose this one is in docs/training.md).
Prints per epoch the training time, the training loss and the test accuracy, for issue 15's
"an epoch of fashion-cnn takes no longer than the same model in PyTorch on the same machine"
and its 92% accuracy.

Run: python3 scripts/fashion_cnn_torch.py [--epochs 10] [--threads 2] [--device cpu|cuda]
     [--augment none|flip|crop-flip] [--widths 24,48,96] [--smoothing 0.0] [--seed 0]
"""
import argparse
import gzip
import pathlib
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

DATA = pathlib.Path("/usr/share/datasets/fashion-mnist")
MEAN, STD = 0.2860, 0.3530


def idx(path):
    b = gzip.open(path).read() if path.read_bytes()[:2] == b"\x1f\x8b" else path.read_bytes()
    nd = b[3]
    dims = [int.from_bytes(b[4 + 4 * i:8 + 4 * i], "big") for i in range(nd)]
    return np.frombuffer(b, dtype=np.uint8, offset=4 + 4 * nd).reshape(dims)


def load(split, d):
    x = torch.from_numpy(idx(d / f"{split}-images-idx3-ubyte.gz").copy()).float().div(255)
    y = torch.from_numpy(idx(d / f"{split}-labels-idx1-ubyte.gz").copy()).long()
    return ((x - MEAN) / STD).unsqueeze(1), y


class BasicBlock(nn.Module):
    def __init__(self, i, o, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(i, o, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(o)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(o, o, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(o)
        self.downsample = None
        if stride != 1 or i != o:
            self.downsample = nn.Sequential(nn.Conv2d(i, o, 1, stride, bias=False), nn.BatchNorm2d(o))

    def forward(self, x):
        out = self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))
        return self.relu(out + (x if self.downsample is None else self.downsample(x)))


class SmallResNet(nn.Module):
    def __init__(self, widths=(16, 32, 64), classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, widths[0], 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.relu = nn.ReLU(inplace=True)
        layers, i = [], widths[0]
        for s, w in enumerate(widths):
            layers.append(nn.Sequential(BasicBlock(i, w, 1 if s == 0 else 2)))
            i = w
        self.layers = nn.ModuleList(layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(i, classes)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        for l in self.layers:
            x = l(x)
        return self.fc(torch.flatten(self.avgpool(x), 1))


def augment(x, crop=True):
    """Random 28x28 crops of x [n, 1, 28, 28] zero-padded by 2 (zero before normalization)
    when `crop`, then left-right flips with probability 0.5."""
    n = x.shape[0]
    if not crop:
        flip = torch.rand(n) < 0.5
        return torch.where(flip[:, None, None, None], x.flip(-1), x)
    p = F.pad(x, (2, 2, 2, 2), value=-MEAN / STD)
    dy, dx = torch.randint(0, 5, (n,)), torch.randint(0, 5, (n,))
    ar = torch.arange(28)
    rows = (dy[:, None] + ar)[:, :, None]
    cols = (dx[:, None] + ar)[:, None, :]
    out = p[torch.arange(n)[:, None, None], 0, rows, cols]
    flip = torch.rand(n) < 0.5
    out = torch.where(flip[:, None, None], out.flip(-1), out)
    return out.unsqueeze(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--data", default=str(DATA))
    ap.add_argument("--augment", default="flip", choices=["none", "flip", "crop-flip"])
    ap.add_argument("--widths", default="24,48,96")
    ap.add_argument("--smoothing", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    dev = torch.device(a.device)
    xtr, ytr = load("train", pathlib.Path(a.data))
    xte, yte = load("t10k", pathlib.Path(a.data))
    model = SmallResNet(tuple(int(w) for w in a.widths.split(","))).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=a.epochs)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {sum(p.numel() for p in model.parameters())} parameters")
    for epoch in range(a.epochs):
        model.train()
        t0 = time.time()
        order = torch.randperm(len(xtr))
        total, n = 0.0, 0
        for b in range(0, len(xtr), a.batch_size):
            i = order[b:b + a.batch_size]
            x = xtr[i] if a.augment == "none" else augment(xtr[i], a.augment == "crop-flip")
            x, y = x.to(dev), ytr[i].to(dev)
            loss = F.cross_entropy(model(x), y, label_smoothing=a.smoothing)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item() * len(i)
            n += len(i)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        secs = time.time() - t0
        sched.step()
        model.eval()
        correct = 0
        with torch.no_grad():
            for b in range(0, len(xte), 1000):
                correct += (model(xte[b:b + 1000].to(dev)).argmax(1).cpu() == yte[b:b + 1000]).sum().item()
        print(f"epoch {epoch + 1}/{a.epochs}: {secs:.1f} s ({n / secs:.0f} samples/s), loss {total / n:.4f}, test accuracy {correct / len(xte):.4f}", flush=True)


if __name__ == "__main__":
    main()
