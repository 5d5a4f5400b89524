"""PyTorch fixtures for the convolution, pooling and channel-norm layers of ferrite-nn
(ferrite_testing::torch_layers, run by crates/nn/tests/layers_vs_torch.rs on the CPU and
crates/cuda/tests/cuda.rs on CUDA).

Run: python3 scripts/nn_ops_fixtures.py   (needs torch; CPU is enough)
Writes crates/testing/fixtures/nn_ops.json. Per case, in float64: the module's parameters
(by PyTorch's names), its train-mode steps (input, output, the gradient of the input and of
every parameter for loss = sum(output * r) with fixed random r), the buffers after those
steps, and an eval-mode step. Cases name the module and its arguments so the Rust test can
build the same layer.
"""
import json
import pathlib

import torch
from torch import nn

torch.manual_seed(0)
D = torch.float64


def flat(x):
    return {"shape": list(x.shape), "data": x.detach().reshape(-1).tolist()}


def case(module, args, shapes, train_steps=1, eval_step=False):
    module = module.to(D)
    out = {"module": type(module).__name__, "args": args,
           "params": {n: flat(p) for n, p in module.named_parameters()}, "steps": []}
    module.train()
    for s in range(train_steps):
        x = (torch.rand(*shapes, dtype=D) * 4 - 2).requires_grad_(True)
        module.zero_grad()
        y = module(x)
        r = torch.rand(*y.shape, dtype=D) * 2 - 1
        (y * r).sum().backward()
        out["steps"].append({
            "input": flat(x), "output": flat(y), "r": flat(r), "input_grad": flat(x.grad),
            "param_grads": {n: flat(p.grad) for n, p in module.named_parameters()},
        })
    out["buffers"] = {n: flat(b.to(D)) for n, b in module.named_buffers()}
    if eval_step:
        module.eval()
        x = torch.rand(*shapes, dtype=D) * 4 - 2
        out["eval"] = {"input": flat(x), "output": flat(module(x))}
    return out


cases = {
    "conv2d_groups": case(nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2),
                          {"in": 4, "out": 6, "k": [3, 3], "stride": [2, 2], "padding": [1, 1],
                           "dilation": [1, 1], "groups": 2, "bias": True}, (2, 4, 7, 6)),
    "conv2d_same": case(nn.Conv2d(3, 4, (4, 3), padding="same", dilation=(1, 2), bias=False),
                        {"in": 3, "out": 4, "k": [4, 3], "stride": [1, 1], "padding": "same",
                         "dilation": [1, 2], "groups": 1, "bias": False}, (1, 3, 6, 7)),
    "conv2d_depthwise": case(nn.Conv2d(4, 4, 3, padding=1, groups=4),
                             {"in": 4, "out": 4, "k": [3, 3], "stride": [1, 1], "padding": [1, 1],
                              "dilation": [1, 1], "groups": 4, "bias": True}, (2, 4, 5, 5)),
    "conv1d": case(nn.Conv1d(3, 5, 4, stride=2, padding=1, dilation=2),
                   {"in": 3, "out": 5, "k": [4], "stride": [2], "padding": [1], "dilation": [2],
                    "groups": 1, "bias": True}, (2, 3, 15)),
    "conv_transpose2d": case(nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1,
                                                groups=2),
                             {"in": 4, "out": 6, "k": [3, 3], "stride": [2, 2], "padding": [1, 1],
                              "output_padding": [1, 1], "dilation": [1, 1], "groups": 2,
                              "bias": True}, (2, 4, 4, 5)),
    "max_pool2d": case(nn.MaxPool2d(3, stride=2, padding=1, ceil_mode=True),
                       {"k": [3, 3], "stride": [2, 2], "padding": [1, 1], "dilation": [1, 1],
                        "ceil_mode": True, "count_include_pad": True}, (2, 3, 9, 8)),
    "max_pool2d_dilated": case(nn.MaxPool2d((3, 2), stride=(2, 1), padding=(1, 0), dilation=(2, 1)),
                               {"k": [3, 2], "stride": [2, 1], "padding": [1, 0], "dilation": [2, 1],
                                "ceil_mode": False, "count_include_pad": True}, (1, 2, 9, 7)),
    "avg_pool2d": case(nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
                       {"k": [3, 3], "stride": [2, 2], "padding": [1, 1], "dilation": [1, 1],
                        "ceil_mode": True, "count_include_pad": False}, (2, 3, 9, 8)),
    "avg_pool2d_default": case(nn.AvgPool2d(2),
                               {"k": [2, 2], "stride": [2, 2], "padding": [0, 0], "dilation": [1, 1],
                                "ceil_mode": False, "count_include_pad": True}, (1, 2, 7, 6)),
    "max_pool1d": case(nn.MaxPool1d(3, stride=2, padding=1),
                       {"k": [3], "stride": [2], "padding": [1], "dilation": [1],
                        "ceil_mode": False, "count_include_pad": True}, (2, 3, 11)),
    "avg_pool1d": case(nn.AvgPool1d(3, stride=2, padding=1, ceil_mode=True),
                       {"k": [3], "stride": [2], "padding": [1], "dilation": [1],
                        "ceil_mode": True, "count_include_pad": True}, (2, 3, 11)),
    "adaptive_avg_pool2d": case(nn.AdaptiveAvgPool2d((3, 4)), {"out": [3, 4]}, (2, 3, 7, 10)),
    "adaptive_max_pool2d": case(nn.AdaptiveMaxPool2d((3, 4)), {"out": [3, 4]}, (2, 3, 7, 10)),
    "batch_norm2d": case(nn.BatchNorm2d(3), {"c": 3, "momentum": 0.1, "affine": True, "track": True},
                         (4, 3, 5, 5), train_steps=2, eval_step=True),
    "batch_norm1d_cumulative": case(nn.BatchNorm1d(5, momentum=None),
                                    {"c": 5, "momentum": None, "affine": True, "track": True},
                                    (8, 5), train_steps=3, eval_step=True),
    "batch_norm1d_no_stats": case(nn.BatchNorm1d(4, affine=False, track_running_stats=False),
                                  {"c": 4, "momentum": 0.1, "affine": False, "track": False},
                                  (6, 4, 3), train_steps=1, eval_step=True),
    "group_norm": case(nn.GroupNorm(2, 6), {"groups": 2, "c": 6, "affine": True}, (2, 6, 4, 3)),
    "instance_norm2d": case(nn.InstanceNorm2d(3, affine=True),
                            {"c": 3, "momentum": 0.1, "affine": True, "track": False}, (2, 3, 5, 4)),
    "instance_norm2d_stats": case(nn.InstanceNorm2d(3, track_running_stats=True),
                                  {"c": 3, "momentum": 0.1, "affine": False, "track": True},
                                  (2, 3, 5, 4), train_steps=2, eval_step=True),
}

path = pathlib.Path(__file__).resolve().parent.parent / "crates/testing/fixtures/nn_ops.json"
path.write_text(json.dumps({"torch": torch.__version__, "cases": cases}))
print(f"wrote {path} ({path.stat().st_size} bytes)")
