"""PyTorch's char-GPT training step (6 layers, 6 heads, 384 wide, context 256, batch 64,
vocab 65; AdamW fused, bf16 autocast), the model of the reference's torch_train.py T3, alone
in its process so that its peak memory is its own.

usage: python3 torch_char_gpt.py eager|compile|graph
graph: the whole step (forward, loss, backward, AdamW with capturable state) captured as one
CUDA graph after warm-up steps on a side stream and replayed, as torch_train.py does for the
seed CNN and the MLP.
Prints one JSON line: steps/s over 50 steps after warm-up, and the peak of
torch.cuda.max_memory_allocated over those steps (graph: over the capture and the replays,
since the graph's own pool is not counted as allocated once its capture has ended).
"""
import json, sys, time
import torch, torch.nn as nn, torch.nn.functional as F

mode = sys.argv[1] if len(sys.argv) > 1 else "eager"
if mode not in ("eager", "compile", "graph"):
    sys.exit(f"torch_char_gpt.py: mode must be eager, compile or graph, not {mode!r}")
torch.manual_seed(0)
dev = "cuda"


class Block(nn.Module):
    def __init__(s, d, h):
        super().__init__()
        s.h = h
        s.ln1, s.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        s.qkv, s.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        s.fc, s.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(s, x):
        B, T, C = x.shape
        q, k, v = s.qkv(s.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, s.h, C // s.h).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + s.proj(a.transpose(1, 2).reshape(B, T, C))
        return x + s.out(F.gelu(s.fc(s.ln2(x))))


class GPT(nn.Module):
    def __init__(s, V=65, T=256, d=384, L=6, h=6):
        super().__init__()
        s.tok, s.pos = nn.Embedding(V, d), nn.Embedding(T, d)
        s.blocks = nn.Sequential(*[Block(d, h) for _ in range(L)])
        s.ln = nn.LayerNorm(d)
        s.head = nn.Linear(d, V, bias=False)

    def forward(s, idx):
        x = s.tok(idx) + s.pos(torch.arange(idx.shape[1], device=idx.device))
        return s.head(s.ln(s.blocks(x)))


m = GPT().to(dev)
opt = torch.optim.AdamW(m.parameters(), lr=1e-3, fused=True, capturable=mode == "graph")
fwd = torch.compile(m) if mode == "compile" else m
idx = torch.randint(0, 65, (64, 256), device=dev)
tgt = torch.randint(0, 65, (64, 256), device=dev)


def step():
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = F.cross_entropy(fwd(idx).view(-1, 65), tgt.view(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


if mode == "graph":
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(5):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    with torch.cuda.graph(graph):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(fwd(idx).view(-1, 65), tgt.view(-1))
        loss.backward()
        opt.step()
    step = graph.replay
for _ in range(15):
    step()
torch.cuda.synchronize()
if mode != "graph":
    torch.cuda.reset_peak_memory_stats()
t = time.perf_counter()
n = 50
for _ in range(n):
    step()
torch.cuda.synchronize()
rate = n / (time.perf_counter() - t)
print(json.dumps({"workload": "char_gpt", "mode": mode, "steps_per_s": round(rate, 2),
                  "peak_mib": round(torch.cuda.max_memory_allocated() / 2**20)}), flush=True)
