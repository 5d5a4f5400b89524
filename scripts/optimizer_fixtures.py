#!/usr/bin/env python3
"""Optimizer trajectories from PyTorch for crates/train/tests/optim.rs.

Three parameters ([5, 4], [4], [3, 2, 2]; 36 elements) start from p0[k] = 0.5 sin(1.7 k + 0.3)
and receive 100 steps of the gradient g_t[k] = sin(0.37 t + 0.71 k) (1 + 0.5 cos(0.13 k)) (k the
flat index over all parameters, computed in float64 and rounded to float32 on both sides, so
Rust regenerates them exactly). Steps 13 and 14 multiply the gradient by 40 to exercise large
updates. Parameters are recorded after steps 1, 2, 10, 50 and 100. Lion and LAMB are not in
torch.optim: their references below follow the papers (Lion: Chen et al. 2023, as in
lion-pytorch; LAMB: You et al. 2020, with Adam bias correction and the trust ratio
||p|| / ||update|| taken as 1 when either norm is 0).

Usage: python3 scripts/optimizer_fixtures.py  (writes crates/train/tests/fixtures/optim.json)
"""
import json
import math
import os

import torch

SHAPES = [(5, 4), (4,), (3, 2, 2)]
STEPS = 100
RECORD = [1, 2, 10, 50, 100]


def init():
    out, k = [], 0
    for s in SHAPES:
        n = math.prod(s)
        vals = [0.5 * math.sin(1.7 * (k + i) + 0.3) for i in range(n)]
        out.append(torch.nn.Parameter(torch.tensor(vals, dtype=torch.float32).reshape(s)))
        k += n
    return out


def grads(t):
    out, k = [], 0
    scale = 40.0 if t in (13, 14) else 1.0
    for s in SHAPES:
        n = math.prod(s)
        vals = [scale * math.sin(0.37 * t + 0.71 * (k + i)) * (1 + 0.5 * math.cos(0.13 * (k + i))) for i in range(n)]
        out.append(torch.tensor(vals, dtype=torch.float32).reshape(s))
        k += n
    return out


class Lion(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for g in self.param_groups:
            b1, b2 = g["betas"]
            for p in g["params"]:
                st = self.state[p]
                if not st:
                    st["exp_avg"] = torch.zeros_like(p)
                m = st["exp_avg"]
                p.mul_(1 - g["lr"] * g["weight_decay"])
                update = (m * b1 + p.grad * (1 - b1)).sign_()
                p.add_(update, alpha=-g["lr"])
                m.mul_(b2).add_(p.grad, alpha=1 - b2)


class Lamb(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for g in self.param_groups:
            b1, b2 = g["betas"]
            for p in g["params"]:
                st = self.state[p]
                if not st:
                    st["step"] = 0
                    st["exp_avg"] = torch.zeros_like(p)
                    st["exp_avg_sq"] = torch.zeros_like(p)
                st["step"] += 1
                t = st["step"]
                m, v = st["exp_avg"], st["exp_avg_sq"]
                m.mul_(b1).add_(p.grad, alpha=1 - b1)
                v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                mhat = m / (1 - b1 ** t)
                vhat = v / (1 - b2 ** t)
                r = mhat / (vhat.sqrt() + g["eps"]) + g["weight_decay"] * p
                wn, rn = p.norm(), r.norm()
                trust = (wn / rn) if (wn > 0 and rn > 0) else torch.tensor(1.0)
                p.add_(r, alpha=-g["lr"] * float(trust))


O = torch.optim
CONFIGS = [
    ("sgd", {"lr": 0.05}, lambda ps: O.SGD(ps, lr=0.05)),
    ("sgd", {"lr": 0.05, "momentum": 0.9, "dampening": 0.1, "weight_decay": 0.01},
     lambda ps: O.SGD(ps, lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01)),
    ("sgd", {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01},
     lambda ps: O.SGD(ps, lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01)),
    ("adam", {"lr": 0.01}, lambda ps: O.Adam(ps, lr=0.01)),
    ("adam", {"lr": 0.01, "betas": [0.8, 0.99], "eps": 1e-6, "weight_decay": 0.1, "amsgrad": True},
     lambda ps: O.Adam(ps, lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1, amsgrad=True)),
    ("adamw", {"lr": 0.01}, lambda ps: O.AdamW(ps, lr=0.01)),
    ("adamw", {"lr": 0.01, "weight_decay": 0.1, "amsgrad": True},
     lambda ps: O.AdamW(ps, lr=0.01, weight_decay=0.1, amsgrad=True)),
    ("rmsprop", {"lr": 0.01}, lambda ps: O.RMSprop(ps, lr=0.01)),
    ("rmsprop", {"lr": 0.01, "alpha": 0.9, "eps": 1e-6, "weight_decay": 0.01, "momentum": 0.5, "centered": True},
     lambda ps: O.RMSprop(ps, lr=0.01, alpha=0.9, eps=1e-6, weight_decay=0.01, momentum=0.5, centered=True)),
    ("adagrad", {"lr": 0.1}, lambda ps: O.Adagrad(ps, lr=0.1)),
    ("adagrad", {"lr": 0.1, "lr_decay": 0.01, "weight_decay": 0.01, "initial_accumulator_value": 0.1, "eps": 1e-8},
     lambda ps: O.Adagrad(ps, lr=0.1, lr_decay=0.01, weight_decay=0.01, initial_accumulator_value=0.1)),
    ("lion", {"lr": 0.001}, lambda ps: Lion(ps, lr=0.001)),
    ("lion", {"lr": 0.001, "betas": [0.95, 0.98], "weight_decay": 0.1},
     lambda ps: Lion(ps, lr=0.001, betas=(0.95, 0.98), weight_decay=0.1)),
    ("lamb", {"lr": 0.01}, lambda ps: Lamb(ps, lr=0.01)),
    ("lamb", {"lr": 0.01, "weight_decay": 0.1, "eps": 1e-8},
     lambda ps: Lamb(ps, lr=0.01, weight_decay=0.1, eps=1e-8)),
]


def run(make, groups=False):
    ps = init()
    if groups:
        opt = make([{"params": [ps[0]]}, {"params": ps[1:], "lr": 0.002, "weight_decay": 0.2}])
    else:
        opt = make(ps)
    rec = {}
    for t in range(1, STEPS + 1):
        for p, g in zip(ps, grads(t)):
            p.grad = g.clone()
        opt.step()
        if t in RECORD:
            rec[str(t)] = [v for p in ps for v in p.detach().reshape(-1).tolist()]
    return rec


cases = [{"name": n, "hp": hp, "trajectory": run(m)} for n, hp, m in CONFIGS]
cases.append({
    "name": "adamw", "hp": {"lr": 0.01}, "groups": [{"lr": 0.002, "weight_decay": 0.2}],
    "trajectory": run(lambda g: O.AdamW(g, lr=0.01), groups=True),
})
path = os.path.join(os.path.dirname(__file__), "..", "crates", "train", "tests", "fixtures", "optim.json")
with open(path, "w") as f:
    json.dump({"torch": torch.__version__, "shapes": SHAPES, "record": RECORD, "cases": cases}, f)
print("wrote", path, len(cases), "cases")
