"""The Llama that `ballast train` trains (kind "llama"), in PyTorch, with Ballast's arithmetic
(runtime/kernels_llama_cpu.c, runtime/llama_layers.c): token embedding (no positions); pre-norm
blocks of RMSNorm (x * (mean(x^2) + eps)^-1/2 * w), grouped-query causal attention over q and k
turned by rotary positions (pairs (i, i + head_size/2), angle t * theta^(-2i/head_size) in
double, rounded once), output projection, RMSNorm, SwiGLU MLP (silu(gate) * up, down); final
RMSNorm, untied output projection, mean cross-entropy. No biases.

Modules carry LlamaForCausalLM's names (model.embed_tokens, model.layers.N.self_attn.q_proj,
..., model.norm, lm_head), so state_dict() is a Hugging Face Llama's, and so is a safetensors
file of it: Ballast reads and writes the same names (runtime/safetensors.h).

attention "manual": the materialised causal softmax Ballast computes; "sdpa":
F.scaled_dot_product_attention(is_causal=True) (PyTorch 2.0 and later), which runs flash
attention where PyTorch has a kernel for it. recompute: torch.utils.checkpoint around every
block.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


class RMSNorm(nn.Module):
    def __init__(self, C, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(C))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(T, hs, theta):
    """cos and sin (T, hs/2) of t * theta^(-2i/hs), computed in double and rounded once."""
    i = torch.arange(hs // 2, dtype=torch.float64)
    angle = torch.arange(T, dtype=torch.float64)[:, None] * theta ** (-2.0 * i / hs)
    return angle.cos().float(), angle.sin().float()


def rotate(x, cos, sin):
    """x (B, H, T, hs): pairs (i, i + hs/2) turned by the angles."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class Attention(nn.Module):
    def __init__(self, m, attention):
        super().__init__()
        C, self.nh, self.nkv = m["n_embd"], m["n_head"], m["n_kv_head"]
        self.hs, self.attention = C // self.nh, attention
        self.q_proj = nn.Linear(C, self.nh * self.hs, bias=False)
        self.k_proj = nn.Linear(C, self.nkv * self.hs, bias=False)
        self.v_proj = nn.Linear(C, self.nkv * self.hs, bias=False)
        self.o_proj = nn.Linear(C, C, bias=False)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        q = self.q_proj(x).view(B, T, self.nh, self.hs).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.nkv, self.hs).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.nkv, self.hs).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        # query head h reads key/value head h // (n_head / n_kv_head)
        group = self.nh // self.nkv
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        if self.attention == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.hs))
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            y = att.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v
        return self.o_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self, C, F_):
        super().__init__()
        self.gate_proj = nn.Linear(C, F_, bias=False)
        self.up_proj = nn.Linear(C, F_, bias=False)
        self.down_proj = nn.Linear(F_, C, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, m, attention):
        super().__init__()
        self.input_layernorm = RMSNorm(m["n_embd"], m["norm_eps"])
        self.self_attn = Attention(m, attention)
        self.post_attention_layernorm = RMSNorm(m["n_embd"], m["norm_eps"])
        self.mlp = MLP(m["n_embd"], m["ffn_hidden"])

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Module):
    def __init__(self, m, attention):
        super().__init__()
        self.embed_tokens = nn.Embedding(m["vocab_size"], m["n_embd"])
        self.layers = nn.ModuleList(Block(m, attention) for _ in range(m["n_layer"]))
        self.norm = RMSNorm(m["n_embd"], m["norm_eps"])


class Llama(nn.Module):
    def __init__(self, m, recompute, attention="manual"):
        super().__init__()
        self.recompute = recompute
        self.model = Decoder(m, attention)
        self.lm_head = nn.Linear(m["n_embd"], m["vocab_size"], bias=False)
        cos, sin = rope_tables(m["seq_len"], m["n_embd"] // m["n_head"], m["rope_theta"])
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = (0.02 / math.sqrt(2 * m["n_layer"])
                       if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02)
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx, targets):
        T = idx.shape[1]
        cos, sin = self.cos[:T], self.sin[:T]
        x = self.model.embed_tokens(idx)
        for b in self.model.layers:
            x = checkpoint(b, x, cos, sin, use_reentrant=False) if self.recompute else b(x, cos, sin)
        logits = self.lm_head(self.model.norm(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1))
