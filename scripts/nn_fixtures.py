"""PyTorch fixtures for ferrite-nn's layer and loss tests (crates/nn/tests/torch_cases.rs and,
on CUDA, crates/nn/tests/gpu.rs).

Run: python3 scripts/nn_fixtures.py   (needs torch and safetensors; CPU is enough)
Writes, under crates/nn/tests/fixtures/:
- nn_cases.json: one entry per case: kind (layer or loss), config, input names (float inputs
  get gradients; int inputs do not), parameter names (PyTorch state-dict keys);
- nn_tensors.safetensors: per case, in float64 (class indices int64): inputs
  `<case>/in.<name>`, parameters `<case>/param.<key>`, the output `<case>/out`, a cotangent
  `<case>/r` (loss = sum(out * r)), and the gradients `<case>/grad.in.<name>`,
  `<case>/grad.param.<key>` of that loss;
- torch_model.safetensors: `safetensors.torch.save_file(model.state_dict())` of a small
  Sequential (Linear, LayerNorm, GELU, Linear), with its input and output in nn_tensors
  (`model/in.x`, `model/out`).
"""
import json
import pathlib

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

torch.manual_seed(0)
D = torch.float64
OUT = pathlib.Path(__file__).resolve().parent.parent / "crates/nn/tests/fixtures"
cases = []
tensors = {}


def rnd(*shape, lo=-2.0, hi=2.0):
    return torch.rand(tuple(shape), dtype=D) * (hi - lo) + lo


def add_case(name, kind, cfg, inputs, fn, module=None, nograd=()):
    """inputs: dict name -> tensor (float ones not in `nograd` get gradients). fn(inputs) -> output."""
    ins = {k: (v.clone().requires_grad_(True) if v.is_floating_point() and k not in nograd else v) for k, v in inputs.items()}
    out = fn(ins)
    r = rnd(*out.shape)
    (out * r).sum().backward()
    params = {}
    if module is not None:
        params = {k: v for k, v in module.named_parameters()}
    for k, v in ins.items():
        tensors[f"{name}/in.{k}"] = v.detach().contiguous()
        if v.grad is not None:
            tensors[f"{name}/grad.in.{k}"] = v.grad.detach().contiguous()
    for k, v in params.items():
        tensors[f"{name}/param.{k}"] = v.detach().contiguous()
        tensors[f"{name}/grad.param.{k}"] = v.grad.detach().contiguous()
    tensors[f"{name}/out"] = out.detach().contiguous()
    tensors[f"{name}/r"] = r.contiguous()
    cases.append({"name": name, "kind": kind, "cfg": cfg, "inputs": list(ins.keys()), "params": list(params.keys())})


# ---- layers ----
for i, (fi, fo, bias, xs) in enumerate([(4, 3, True, (5, 4)), (5, 2, False, (2, 3, 5)), (1, 1, True, (3, 1))]):
    m = torch.nn.Linear(fi, fo, bias=bias).double()
    add_case(f"linear_{i}", "Linear", {"in": fi, "out": fo, "bias": bias}, {"x": rnd(*xs)}, lambda t, m=m: m(t["x"]), m)
for i, (a, b, o, bias, lead) in enumerate([(3, 4, 2, True, (5,)), (2, 2, 3, False, (2, 3))]):
    m = torch.nn.Bilinear(a, b, o, bias=bias).double()
    add_case(f"bilinear_{i}", "Bilinear", {"in1": a, "in2": b, "out": o, "bias": bias},
             {"x1": rnd(*lead, a), "x2": rnd(*lead, b)}, lambda t, m=m: m(t["x1"], t["x2"]), m)
for i, (shape, affine, bias, eps, xs) in enumerate([([6], True, True, 1e-5, (4, 6)), ([3, 4], True, False, 1e-3, (2, 3, 4)), ([5], False, True, 1e-5, (3, 5))]):
    m = torch.nn.LayerNorm(shape, eps=eps, elementwise_affine=affine, bias=bias).double()
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(rnd(*p.shape))
    add_case(f"layer_norm_{i}", "LayerNorm", {"shape": shape, "affine": affine, "bias": bias, "eps": eps}, {"x": rnd(*xs)}, lambda t, m=m: m(t["x"]), m)
