"""Per-kernel CUDA time a step of PyTorch's compiled GPT-2 124M training step (the model and
step of gpt2_train.py: batch 16, context 1024, bf16 autocast, fused AdamW, clip 1.0), summed
over three profiled steps by torch.profiler after four warm-up steps.
Usage: python3 scripts/gpu/torch_gpt2_profile.py PATH/TO/gpt2_train.py"""
import sys
import types

import torch
src = open(sys.argv[1]).read().split("def run(")[0]
sys.argv = ["x", "16", "1024", "1"]
g = types.ModuleType("g"); exec(src, g.__dict__)
from torch.profiler import profile, ProfilerActivity
m = g.GPT().cuda()
opt = torch.optim.AdamW(m.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
f = torch.compile(m)
x = torch.randint(0, g.V, (16, 1024), device="cuda"); y = torch.randint(0, g.V, (16, 1024), device="cuda")
def step():
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = f(x, y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
    opt.step(); opt.zero_grad(set_to_none=True)
for _ in range(4): step()
torch.cuda.synchronize()
N = 3
with profile(activities=[ProfilerActivity.CUDA]) as p:
    for _ in range(N): step()
    torch.cuda.synchronize()
tot = {}
cnt = {}
for e in p.events():
    if e.device_type == torch.autograd.DeviceType.CUDA:
        tot[e.name] = tot.get(e.name, 0) + e.device_time
        cnt[e.name] = cnt.get(e.name, 0) + 1
s = sum(tot.values()) / N / 1000
print(f"kernel ms/step total {s:.2f}")
for k, v in sorted(tot.items(), key=lambda kv: -kv[1])[:60]:
    print(f"{v/N/1000:8.3f} ms {cnt[k]//N:4d}x  {k[:150]}")
