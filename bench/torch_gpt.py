"""The model that `ballast train` trains, in PyTorch, timed the same way: tokens per second of
training steps (forward, backward, AdamW) with the first step excluded as warm-up.

The model file's kind picks the twin: "gpt" bench/torch_gpt_model.py (token + position
embeddings, pre-norm blocks of causal multi-head attention and a 4x GELU (tanh) MLP, final
layer norm, untied output projection), "llama" bench/torch_llama_model.py (RMSNorm, rotary
grouped-query attention, SwiGLU, untied head); its "attention" field the attention: "flash"
F.scaled_dot_product_attention (on a PyTorch without it, before 2.0, the materialised
softmax, said on standard error and in the output's "attention"), anything else the
materialised softmax Ballast computes. Mean cross-entropy; AdamW(betas 0.9, 0.95, eps
1e-8, weight decay 0.1 on matrices only);
`micro_batches` micro-batches of gradient accumulation per step. With --recompute every
block runs under torch.utils.checkpoint (activations recomputed in backward).

usage: torch_gpt.py MODEL.json --micro-batches M --steps N --threads T [--intra-op K]
                    [--recompute]
T threads for OpenBLAS's matrix products, K (default T) for PyTorch's own intra-op work.
prints one JSON line: {"tokens_per_s": ..., "step_ms": [...], "attention": "sdpa"|"manual"}
"""
import argparse
import json
import os
import sys
import time

# The thread count must reach OpenBLAS before torch loads it: torch.set_num_threads sets
# OpenMP's intra-op threads but leaves Debian's OpenBLAS (pthreads) at one thread per core.
if __name__ == "__main__" and "--threads" in sys.argv:
    os.environ["OPENBLAS_NUM_THREADS"] = sys.argv[sys.argv.index("--threads") + 1]

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gpt_model import GPT  # noqa: E402
from torch_llama_model import Llama  # noqa: E402


def build(m, recompute):
    """The reference for model file `m`."""
    attention = "sdpa" if m.get("attention") == "flash" else "manual"
    if attention == "sdpa" and not hasattr(torch.nn.functional, "scaled_dot_product_attention"):
        print("torch_gpt.py: PyTorch %s has no F.scaled_dot_product_attention (2.0 and later): "
              "the materialised softmax instead" % torch.__version__, file=sys.stderr)
        attention = "manual"
    return (Llama if m.get("kind") == "llama" else GPT)(m, recompute, attention), attention


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
    model, attention = build(m, a.recompute)
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
                      "step_ms": step_ms, "attention": attention}))


if __name__ == "__main__":
    main()