for i, (shape, eps, affine, xs) in enumerate([([6], None, True, (4, 6)), ([3, 4], 1e-5, True, (2, 3, 4)), ([5], 1e-6, False, (3, 5))]):
    m = torch.nn.RMSNorm(shape, eps=eps, elementwise_affine=affine).double()
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(rnd(*p.shape))
    add_case(f"rms_norm_{i}", "RMSNorm", {"shape": shape, "eps": eps, "affine": affine}, {"x": rnd(*xs)}, lambda t, m=m: m(t["x"]), m)
for i, (n, d, pad, ids) in enumerate([(10, 4, None, [[1, 2, 3], [9, 0, 2]]), (10, 4, 2, [[1, 2, 3], [2, 2, 9]]), (6, 3, -1, [5, 0, 5, 1])]):
    m = torch.nn.Embedding(n, d, padding_idx=pad).double()
    add_case(f"embedding_{i}", "Embedding", {"num": n, "dim": d, "padding_idx": pad},
             {"ids": torch.tensor(ids, dtype=torch.int64)}, lambda t, m=m: m(t["ids"]), m)

rnn_configs = [
    ("RNN", dict(nonlinearity="tanh"), 3, 4, 1, True, False, False, False),
    ("RNN", dict(nonlinearity="relu"), 3, 4, 2, False, True, True, True),
    ("LSTM", {}, 3, 5, 1, True, False, False, True),
    ("LSTM", {}, 2, 3, 2, True, True, True, False),
    ("GRU", {}, 3, 4, 1, True, False, True, True),
    ("GRU", {}, 2, 3, 2, False, True, False, False),
]
for i, (kind, extra, fi, hs, layers, bias, batch_first, bidir, with_state) in enumerate(rnn_configs):
    cls = getattr(torch.nn, kind)
    m = cls(fi, hs, num_layers=layers, bias=bias, batch_first=batch_first, bidirectional=bidir, **extra).double()
    T, B = 4, 2
    xs = (B, T, fi) if batch_first else (T, B, fi)
    ins = {"x": rnd(*xs)}
    dirs = 2 if bidir else 1
    if with_state:
        ins["h0"] = rnd(layers * dirs, B, hs, lo=-1, hi=1)
        if kind == "LSTM":
            ins["c0"] = rnd(layers * dirs, B, hs, lo=-1, hi=1)

    def f(t, m=m, kind=kind):
        if "h0" in t:
            st = (t["h0"], t["c0"]) if kind == "LSTM" else t["h0"]
            return m(t["x"], st)[0]
        return m(t["x"])[0]
    cfg = {"input": fi, "hidden": hs, "layers": layers, "bias": bias, "batch_first": batch_first, "bidirectional": bidir, "relu": extra.get("nonlinearity") == "relu"}
    add_case(f"rnn_{i}_{kind}", kind, cfg, ins, f, m)

mha_configs = [
    (8, 2, True, False, False, False, 5, 5), (8, 4, True, True, True, True, 4, 4),
    (6, 3, False, False, False, False, 3, 5), (8, 2, True, False, True, False, 4, 4),
]
for i, (e, h, bias, batch_first, causal, padmask, L, S) in enumerate(mha_configs):
    m = torch.nn.MultiheadAttention(e, h, bias=bias, batch_first=batch_first).double()
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() == 1:
                p.copy_(rnd(*p.shape, lo=-0.5, hi=0.5))
    B = 2
    qs, ks = ((B, L, e), (B, S, e)) if batch_first else ((L, B, e), (S, B, e))
    ins = {"q": rnd(*qs), "k": rnd(*ks), "v": rnd(*ks)}
    if padmask:
        mk = torch.zeros(B, S, dtype=torch.bool)
        mk[0, -1] = True
        mk[1, 1] = True
        ins["mask"] = mk

    def f(t, m=m, causal=causal, L=L, S=S):
        am = torch.triu(torch.ones(L, S, dtype=torch.bool), diagonal=1 + S - L) if causal else None
        return m(t["q"], t["k"], t["v"], key_padding_mask=t.get("mask"), attn_mask=am, need_weights=False)[0]
    add_case(f"mha_{i}", "MultiheadAttention", {"embed": e, "heads": h, "bias": bias, "batch_first": batch_first, "causal": causal}, ins, f, m)

