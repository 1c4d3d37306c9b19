"""The GPT that `ballast train` trains, in PyTorch, timed the same way: tokens per second of
training steps (forward, backward, AdamW) with the first step excluded as warm-up.

Same model as runtime/backend_cpu.c: token + position embeddings, pre-norm blocks of causal
multi-head attention and a 4x GELU (tanh) MLP, final layer norm, untied output projection,
mean cross-entropy; AdamW(betas 0.9, 0.95, eps 1e-8, weight decay 0.1 on matrices only);
`micro_batches` micro-batches of gradient accumulation per step. With --recompute every
block runs under torch.utils.checkpoint (activations recomputed in backward).

usage: torch_gpt.py MODEL.json --micro-batches M --steps N --threads T [--intra-op K]
                    [--recompute]
T threads for OpenBLAS's matrix products, K (default T) for PyTorch's own intra-op work.
prints one JSON line: {"tokens_per_s": ..., "step_ms": [...]}
"""
import argparse
import json
import math
import os
import sys
import time

# The thread count must reach OpenBLAS before torch loads it: torch.set_num_threads sets
# OpenMP's intra-op threads but leaves Debian's OpenBLAS (pthreads) at one thread per core.
if __name__ == "__main__" and "--threads" in sys.argv:
    os.environ["OPENBLAS_NUM_THREADS"] = sys.argv[sys.argv.index("--threads") + 1]

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.nh = NH
        self.ln1 = nn.LayerNorm(C)
        self.qkv = nn.Linear(C, 3 * C)
        self.proj = nn.Linear(C, C)
        self.ln2 = nn.LayerNorm(C)
        self.fc = nn.Linear(C, 4 * C)
        self.fcproj = nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q = q.view(B, T, self.nh, C // self.nh).transpose(1, 2)
        k = k.view(B, T, self.nh, C // self.nh).transpose(1, 2)
        v = v.view(B, T, self.nh, C // self.nh).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // self.nh))
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.proj(y)
        return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, m, recompute):
        super().__init__()
        C = m["n_embd"]
        self.recompute = recompute
        self.wte = nn.Embedding(m["vocab_size"], C)
        self.wpe = nn.Embedding(m["seq_len"], C)
        self.blocks = nn.ModuleList(Block(C, m["n_head"]) for _ in range(m["n_layer"]))
        self.lnf = nn.LayerNorm(C)
        self.lm = nn.Linear(C, m["vocab_size"], bias=False)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * m["n_layer"]) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.blocks:
            x = checkpoint(b, x, use_reentrant=False) if self.recompute else b(x)
        logits = self.lm(self.lnf(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--micro-batches", type=int, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--intra-op", type=int)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--recompute", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(a.intra_op or a.threads)
    torch.manual_seed(1)
    m = json.load(open(a.model))
    B, T, V, M = m["micro_batch"], m["seq_len"], m["vocab_size"], a.micro_batches
    model = GPT(m, a.recompute)
    decay = [p for p in model.parameters() if p.dim() == 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": other, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    step_ms = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        for _ in range(M):
            x = torch.randint(0, V, (B, T + 1))
            loss = model(x[:, :-1], x[:, 1:]) / M
            loss.backward()
        opt.step()
        step_ms.append((time.perf_counter() - t0) * 1e3)
    timed = step_ms[1:] if len(step_ms) > 1 else step_ms
    print(json.dumps({"tokens_per_s": M * B * T * len(timed) / (sum(timed) / 1e3),
                      "step_ms": step_ms}))


if __name__ == "__main__":
    main()
