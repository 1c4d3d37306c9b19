"""The GPT that `ballast train` trains, in PyTorch on a GPU, timed the same way: tokens per
second of whole training steps (micro-batches of forward and backward, then AdamW), the first
WARMUP steps excluded (torch.compile compiles in them), CUDA synchronised at each step's end.

Same model as runtime/cuda/backend.cu: token + position embeddings, pre-norm blocks of causal
multi-head attention and a 4x GELU (tanh) MLP, final layer norm, untied output projection,
mean cross-entropy; AdamW (betas 0.9, 0.95, eps 1e-8, weight decay 0.1 on matrices only,
fused kernel); `micro_batches` micro-batches of gradient accumulation per step.

--dtype fp32: fp32 everywhere, TF32 off (as Ballast's cuBLAS calls: CUBLAS_COMPUTE_32F).
--dtype bf16: fp32 weights and optimizer, autocast to bf16 (PyTorch's usual mixed precision;
Ballast keeps bf16 weights beside fp32 masters, the same arithmetic).
--attention sdpa (default): F.scaled_dot_product_attention(is_causal=True), what PyTorch users
run (flash or memory-efficient kernels); manual: the materialised softmax Ballast computes.
--compile: torch.compile the model. --recompute: torch.utils.checkpoint around every block.

prints one JSON line: {"tokens_per_s", "step_ms": [...], "peak_bytes", "device", "torch"}
"""
import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


class Block(nn.Module):
    def __init__(self, C, NH, attention):
        super().__init__()
        self.nh, self.attention = NH, attention
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
        if self.attention == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // self.nh))
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            y = att.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.proj(y)
        return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, m, recompute, attention):
        super().__init__()
        C = m["n_embd"]
        self.recompute = recompute
        self.wte = nn.Embedding(m["vocab_size"], C)
        self.wpe = nn.Embedding(m["seq_len"], C)
        self.blocks = nn.ModuleList(Block(C, m["n_head"], attention) for _ in range(m["n_layer"]))
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
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.blocks:
            x = checkpoint(b, x, use_reentrant=False) if self.recompute else b(x)
        logits = self.lm(self.lnf(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--micro-batches", type=int, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--dtype", choices=["fp32", "bf16"], required=True)
    ap.add_argument("--attention", choices=["sdpa", "manual"], default="sdpa")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--recompute", action="store_true")
    ap.add_argument("--lr", type=float, default=1e-3)
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(1)
    dev = torch.device("cuda")
    m = json.load(open(a.model))
    B, T, V, M = m["micro_batch"], m["seq_len"], m["vocab_size"], a.micro_batches
    model = GPT(m, a.recompute, a.attention).to(dev)
    run = torch.compile(model) if a.compile else model
    decay = [p for p in model.parameters() if p.dim() == 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": other, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    data = torch.randint(0, V, (M, B, T + 1), device=dev)
    step_ms = []
    torch.cuda.reset_peak_memory_stats()
    for _ in range(a.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        for i in range(M):
            x = data[i]
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=a.dtype == "bf16"):
                loss = run(x[:, :-1], x[:, 1:]) / M
            loss.backward()
        opt.step()
        torch.cuda.synchronize()
        step_ms.append((time.perf_counter() - t0) * 1e3)
    timed = step_ms[a.warmup:] if len(step_ms) > a.warmup else step_ms[-1:]
    print(json.dumps({"tokens_per_s": M * B * T * len(timed) / (sum(timed) / 1e3),
                      "step_ms": step_ms, "peak_bytes": torch.cuda.max_memory_allocated(),
                      "device": torch.cuda.get_device_name(), "torch": torch.__version__}))


if __name__ == "__main__":
    main()