enc_configs = [(8, 2, 16, False, False, False, False, False), (8, 4, 12, True, True, True, True, True)]
for i, (d, h, ff, gelu, norm_first, batch_first, causal, padmask) in enumerate(enc_configs):
    m = torch.nn.TransformerEncoderLayer(d, h, dim_feedforward=ff, dropout=0.0, activation="gelu" if gelu else "relu",
                                         batch_first=batch_first, norm_first=norm_first).double()
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() == 1:
                p.copy_(rnd(*p.shape, lo=-0.5, hi=0.5))
    B, L = 2, 5
    ins = {"x": rnd(*((B, L, d) if batch_first else (L, B, d)))}
    if padmask:
        mk = torch.zeros(B, L, dtype=torch.bool)
        mk[1, -2:] = True
        ins["mask"] = mk

    def f(t, m=m, causal=causal, L=L):
        am = torch.triu(torch.ones(L, L, dtype=torch.bool), diagonal=1) if causal else None
        return m(t["x"], src_mask=am, src_key_padding_mask=t.get("mask"))
    add_case(f"encoder_{i}", "TransformerEncoderLayer", {"d_model": d, "nhead": h, "ff": ff, "gelu": gelu, "norm_first": norm_first, "batch_first": batch_first, "causal": causal}, ins, f, m)

dec_configs = [(8, 2, 16, False, False, False, True, False), (8, 4, 12, True, True, True, True, True)]
for i, (d, h, ff, gelu, norm_first, batch_first, causal, padmask) in enumerate(dec_configs):
    m = torch.nn.TransformerDecoderLayer(d, h, dim_feedforward=ff, dropout=0.0, activation="gelu" if gelu else "relu",
                                         batch_first=batch_first, norm_first=norm_first).double()
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() == 1:
                p.copy_(rnd(*p.shape, lo=-0.5, hi=0.5))
    B, L, S = 2, 4, 6
    ins = {"tgt": rnd(*((B, L, d) if batch_first else (L, B, d))), "memory": rnd(*((B, S, d) if batch_first else (S, B, d)))}
    if padmask:
        mk = torch.zeros(B, S, dtype=torch.bool)
        mk[0, -3:] = True
        ins["mask"] = mk

    def f(t, m=m, causal=causal, L=L):
        am = torch.triu(torch.ones(L, L, dtype=torch.bool), diagonal=1) if causal else None
        return m(t["tgt"], t["memory"], tgt_mask=am, memory_key_padding_mask=t.get("mask"))
    add_case(f"decoder_{i}", "TransformerDecoderLayer", {"d_model": d, "nhead": h, "ff": ff, "gelu": gelu, "norm_first": norm_first, "batch_first": batch_first, "causal": causal}, ins, f, m)

acts = [
    ("ReLU", {}, F.relu), ("LeakyReLU", {"slope": 0.1}, lambda x: F.leaky_relu(x, 0.1)),
    ("LeakyReLU", {"slope": 0.01}, lambda x: F.leaky_relu(x)),
    ("ELU", {"alpha": 0.7}, lambda x: F.elu(x, 0.7)), ("ELU", {"alpha": 1.0}, F.elu),
    ("GELU", {"tanh": False}, F.gelu), ("GELU", {"tanh": True}, lambda x: F.gelu(x, approximate="tanh")),
    ("SiLU", {}, F.silu), ("Mish", {}, F.mish),
    ("Softplus", {"beta": 1.0, "threshold": 20.0}, F.softplus),
    ("Softplus", {"beta": 2.0, "threshold": 3.0}, lambda x: F.softplus(x, 2.0, 3.0)),
    ("Softsign", {}, F.softsign), ("Hardsigmoid", {}, F.hardsigmoid), ("Hardswish", {}, F.hardswish),
    ("Tanh", {}, torch.tanh), ("Sigmoid", {}, torch.sigmoid),
    ("Softmax", {"dim": 1}, lambda x: F.softmax(x, 1)), ("Softmax", {"dim": -1}, lambda x: F.softmax(x, -1)),
    ("LogSoftmax", {"dim": 0}, lambda x: F.log_softmax(x, 0)), ("LogSoftmax", {"dim": -1}, lambda x: F.log_softmax(x, -1)),
]
for i, (kind, cfg, f) in enumerate(acts):
    x = rnd(2, 5, 3, lo=-4, hi=4)
    add_case(f"act_{i}_{kind}", kind, cfg, {"x": x}, lambda t, f=f: f(t["x"]))

