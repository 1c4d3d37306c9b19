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
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from torch_gpt_model import GPT  # noqa: E402


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
