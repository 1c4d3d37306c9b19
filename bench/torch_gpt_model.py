"""The GPT that `ballast train` trains, in PyTorch: token + position embeddings, pre-norm
blocks of causal multi-head attention and a 4x GELU (tanh) MLP, final layer norm, untied output
projection, mean cross-entropy; GPT-2's initialisation. Shared by the CPU benchmark
(bench/torch_gpt.py) and the GPU one (bench/gpu/torch_gpt_cuda.py).

attention "manual": the materialised causal softmax Ballast computes; "sdpa":
F.scaled_dot_product_attention(is_causal=True), what PyTorch users run on GPUs.
recompute: torch.utils.checkpoint around every block.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


class Block(nn.Module):
    def __init__(self, C, NH, attention="manual"):
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
    def __init__(self, m, recompute, attention="manual"):
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