# ---- losses ----
R = ["mean", "sum", "none"]


def ce_case(i, shape, cfg, probs=False):
    c = shape[1] if len(shape) > 1 else shape[0]
    x = rnd(*shape, lo=-3, hi=3)
    ins = {"input": x}
    if probs:
        ins["target"] = torch.softmax(rnd(*shape), 1 if len(shape) > 1 else 0)
    else:
        tshape = (shape[0],) + tuple(shape[2:]) if len(shape) > 1 else ()
        t = torch.randint(0, c, tshape, dtype=torch.int64)
        if cfg.get("ignore_index") is not None and t.numel() > 1:
            t.view(-1)[0] = cfg["ignore_index"]
        ins["target"] = t
    if cfg.get("weight"):
        ins["weight"] = torch.rand(c, dtype=D) + 0.5
    kw = {"reduction": cfg["reduction"], "label_smoothing": cfg.get("label_smoothing", 0.0)}
    if cfg.get("ignore_index") is not None:
        kw["ignore_index"] = cfg["ignore_index"]

    def f(t):
        w = t["weight"].detach() if "weight" in t else None
        return F.cross_entropy(t["input"], t["target"], weight=w, **kw)
    add_case(f"cross_entropy_{i}", "cross_entropy", cfg, ins, f)


ce_configs = [
    ((5, 7), {"reduction": "mean"}), ((5, 7), {"reduction": "sum", "weight": True}),
    ((6, 4), {"reduction": "mean", "ignore_index": 1}), ((6, 4), {"reduction": "mean", "ignore_index": -100, "weight": True}),
    ((5, 7), {"reduction": "mean", "label_smoothing": 0.1}), ((5, 7), {"reduction": "none", "label_smoothing": 0.2, "weight": True, "ignore_index": 3}),
    ((2, 4, 3), {"reduction": "mean", "weight": True}), ((2, 4, 3, 2), {"reduction": "none"}), ((7,), {"reduction": "mean"}),
    ((9, 33), {"reduction": "mean", "label_smoothing": 0.05, "weight": True}),
]
for i, (shape, cfg) in enumerate(ce_configs):
    ce_case(i, shape, cfg)
for j, (shape, cfg) in enumerate([((5, 7), {"reduction": "mean"}), ((4, 3, 2), {"reduction": "sum", "label_smoothing": 0.1, "weight": True}), ((5, 7), {"reduction": "none", "weight": True})]):
    ce_case(len(ce_configs) + j, shape, dict(cfg, probs=True), probs=True)

for i, (shape, cfg) in enumerate([((5, 4), {"reduction": "mean"}), ((6, 3), {"reduction": "mean", "weight": True, "ignore_index": 0}), ((2, 3, 4), {"reduction": "sum"}), ((5, 4), {"reduction": "none", "weight": True})]):
    c = shape[1]
    tshape = (shape[0],) + tuple(shape[2:])
    ins = {"input": torch.log_softmax(rnd(*shape), 1), "target": torch.randint(0, c, tshape, dtype=torch.int64)}
    if cfg.get("weight"):
        ins["weight"] = torch.rand(c, dtype=D) + 0.5
    ii = cfg.get("ignore_index", -100)

    def f(t, cfg=cfg, ii=ii):
        w = t["weight"].detach() if "weight" in t else None
        return F.nll_loss(t["input"], t["target"], weight=w, ignore_index=ii, reduction=cfg["reduction"])
    add_case(f"nll_loss_{i}", "nll_loss", cfg, ins, f)

