#!/usr/bin/env python3
"""Learning-rate schedules from PyTorch for crates/train/tests/lr_scheduler.rs.

Each case builds an SGD optimizer (momentum, so OneCycleLR can cycle it) over two parameter
groups with different learning rates, attaches PyTorch's scheduler, and records the learning
rate (and momentum) of every group after construction and after each of 1,000 `step()` calls.
ReduceLROnPlateau is fed a fixed metric sequence, recorded too.

Usage: python3 scripts/scheduler_fixtures.py  (writes crates/train/tests/fixtures/lr_schedules.json)
"""
import json
import math
import os

import torch

STEPS = 1000
LRS = [0.1, 0.03]


def optimizer():
    params = [torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))]
    return torch.optim.SGD(
        [{"params": [params[0]], "lr": LRS[0]}, {"params": [params[1]], "lr": LRS[1]}],
        lr=LRS[0],
        momentum=0.9,
    )


def metric(t):
    # Falls, then sits on plateaus with noise, then rises: exercises patience and cooldown.
    return 1.0 / (1.0 + 0.02 * min(t, 150)) + 0.01 * math.sin(0.9 * t) + (0.001 * (t - 600) if t > 600 else 0.0)


def record(name, params, make, metric_fed=False):
    opt = optimizer()
    sched = make(opt)
    lrs, moms, metrics = [], [], []

    def snap():
        lrs.append([g["lr"] for g in opt.param_groups])
        moms.append([g["momentum"] for g in opt.param_groups])

    snap()
    for t in range(STEPS):
        opt.step()
        if metric_fed:
            m = metric(t)
            metrics.append(m)
            sched.step(m)
        else:
            sched.step()
        snap()
    case = {"name": name, "params": params, "lrs": lrs}
    if name.startswith("OneCycleLR"):
        case["momentum"] = moms
    if metric_fed:
        case["metrics"] = metrics
    return case


S = torch.optim.lr_scheduler
cases = [
    record("StepLR", {"step_size": 30, "gamma": 0.5}, lambda o: S.StepLR(o, 30, 0.5)),
    record("MultiStepLR", {"milestones": [100, 250, 250, 700], "gamma": 0.3},
           lambda o: S.MultiStepLR(o, [100, 250, 250, 700], 0.3)),
    record("ExponentialLR", {"gamma": 0.995}, lambda o: S.ExponentialLR(o, 0.995)),
    record("CosineAnnealingLR", {"T_max": 200, "eta_min": 0.001},
           lambda o: S.CosineAnnealingLR(o, 200, 0.001)),
    record("CosineAnnealingLR", {"T_max": 37, "eta_min": 0.0},
           lambda o: S.CosineAnnealingLR(o, 37)),
    record("CosineAnnealingWarmRestarts", {"T_0": 50, "T_mult": 1, "eta_min": 0.0},
           lambda o: S.CosineAnnealingWarmRestarts(o, 50)),
    record("CosineAnnealingWarmRestarts", {"T_0": 10, "T_mult": 2, "eta_min": 0.0005},
           lambda o: S.CosineAnnealingWarmRestarts(o, 10, 2, 0.0005)),
    record("LinearLR", {"start_factor": 1.0 / 3, "end_factor": 1.0, "total_iters": 5},
           lambda o: S.LinearLR(o)),
    record("LinearLR", {"start_factor": 0.01, "end_factor": 0.5, "total_iters": 400},
           lambda o: S.LinearLR(o, 0.01, 0.5, 400)),
    record("OneCycleLR", {"max_lr": [0.5, 0.2], "total_steps": 1000, "pct_start": 0.3,
                          "anneal_strategy": "cos", "three_phase": False,
                          "div_factor": 25.0, "final_div_factor": 1e4},
           lambda o: S.OneCycleLR(o, [0.5, 0.2], total_steps=1000)),
    record("OneCycleLR", {"max_lr": [0.5, 0.2], "total_steps": 1000, "pct_start": 0.25,
                          "anneal_strategy": "linear", "three_phase": True,
                          "div_factor": 10.0, "final_div_factor": 100.0},
           lambda o: S.OneCycleLR(o, [0.5, 0.2], total_steps=1000, pct_start=0.25,
                                  anneal_strategy="linear", three_phase=True,
                                  div_factor=10.0, final_div_factor=100.0)),
    record("LambdaLR", {"lambda": "0.97 ** (epoch // 10)"},
           lambda o: S.LambdaLR(o, lambda e: 0.97 ** (e // 10))),
    record("LambdaLR", {"lambda": "warmup 100 then inverse sqrt"},
           lambda o: S.LambdaLR(o, lambda e: min((e + 1) / 100, 10.0 / math.sqrt(e + 1)))),
    record("SequentialLR", {"schedulers": ["LinearLR(0.1, 1.0, 50)", "CosineAnnealingLR(950, 0.0)"],
                            "milestones": [50]},
           lambda o: S.SequentialLR(o, [S.LinearLR(o, 0.1, 1.0, 50), S.CosineAnnealingLR(o, 950)], [50])),
    record("SequentialLR", {"schedulers": ["ExponentialLR(0.99)", "StepLR(100, 0.5)", "ExponentialLR(0.999)"],
                            "milestones": [200, 600]},
           lambda o: S.SequentialLR(o, [S.ExponentialLR(o, 0.99), S.StepLR(o, 100, 0.5),
                                        S.ExponentialLR(o, 0.999)], [200, 600])),
    record("ReduceLROnPlateau", {"mode": "min", "factor": 0.5, "patience": 10, "threshold": 1e-4,
                                 "threshold_mode": "rel", "cooldown": 5, "min_lr": [0.001, 0.0],
                                 "eps": 1e-8},
           lambda o: S.ReduceLROnPlateau(o, "min", 0.5, 10, 1e-4, "rel", 5, [0.001, 0.0]), True),
    record("ReduceLROnPlateau", {"mode": "max", "factor": 0.1, "patience": 3, "threshold": 0.01,
                                 "threshold_mode": "abs", "cooldown": 0, "min_lr": [0.0, 0.0],
                                 "eps": 1e-8},
           lambda o: S.ReduceLROnPlateau(o, "max", 0.1, 3, 0.01, "abs"), True),
]

out = os.path.join(os.path.dirname(__file__), "..", "crates", "train", "tests", "fixtures", "lr_schedules.json")
with open(out, "w") as f:
    json.dump({"torch": torch.__version__, "lrs": LRS, "momentum": 0.9, "steps": STEPS, "cases": cases}, f)
print(f"wrote {out}: {len(cases)} cases")
