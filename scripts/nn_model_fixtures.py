"""End-to-end PyTorch fixtures for ferrite-nn's whole models (crates/nn/tests/models_vs_torch.rs
on the CPU, crates/nn/tests/gpu.rs on CUDA).

Run: python3 scripts/nn_model_fixtures.py   (needs torch and safetensors; CPU is enough)

Two models, each defined here exactly as its PyTorch source defines it (torchvision is not
needed: `ResNet`/`BasicBlock` below are torchvision.models.resnet's, names and all):
- resnet18: torchvision's ResNet-18 layout (stem 7x7/2 + maxpool, 4 stages of 2 BasicBlocks,
  avgpool, fc) at widths 8, 16, 32, 64 instead of 64 .. 512 to keep the fixture small; every
  state-dict key is torchvision's (`layer2.0.downsample.1.running_var`, ...).
- encoder: Embedding(61, 32) -> nn.TransformerEncoder(2 x TransformerEncoderLayer(32, 4, 64,
  dropout 0, batch_first, post-norm), norm=LayerNorm(32)) with a causal mask -> Linear(32, 61).

Writes, under crates/nn/tests/fixtures/, per model M:
- M.safetensors: `safetensors.torch.save_file(model.state_dict())` as PyTorch saves it (float32;
  num_batches_tracked int64);
- M_ref.safetensors: computed in float64 from those float32 weights, in train mode: `in` (the
  input; token ids int64), `out`, `r` (loss = sum(out * r)), `grad.<key>` for every parameter,
  `after.<key>` for every buffer after that forward (running statistics), and `eval_out` (the
  output in eval mode after the step's statistics update).
"""
import pathlib

import torch
import torch.nn as nn
from safetensors.torch import save_file

OUT = pathlib.Path(__file__).resolve().parent.parent / "crates/nn/tests/fixtures"


def conv3x3(i, o, stride=1):
    return nn.Conv2d(i, o, kernel_size=3, stride=stride, padding=1, bias=False)


def conv1x1(i, o, stride=1):
    return nn.Conv2d(i, o, kernel_size=1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    """torchvision.models.resnet.BasicBlock."""

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        return self.relu(out + identity)


class ResNet(nn.Module):
    """torchvision.models.resnet.ResNet with BasicBlock, stage widths as a parameter."""

    def __init__(self, layers, widths, num_classes):
        super().__init__()
        self.inplanes = widths[0]
        self.conv1 = nn.Conv2d(3, self.inplanes, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(self.inplanes)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(widths[0], layers[0])
        self.layer2 = self._make_layer(widths[1], layers[1], stride=2)
        self.layer3 = self._make_layer(widths[2], layers[2], stride=2)
        self.layer4 = self._make_layer(widths[3], layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(widths[3], num_classes)

    def _make_layer(self, planes, blocks, stride=1):
        downsample = None
        if stride != 1 or self.inplanes != planes:
            downsample = nn.Sequential(conv1x1(self.inplanes, planes, stride), nn.BatchNorm2d(planes))
        layers = [BasicBlock(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes
        for _ in range(1, blocks):
            layers.append(BasicBlock(self.inplanes, planes))
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class Encoder(nn.Module):
    def __init__(self, vocab=61, d=32):
        super().__init__()
        self.embedding = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(d, 4, 64, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(d), enable_nested_tensor=False)
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens):
        t = tokens.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(t, dtype=torch.float64)
        return self.head(self.encoder(self.embedding(tokens), mask=mask, is_causal=True))


def randomize_buffers(model, gen):
    """Non-trivial running statistics, so eval mode and their update are really checked."""
    for name, b in model.named_buffers():
        if name.endswith("running_mean"):
            b.copy_(torch.randn(b.shape, generator=gen) * 0.1)
        elif name.endswith("running_var"):
            b.copy_(torch.rand(b.shape, generator=gen) + 0.5)


def write(name, model, x):
    model = model.float()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, OUT / f"{name}.safetensors")
    model = model.double().train()
    xin = x.double() if x.is_floating_point() else x
    out = model(xin)
    gen = torch.Generator().manual_seed(7)
    r = torch.rand(out.shape, generator=gen, dtype=torch.float64) * 2 - 1
    (out * r).sum().backward()
    ref = {"in": xin, "out": out.detach(), "r": r}
    for k, p in model.named_parameters():
        ref[f"grad.{k}"] = p.grad
    for k, b in model.named_buffers():
        ref[f"after.{k}"] = b
    model.eval()
    with torch.no_grad():
        ref["eval_out"] = model(xin)
    save_file({k: v.detach().contiguous() for k, v in ref.items()}, OUT / f"{name}_ref.safetensors")
    n = sum(p.numel() for p in model.parameters())
    print(f"{name}: {n} parameters, out {tuple(out.shape)}")


def main():
    torch.manual_seed(0)
    resnet = ResNet([2, 2, 2, 2], [8, 16, 32, 64], num_classes=10)
    with torch.no_grad():
        randomize_buffers(resnet, torch.Generator().manual_seed(1))
    write("resnet18", resnet, torch.randn(4, 3, 32, 32))

    torch.manual_seed(1)
    write("encoder", Encoder(), torch.randint(0, 61, (2, 9)))


if __name__ == "__main__":
    main()