for i, red in enumerate(R):
    ins = {"input": torch.rand(4, 3, dtype=D) * 0.9 + 0.05, "target": torch.rand(4, 3, dtype=D)}
    if i == 1:
        ins["weight"] = torch.rand(4, 3, dtype=D)
    add_case(f"bce_{i}", "binary_cross_entropy", {"reduction": red}, ins,
             lambda t, red=red: F.binary_cross_entropy(t["input"], t["target"], weight=t.get("weight"), reduction=red), nograd=("weight",))
for i, red in enumerate(R):
    ins = {"input": rnd(4, 3, lo=-5, hi=5), "target": torch.rand(4, 3, dtype=D)}
    if i != 0:
        ins["pos_weight"] = torch.rand(3, dtype=D) * 3
    if i == 2:
        ins["weight"] = torch.rand(4, 3, dtype=D)
    add_case(f"bce_logits_{i}", "binary_cross_entropy_with_logits", {"reduction": red}, ins,
             lambda t, red=red: F.binary_cross_entropy_with_logits(t["input"], t["target"], weight=t.get("weight"), pos_weight=t.get("pos_weight"), reduction=red), nograd=("weight", "pos_weight"))


def focal(x, t, alpha, gamma, red):
    # torchvision.ops.sigmoid_focal_loss, verbatim.
    p = torch.sigmoid(x)
    ce = F.binary_cross_entropy_with_logits(x, t, reduction="none")
    p_t = p * t + (1 - p) * (1 - t)
    loss = ce * ((1 - p_t) ** gamma)
    if alpha >= 0:
        loss = (alpha * t + (1 - alpha) * (1 - t)) * loss
    return {"mean": loss.mean, "sum": loss.sum, "none": lambda: loss}[red]()


for i, (alpha, gamma, red) in enumerate([(0.25, 2.0, "mean"), (-1.0, 1.5, "sum"), (0.5, 0.0, "none")]):
    ins = {"input": rnd(5, 3, lo=-3, hi=3), "target": (torch.rand(5, 3) > 0.5).double()}
    add_case(f"focal_{i}", "sigmoid_focal_loss", {"alpha": alpha, "gamma": gamma, "reduction": red}, ins,
             lambda t, a=alpha, g=gamma, r=red: focal(t["input"], t["target"], a, g, r))
for i, (margin, red) in enumerate([(1.0, "mean"), (0.5, "sum"), (2.0, "none")]):
    ins = {"input": rnd(4, 5), "target": torch.where(torch.rand(4, 5) > 0.5, 1.0, -1.0).double()}
    add_case(f"hinge_{i}", "hinge_embedding_loss", {"margin": margin, "reduction": red}, ins,
             lambda t, m=margin, r=red: F.hinge_embedding_loss(t["input"], t["target"], margin=m, reduction=r))
for i, (p, margin, w, red) in enumerate([(1, 1.0, False, "mean"), (2, 0.5, True, "sum"), (1, 2.0, True, "none")]):
    ins = {"input": rnd(5, 4), "target": torch.randint(0, 4, (5,), dtype=torch.int64)}
    if w:
        ins["weight"] = torch.rand(4, dtype=D) + 0.5
    add_case(f"multi_margin_{i}", "multi_margin_loss", {"p": p, "margin": margin, "reduction": red}, ins,
             lambda t, p=p, m=margin, r=red: F.multi_margin_loss(t["input"], t["target"], p=p, margin=m, weight=t["weight"].detach() if "weight" in t else None, reduction=r))
for i, red in enumerate(R):
    ins = {"input": rnd(3, 4), "target": rnd(3, 4)}
    add_case(f"mse_{i}", "mse_loss", {"reduction": red}, ins, lambda t, r=red: F.mse_loss(t["input"], t["target"], reduction=r))
    add_case(f"l1_{i}", "l1_loss", {"reduction": red}, ins, lambda t, r=red: F.l1_loss(t["input"], t["target"], reduction=r))
for i, (delta, red) in enumerate([(1.0, "mean"), (0.5, "sum"), (2.0, "none")]):
    ins = {"input": rnd(3, 5), "target": rnd(3, 5)}
    add_case(f"huber_{i}", "huber_loss", {"delta": delta, "reduction": red}, ins, lambda t, d=delta, r=red: F.huber_loss(t["input"], t["target"], delta=d, reduction=r))
for i, (beta, red) in enumerate([(1.0, "mean"), (0.5, "sum"), (0.0, "none")]):
    ins = {"input": rnd(3, 5), "target": rnd(3, 5)}
    add_case(f"smooth_l1_{i}", "smooth_l1_loss", {"beta": beta, "reduction": red}, ins, lambda t, b=beta, r=red: F.smooth_l1_loss(t["input"], t["target"], beta=b, reduction=r))
for i, (red, logt) in enumerate([("mean", False), ("batchmean", False), ("sum", True), ("none", False)]):
    tgt = torch.softmax(rnd(4, 5), 1)
    if not logt:
        tgt[0, 0] = 0.0
    else:
        tgt = torch.log(tgt)
    ins = {"input": torch.log_softmax(rnd(4, 5), 1), "target": tgt}
    add_case(f"kl_div_{i}", "kl_div", {"reduction": red, "log_target": logt}, ins,
             lambda t, r=red, l=logt: F.kl_div(t["input"], t["target"], reduction=r, log_target=l), nograd=("target",))
for i, (margin, red) in enumerate([(0.0, "mean"), (0.2, "sum"), (-0.3, "none")]):
    ins = {"x1": rnd(5, 4), "x2": rnd(5, 4), "target": torch.tensor([1, -1, 1, -1, -1], dtype=torch.int64)}
    add_case(f"cosine_embedding_{i}", "cosine_embedding_loss", {"margin": margin, "reduction": red}, ins,
             lambda t, m=margin, r=red: F.cosine_embedding_loss(t["x1"], t["x2"], t["target"], margin=m, reduction=r))
for i, (margin, red) in enumerate([(0.0, "mean"), (0.3, "sum"), (1.0, "none")]):
    ins = {"x1": rnd(6), "x2": rnd(6), "target": torch.where(torch.rand(6) > 0.5, 1.0, -1.0).double()}
    add_case(f"margin_ranking_{i}", "margin_ranking_loss", {"margin": margin, "reduction": red}, ins,
             lambda t, m=margin, r=red: F.margin_ranking_loss(t["x1"], t["x2"], t["target"], margin=m, reduction=r))
for i, (margin, p, swap, red) in enumerate([(1.0, 2.0, False, "mean"), (0.5, 1.0, True, "sum"), (2.0, 3.0, True, "none")]):
    ins = {"anchor": rnd(4, 5), "positive": rnd(4, 5), "negative": rnd(4, 5)}
    add_case(f"triplet_{i}", "triplet_margin_loss", {"margin": margin, "p": p, "swap": swap, "reduction": red}, ins,
             lambda t, m=margin, p=p, s=swap, r=red: F.triplet_margin_loss(t["anchor"], t["positive"], t["negative"], margin=m, p=p, swap=s, reduction=r))

# ---- a PyTorch state dict ----
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.GELU(), torch.nn.Linear(8, 3))
with torch.no_grad():
    model[1].weight.copy_(torch.rand(8) + 0.5)
    model[1].bias.copy_(torch.rand(8) - 0.5)
x = torch.rand(5, 4) * 2 - 1
tensors["model/in.x"] = x.double()
tensors["model/out"] = model(x).detach().double()
OUT.mkdir(parents=True, exist_ok=True)
save_file(model.state_dict(), str(OUT / "torch_model.safetensors"))
save_file(tensors, str(OUT / "nn_tensors.safetensors"))
(OUT / "nn_cases.json").write_text(json.dumps({"cases": cases}, indent=1) + "\n")
print(f"{len(cases)} cases, {len(tensors)} tensors")
